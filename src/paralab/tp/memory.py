"""Activation memory per rank: the bytes autograd saves for the backward, measured and in closed form.

`SavedBytes` counts, through saved-tensor hooks, every distinct storage autograd keeps
for the backward during a forward, parameters excluded (they are held anyway). Views
of one storage count once: the output projection's input is a view of attention's
output (the CPU kernel lays it out (b, s, heads, d)), so it costs nothing more.

The closed form of one block of this package (float64, b sequences, s tokens, hidden h,
ffn f, a heads of d, tp ranks; s_l = s/tp under SP, s otherwise), in elements:

| saved by | what | elements |
|---|---|---|
| each norm (2) | input, mean, 1/std | b·s_l·h + 2·b·s_l |
| q/k/v linear | its input, the norm output (under SP its shard) | b·s_l·h |
| attention | q/k/v (one storage), output, log-sum-exp | 3·b·s·h/tp + b·s·h/tp + b·(a/tp)·s |
| MLP up | its input, the norm output (under SP its shard) | b·s_l·h |
| GELU, MLP down | GELU's input, down's input | 2·b·s·f/tp |

What SP divides by tp here: the norms (their inputs and statistics), the regions that
hold s/tp tokens, and the inputs of the two column linears, which save only this rank's
shard and all-gather it again in the backward (`layers.SequenceParallelColumnLinear`, as
Megatron does; one more all-gather per column linear). Everything else TP already divides,
so under SP a rank saves exactly 1/tp of one process, Korthikanti et al.'s accounting.

torch's DTensor SP (`dtensor.block_plan`, torchtitan's plan) divides the norms alike but
not the column inputs: `ColwiseParallel(input_layouts=Shard(1))` all-gathers in its input
hook, before the linear runs, so autograd keeps the gathered b·s·h for the weight gradient
(`dtensor.dtensor_memory_job` measures it). It needs no re-gather in the backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

from paralab.tp.costs import ITEMSIZE
from paralab.tp.model import LMConfig


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's tensor: a DTensor's local shard (autograd saves DTensors under torch's TP)."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


class SavedBytes:
    """Inside `with SavedBytes(params) as saved:`, `saved.bytes` grows by each new storage saved."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.excluded = {_local(p).untyped_storage().data_ptr() for p in params}
        self.seen: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        if storage.data_ptr() not in self.excluded:
            self.seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    @contextlib.contextmanager
    def recording(self) -> Iterator["SavedBytes"]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


def block_saved_bytes(
    config: LMConfig, tp: int, sequence_parallel: bool, *, saves_gathered_input: bool = False
) -> dict[str, int]:
    """The closed form above, per part of one block, in bytes.

    `saves_gathered_input`: each column linear keeps its all-gathered input (b·s·h), as
    torch's `ColwiseParallel(input_layouts=Shard(1))` does, gathering in its input hook
    outside the linear; Megatron's SP linear keeps its shard (b·s·h/tp) and gathers again."""
    b, s, h, f = config.batch, config.seq, config.hidden, config.ffn
    s_local = s // tp if sequence_parallel else s
    s_column = s if saves_gathered_input else s_local
    parts = {
        "norms": 2 * (b * s_local * h + 2 * b * s_local),
        "column inputs": 2 * b * s_column * h,
        "attention": 4 * b * s * h // tp + b * (config.heads // tp) * s,
        "MLP hidden": 2 * b * s * f // tp,
    }
    return {k: v * ITEMSIZE for k, v in parts.items()}
