"""Lab 07 exercises: f and g's backwards, the splits, the vocab-parallel loss, the clipped norm; and their bugs.

The lab's bug clinic and tests/test_tp.py import the clinic's bug from here, so it is
written once; `tp_clinic_change()` hands it over as a patch set under a name that does
not give it away before the clinic asks.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from paralab.exercises import Exercise
from paralab.patches import Patches
from paralab.tp.layout import Split, owned_range
from paralab.tp.mappings import all_reduce_sum

LAB = "07_tensor_parallel"


def _draw(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- f and g
def _grad_cases(rank: int, world: int) -> list[tuple]:
    """A different gradient on every rank, (batch, seq, hidden), on the whole world."""
    return [(_draw(10 * rank + k, (2, 3, 4)), None) for k in range(2)]


def _hidden_grad_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    shape = (draw.randint(1, 3), draw.randint(1, 5), draw.randint(2, 7))
    return [(_draw(seed + 10 * rank + k, shape), None) for k in range(2)]


def keep_own_gradient(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug as f's backward: each rank keeps its own partial gradient (the all-reduce dropped)."""
    return grad


def average_gradients(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug as f's backward: the mean of the partial gradients, tp times too small."""
    return all_reduce_sum(grad, group) / dist.get_world_size(group)


def sum_gradients(grad: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug as g's backward: sums tp copies of one gradient (tp times too large in the model)."""
    return all_reduce_sum(grad, group)


def tp_clinic_change() -> Patches:
    """The bug clinic's change, for `run(..., patches=...)`."""
    return {"paralab.tp.mappings": {"f_backward": keep_own_gradient}}


# --------------------------------------------------------------------------- shard
def _shard_cases(rank: int, world: int) -> list[tuple]:
    """A column split, a fused q/k/v column split, a row split, at tp = 2, 4 and 3."""
    cases = []
    for tp in (2, 4, 3):
        for split, shape in ((Split(0), (12, 5)), (Split(0, 3), (36, 5)), (Split(1), (5, 12))):
            for r in range(tp):
                cases.append((_draw(tp, shape), split, r, tp))
    return cases


def _hidden_shard_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """At least 2 rows per shard: with 1, a strided cut takes the same rows as a contiguous one."""
    draw = random.Random(seed)
    cases = []
    for tp in (3, 6):
        per, other = draw.randint(2, 3), draw.randint(2, 5)
        for split, shape in (
            (Split(0), (tp * per, other)),
            (Split(0, 3), (3 * tp * per, other)),
            (Split(1), (other, tp * per)),
        ):
            cases.append((_draw(seed + tp, shape), split, draw.randrange(tp), tp))
    return cases


def shard_strided(full, split, rank, tp):
    """Bug: rank r takes every tp-th row (r, r+tp, ...) instead of a contiguous block."""
    if split is None:
        return full.clone()
    index = torch.arange(rank, full.shape[split.dim], tp)
    return full.index_select(split.dim, index)


def shard_ignoring_parts(full, split, rank, tp):
    """Bug: a fused q/k/v weight cut as one block, so rank 0 gets only q rows, the last only v rows."""
    if split is None:
        return full.clone()
    return full.chunk(tp, split.dim)[rank].clone()


# --------------------------------------------------------------------------- vocab_parallel_loss
def _loss_cases(rank: int, world: int) -> list[tuple]:
    """This rank's (N, V/tp) logit columns of a shared (N, V) matrix, and the targets."""
    cases = []
    for k, (n, v, scale) in enumerate(((6, 12, 1.0), (5, 24, 300.0))):
        full = scale * _draw(k, (n, v))
        target = torch.randint(0, full.shape[1], (n,), generator=torch.Generator().manual_seed(k))
        start, end = owned_range(full.shape[1], rank, world)
        cases.append((full[:, start:end].clone(), target, None))
    return cases


def _hidden_loss_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    n, per = draw.randint(2, 9), draw.randint(1, 5)
    full = draw.uniform(1, 50) * _draw(seed, (n, per * world))
    target = torch.randint(0, full.shape[1], (n,), generator=torch.Generator().manual_seed(seed))
    start, end = owned_range(full.shape[1], rank, world)
    return [(full[:, start:end].clone(), target, None)]


def _loss_and_lse(result: tuple) -> dict[str, torch.Tensor]:
    loss, lse = result
    return {"loss": loss, "lse": lse}


def _lse_from(shifted_sum: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return shifted_sum.log() + shift


def loss_with_local_max(logits, target, group):
    """Bug: each rank shifts by its own max, then sums exp over ranks as if all used one shift."""
    rank, tp = dist.get_rank(group), dist.get_world_size(group)
    start, end = owned_range(logits.shape[-1] * tp, rank, tp)
    shift = logits.max(dim=-1).values
    sum_exp = (logits - shift.unsqueeze(-1)).exp().sum(-1)
    dist.all_reduce(sum_exp, group=group)
    mine = (target >= start) & (target < end)
    local = torch.where(mine, target - start, torch.zeros_like(target))
    picked = (logits - shift.unsqueeze(-1)).gather(-1, local.unsqueeze(-1)).squeeze(-1)
    picked = torch.where(mine, picked, torch.zeros_like(picked))
    dist.all_reduce(picked, group=group)
    return sum_exp.log() - picked, _lse_from(sum_exp, shift)


def loss_target_not_masked(logits, target, group):
    """Bug: every rank adds the logit at the target's local index, owner or not."""
    shift = logits.max(dim=-1).values
    dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - shift.unsqueeze(-1)
    sum_exp = shifted.exp().sum(-1)
    dist.all_reduce(sum_exp, group=group)
    local = (target % logits.shape[-1]).unsqueeze(-1)
    picked = shifted.gather(-1, local).squeeze(-1)
    dist.all_reduce(picked, group=group)
    return sum_exp.log() - picked, _lse_from(sum_exp, shift)


# --------------------------------------------------------------------------- tp_grad_norm
def _norm_case(seed: int, rank: int, world: int, shapes, replicated, scale: float = 1.0) -> tuple:
    """This rank's pieces of gradients drawn from `seed`: a row shard of each sharded one
    (rows = a multiple of world), the whole of each replicated one."""
    pieces = []
    for k, (shape, whole) in enumerate(zip(shapes, replicated)):
        full = scale * _draw(seed + k, shape)
        if whole:
            pieces.append(full)
        else:
            start, end = owned_range(full.shape[0], rank, world)
            pieces.append(full[start:end].clone())
    return pieces, list(replicated), None


def _norm_cases(rank: int, world: int) -> list[tuple]:
    """Sharded and replicated gradients together; replicated only; a large scale."""
    return [
        _norm_case(
            0, rank, world, [(2 * world, 3), (4,), (world, 5), (3,)], [False, True, False, True]
        ),
        _norm_case(10, rank, world, [(6,), (2, 2)], [True, True]),
        _norm_case(20, rank, world, [(world, 2), (5,)], [False, True], scale=1e3),
    ]


def _hidden_norm_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    count = draw.randint(2, 6)
    replicated = [draw.random() < 0.5 for _ in range(count)]
    replicated[0], replicated[1] = False, True
    shapes = [
        (draw.randint(1, 4) * (1 if whole else world), draw.randint(1, 4)) for whole in replicated
    ]
    return [_norm_case(seed, rank, world, shapes, replicated, scale=draw.uniform(0.1, 10))]


def norm_counting_replicas(grads, replicated, group):
    """Bug: every rank adds the replicated gradients' squares, so each counts tp times."""
    square = sum(g.double().pow(2).sum() for g in grads)
    dist.all_reduce(square, group=group)
    return square.sqrt()


def norm_summing_rank_norms(grads, replicated, group):
    """Bug: each rank's own norm all-reduced, a sum of norms instead of a norm of the sum of squares."""
    first = dist.get_rank(group) == 0
    square = sum(
        g.double().pow(2).sum() for g, whole in zip(grads, replicated) if first or not whole
    )
    norm = torch.as_tensor(square, dtype=torch.float64).sqrt()
    dist.all_reduce(norm, group=group)
    return norm


EXERCISES = [
    Exercise(
        name="f_backward",
        lab=LAB,
        target="paralab.tp.mappings.f_backward",
        prompt=(
            "f stands in front of a column-parallel linear: identity forward. Every rank's column shard "
            "took the same input and hands back its own partial gradient of it, `grad`. Return the "
            "gradient of f's input, on every rank (`group=None`: the whole world)."
        ),
        hint="the input's gradient is the sum over every rank of the partial gradients",
        cases=_grad_cases,
        hidden=_hidden_grad_cases,
        world_sizes=(2, 4),
        hidden_world_sizes=(3,),
        points=1,
        minutes=5,
        bugs=[
            ("all-reduce dropped: a partial gradient (the clinic's)", keep_own_gradient, "world 2"),
            ("the mean instead of the sum", average_gradients, "world 2"),
        ],
    ),
    Exercise(
        name="g_backward",
        lab=LAB,
        target="paralab.tp.mappings.g_backward",
        prompt=(
            "g stands behind a row-parallel linear: its forward all-reduces the ranks' partial sums, so "
            "every rank holds the full output. `grad` is the gradient arriving at g's output on this rank. "
            "Return the gradient of g's input on this rank."
        ),
        hint="every rank's partial sum entered the total once: its gradient is the total's gradient",
        cases=_grad_cases,
        hidden=_hidden_grad_cases,
        world_sizes=(2, 4),
        hidden_world_sizes=(3,),
        points=1,
        minutes=5,
        bugs=[("an all-reduce in the backward too", sum_gradients, "world 2")],
    ),
    Exercise(
        name="shard",
        lab=LAB,
        target="paralab.tp.layout.shard",
        prompt=(
            "Cut rank `rank`'s piece out of a full weight for tp ranks: `split.dim` 0 for a column-parallel "
            "weight (out, in), 1 for a row-parallel one; a fused weight of `split.parts` equal blocks (q, k, "
            "v) is cut in each block, so a rank holds the q, k and v of the same heads. `split=None`: a copy."
        ),
        hint="chunk the dim into `parts` blocks, take chunk `rank` of `tp` from each, concatenate them",
        cases=_shard_cases,
        hidden=_hidden_shard_cases,
        points=2,
        minutes=10,
        bugs=[
            ("rows taken strided, not contiguous", shard_strided, "case 0:"),
            ("a fused q/k/v weight cut as one block", shard_ignoring_parts, "case 2:"),
        ],
    ),
    Exercise(
        name="vocab_parallel_loss",
        lab=LAB,
        target="paralab.tp.cross_entropy.vocab_parallel_loss",
        prompt=(
            "Rank r holds logit columns [r·V/tp, (r+1)·V/tp) of every position, `(N, V/tp)`, and the global "
            "targets `(N,)`. Return `(loss, lse)`, each `(N,)` and the same on every rank: the cross-entropy "
            "`lse - z_target` and the log-sum-exp over the whole vocabulary, with all-reduces of one number "
            "per position only (never gather the logits). It must stay finite for logits near 1e3."
        ),
        hint="three all-reduces: the max (for a stable exp), the sum of exp(z - max), the target's logit "
        "(only its owner contributes)",
        cases=_loss_cases,
        hidden=_hidden_loss_cases,
        world_sizes=(2, 4),
        hidden_world_sizes=(3,),
        points=3,
        minutes=20,
        atol=1e-12,
        rtol=1e-12,
        normalize=_loss_and_lse,
        bugs=[
            ("each rank shifts by its own max", loss_with_local_max, "case 1"),
            ("the target logit taken on every rank", loss_target_not_masked, "case 0"),
        ],
    ),
    Exercise(
        name="tp_grad_norm",
        lab=LAB,
        target="paralab.tp.clip.tp_grad_norm",
        prompt=(
            "Gradient clipping needs the L2 norm of the whole model's gradient, as one vector. `grads[i]` "
            "is this rank's piece of gradient i: a shard of it, or, when `replicated[i]`, the whole of it "
            "(every rank holds the same one). Return the norm, a float64 0-d tensor, the same on every "
            "rank of `group` (`None`: the whole world), with one all-reduce."
        ),
        hint="sum squares, not norms; a gradient every rank holds must enter the sum once (Megatron: "
        "only tp rank 0 counts it)",
        cases=_norm_cases,
        hidden=_hidden_norm_cases,
        world_sizes=(2, 4),
        hidden_world_sizes=(3,),
        points=2,
        minutes=10,
        atol=0.0,
        rtol=1e-12,
        bugs=[
            ("replicated gradients counted on every rank", norm_counting_replicas, "case 0"),
            ("the ranks' norms summed", norm_summing_rank_norms, "case 0"),
        ],
    ),
]
