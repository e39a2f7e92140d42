"""Hand-written FSDP (ZeRO-3) and HSDP over real process groups, with DDP for contrast.

Every FSDP unit (one block of the model) is flattened into one vector, padded to
a multiple of the shard-group size N, and each rank keeps only its contiguous
1/N slice, the shard. A unit's life in one training step:

    forward : all-gather the shards -> full parameters -> run the unit -> free them
    backward: all-gather again -> the unit's gradients -> reduce-scatter (mean) -> free
    HSDP    : the reduced gradient shard is then averaged across the replica group
    step    : the optimizer updates the shard only (its state is 1/N too)

`reshard_after_forward=False` keeps the gathered parameters from forward to
backward (ZeRO-2-like): one all-gather less per unit, more memory held.

The unit's forward and backward live in one `torch.autograd.Function`, so the
collectives run in a fixed order on every rank: all-gathers in unit order
during forward, then per unit in reverse order all-gather, reduce-scatter,
all-reduce during backward. "Free" releases the storage of the gathered
tensor while autograd keeps the tensor object; the backward gather refills
that same storage (FSDP2 does the same with `untyped_storage().resize_`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call


# ---------------------------------------------------------------- one unit's shard
def padded_size(numel: int, n: int) -> int:
    """Smallest multiple of `n` that holds `numel`: all-gather needs equal shards on every rank."""
    return -(-numel // n) * n


def flat_shard(module: nn.Module, n: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s 1/n slice of the module's flattened, zero-padded parameters (a copy)."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    padded = torch.nn.functional.pad(flat, (0, padded_size(flat.numel(), n) - flat.numel()))
    size = padded.numel() // n
    return padded[rank * size : (rank + 1) * size].clone()


@dataclass
class FlatUnit:
    """One FSDP unit as one rank holds it: the layout of its parameters and its shard."""

    module: nn.Module  # structure only (on the meta device); its numbers come from `full`
    names: list[str]
    shapes: list[torch.Size]
    numel: int  # real parameters, without padding
    shard: nn.Parameter  # this rank's slice; autograd accumulates the reduced gradient in .grad
    full: torch.Tensor | None = None  # the gathered flat parameters (storage is empty when freed)


def shard_unit(module: nn.Module, group: dist.ProcessGroup | None) -> FlatUnit:
    """Keep this rank's shard of `module` and drop the module's own full parameters."""
    n, rank = _size_and_rank(group)
    names, params = zip(*module.named_parameters())
    unit = FlatUnit(
        module=module,
        names=list(names),
        shapes=[p.shape for p in params],
        numel=sum(p.numel() for p in params),
        shard=nn.Parameter(flat_shard(module, n, rank)),
    )
    module.to("meta")
    return unit


def unflatten(unit: FlatUnit, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Name -> view into the flat parameters (views, so gradients land in `flat`)."""
    views, offset = {}, 0
    for name, shape in zip(unit.names, unit.shapes):
        size = shape.numel()
        views[name] = flat[offset : offset + size].view(shape)
        offset += size
    return views


