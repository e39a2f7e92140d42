"""What the composition chapters (labs 05 and 06) say torch does, run on CPU.

labs/05_training_composition/02_activation_checkpointing.md and
labs/06_inference_pipeline/02_reshard_after_forward_for_inference.md cite these
tests by name: which forward ops a backward re-runs under no, full and
selective activation checkpointing (counted at the dispatcher, so an op that
selective checkpointing serves from its cache is not counted), and how many
all-gathers FSDP2 makes per forward with and without `reshard_after_forward`;
which variant `checkpoint()` runs when `use_reentrant` is not given, what the
engines' wrapper passes, and that a checkpoint Dynamo traces needs
TorchDispatchMode contexts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from paralab.launch import run
from paralab.ledger import Ledger
from paralab.train.parallelism import checkpointed

MATMULS = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that actually execute while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def save_matmuls(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    """A selective policy in torchtitan's spirit: keep matmul outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if func in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def block() -> nn.Module:
    """Linear -> GELU -> Linear: on a 2-D input each Linear is one aten.addmm."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).double()


def forward_ops_in_backward(way: str) -> dict[str, int]:
    """How many times the backward re-runs the block's forward ops (addmm, gelu)."""
    model, x = block(), torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    forwards = {
        "none": lambda: model(x),
        "full": lambda: checkpoint(model, x, use_reentrant=False),
        "full, early_stop=False": lambda: checkpoint(
            model, x, use_reentrant=False, early_stop=False
        ),
        "selective": lambda: checkpoint(
            model,
            x,
            use_reentrant=False,
            context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls),
        ),
    }
    out = forwards[way]()
    with OpCounter() as counter:
        out.sum().backward()
    return {op: counter.ops[op] for op in ("addmm", "gelu")}


@pytest.mark.parametrize(
    "way, recomputed",
    [
        ("none", {"addmm": 0, "gelu": 0}),
        # the second Linear's output is not needed by any backward formula: recompute stops before it
        ("full", {"addmm": 1, "gelu": 1}),
        # torchtitan passes early_stop=False: the whole block is re-run
        ("full, early_stop=False", {"addmm": 2, "gelu": 1}),
        # matmul outputs come from the cache, only the pointwise GELU runs again
        ("selective", {"addmm": 0, "gelu": 1}),
    ],
)
def test_what_the_backward_recomputes(way, recomputed):
    assert forward_ops_in_backward(way) == recomputed


def _collectives(model: nn.Module, x: torch.Tensor, *, train: bool) -> dict:
    with Ledger() as ledger:
        with ledger.phase("forward"):
            out = model(x)
        if train:
            with ledger.phase("backward"):
                out.sum().backward()
    return {f"{phase} {op}": tally.calls for (phase, op), tally in ledger.summary().items()}


def _fsdp_job() -> dict:
    """On each rank: FSDP2 all-gathers per inference forward (three forwards, each setting),
    and per training step with activation checkpointing wrapped inside or outside the FSDP unit."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = torch.randn(2, 8, dtype=torch.float64)
    result = {}
    for reshard in (True, False):
        model = nn.Sequential(*[block() for _ in range(3)])
        for layer in model:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        with torch.no_grad():
            result[f"reshard_after_forward={reshard}"] = [
                _collectives(model, torch.randn(2, 8, dtype=torch.float64), train=False)
                for _ in range(3)
            ]
    for order in ("no AC", "AC inside FSDP", "AC outside FSDP"):
        layers = [block() for _ in range(2)]
        for i, layer in enumerate(layers):
            if (
                order == "AC inside FSDP"
            ):  # torchtitan's and Cosmos's order: apply_ac, then apply_fsdp
                layers[i] = checkpoint_wrapper(layer)
                fully_shard(layers[i], mesh=mesh)
            else:
                fully_shard(layer, mesh=mesh)
                if order == "AC outside FSDP":
                    layers[i] = checkpoint_wrapper(layer)
        model = nn.Sequential(*layers)
        fully_shard(model, mesh=mesh)
        result[order] = _collectives(model, x, train=True)
    return result


@pytest.fixture(scope="module")
def fsdp_counts():
    return run(_fsdp_job, 2, timeout=120)


def test_reshard_after_forward_false_gathers_once_for_many_forwards(fsdp_counts):
    for rank_counts in fsdp_counts:
        assert rank_counts["reshard_after_forward=True"] == [{"forward all_gather_single": 3}] * 3
        assert rank_counts["reshard_after_forward=False"] == [
            {"forward all_gather_single": 3},
            {},
            {},
        ]


def test_activation_checkpointing_adds_no_collective(fsdp_counts):
    step = {
        "forward all_gather_single": 2,
        "backward all_gather_single": 2,
        "backward reduce_scatter_single": 2,
    }
    for rank_counts in fsdp_counts:
        assert (
            rank_counts["no AC"]
            == rank_counts["AC inside FSDP"]
            == rank_counts["AC outside FSDP"]
            == step
        )


def test_checkpoint_without_use_reentrant_is_reentrant():
    """torch 2.13: `checkpoint(fn, x)` with no `use_reentrant` warns and runs the reentrant variant."""
    model, x = block(), torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant"):
        implicit = checkpoint(model, x)
    explicit = checkpoint(model, x, use_reentrant=False)
    assert type(implicit.grad_fn).__name__ == "CheckpointFunctionBackward"
    assert type(explicit.grad_fn).__name__ != "CheckpointFunctionBackward"


def test_checkpoint_wrapper_is_non_reentrant_and_keeps_early_stop():
    """The wrapper both engines use defaults to NO_REENTRANT; without `early_stop` it keeps True."""
    wrapped = checkpointed(block())
    assert wrapped.checkpoint_fn.keywords["use_reentrant"] is False
    assert "early_stop" not in wrapped.checkpoint_fn.keywords
    assert inspect.signature(checkpoint).parameters["early_stop"].default is True


def test_a_traced_checkpoint_needs_dispatch_mode_contexts():
    """Compiling through a checkpoint whose context_fn returns plain context managers fails."""
    wrapped = checkpoint_wrapper(
        block(), context_fn=lambda: (contextlib.nullcontext(), contextlib.nullcontext())
    )
    compiled = torch.compile(wrapped, backend="aot_eager")
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(Exception, match="must generate a tuple of two `TorchDispatchMode`s"):
        compiled(x)
    torch._dynamo.reset()
