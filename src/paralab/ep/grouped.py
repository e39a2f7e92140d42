"""The local experts as one batched matmul instead of a loop, with torchtitan's alignment padding.

A rank's local experts each get a variable number of rows (dropless routing). A loop runs one
small matmul per expert; a grouped matmul runs them in one kernel. torchtitan's
`use_grouped_mm` path lays the rows out flat, each expert's block padded with zero rows to a
multiple of an alignment (8 rows for bf16) and to at least one alignment (an expert with no
rows still gets a block), and hands `torch._grouped_mm` the blocks' end offsets.

`torch._grouped_mm` takes no float64, and this lab checks in float64, so the lab runs the
honest CPU stand-in: the aligned blocks, each padded further to the longest one, as a
(local experts, rows, dim) batch for `torch.baddbmm`. The padding rows are computed and thrown
away. `aligned_layout` is the flat layout `torch._grouped_mm` takes; tests/test_ep_grouped.py
runs `torch._grouped_mm` itself on it in float32.
"""

from __future__ import annotations

import torch
from torch import nn


def aligned_sizes(counts: list[int], alignment: int) -> list[int]:
    """Each expert's block: its rows rounded up to a multiple of `alignment`, at least one
    alignment (torchtitan's `generate_permute_indices`: clamp_min, then round up)."""
    return [-(-max(count, alignment) // alignment) * alignment for count in counts]


def aligned_layout(
    rows: torch.Tensor, counts: list[int], alignment: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat rows, offsets): each expert's block of `rows` (grouped by expert) followed by
    zero rows up to its aligned size; offsets are the blocks' ends, as `torch._grouped_mm`
    takes them."""
    sizes = aligned_sizes(counts, alignment)
    blocks = [
        torch.cat([block, block.new_zeros(size - block.shape[0], block.shape[1])])
        for block, size in zip(rows.split(counts), sizes)
    ]
    return torch.cat(blocks), torch.tensor(sizes).cumsum(0).to(torch.int32)


def padded_batch(rows: torch.Tensor, counts: list[int], alignment: int) -> torch.Tensor:
    """(local experts, longest aligned block, dim): expert e's rows first in slice e, zeros after."""
    longest = max(aligned_sizes(counts, alignment))
    batch = rows.new_zeros(len(counts), longest, rows.shape[1])
    for e, block in enumerate(rows.split(counts)):
        batch[e, : block.shape[0]] = block
    return batch


def stacked_weights(experts: list[nn.Module]) -> dict[str, torch.Tensor]:
    """The local experts' fc1 and fc2 as (local experts, ...) tensors, stacked (differentiable),
    as torchtitan's `GroupedExperts` stores them from the start."""
    return {
        "w1": torch.stack([e.fc1.weight.t() for e in experts]),
        "b1": torch.stack([e.fc1.bias for e in experts]).unsqueeze(1),
        "w2": torch.stack([e.fc2.weight.t() for e in experts]),
        "b2": torch.stack([e.fc2.bias for e in experts]).unsqueeze(1),
    }


def run_grouped_experts(
    experts: list[nn.Module], rows: torch.Tensor, counts: list[int], alignment: int
) -> torch.Tensor:
    """`run_local_experts` as two batched matmuls over the padded batch: fc2(tanh(fc1(x)))
    for every local expert at once; the padding rows are dropped on the way out."""
    w = stacked_weights(experts)
    batch = padded_batch(rows, counts, alignment)
    hidden = torch.tanh(torch.baddbmm(w["b1"], batch, w["w1"]))
    out = torch.baddbmm(w["b2"], hidden, w["w2"])
    return torch.cat([out[e, :count] for e, count in enumerate(counts)])
