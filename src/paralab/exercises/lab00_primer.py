"""Collectives primer exercises: every collective's backward written with plain collectives, and
the ring reduce-scatter by hand; and the known-wrong versions they must catch."""

from __future__ import annotations

import functools
import random

import torch
import torch.distributed as dist

from paralab.collectives.ring import _exchange
from paralab.collectives.runs import OPS, mirror, upstream_grad
from paralab.exercises import Exercise

LAB = "00_collectives_primer"


# --------------------------------------------------------------------------- mirror
def _mirror_cases(rank: int, world: int) -> list[tuple]:
    """The lab's upstream gradients (element c of rank r is 10 r + c), one case per collective."""
    return [(op, upstream_grad(op, rank, world), world) for op in OPS]


def _hidden_mirror_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Random gradients with 2 to 4 elements per slot, drawn from the seed, one case per collective."""
    per_slot = random.Random(seed).randint(2, 4)
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return [
        (
            op,
            torch.randn(per_slot * (1 if op == "reduce_scatter" else world), generator=g).double(),
            world,
        )
        for op in OPS
    ]


def mirror_own_slot_only(op: str, grad_out: torch.Tensor, n: int) -> torch.Tensor:
    """Bug: the all-gather's backward keeps this rank's own slot of the gradient, not the sum of
    that slot over every rank's gradient (one copy's gradient instead of all of them)."""
    if op == "all_gather":
        return grad_out.chunk(n)[dist.get_rank()].clone()
    return mirror(op, grad_out, n)


def mirror_send_forward(op: str, grad_out: torch.Tensor, n: int) -> torch.Tensor:
    """Bug: a send's gradient goes on round the ring (to rank+1) instead of back (to rank-1)."""
    if op != "send_recv":
        return mirror(op, grad_out, n)
    rank, grad_in = dist.get_rank(), torch.empty_like(grad_out)
    for work in dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, grad_out, (rank + 1) % n),
            dist.P2POp(dist.irecv, grad_in, (rank - 1) % n),
        ]
    ):
        work.wait()
    return grad_in


def mirror_broadcast_all_reduced(op: str, grad_out: torch.Tensor, n: int) -> torch.Tensor:
    """Bug: the broadcast's backward all-reduces, so every rank's unused input gets the root's gradient."""
    if op != "broadcast":
        return mirror(op, grad_out, n)
    grad_in = grad_out.clone()
    dist.all_reduce(grad_in)
    return grad_in


