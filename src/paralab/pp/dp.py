"""PP × DP: dp copies of the pipeline, each on its share of the global batch, whose gradients
are summed over the dp group once per step, after the last micro-batch's backward.

Between micro-batches a stage only accumulates: Megatron sums after the schedule, or, with
`overlap_grad_reduce`, its schedules hold its DDP's `no_sync` (`disable_grad_sync`) until the
last micro-batch's backward or later; picotron sets `require_backward_grad_sync` on that
backward only. Syncing after every micro-batch, as a DDP without `no_sync` would, gives the
same gradients (the accumulated part is already equal on every replica, so its average is
itself) for m times the collectives.

Ranks follow Megatron's default order (tp-cp-ep-dp-pp) with tp = cp = ep = 1: dp varies
fastest, so the dp groups are neighbours ({0, 1}, {2, 3} at pp = dp = 2) and a pipeline is
every dp-th rank ({0, 2}, {1, 3}). Each sync is one all-reduce of a stage's gradients
flattened into one buffer (Megatron's grad buffer, one bucket), summed, then divided by dp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from paralab.check import Verdict, claim, compare
from paralab.ledger import Ledger, in_phase, sent
from paralab.pp.costs import dp_sync_bytes, dp_sync_collectives, stage_parameters
from paralab.pp.executor import run_actions
from paralab.pp.model import Stage, global_batch, make_blocks, microbatch_loss
from paralab.pp.runs import Params, merged, reference_run, sgd_step
from paralab.pp.schedules import addressed, build_schedule


def pp_dp_ranks(world: int, pp: int) -> tuple[list[list[int]], list[list[int]]]:
    """(pipelines, dp groups) of `world` ranks, dp fastest: pipeline d is ranks d, d + dp, ...;
    dp group r (pipeline rank r) is ranks r·dp ... r·dp + dp - 1."""
    if world % pp:
        raise ValueError(f"pp = {pp} does not divide the {world} ranks")
    dp = world // pp
    return [list(range(d, world, dp)) for d in range(dp)], [
        list(range(r * dp, (r + 1) * dp)) for r in range(pp)
    ]


def new_dp_groups(pp: int) -> list[dist.ProcessGroup]:
    """One process group per dp group; every rank must create every group, in the same order."""
    return [dist.new_group(ranks) for ranks in pp_dp_ranks(dist.get_world_size(), pp)[1]]


def sync_stage_grads(stage: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """The stage's gradients, flattened into one buffer, summed over dp and divided by dp."""
    grads = [p.grad for p in stage.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with in_phase("dp sync"):
        dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, synced in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(synced.view_as(g))


def dp_grad_sync(
    stages: dict[int, Stage], group: dist.ProcessGroup, microbatches: int, deferred: bool
) -> Callable[[int, int], None]:
    """The executor's `after_grads` for one step: sync a stage's gradients over dp once its
    last micro-batch's are in (deferred), or after every micro-batch's (not deferred)."""
    done = dict.fromkeys(stages, 0)

    def after_grads(stage: int, microbatch: int) -> None:
        done[stage] += 1
        if not deferred or done[stage] == microbatches:
            sync_stage_grads(stages[stage], group)

    return after_grads


def pp_dp_worker(
    pp: int,
    schedule: str = "1f1b",
    microbatches: int = 4,
    virtual: int = 1,
    deferred: bool = True,
    steps: int = 2,
    seed: int = 0,
    dp_groups: list[dist.ProcessGroup] | None = None,
) -> dict[str, Any]:
    """On every rank: `steps` steps of pp × dp, each replica on its m of the dp·m micro-batches;
    the dp sync once per stage after its last micro-batch (`deferred`) or after every one.

    Returns this rank's gradients of every step (synced), its parameters after the last, and
    the ledger's records of step 0. `dp_groups` (from `new_dp_groups`) saves creating them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pipelines, _ = pp_dp_ranks(world, pp)
    dp, replica, pp_rank = world // pp, rank % (world // pp), rank // (world // pp)
    group = (dp_groups or new_dp_groups(pp))[pp_rank]
    plan = addressed(build_schedule(schedule, pp, microbatches, virtual), tuple(pipelines[replica]))
    blocks = make_blocks(seed)
    stages = {s: Stage(blocks, s, plan.n_stages) for s in plan.stages_of(pp_rank)}
    named = {k: p for st in stages.values() for k, p in st.named_model_parameters().items()}
    grads: list[Params] = []
    records: list = []
    for step in range(steps):
        x, y = global_batch(dp * microbatches, step, seed)
        mine = slice(replica * microbatches, (replica + 1) * microbatches)
        inputs, targets = x.chunk(dp * microbatches)[mine], y.chunk(dp * microbatches)[mine]
        sync = dp_grad_sync(stages, group, microbatches, deferred)
        with Ledger() as led:
            run_actions(plan, pp_rank, stages, inputs, targets, after_grads=sync)
        if step == 0:
            records = led.records
        grads.append({k: p.grad.clone() for k, p in named.items()})
        sgd_step(list(named.values()))
    params = {k: p.detach().clone() for k, p in named.items()}
    return {"grads": grads, "params": params, "records": records, "replica": replica}


def pp_dp_sweep(pp: int, configs: list[tuple]) -> list[dict[str, Any]]:
    """On every rank: `pp_dp_worker(pp, *config)` for each config, in one launch."""
    groups = new_dp_groups(pp)
    return [pp_dp_worker(pp, *config, dp_groups=groups) for config in configs]


def reference_replicas(
    dp: int, microbatches: int, steps: int = 2, seed: int = 0
) -> tuple[Params, list[Params]]:
    """One process, summing in the pp × dp run's order: each replica's m micro-batches
    accumulated on their own (loss over m), the dp sums added in replica order, over dp.

    At dp = 2 this is the deferred run bitwise (an all-reduce of two ranks adds the same two
    numbers on both); `reference_run(dp·m)`, one sum over all dp·m micro-batches, is the
    same gradient to rounding. Returns the parameters after `steps` and every step's gradients."""
    blocks = make_blocks(seed)
    named = {f"blocks.{k}": p for k, p in blocks.named_parameters()}
    grads = []
    for step in range(steps):
        x, y = global_batch(dp * microbatches, step, seed)
        xs, ys = x.chunk(dp * microbatches), y.chunk(dp * microbatches)
        sums: list[Params] = []
        for replica in range(dp):
            for i in range(replica * microbatches, (replica + 1) * microbatches):
                out = xs[i]
                for block in blocks:
                    out = block(out)
                microbatch_loss(out, ys[i], microbatches).backward()
            sums.append({k: p.grad for k, p in named.items()})
            for p in named.values():
                p.grad = None
        for k, p in named.items():
            total = sums[0][k]
            for other in sums[1:]:
                total = total + other[k]
            p.grad = total / dp
        grads.append({k: p.grad.clone() for k, p in named.items()})
        sgd_step(list(named.values()))
    return {k: p.detach().clone() for k, p in named.items()}, grads


def dp_sync_record(per_rank: list[dict]) -> list[tuple[int, int]]:
    """(all-reduces, bytes sent) each rank made for the dp sync in step 0, from its ledger."""
    return [
        (
            sum(r.op == "all_reduce" and r.phase == "dp sync" for r in rank["records"]),
            sent(rank["records"], phase="dp sync"),
        )
        for rank in per_rank
    ]


def check_pp_dp(per_rank: list[dict], pp: int, config: tuple, steps: int = 2) -> list[Verdict]:
    """One pp × dp run against one process: every replica's gradients of every step and its
    parameters after the last, to rounding vs one sum over the dp·m micro-batches and, where
    the sync is deferred at dp = 2, bitwise vs the same sums grouped by replica; its dp
    all-reduces and their bytes per rank vs `dp_sync_collectives` and `dp_sync_bytes`."""
    schedule, m, virtual, deferred = config
    dp = len(per_rank) // pp
    name = f"{schedule} pp={pp} dp={dp} m={m} " + ("deferred" if deferred else "every micro-batch")
    want_params, want_grads = reference_run(dp * m, steps)
    grouped_params, grouped_grads = reference_replicas(dp, m, steps)
    verdicts = []
    for replica in range(dp):
        mine = [r for r in per_rank if r["replica"] == replica]
        for step in range(steps):
            got = merged(mine, "grads", step)
            verdicts += compare(got, want_grads[step], atol=1e-15, name=f"{name} grad {step}")
            if deferred and dp == 2:
                verdicts += compare(got, grouped_grads[step], name=f"{name} grad {step}, grouped")
        verdicts += compare(merged(mine, "params"), want_params, atol=1e-15, name=f"{name} params")
        if deferred and dp == 2:
            verdicts += compare(merged(mine, "params"), grouped_params, name=f"{name} params")
    n_stages = pp * virtual
    for rank, (calls, nbytes) in enumerate(dp_sync_record(per_rank)):
        stages = [s for s in range(n_stages) if s % pp == rank // dp]
        params = [stage_parameters(s, n_stages) for s in stages]
        want = (dp_sync_collectives(m, virtual, deferred), dp_sync_bytes(params, dp, m, deferred))
        verdicts.append(
            claim(
                f"{name} rank {rank}: dp all-reduces, bytes",
                (calls, nbytes) == want,
                f"{calls}, {nbytes} B",
            )
        )
    return verdicts
