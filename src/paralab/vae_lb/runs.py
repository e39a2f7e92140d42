"""Lab 04's experiments: the per-rank job, the plan every group should make, and the checks of a run.

Single process: the planner against the baselines (`compare_strategies`,
`mean_over_random_batches`) and a plan as a table (`moves_table`).

On ranks: `lb_worker` runs `offload_encode` for several lb sizes in one launch
and reports the latents, a fingerprint of every video the rank encoded (to see
*where* compute ran), its ledger and the plan it computed. It calls
`protocol.offload_encode`, looked up when it runs, so `run(..., patches=
{"paralab.vae_lb.protocol": {"offload_encode": f}})` hands the ranks another one.
The notebook and the tests check those reports with `run_checks` against what
one process computes here: the latents, the plan and the bytes of
`costs.exchange_bytes`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable

import torch
import torch.distributed as dist

from paralab.check import Verdict, compare
from paralab.ledger import Ledger, received, sent
from paralab.models import TinyVideoEncoder, random_video_shapes
from paralab.parallel_dims import ParallelDims
from paralab.tables import text_table
from paralab.vae_lb import protocol
from paralab.vae_lb.costs import encode_cost, exchange_bytes
from paralab.vae_lb.planner import (
    Move,
    assign_lpt,
    assign_round_robin_by_size,
    assignment_from_moves,
    loads_of,
    plan_rebalance,
)

Costs = list[list[float]]  # per global rank, the cost of each of its videos


# ------------------------------------------------------------------ the planner against the baselines, one process
def spread(loads: dict[int, float]) -> float:
    """Largest minus smallest load."""
    return max(loads.values()) - min(loads.values())


def makespan_bound(costs: dict[int, list[float]]) -> float:
    """No schedule ends before max(total / ranks, largest video)."""
    total = sum(sum(c) for c in costs.values())
    return max(total / len(costs), max((max(c) for c in costs.values() if c), default=0.0))


def compare_strategies(costs: dict[int, list[float]]) -> dict[str, tuple[float, float, int, float]]:
    """Per strategy: makespan, spread, videos moved, bytes moved (raw video there + latent back, 3THW + THW)."""
    strategies = {
        "no balancing": assignment_from_moves(costs, []),
        "greedy closest-fit": assignment_from_moves(costs, plan_rebalance(costs)),
        "round-robin by size": assign_round_robin_by_size(costs),
        "LPT": assign_lpt(costs),
    }
    rows = {}
    for name, where in strategies.items():
        moved = [s for s, r in where.items() if r != s[0]]
        loads = loads_of(costs, where)
        rows[name] = (
            max(loads.values()),
            spread(loads),
            len(moved),
            sum(4 * costs[o][i] for o, i in moved),
        )
    return rows


def random_costs(seed: int, lb: int = 8) -> dict[int, list[float]]:
    """T*H*W of 0 to 6 random videos per rank of an lb group (the lab's batch shapes), reproducible from `seed`."""
    rng = random.Random(seed)
    return {
        r: [
            float(math.prod(s[1:]))
            for s in random_video_shapes(rng.randint(0, 6), seed=1000 * seed + r)
        ]
        for r in range(lb)
    }


def mean_over_random_batches(seeds: range) -> dict[str, tuple[float, float]]:
    """Per strategy, over the random batches with any work: mean makespan / bound and mean videos moved."""
    sums: dict[str, list[float]] = {}
    for seed in seeds:
        costs = random_costs(seed)
        if not any(any(c) for c in costs.values()):
            continue
        bound = makespan_bound(costs)
        for name, (makespan, _, moved, _) in compare_strategies(costs).items():
            ratio, moves, count = sums.setdefault(name, [0.0, 0.0, 0])
            sums[name] = [ratio + makespan / bound, moves + moved, count + 1]
    return {name: (ratio / count, moves / count) for name, (ratio, moves, count) in sums.items()}


def moves_table(
    costs: dict[int, list[float]], moves: list[Move], shapes: dict | None = None
) -> str:
    """The plan, one row per move, with the gap between the two ranks before and after it."""
    loads = {r: sum(c) for r, c in costs.items()}
    rows = []
    for k, m in enumerate(moves):
        cost = costs[m.from_rank][m.local_index]
        before = loads[m.from_rank] - loads[m.to_rank]
        loads[m.from_rank] -= cost
        loads[m.to_rank] += cost
        after = abs(loads[m.from_rank] - loads[m.to_rank])
        shape = str(shapes[m.from_rank][m.local_index]) if shapes else "-"
        rows.append(
            (
                k,
                m.from_rank,
                m.to_rank,
                m.local_index,
                shape,
                f"{cost:,.0f}",
                f"{before:,.0f}",
                f"{after:,.0f}",
            )
        )
    header = ("move", "from", "to", "index", "shape (T,H,W)", "cost", "gap before", "gap after")
    return text_table(header, rows, align_right=range(8))


# ------------------------------------------------------------------ the exchange on real ranks
def group_loads(
    costs: Costs, lb: int
) -> list[tuple[list[int], int, dict[int, float], dict[int, float]]]:
    """Per lb group: its ranks, the moves its plan makes, and each rank's load before and after the plan."""
    after = loads_of(dict(enumerate(costs)), planned_encoder(costs, lb))
    plan = global_plan(costs, lb)
    return [
        (
            ranks,
            sum(1 for m in plan if m[0] in ranks),
            {r: sum(costs[r]) for r in ranks},
            {r: after[r] for r in ranks},
        )
        for ranks in groups_of(len(costs), lb)
    ]


def fingerprint(video: torch.Tensor) -> str:
    """A short name of a video's bytes and shape: which video a rank encoded."""
    return hashlib.sha1(video.numpy().tobytes()).hexdigest()[:12] + str(tuple(video.shape))


def video_costs(batch: list[list[torch.Tensor]]) -> Costs:
    return [[encode_cost(v) for v in videos] for videos in batch]


def lb_worker(
    batch: list[list[torch.Tensor]], lb_sizes: list[int], costs: Costs | None = None
) -> list[dict]:
    """On every rank: for each lb size, offload_encode this rank's videos and report what happened.

    `costs` defaults to `encode_cost` of each video (a test may force a plan with others).
    It calls `protocol.offload_encode` as that module holds it when it runs, so a patch of
    `paralab.vae_lb.protocol` reaches it.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    costs = video_costs(batch) if costs is None else costs
    encoder, reports = TinyVideoEncoder(), []
    for lb in lb_sizes:
        pd = ParallelDims(world, lb=lb)
        pd.build_meshes("cpu")
        group = pd.lb_mesh.get_group()
        encoded: list[str] = []

        def encode_fn(video: torch.Tensor) -> torch.Tensor:
            encoded.append(fingerprint(video))  # noqa: B023 - called in this iteration
            return encoder(video)

        plan = plan_rebalance(
            protocol.share_costs(costs[rank], group)
        )  # what every rank of the group should agree on
        with Ledger() as ledger:
            latents = protocol.offload_encode(batch[rank], costs[rank], encode_fn, group)
        reports.append(
            {
                "latents": latents,
                "encoded": encoded,
                "records": ledger.records,
                "plan": plan,
                "group": dist.get_process_group_ranks(group),
            }
        )
    return reports


def groups_of(world: int, lb: int) -> list[list[int]]:
    """The global ranks of each lb group (contiguous blocks of `lb`)."""
    return [list(range(start, start + lb)) for start in range(0, world, lb)]


def global_plan(costs: Costs, lb: int) -> list[tuple[int, int, int]]:
    """The plan of every group, computed here: (owner, helper, local index) in global rank labels."""
    moves = []
    for ranks in groups_of(len(costs), lb):
        group_costs = {g: costs[r] for g, r in enumerate(ranks)}
        moves += [
            (ranks[m.from_rank], ranks[m.to_rank], m.local_index)
            for m in plan_rebalance(group_costs)
        ]
    return moves


def planned_encoder(costs: Costs, lb: int) -> dict[tuple[int, int], int]:
    """(owner, local index) -> the global rank that must encode it."""
    where = {(r, i): r for r, c in enumerate(costs) for i in range(len(c))}
    where.update({(owner, index): helper for owner, helper, index in global_plan(costs, lb)})
    return where


def measured_bytes(reports: list[dict]) -> tuple[list[int], list[int], list[int]]:
    """Per rank, from its ledger: P2P bytes sent, P2P bytes received, all_gather bytes sent."""
    return (
        [sent(rep["records"], op="isend") for rep in reports],
        [received(rep["records"], op="irecv") for rep in reports],
        [sent(rep["records"], op="all_gather") for rep in reports],
    )


def reference_latents(
    batch: list[list[torch.Tensor]], encoder: Callable | None = None
) -> list[list[torch.Tensor]]:
    """Every video encoded here, in one process, in its owner's order."""
    encoder = encoder or TinyVideoEncoder()
    return [[encoder(v) for v in videos] for videos in batch]


def _flat(latents: list[torch.Tensor]) -> torch.Tensor:
    return (
        torch.cat([z.flatten() for z in latents])
        if latents
        else torch.zeros(0, dtype=torch.float64)
    )


def _shapes(latents: list[torch.Tensor]) -> torch.Tensor:
    return (
        torch.tensor([list(z.shape) for z in latents], dtype=torch.int64)
        if latents
        else torch.zeros(0, 4, dtype=torch.int64)
    )


def run_checks(
    reports: list[dict],
    batch: list[list[torch.Tensor]],
    lb: int,
    costs: Costs | None = None,
    tag: str = "",
) -> list[Verdict]:
    """The verdicts of one run, one row per property (latents compared as one flat tensor, owner order)."""
    world = len(reports)
    costs = video_costs(batch) if costs is None else costs
    tag = tag or f"w{world} lb{lb}"
    got = [z for rep in reports for z in rep["latents"]]
    want = [z for zs in reference_latents(batch) for z in zs]
    verdicts = compare(_flat(got), _flat(want), name=f"{tag}: latents, owner order")
    verdicts += compare(_shapes(got), _shapes(want), name=f"{tag}: latent shapes")
    encoded = [fp for rep in reports for fp in rep["encoded"]]
    videos = [(r, i) for r in range(world) for i in range(len(batch[r]))]
    counts = torch.tensor(
        [encoded.count(fingerprint(batch[r][i])) for r, i in videos], dtype=torch.int64
    )
    verdicts += compare(
        counts, torch.ones(len(videos), dtype=torch.int64), name=f"{tag}: each video encoded once"
    )
    at = {fp: rank for rank, rep in enumerate(reports) for fp in rep["encoded"]}
    where = planned_encoder(costs, lb)
    verdicts += compare(
        torch.tensor([at.get(fingerprint(batch[r][i]), -1) for r, i in videos], dtype=torch.int64),
        torch.tensor([where[(r, i)] for r, i in videos], dtype=torch.int64),
        name=f"{tag}: encoded on the planned rank",
    )
    plan = global_plan(costs, lb)
    plans, expected = [], []
    for rep in reports:
        ranks = rep["group"]
        plans += [[ranks[m.from_rank], ranks[m.to_rank], m.local_index] for m in rep["plan"]]
        expected += [list(m) for m in plan if m[0] in ranks]
    verdicts += compare(
        torch.tensor(plans, dtype=torch.int64).reshape(-1, 3),
        torch.tensor(expected, dtype=torch.int64).reshape(-1, 3),
        name=f"{tag}: same plan on every rank",
    )
    formulas = exchange_bytes(batch, plan, groups_of(world, lb))
    for what, have, formula in zip(
        ("P2P bytes sent", "P2P bytes received", "all_gather bytes sent"),
        measured_bytes(reports),
        formulas,
    ):
        verdicts += compare(
            torch.tensor(have), torch.tensor(formula), name=f"{tag}: {what} = formula"
        )
    return verdicts
