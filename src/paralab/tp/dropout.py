"""Dropout under tensor parallelism: which ranks must draw the same mask, with an RNG tracker.

An activation every tp rank holds whole (the residual stream under TP) must get the same
mask on every rank, or the ranks' copies drift apart. An activation each rank holds a
different part of (its heads' attention probabilities; under SP, its tokens) must get
masks that differ across ranks, or head j of every rank is dropped alike. Megatron keeps
two generators per rank (NVIDIA/Megatron-LM@d98e8a64:megatron/core/tensor_parallel/random.py,
`model_parallel_cuda_manual_seed`): the default one seeded `seed` on every tp rank, and a
tensor-parallel one seeded `seed + 2718 + tp_rank`, entered with `get_cuda_rng_tracker().fork()`
around attention dropout, and around the whole block under SP, where the residual
dropout acts on this rank's tokens (`dot_product_attention.py`, `transformer_block.py`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab.tp.layout import owned_range
from paralab.tp.mappings import SEQ_DIM
from paralab.tp.model import CONFIG

TP_SEED_OFFSET = 2718
"""Megatron's offset of the tensor-parallel seed (any positive value works, its comment says)."""

HEAD_DIM = 1
"""Attention probabilities are (batch, heads, query, key)."""


class RNGTracker:
    """This rank's two generators: `default` the same on every tp rank, `tensor_parallel` its own."""

    def __init__(self, seed: int, tp_rank: int) -> None:
        self.default = torch.Generator().manual_seed(seed)
        self.tensor_parallel = torch.Generator().manual_seed(seed + TP_SEED_OFFSET + tp_rank)


def dropout_mask(shape: torch.Size, p: float, generator: torch.Generator) -> torch.Tensor:
    """Keep each element with probability 1 - p, scaled by 1 / (1 - p), as `F.dropout` scales."""
    keep = torch.rand(shape, generator=generator, dtype=torch.float64) >= p
    return keep.double() / (1 - p)


def dropout_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Full attention probabilities (b, heads, s, s) and a residual activation (b, s, h)."""
    g = torch.Generator().manual_seed(3000 + seed)
    b, a, s, h = CONFIG.batch, CONFIG.heads, CONFIG.seq, CONFIG.hidden
    probs = torch.rand(b, a, s, s, dtype=torch.float64, generator=g).softmax(-1)
    return probs, torch.randn(b, s, h, dtype=torch.float64, generator=g)


def dropout_job(
    sequence_parallel: bool = False, p: float = 0.25, seed: int = 0, tracked: bool = True
) -> dict[str, torch.Tensor]:
    """On every rank (tp = world): dropout on this rank's heads of the attention probabilities,
    then on its residual activation (whole under TP, its tokens under SP), in Megatron's order.

    `tracked=False` draws everything from the default generator: no tracker."""
    rank, tp = dist.get_rank(), dist.get_world_size()
    tracker = RNGTracker(seed, rank)
    own = tracker.tensor_parallel if tracked else tracker.default
    probs, residual = dropout_inputs(seed)
    start, end = owned_range(probs.shape[HEAD_DIM], rank, tp)
    probs = probs[:, start:end]
    if sequence_parallel:
        start, end = owned_range(residual.shape[SEQ_DIM], rank, tp)
        residual = residual[:, start:end]
    residual_generator = own if sequence_parallel else tracker.default
    return {
        "probs": probs * dropout_mask(probs.shape, p, own),
        "residual": residual * dropout_mask(residual.shape, p, residual_generator),
    }


def dropout_reference(
    tp: int, sequence_parallel: bool = False, p: float = 0.25, seed: int = 0
) -> dict[str, torch.Tensor]:
    """One process: the full tensors, each rank's part masked by the mask that rank's tracker
    draws; the default generator's mask once for an activation every rank holds whole."""
    probs, residual = dropout_inputs(seed)
    trackers = [RNGTracker(seed, r) for r in range(tp)]
    head_masks = [
        dropout_mask(
            probs[:, slice(*owned_range(probs.shape[HEAD_DIM], r, tp))].shape, p, t.tensor_parallel
        )
        for r, t in enumerate(trackers)
    ]
    if sequence_parallel:
        local = residual[:, : residual.shape[SEQ_DIM] // tp].shape
        residual_mask = torch.cat(
            [dropout_mask(local, p, t.tensor_parallel) for t in trackers], dim=SEQ_DIM
        )
    else:
        residual_mask = dropout_mask(residual.shape, p, trackers[0].default)
    return {
        "probs": probs * torch.cat(head_masks, dim=HEAD_DIM),
        "residual": residual * residual_mask,
    }
