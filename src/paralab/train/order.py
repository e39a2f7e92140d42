"""The wrap order on real ranks: four cases that put one step where the engines do not.

Each case builds the lab's DiT with its four steps arranged one way, trains it, and
returns the parameters (or the error), what sits in `model.blocks[0]` from the outside
in, and how many graphs Dynamo compiled. The notebook checks every parameter against
one process, element by element.

- `swap_after_compile`: compile, one call (a warm-up), then `apply_cp` swaps
  `block.attention`. Dynamo guards module attributes (`guard_nn_modules`), so the
  next call recompiles with the CP attention: correct.
- `hooks_after_compile`: compile, one call, then CP installed as forward pre-hooks on
  each attention module (the way torchtitan's `_ContextParallel` installs it). Dynamo
  skips guards on hooks (`skip_nnmodule_hook_guards`): the traced graph never calls
  them, each rank attends over its own tokens only. Silently wrong.
- `hooks_before_compile`: the same hooks, installed before the first call: correct.
- `compile_inside_checkpoint`: CP, compile each block, then AC wraps the compiled block.
- `ac_before_cp`: AC wraps each block, then `apply_cp` sets `.attention` on the wrapper.
- `ac_then_compile`: the engines' order with both on: CP, AC, compile (the wrapper), FSDP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.utils import counters

from paralab.parallel_dims import ParallelDims
from paralab.train.model import SequenceShard, build_model
from paralab.train.parallelism import apply_ac, apply_compile, apply_cp, apply_fsdp, blocks_of
from paralab.train.runs import compile_report, dims_of, make_sample, sample_index, training_loop

CASES = (
    "swap_after_compile",
    "hooks_after_compile",
    "hooks_before_compile",
    "compile_inside_checkpoint",
    "ac_before_cp",
    "ac_then_compile",
)


class GatherTokens(torch.autograd.Function):
    """All-gather along the token dim (2) over the cp group; backward: sum the gradients, keep mine."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        mine = grad.chunk(dist.get_world_size(ctx.group), dim=2)[dist.get_rank(ctx.group)]
        return mine.contiguous(), None


def install_cp_hooks(model: nn.Module, parallel_dims: ParallelDims) -> nn.Module:
    """CP as hooks: a forward pre-hook on each attention gathers the cp group's keys and values.

    Each rank's queries then attend over the whole sequence (all-gather KV context
    parallelism, bidirectional only). The model code is untouched: only hooks and the
    `SequenceShard` change, as with torchtitan's `_ContextParallel` plan.
    """
    group = parallel_dims.cp_mesh.get_group()

    def gather_keys_and_values(module: nn.Module, args: tuple) -> tuple:
        q, k, v = args
        return q, GatherTokens.apply(k, group), GatherTokens.apply(v, group)

    for block in blocks_of(model):
        block.attention.register_forward_pre_hook(gather_keys_and_values)
    model.shard = SequenceShard(parallel_dims.cp_rank, parallel_dims.cp_size)
    return model


def warm_up(model: nn.Module, parallel_dims: ParallelDims) -> None:
    """One forward on this rank's tokens, its output dropped (a warm-up): Dynamo traces now.

    Same token shard, same grad mode as training, so no shape or global-state guard
    differs at the next call: only what Dynamo guards on the module itself can make it
    recompile.
    """
    model.shard = SequenceShard(parallel_dims.cp_rank, parallel_dims.cp_size)
    model(*make_sample(0, 0, 0)[:2])


def wrapper_chain(module: nn.Module) -> list[str]:
    """Class names from `module` inwards, through compile and checkpoint wrappers, to the block."""
    chain = [type(module).__name__]
    while True:
        inner = getattr(module, "_orig_mod", None) or getattr(
            module, "_checkpoint_wrapped_module", None
        )
        if inner is None:
            return chain
        module = inner
        chain.append(type(module).__name__)


def innermost(module: nn.Module) -> nn.Module:
    while hasattr(module, "_orig_mod") or hasattr(module, "_checkpoint_wrapped_module"):
        module = getattr(module, "_orig_mod", None) or module._checkpoint_wrapped_module
    return module


def build_case(case: str, pd: ParallelDims) -> nn.Module:
    """The DiT with its steps arranged as `case` says (FSDP last in every case)."""
    model = build_model()
    if case == "swap_after_compile":
        apply_compile(model, True)
        warm_up(model, pd)
        apply_cp(model, pd, "ring")
    elif case == "hooks_after_compile":
        apply_compile(model, True)
        warm_up(model, pd)
        install_cp_hooks(model, pd)
    elif case == "hooks_before_compile":
        install_cp_hooks(model, pd)
        apply_compile(model, True)
        warm_up(model, pd)
    elif case == "compile_inside_checkpoint":
        apply_cp(model, pd, "ring")
        apply_compile(model, True)
        apply_ac(model, "full")
    elif case == "ac_before_cp":
        apply_ac(model, "full")
        apply_cp(model, pd, "ring")
    elif case == "ac_then_compile":
        apply_cp(model, pd, "ring")
        apply_ac(model, "full")
        apply_compile(model, True)
    else:
        raise ValueError(f"case = {case!r}, expected one of {CASES}")
    return apply_fsdp(model, pd)


def order_case(dims: dict, case: str, *, steps: int = 1) -> dict:
    """Train `case` on this rank; params or the error's first line, the nesting, compiled graphs."""
    torch._dynamo.reset()
    counters.clear()  # graphs of this case only
    pd = dims_of(dims)
    model = build_case(case, pd)
    block = blocks_of(model)[0]
    attention = innermost(block).attention
    out = {
        "nesting": wrapper_chain(block),
        "attention": type(attention).__name__,
        "attention hooks": len(attention._forward_pre_hooks),
    }
    try:
        out["params"] = training_loop(
            model, sample_index(dist.get_rank(), pd), steps=steps, optimizer="sgd", seed=0
        )
        out["error"] = None
    except Exception as exc:  # the notebook shows what each arrangement does
        out["params"], out["error"] = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    out["graphs"] = compile_report()["graphs"]
    return out


def order_cases(dims: dict, cases: tuple[str, ...] = CASES, *, steps: int = 1) -> dict:
    """Every case in one launch: {case: `order_case(...)`}."""
    return {case: order_case(dims, case, steps=steps) for case in cases}
