"""Install the training axes on a model, in Cosmos's order: CP, then AC, then compile, then FSDP.

Each step wraps or rewrites what the previous one left, so the order is part of
the algorithm: CP rewrites the attention dispatch and the input layout, AC then
checkpoints blocks that already contain the CP attention (and so re-runs its
collectives when it recomputes), compile traces that, and FSDP shards last,
around everything, so that its hooks gather parameters for the code that
actually runs.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from paralab.cp.ring import ring_attention
from paralab.cp.ulysses import ulysses_attention
from paralab.ledger import in_phase
from paralab.parallel_dims import ParallelDims, fsdp_mesh
from paralab.train.model import SequenceShard

ATTENTIONS = ("ring", "ulysses")
AC_MODES = ("none", "full", "selective")
COMPILE_BACKEND = "aot_eager"
"""AOTAutograd traces forward and backward graphs and runs them eagerly: no C++ compiler needed."""
ORDER = ("cp", "ac", "compile", "fsdp")


class CPAttention(nn.Module):
    """Lab 02's ring or Ulysses attention over the cp group, in place of `LocalAttention`."""

    def __init__(self, algorithm: str, group: dist.ProcessGroup, causal: bool) -> None:
        super().__init__()
        if algorithm not in ATTENTIONS:
            raise ValueError(f"apply_cp: attention = {algorithm!r}, expected one of {ATTENTIONS}")
        self.algorithm, self.group, self.causal = algorithm, group, causal

    @property
    def zigzag(self) -> bool:
        """The causal ring balances work with zigzag shards; Ulysses wants contiguous ones."""
        return self.algorithm == "ring" and self.causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.algorithm == "ring":
            return ring_attention(q, k, v, self.group, causal=self.causal, zigzag=self.zigzag)
        return ulysses_attention(q, k, v, self.group, causal=self.causal)


def blocks_of(model: nn.Module) -> nn.ModuleList:
    return model.blocks


def apply_cp(model: nn.Module, parallel_dims: ParallelDims, attention: str = "ring") -> nn.Module:
    """Swap every block's attention for ring/Ulysses over the cp group and shard the input sequence.

    Sets `block.attention` on each object that sits in `model.blocks`.
    """
    if not parallel_dims.cp_enabled:
        return model
    group = parallel_dims.cp_mesh.get_group()
    for block in blocks_of(model):
        block.attention = CPAttention(attention, group, model_is_causal(model))
    model.shard = SequenceShard(
        parallel_dims.cp_rank,
        parallel_dims.cp_size,
        zigzag=attention == "ring" and model_is_causal(model),
    )
    return model


def model_is_causal(model: nn.Module) -> bool:
    return any(getattr(m, "causal", False) for m in model.modules())


def _recompute_labelled() -> tuple[
    contextlib.AbstractContextManager, contextlib.AbstractContextManager
]:
    """`checkpoint`'s context_fn: nothing around the first forward, a ledger label around the recompute."""
    return contextlib.nullcontext(), in_phase("recompute")


def checkpointed(module: nn.Module, label_recompute: bool = True) -> nn.Module:
    """torch.utils.checkpoint (non-reentrant) around `module`, the wrapper torchtitan and Cosmos use.

    `label_recompute`: the ledger's recompute label as `context_fn`. Leave it off when
    Dynamo will trace the checkpoint: a traced checkpoint's context_fn must return two
    TorchDispatchModes, and the label is a plain context manager.
    """
    if not label_recompute:
        return checkpoint_wrapper(module, preserve_rng_state=False)
    return checkpoint_wrapper(module, preserve_rng_state=False, context_fn=_recompute_labelled)


def apply_ac(model: nn.Module, mode: str = "none", *, label_recompute: bool = True) -> nn.Module:
    """Activation checkpointing per block.

    full: checkpoint each whole block; its backward re-runs the block's forward,
      the CP attention and its collectives included.
    selective (a region split): checkpoint the two regions around the attention
      (norm + qkv projection; the MLP) and leave the attention outside, so its
      output is saved and the recompute sends nothing.

    label_recompute: see `checkpointed`.
    """
    if mode not in AC_MODES:
        raise ValueError(f"apply_ac: mode = {mode!r}, expected one of {AC_MODES}")
    blocks = blocks_of(model)
    for i, block in enumerate(blocks):
        if mode == "full":
            blocks[i] = checkpointed(block, label_recompute)
        elif mode == "selective":
            block.qkv = checkpointed(block.qkv, label_recompute)
            block.mlp = checkpointed(block.mlp, label_recompute)
    return model


def apply_compile(model: nn.Module, enabled: bool) -> nn.Module:
    """torch.compile each block (as torchtitan and Cosmos do), with the CPU-friendly `COMPILE_BACKEND`."""
    if enabled:
        blocks = blocks_of(model)
        for i, block in enumerate(blocks):
            blocks[i] = torch.compile(block, backend=COMPILE_BACKEND)
    return model


def shard_on(model: nn.Module, mesh: DeviceMesh | None) -> nn.Module:
    """FSDP2 `fully_shard` on every block, then on the root (embedding, positions, head)."""
    for block in blocks_of(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def apply_fsdp(model: nn.Module, parallel_dims: ParallelDims) -> nn.Module:
    """FSDP (HSDP when dp_replicate > 1) on `fsdp_mesh`: 1-D unless there really are replicas."""
    return shard_on(model, fsdp_mesh(parallel_dims))


def parallelize(
    model: nn.Module,
    parallel_dims: ParallelDims,
    *,
    attention: str = "ring",
    ac: str = "none",
    compile: bool = False,
) -> nn.Module:
    """apply_cp -> apply_ac -> apply_compile -> apply_fsdp, in the order `ORDER` names."""
    steps = {
        "cp": lambda: apply_cp(model, parallel_dims, attention),
        "ac": lambda: apply_ac(model, ac),
        "compile": lambda: apply_compile(model, compile),
        "fsdp": lambda: apply_fsdp(model, parallel_dims),
    }
    for step in ORDER:
        steps[step]()
    return model