def _size_and_rank(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


# ---------------------------------------------------------------- the collectives
def gather_unit_params(unit: FlatUnit, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather every rank's shard into the unit's full flat parameters (padding at the end).

    The first gather allocates `unit.full`; later ones refill its freed storage,
    keeping its autograd version counter, because the graph saved views of it.
    """
    ### BEGIN SOLUTION
    n, _ = _size_and_rank(group)
    padded = unit.shard.numel() * n
    if unit.full is None:
        unit.full = torch.empty(padded, dtype=unit.shard.dtype, device=unit.shard.device)
    else:
        unit.full.untyped_storage().resize_(padded * unit.full.element_size())
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(unit.full):
        if n == 1:
            unit.full.copy_(unit.shard)
        else:
            dist.all_gather_into_tensor(unit.full, unit.shard.detach(), group=group)
    ### END SOLUTION
    return unit.full


def free_unit_params(unit: FlatUnit) -> None:
    """Release the gathered parameters' memory; only the shard stays."""
    unit.full.untyped_storage().resize_(0)


def gradient_divide_factors(
    shard_group: dist.ProcessGroup | None, replicate_group: dist.ProcessGroup | None
) -> tuple[int, int]:
    """What the reduce-scatter's sum and the replica all-reduce's sum are each divided by: their own
    group's size, so each step is a mean and the mean of equal-sized means is the mean over every
    data-parallel rank. The decision FSDP2 makes in `_get_gradient_divide_factors`."""
    return _size_and_rank(shard_group)[0], _size_and_rank(replicate_group)[0]


def reduce_scatter_grads(
    full_grad: torch.Tensor,
    shard_group: dist.ProcessGroup | None,
    replicate_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """This rank's shard of the unit's gradient, averaged over every data-parallel rank.

    Reduce-scatter (mean) inside the shard group: each rank receives the slice of
    its own shard. HSDP then averages that slice across the replicas holding the
    same shard (all-reduce, mean). Mean of equal-sized means = the global mean.
    """
    ### BEGIN SOLUTION
    n, _ = _size_and_rank(shard_group)
    by_shards, by_replicas = gradient_divide_factors(shard_group, replicate_group)
    if n == 1:
        shard_grad = full_grad.clone()
    else:
        shard_grad = torch.empty(
            full_grad.numel() // n, dtype=full_grad.dtype, device=full_grad.device
        )
        dist.reduce_scatter_tensor(shard_grad, full_grad, op=dist.ReduceOp.SUM, group=shard_group)
    shard_grad.div_(by_shards)
    replicas, _ = _size_and_rank(replicate_group)
    if replicas > 1:
        dist.all_reduce(shard_grad, op=dist.ReduceOp.SUM, group=replicate_group)
        shard_grad.div_(by_replicas)
    ### END SOLUTION
    return shard_grad


# ---------------------------------------------------------------- forward and backward of a unit
class ShardedUnitFunction(torch.autograd.Function):
    """y = unit(x) with the unit's parameters gathered only while they are needed.

    `shard` is an input only so that autograd hands the gradient returned for it
    (the reduced gradient shard) to `shard.grad`; the numbers come from the gather.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, shard: torch.Tensor, unit: FlatUnit, engine: "HandFSDP"
    ) -> torch.Tensor:
        full = gather_unit_params(unit, engine.shard_group)
        engine.note_memory()
        with torch.enable_grad():
            params = full.detach().requires_grad_()
            x_in = x.detach().requires_grad_(ctx.needs_input_grad[0])
            y = functional_call(unit.module, unflatten(unit, params), (x_in,))
        ctx.unit, ctx.engine, ctx.graph = unit, engine, (x_in, params, y)
        if engine.reshard_after_forward:
            free_unit_params(unit)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple:
        unit, engine = ctx.unit, ctx.engine
        x_in, params, y = ctx.graph
        if engine.reshard_after_forward:
            gather_unit_params(unit, engine.shard_group)
            engine.note_memory()
        inputs = (x_in, params) if x_in.requires_grad else (params,)
        grads = torch.autograd.grad(y, inputs, grad_y)
        free_unit_params(unit)
        ctx.graph = None
        shard_grad = reduce_scatter_grads(grads[-1], engine.shard_group, engine.replicate_group)
        grad_x = grads[0] if x_in.requires_grad else None
        return grad_x, shard_grad, None, None


@dataclass
class HandFSDP:
    """ZeRO-3 (or HSDP, or ZeRO-2-like) over a model whose forward is its units run in order."""

    units: list[FlatUnit]
    shard_group: dist.ProcessGroup | None
    replicate_group: dist.ProcessGroup | None = None
    reshard_after_forward: bool = True
    peak_gathered_bytes: int = 0

    @classmethod
    def wrap(
        cls,
        modules: list[nn.Module],
        shard_group: dist.ProcessGroup | None,
        replicate_group: dist.ProcessGroup | None = None,
        reshard_after_forward: bool = True,
    ) -> "HandFSDP":
        """Shard each module (an FSDP unit) over `shard_group`; replicate over `replicate_group`."""
        units = [shard_unit(m, shard_group) for m in modules]
        return cls(units, shard_group, replicate_group, reshard_after_forward)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = ShardedUnitFunction.apply(x, unit.shard, unit, self)
        return x

    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units]

    def gathered_bytes(self) -> int:
        """Bytes of full parameters alive right now, read from the real storages."""
        return sum(u.full.untyped_storage().nbytes() for u in self.units if u.full is not None)

    def note_memory(self) -> None:
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes())


# ---------------------------------------------------------------- DDP, for contrast
def all_reduce_gradients(modules: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    """DDP: average each unit's gradients over all ranks as one flat bucket."""
    n, _ = _size_and_rank(group)
    for module in modules:
        grads = [p.grad for p in module.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if n > 1:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            flat.div_(n)
        for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))


# ---------------------------------------------------------------- the sharded optimizer
def sgd_momentum_step(
    param: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, momentum: float
) -> None:
    """torch.optim.SGD(momentum=m) on one tensor: buf = m*buf + g; p -= lr*buf."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = grad.detach().clone()
    else:
        state["momentum_buffer"].mul_(momentum).add_(grad)
    param.add_(state["momentum_buffer"], alpha=-lr)


def adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """torch.optim.Adam on one tensor, the same operations in the same order."""
    if "exp_avg" not in state:
        state.update(step=0, exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
    beta1, beta2 = betas
    state["step"] += 1
    step = float(state["step"])
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (state["exp_avg_sq"].sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-step_size)


class ShardOptimizer:
    """SGD with momentum or Adam, elementwise, on whatever tensors it is handed.

    FSDP hands it the shards, so its state is 1/N of the model; DDP hands it the
    full parameters. Elementwise means a shard's update equals the same slice of
    the full update: the sharded step needs no communication.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        kind: str = "adam",
        lr: float = 0.05,
        momentum: float = 0.9,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if kind not in ("sgd", "adam"):
            raise ValueError(f"optimizer kind must be 'sgd' or 'adam', got kind={kind!r}")
        self.params, self.kind, self.lr = list(params), kind, lr
        self.momentum, self.betas, self.eps = momentum, betas, eps
        self.state: list[dict] = [{} for _ in self.params]

    @torch.no_grad()
    def step(self) -> None:
        for p, state in zip(self.params, self.state):
            if self.kind == "sgd":
                sgd_momentum_step(p, p.grad, state, self.lr, self.momentum)
            else:
                adam_step(p, p.grad, state, self.lr, self.betas, self.eps)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state held, read from the real tensors."""
        return sum(t.nbytes for s in self.state for t in s.values() if isinstance(t, torch.Tensor))
