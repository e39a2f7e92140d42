"""Lab 08 exercises: the 1F1B action list, the bubble formula, 1F1B's exposed link latency,
the micro-batch loss scaling, the bytes of the data-parallel gradient sync; and the bug
clinic's change.

The lab's bug clinic and tests/test_pp_dist.py import the clinic's change from here, so it
is written once; `p2p_clinic_change()` hands it over as a patch set under a name that does
not give it away before the clinic asks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.exercises import Exercise
from paralab.patches import Patches
from paralab.pp.costs import bubble_over_useful_time
from paralab.pp.executor import message_tag
from paralab.pp.schedules import Message

LAB = "08_pipeline_parallel"


# --------------------------------------------------------------------------- the bug clinic
def exchange_in_program_order(
    sends: Sequence[tuple[Message, torch.Tensor]],
    recvs: Sequence[tuple[Message, torch.Tensor]],
    microbatches: int,
) -> list[dist.Work]:
    """Each message as its own blocking call, in the order the program states them:
    the previous action's sends first, then this action's receives."""
    for m, t in sends:
        dist.send(t, m.peer, tag=message_tag(m, microbatches))
    for m, t in recvs:
        dist.recv(t, m.peer, tag=message_tag(m, microbatches))
    return []


def p2p_clinic_change() -> Patches:
    """The clinic's change to the executor, as a patch set for `run(..., patches=...)`."""
    return {"paralab.pp.executor": {"exchange": exchange_in_program_order}}


# --------------------------------------------------------------------------- the 1F1B list
def _as_rows(orders: list) -> list[torch.Tensor]:
    """Each rank's order as rows (kind: F=0 B=1 W=2, stage, micro-batch), so lists compare element-wise."""
    return [
        torch.tensor([["FBW".index(k), s, i] for k, s, i in order], dtype=torch.int64).reshape(
            -1, 3
        )
        for order in orders
    ]


def _order_cases(rank: int, world: int) -> list[tuple]:
    return [(2, 4), (4, 8), (4, 2)]


def _hidden_order_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [(3, 5), (3, 2), (draw.randint(2, 5), draw.randint(6, 9))]


def warmup_one_short(pp: int, microbatches: int) -> list:
    """Bug: warm-up of pp - r - 1 forwards, then backward first (the last rank's first B has no F)."""
    orders = []
    for r in range(pp):
        warmup = min(pp - r - 1, microbatches)
        order = [("F", r, i) for i in range(warmup)]
        for i in range(microbatches):
            order.append(("B", r, i))
            if warmup + i < microbatches:
                order.append(("F", r, warmup + i))
        orders.append(order)
    return orders


def same_warmup_everywhere(pp: int, microbatches: int) -> list:
    """Bug: every rank warms up with min(pp, m) forwards, as if each were the first stage."""
    orders = []
    for r in range(pp):
        warmup = min(pp, microbatches)
        order = [("F", r, i) for i in range(warmup)]
        for i in range(microbatches):
            order.append(("B", r, i))
            if warmup + i < microbatches:
                order.append(("F", r, warmup + i))
        orders.append(order)
    return orders


def all_forwards_first(pp: int, microbatches: int) -> list:
    """Bug: GPipe's order (every forward, then every backward)."""
    return [
        [("F", r, i) for i in range(microbatches)] + [("B", r, i) for i in range(microbatches)]
        for r in range(pp)
    ]


# --------------------------------------------------------------------------- the bubble formula
def _bubble_cases(rank: int, world: int) -> list[tuple]:
    return [("gpipe", 4, 8, 1), ("1f1b", 2, 4, 1), ("interleaved", 4, 8, 2), ("zbh1", 4, 8, 1)]


def _hidden_bubble_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [
        ("1f1b", 3, 5, 1),
        ("zbh1", 3, 5, 1),
        ("interleaved", 3, 6, 2),
        ("gpipe", draw.randint(2, 8), draw.randint(8, 16), 1),
    ]


def _as_number(value: float) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float64)


