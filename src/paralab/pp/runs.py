"""Lab 08's experiments: the per-rank job, the public `train`, the one-process references, the checks.

`pp_worker` runs `steps` training steps of one schedule on every rank (the ledger on
the first) and returns what the checks need: gradients of every step, the parameters
after the last, the ledger records, the executed order, wall-clock spans and memory.
`train` is the same loop returning only the full parameters, identical on every rank.
`reference` is one process: the same global batch, the same micro-batches accumulated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.check import Verdict, claim, compare
from paralab.ledger import Ledger, sent
from paralab.pp.clock import Event, Timeline, run_clock
from paralab.pp.costs import (
    boundary_bytes,
    in_flight_formula,
    peak_held_bytes,
    stage_saved_bytes,
    step_bytes_sent,
)
from paralab.pp.executor import StepRecord, run_actions
from paralab.pp.model import (
    HIDDEN,
    LEARNING_RATE,
    Stage,
    global_batch,
    make_blocks,
    microbatch_loss,
)
from paralab.pp.schedules import Schedule, build_schedule

Params = dict[str, torch.Tensor]


def sgd_step(parameters: list[torch.nn.Parameter]) -> None:
    """p -= lr · grad for each parameter, and its gradient cleared for the next step."""
    with torch.no_grad():
        for p in parameters:
            p -= LEARNING_RATE * p.grad
            p.grad = None


def _steps(
    plan: Schedule, rank: int, steps: int, seed: int, ledger_first: bool
) -> tuple[dict[int, Stage], list[Params], list[StepRecord], list]:
    blocks = make_blocks(seed)
    stages = {s: Stage(blocks, s, plan.n_stages) for s in plan.stages_of(rank)}
    named = {k: p for st in stages.values() for k, p in st.named_model_parameters().items()}
    grads, records, ledger_records = [], [], []
    for step in range(steps):
        x, y = global_batch(plan.microbatches, step, seed)
        inputs, targets = x.chunk(plan.microbatches), y.chunk(plan.microbatches)
        if ledger_first and step == 0:
            with Ledger() as led:
                records.append(run_actions(plan, rank, stages, inputs, targets))
            ledger_records = led.records
        else:
            records.append(run_actions(plan, rank, stages, inputs, targets))
        grads.append({k: p.grad.clone() for k, p in named.items()})
        sgd_step(list(named.values()))
    return stages, grads, records, ledger_records


def pp_worker(
    schedule: str = "1f1b", microbatches: int = 4, virtual: int = 1, steps: int = 2, seed: int = 0
) -> dict[str, Any]:
    """On every rank (pp = world): `steps` steps of `schedule`; this rank's part of everything.

    A bug clinic launches it twice, once as it is and once with `run(..., patches=...)`.
    """
    rank, pp = dist.get_rank(), dist.get_world_size()
    plan = build_schedule(schedule, pp, microbatches, virtual)
    stages, grads, records, ledger_records = _steps(plan, rank, steps, seed, ledger_first=True)
    params = {
        k: p.detach().clone()
        for st in stages.values()
        for k, p in st.named_model_parameters().items()
    }
    return {"params": params, "grads": grads, "step0": records[0], "records": ledger_records}


def grad_norm_worker(schedule: str = "1f1b", microbatches: int = 4, seed: int = 0) -> dict:
    """On every rank: one step, then the global gradient norm as Megatron's
    `get_grad_norm_fp32` forms it: each rank's sum of squares, all-reduced over the pipeline
    (a stage holds only its own parameters), then the square root."""
    rank, pp = dist.get_rank(), dist.get_world_size()
    plan = build_schedule(schedule, pp, microbatches)
    _, grads, _, _ = _steps(plan, rank, 1, seed, ledger_first=False)
    local = sum((g * g).sum() for g in grads[0].values())
    total = local.clone()
    with Ledger() as led:
        dist.all_reduce(total)
    return {"local": local.item(), "norm": total.sqrt().item(), "bytes": sent(led.records)}


def reference_grad_norm(microbatches: int = 4, seed: int = 0) -> float:
    """One process: the norm of every step-0 gradient of the whole model."""
    grads = reference_run(microbatches, 1, seed)[1][0]
    return torch.sqrt(sum((g * g).sum() for g in grads.values())).item()


class TiedEnds(torch.nn.Module):
    """A stage of a model whose input projection and output head share one h × h matrix
    (as a tied embedding and LM head do): the first stage multiplies by it, the last by its
    transpose, a middle stage does not hold it."""

    def __init__(self, stage: Stage, tied: torch.nn.Parameter | None, first: bool, last: bool):
        super().__init__()
        self.stage, self.tied, self.first, self.last = stage, tied, first, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x @ self.tied if self.first else x
        y = self.stage(x)
        return y @ self.tied.T if self.last else y


def tied_matrix(seed: int = 0) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(seed + 7)
    return torch.nn.Parameter(torch.randn(HIDDEN, HIDDEN, dtype=torch.float64, generator=g) / 2)


def tied_worker(schedule: str = "1f1b", microbatches: int = 4, seed: int = 0) -> dict:
    """On every rank: one step of a pipeline whose first and last stages share `tied_matrix`.

    Each end accumulates only its own use's gradient; before the optimizer step they are
    all-reduced between the first and the last rank alone (Megatron's embedding group)."""
    rank, pp = dist.get_rank(), dist.get_world_size()
    plan = build_schedule(schedule, pp, microbatches)
    blocks, ends = make_blocks(seed), (0, plan.n_stages - 1)
    tied = tied_matrix(seed) if rank in ends else None
    stages = {
        s: TiedEnds(Stage(blocks, s, plan.n_stages), tied, s == 0, s == ends[1])
        for s in plan.stages_of(rank)
    }
    x, y = global_batch(microbatches, 0, seed)
    run_actions(plan, rank, stages, x.chunk(microbatches), y.chunk(microbatches))
    group = dist.new_group(list(ends))  # every rank takes part in creating it
    grads = {
        k: p.grad.clone()
        for st in stages.values()
        for k, p in st.stage.named_model_parameters().items()
    }
    partial = None
    if tied is not None:
        partial = tied.grad.clone()
        with Ledger() as led:
            dist.all_reduce(tied.grad, group=group)
        grads["tied"] = tied.grad.clone()
    return {
        "grads": grads,
        "partial": partial,
        "bytes": sent(led.records) if tied is not None else 0,
    }


def reference_tied(microbatches: int = 4, seed: int = 0) -> Params:
    """One process: the same tied model, the micro-batches' losses backward one by one."""
    blocks, tied = make_blocks(seed), tied_matrix(seed)
    x, y = global_batch(microbatches, 0, seed)
    for xi, yi in zip(x.chunk(microbatches), y.chunk(microbatches)):
        out = xi @ tied
        for block in blocks:
            out = block(out)
        microbatch_loss(out @ tied.T, yi, microbatches).backward()
    grads = {f"blocks.{k}": p.grad.clone() for k, p in blocks.named_parameters()}
    return grads | {"tied": tied.grad.clone()}


SWEEP = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1)]
"""Every hand-written schedule with its stages per rank."""