# --------------------------------------------------------------------------- ring_reduce_scatter
@functools.cache
def _pairs(world: int) -> dist.ProcessGroup | None:
    """At 4 ranks, this rank's group of the pairs {0,1} and {2,3}; built once per rank process.
    Every rank creates both groups, in the same order, as `new_group` requires."""
    if world != 4:
        return None
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return groups[dist.get_rank() // 2]


def _full(seed: int, shape: tuple[int, ...], integers: bool) -> torch.Tensor:
    if integers:  # the lab's numbers: element c of rank r is 100 r + c, exact sums
        return torch.arange(shape[0], dtype=torch.float64) + 100 * seed
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _ring_cases(rank: int, world: int) -> list[tuple]:
    """The world's ring on 3 elements per chunk (integers, then random), and at 4 ranks the ring
    of each pair of ranks."""
    cases = [(_full(rank, (3 * world,), True), None), (_full(rank, (3 * world, 2), False), None)]
    pair = _pairs(world)
    if pair is not None:
        cases.append((_full(10 + rank, (3 * 2, 2), False), pair))
    return cases


def _ring_kinds(world: int) -> list[str]:
    return [
        f"the whole world (group=None) of {world}, 3 integers per chunk",
        f"the whole world (group=None) of {world}, chunks of shape (3, 2)",
    ] + (
        ["the {0,1} and {2,3} groups inside 4 ranks, chunks of shape (3, 2)"] if world == 4 else []
    )


def _hidden_ring_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Chunks of another shape, drawn from the seed, on the world and (at 4 ranks) on the pairs."""
    draw = random.Random(seed)
    rows, cols = draw.randint(2, 4), draw.randint(1, 3)
    cases = [(_full(seed * 100 + rank, (rows * world, cols), False), None)]
    pair = _pairs(world)
    if pair is not None:
        cases.append((_full(seed * 100 + 50 + rank, (rows * 2, cols), False), pair))
    return cases


def _hidden_ring_kinds(world: int) -> list[str]:
    return [f"the whole world of {world}, chunks of another shape"] + (
        ["the {0,1} and {2,3} groups inside 4 ranks, chunks of another shape"] if world == 4 else []
    )


def ring_starts_from_own_chunk(x: torch.Tensor, group=None) -> torch.Tensor:
    """Bug: each rank starts by sending its own chunk, so it ends owning the next rank's sum."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = x.chunk(n)
    partial = chunks[rank].clone()
    for step in range(1, n):
        partial = _exchange(partial, group) + chunks[(rank - step) % n]
    return partial


def ring_one_step_short(x: torch.Tensor, group=None) -> torch.Tensor:
    """Bug: n-2 steps instead of n-1: the chunk a rank ends with misses one rank's share."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = x.chunk(n)
    partial = chunks[(rank - 1) % n].clone()
    for step in range(1, n - 1):
        partial = _exchange(partial, group) + chunks[(rank - step - 1) % n]
    return partial


def ring_turned_backwards(x: torch.Tensor, group=None) -> torch.Tensor:
    """Bug: the partial sums travel to rank-1 while the chunk indices assume rank+1."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = x.chunk(n)
    partial = chunks[(rank - 1) % n].clone()
    for step in range(1, n):
        partial = _exchange(partial, group, step=-1) + chunks[(rank - step - 1) % n]
    return partial


EXERCISES = [
    Exercise(
        name="mirror",
        lab=LAB,
        target="paralab.collectives.runs.mirror",
        prompt=(
            "Write every collective's backward with plain collectives. `grad_out` is the gradient "
            "of this rank's output of `op` (one of `OPS`, called as `apply_collective` calls it on "
            "`n` ranks); return the gradient of this rank's input. A collective only copies and "
            "adds numbers, so its backward is the collective whose matrix is the transpose "
            "(the table above the cell). The check runs all six on 2 and 4 ranks."
        ),
        hint="return the gradient of this rank's input of op, shaped like that input, computed "
        "from every rank's grad_out with the collective that is op's transpose",
        cases=_mirror_cases,
        kinds=lambda world: [f"the backward of {op}" for op in OPS],
        hidden=_hidden_mirror_cases,
        hidden_kinds=lambda world: [f"the backward of {op}, random gradients" for op in OPS],
        hidden_world_sizes=(3, 4),
        world_sizes=(2, 4),
        points=2,
        minutes=20,
        bugs=[
            (
                "the all-gather's backward keeps its own slot, unsummed",
                mirror_own_slot_only,
                "world 2, rank 0, case 0:",
            ),
            (
                "the gradient of a send goes on to rank+1 (invisible on 2 ranks)",
                mirror_send_forward,
                "world 4, rank 0, case 5:",
            ),
            (
                "the broadcast's backward all-reduces: unused inputs get a gradient",
                mirror_broadcast_all_reduced,
                "world 2, rank 1, case 4:",
            ),
        ],
    ),
    Exercise(
        name="ring_reduce_scatter",
        lab=LAB,
        target="paralab.collectives.ring.ring_reduce_scatter",
        prompt=(
            "The ring reduce-scatter by hand. Every rank of `group` (`None`: the world) holds `x`, "
            "`n` chunks along dim 0; return chunk `rank` of the sum of every rank's `x`. Use only "
            "`_exchange(t, group)`, which sends `t` to the next rank of the ring and returns what "
            "the previous one sent: `n - 1` steps, one chunk per step, each rank adding its own "
            "share of the chunk that arrives. The check runs on 2 and 4 ranks and on pairs of ranks "
            "inside 4."
        ),
        hint="return chunk rank (along dim 0) of the sum over the group of every rank's x, reached "
        "in n-1 ring steps through _exchange, each sending one chunk of S/n",
        cases=_ring_cases,
        kinds=_ring_kinds,
        hidden=_hidden_ring_cases,
        hidden_kinds=_hidden_ring_kinds,
        hidden_world_sizes=(3, 4),
        world_sizes=(2, 4),
        points=2,
        minutes=15,
        bugs=[
            (
                "starts from its own chunk: ends with the next rank's sum",
                ring_starts_from_own_chunk,
                "world 2, rank 0, case 0:",
            ),
            (
                "one step short: a rank's share missing",
                ring_one_step_short,
                "world 2, rank 0, case 0:",
            ),
            (
                "the ring turns the other way (invisible on 2 ranks)",
                ring_turned_backwards,
                "world 4, rank 0, case 0:",
            ),
        ],
    ),
]