def bubble_without_chunks(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """Bug: interleaving and the split backward change nothing: (p-1)/(m+p-1) for all."""
    return (pp - 1) / (microbatches + pp - 1)


# --------------------------------------------------------------------------- the loss scaling
def _loss_case(seed: int, microbatches: int, shape: tuple[int, ...]) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*shape, dtype=torch.float64, generator=g),
        torch.randn(*shape, dtype=torch.float64, generator=g),
        microbatches,
    )


def _loss_cases(rank: int, world: int) -> list[tuple]:
    return [_loss_case(0, 4, (2, 3, 4)), _loss_case(1, 2, (2, 3, 4)), _loss_case(2, 8, (1, 3, 4))]


def _hidden_loss_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    shape = (draw.randint(1, 4), draw.randint(1, 5), draw.randint(2, 6))
    return [_loss_case(seed, 5, shape), _loss_case(seed + 1, draw.randint(2, 7), shape)]


def loss_not_scaled(output: torch.Tensor, target: torch.Tensor, microbatches: int) -> torch.Tensor:
    """Bug: each micro-batch's full mean; the accumulated gradient is m times too large."""
    return F.mse_loss(output, target)


def loss_summed(output: torch.Tensor, target: torch.Tensor, microbatches: int) -> torch.Tensor:
    """Bug: the squared errors summed over the micro-batch, then over m."""
    return F.mse_loss(output, target, reduction="sum") / microbatches


# --------------------------------------------------------------------------- the link under 1F1B
def _latency_cases(rank: int, world: int) -> list[tuple]:
    return [(4, 8, 0.25), (2, 4, 0.5), (3, 5, 1.0), (4, 32, 0.25)]


def _hidden_latency_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    pp = draw.randint(3, 8)
    return [(5, 7, 0.125), (pp, draw.randint(pp, 6 * pp), draw.choice([0.05, 0.25, 0.5, 2.0]))]


def latency_paid_once(pp: int, microbatches: int, latency: float) -> float:
    """Bug: every hop paid once, filling and draining, as under GPipe: 2(p-1)d."""
    return 2 * (pp - 1) * latency


def latency_at_the_steady_rate(pp: int, microbatches: int, latency: float) -> float:
    """Bug: only the steady state's 2(p-1)d/p per micro-batch, no warm-up or cool-down."""
    return 2 * (pp - 1) * latency * microbatches / pp


# --------------------------------------------------------------------------- the dp sync's bytes
def _sync_cases(rank: int, world: int) -> list[tuple]:
    return [([196], 2, 4, True), ([196], 2, 4, False), ([98, 98], 4, 8, True), ([49, 147], 3, 5)]


def _hidden_sync_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    dp, m = draw.randint(3, 8), draw.randint(2, 9)
    params = [draw.randint(10, 500) for _ in range(draw.randint(1, 3))]
    return [(params, dp, m, True), (params, dp, m, False), ([123, 77], 5, 3, False, 2)]