def sweep_configs(pp: int, steps: int = 2, seed: int = 0) -> list[tuple]:
    """`pp_worker` arguments for every schedule at m = 1, pp and 2·pp."""
    return [(name, m, v, steps, seed) for name, v in SWEEP for m in (1, pp, 2 * pp)]


def pp_sweep(configs: list[tuple]) -> list[dict[str, Any]]:
    """On every rank: `pp_worker(*config)` for each config, in one launch."""
    return [pp_worker(*config) for config in configs]


def train(
    pp: int,
    *,
    schedule: str = "1f1b",
    microbatches: int = 4,
    virtual: int = 1,
    steps: int = 2,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inside `launch.run` on pp ranks: train `steps` SGD steps; the full parameters, on every rank."""
    if dist.get_world_size() != pp:
        raise ValueError(f"train(pp={pp}) must run on pp ranks, not {dist.get_world_size()}")
    plan = build_schedule(schedule, pp, microbatches, virtual)
    stages, _, _, _ = _steps(plan, dist.get_rank(), steps, seed, ledger_first=False)
    mine = {k: p.detach() for st in stages.values() for k, p in st.named_model_parameters().items()}
    parts: list = [None] * pp
    dist.all_gather_object(parts, mine)
    return {k: parts_k[k] for parts_k in parts for k in sorted(parts_k)}


def reference_run(
    microbatches: int = 4, steps: int = 2, seed: int = 0
) -> tuple[Params, list[Params]]:
    """One process, the same global batches: per step, the m micro-batches' losses
    (`microbatch_loss`) backward one by one into the same gradients, then SGD.
    Returns the parameters after `steps` and the gradients of every step."""
    blocks = make_blocks(seed)
    named = {f"blocks.{k}": p for k, p in blocks.named_parameters()}
    grads = []
    for step in range(steps):
        x, y = global_batch(microbatches, step, seed)
        for xi, yi in zip(x.chunk(microbatches), y.chunk(microbatches)):
            out = xi
            for block in blocks:
                out = block(out)
            microbatch_loss(out, yi, microbatches).backward()
        grads.append({k: p.grad.clone() for k, p in named.items()})
        sgd_step(list(named.values()))
    return {k: p.detach().clone() for k, p in named.items()}, grads


def reference(*, microbatches: int = 4, steps: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """The parameters one process reaches after `steps` steps on the same global batches."""
    return reference_run(microbatches, steps, seed)[0]


def full_batch_grads(microbatches: int = 4, seed: int = 0) -> Params:
    """Step 0's gradients from ONE backward of the mean loss over the whole global batch."""
    blocks = make_blocks(seed)
    x, y = global_batch(microbatches, 0, seed)
    out = x
    for block in blocks:
        out = block(out)
    F.mse_loss(out, y).backward()
    return {f"blocks.{k}": p.grad.clone() for k, p in blocks.named_parameters()}


def merged(per_rank: list[dict], key: str, step: int | None = None) -> Params:
    """Every rank's part of `params` (or of the grads of `step`) as one dict."""
    out: Params = {}
    for r in per_rank:
        out.update(r[key] if step is None else r[key][step])
    return dict(sorted(out.items()))


def check_training(
    per_rank: list[dict],
    schedule: str,
    microbatches: int,
    virtual: int = 1,
    steps: int = 2,
    seed: int = 0,
) -> list[Verdict]:
    """Every gradient of every step and the parameters after the last, bitwise vs `reference_run`."""
    want_params, want_grads = reference_run(microbatches, steps, seed)
    name = f"{schedule} pp={len(per_rank)} m={microbatches}" + (
        f" v={virtual}" if virtual > 1 else ""
    )
    verdicts = []
    for step in range(steps):
        verdicts += compare(
            merged(per_rank, "grads", step), want_grads[step], name=f"{name} step {step} grad"
        )
    return verdicts + compare(
        merged(per_rank, "params"), want_params, name=f"{name} params after {steps} steps"
    )


def executed_timeline(per_rank: list[dict], plan: Schedule) -> Timeline:
    """The logical clock applied to the order each rank actually ran."""
    return run_clock([r["step0"].executed for r in per_rank], plan.owner, plan.split_backward)


def wall_timeline(per_rank: list[dict]) -> Timeline:
    """This machine's wall clock: each action's span on each rank, 0 = the first start (ms)."""
    t0 = min(s for r in per_rank for _, s, _ in r["step0"].wall)
    events = []
    for rank, r in enumerate(per_rank):
        for action, (_, start, end) in zip(r["step0"].executed, r["step0"].wall):
            events.append(
                Event(
                    rank,
                    action.kind,
                    action.stage,
                    action.microbatch,
                    1e3 * (start - t0),
                    1e3 * (end - t0),
                )
            )
    return Timeline(len(per_rank), tuple(events), label="wall clock of this machine, ms")


def bytes_per_rank(per_rank: list[dict]) -> torch.Tensor:
    """Bytes each rank sent in step 0, from its ledger: [direction (forward, backward), rank]."""
    return torch.tensor(
        [[sent(r["records"], phase=p) for r in per_rank] for p in ("forward", "backward")]
    )


def check_bytes(per_rank: list[dict], plan: Schedule) -> list[Verdict]:
    """The ledger's bytes per rank and direction vs m · b·s·h·8 per boundary each rank feeds."""
    want = step_bytes_sent(plan.owner, plan.microbatches, boundary_bytes())
    expected = torch.tensor([[w[p] for w in want] for p in ("forward", "backward")])
    return compare(
        bytes_per_rank(per_rank),
        expected,
        name=f"{plan.name} pp={plan.pp} m={plan.microbatches} bytes [dir, rank]",
    )


def check_memory(per_rank: list[dict], plan: Schedule) -> list[Verdict]:
    """Per rank, the peak (stage, micro-batch) activations held vs the closed form, and the
    peak bytes the saved-tensor hooks counted vs the same peak from the list and the model's
    shapes (`peak_held_bytes`); with one stage per rank that is the count × one stage's bytes."""
    verdicts = []
    for rank, r in enumerate(per_rank):
        rec: StepRecord = r["step0"]
        want = in_flight_formula(plan.name, plan.pp, plan.microbatches, rank, plan.virtual)
        want_bytes = peak_held_bytes(plan, rank)
        holds = rec.peak_in_flight == want and rec.peak_saved_bytes == want_bytes
        observed = (
            f"{rec.peak_in_flight} held, formula {want}; "
            f"peak {rec.peak_saved_bytes} B saved, from the list {want_bytes} B"
        )
        if plan.virtual == 1:
            per_mb = stage_saved_bytes(rank, plan.pp)
            holds = holds and want_bytes == want * per_mb
            observed += f" = {want} × {per_mb} B"
        verdicts.append(
            claim(
                f"{plan.name} pp={plan.pp} m={plan.microbatches} rank {rank}: peak held",
                holds,
                observed,
            )
        )
    return verdicts