def sync_every_microbatch(
    stage_params: Sequence[int],
    dp: int,
    microbatches: int,
    deferred: bool = True,
    itemsize: int = 8,
) -> int:
    """Bug: one all-reduce per stage after every micro-batch, deferred or not."""
    return microbatches * sum(2 * (dp - 1) * n * itemsize // dp for n in stage_params)


def sync_without_the_ring(
    stage_params: Sequence[int],
    dp: int,
    microbatches: int,
    deferred: bool = True,
    itemsize: int = 8,
) -> int:
    """Bug: each all-reduce sends its gradients' bytes once, not 2(dp-1)/dp of them."""
    return (1 if deferred else microbatches) * sum(n * itemsize for n in stage_params)


EXERCISES = [
    Exercise(
        name="one_f_one_b_order",
        lab=LAB,
        target="paralab.pp.schedules.one_f_one_b_order",
        prompt=(
            "Return, for every rank r of a pp-rank pipeline (one stage per rank, stage r on rank r), "
            "the order in which it runs its forwards ('F', r, i) and backwards ('B', r, i) of the m "
            "micro-batches under 1F1B: warm-up, steady state one backward and one forward in turn, "
            "cool-down."
        ),
        hint="rank r warms up with min(pp - r, m) forwards; after that, backward i is followed by "
        "forward warmup + i while micro-batches remain",
        cases=_order_cases,
        hidden=_hidden_order_cases,
        points=2,
        minutes=15,
        normalize=_as_rows,
        bugs=[
            ("warm-up one forward short", warmup_one_short, "case 0"),
            ("every rank warms up like the first", same_warmup_everywhere, "case 0"),
            ("GPipe's order", all_forwards_first, "case 0"),
        ],
    ),
    Exercise(
        name="bubble_formula",
        lab=LAB,
        target="paralab.pp.costs.bubble_formula",
        prompt=(
            "Return the closed-form bubble fraction (idle rank-time over all rank-time) of `schedule` "
            "('gpipe', '1f1b', 'interleaved' with v stages per rank, 'zbh1' with B = W = F) for pp "
            "ranks and m micro-batches, m >= pp."
        ),
        hint="p - 1 idle slots of warm-up and cool-down against the work of one rank: m forward+backward "
        "units, v·m smaller ones when interleaved, 3m when B and W are split",
        cases=_bubble_cases,
        hidden=_hidden_bubble_cases,
        points=1,
        minutes=10,
        atol=1e-15,
        normalize=_as_number,
        bugs=[
            ("over the useful time only", bubble_over_useful_time, "case 0"),
            ("one formula for every schedule", bubble_without_chunks, "case 2"),
        ],
    ),
    Exercise(
        name="one_f_one_b_exposed_latency",
        lab=LAB,
        target="paralab.pp.costs.one_f_one_b_exposed_latency",
        prompt=(
            "Return how much a per-message latency d (in units of one rank's forward; F = 1, B = 2) "
            "lengthens a 1F1B step of pp ranks and m micro-batches on the lab's clock: the makespan "
            "with the link minus the makespan without. simulate('1f1b', pp, m, latency=d) measures it."
        ),
        hint="rank 0 holds at most p micro-batches, so each round trip of 2(p-1) hops is paid again "
        "every p micro-batches; measure simulate('1f1b', p, m, latency=1).makespan minus the free "
        "link's for m = p, p + 1, ... and find where the steps fall",
        cases=_latency_cases,
        hidden=_hidden_latency_cases,
        points=1,
        minutes=15,
        atol=1e-12,
        normalize=_as_number,
        bugs=[
            ("paid once, as under GPipe", latency_paid_once, "case 0"),
            ("the steady rate only", latency_at_the_steady_rate, "case 0"),
        ],
    ),
    Exercise(
        name="microbatch_loss",
        lab=LAB,
        target="paralab.pp.model.microbatch_loss",
        prompt=(
            "Return one micro-batch's share of the global-batch loss, for m micro-batches of equal size: "
            "summed over the m micro-batches it must give the mean squared error over the global batch."
        ),
        hint="the micro-batch's mean squared error, over m",
        cases=_loss_cases,
        hidden=_hidden_loss_cases,
        points=1,
        minutes=5,
        atol=1e-15,
        bugs=[
            ("not scaled by 1/m", loss_not_scaled, "case 0"),
            ("summed instead of averaged", loss_summed, "case 0"),
        ],
    ),
    Exercise(
        name="dp_sync_bytes",
        lab=LAB,
        target="paralab.pp.costs.dp_sync_bytes",
        prompt=(
            "Return the bytes one rank sends in one step to sum its stages' gradients over dp "
            "data-parallel replicas: per stage it owns (stage_params[k] parameters of itemsize "
            "bytes), one ring all-reduce of all its gradients flattened together, each call's "
            "bytes rounded down as the ledger counts them; once per step when deferred to the "
            "last micro-batch, after every micro-batch's backward when not."
        ),
        hint="a ring all-reduce of S bytes sends 2(dp-1)/dp·S from each rank (the ledger's "
        "2·(dp-1)·S // dp); deferred, one per stage a step; not deferred, m of them",
        cases=_sync_cases,
        hidden=_hidden_sync_cases,
        points=1,
        minutes=10,
        normalize=_as_number,
        bugs=[
            ("synced after every micro-batch", sync_every_microbatch, "case 0"),
            ("no ring factor", sync_without_the_ring, "case 2"),
        ],
    ),
]
