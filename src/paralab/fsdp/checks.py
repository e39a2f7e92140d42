"""Lab 01's checks: every rank's tensors, bytes and calls against the reference or the formula.

The jobs and references these compare are in `paralab.fsdp.runs`; each check
returns `Verdict`s the notebook prints and the tests assert on.
"""

from __future__ import annotations

import torch

from paralab.check import Verdict, compare
from paralab.fsdp.costs import fsdp2_calls_formula, memory_formula, per_step_sent, traffic_formula
from paralab.fsdp.runs import STEPS, expected_params
from paralab.ledger import calls
from paralab.models import MLPStack


def check_params(
    per_rank: list[dict], reference: MLPStack, atol: float = 0.0, key: str = "params"
) -> list[Verdict]:
    """Every tensor every rank holds after one job (`key`: "params", or "grads" of the
    first step against `reference_first_gradient()`), element by element."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    expected = [expected_params(reference, job, world, r) for r in range(world)]
    return compare([r[key] for r in per_rank], expected, atol=atol, name=per_rank[0]["label"])


def check_counts(label: str, measured: list[list[int]], formula: list[int]) -> Verdict:
    """Integers measured on every rank (rows) against the formula's (one row): one verdict."""
    expected = torch.tensor([formula] * len(measured))
    return compare(torch.tensor(measured), expected, name=label)[0]


MEMORY_PARTS = ("params", "grads", "optimizer", "gathered peak")


def check_traffic(per_rank: list[dict], numels: list[int]) -> Verdict:
    """Bytes every rank sent per step, per collective, vs `traffic_formula` (hand-written engines)."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    formula = traffic_formula(
        job.engine, numels, world, job.dp_replicate, job.reshard_after_forward
    )
    ops = sorted(formula)
    measured = [[per_step_sent(r["records"], STEPS).get(op, 0) for op in ops] for r in per_rank]
    return check_counts(
        f"{per_rank[0]['label']}: {', '.join(ops)}", measured, [formula[op] for op in ops]
    )


def check_memory(per_rank: list[dict], numels: list[int]) -> Verdict:
    """Bytes every rank held (params, grads, optimizer state, gathered peak) vs `memory_formula`."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    formula = memory_formula(
        job.engine, numels, world, job.optimizer, job.dp_replicate, job.reshard_after_forward
    )
    return check_counts(
        f"{per_rank[0]['label']}: {', '.join(MEMORY_PARTS)}",
        [[r["memory"][p] for p in MEMORY_PARTS] for r in per_rank],
        [formula[p] for p in MEMORY_PARTS],
    )


def fsdp2_calls(records: list, dp_replicate: int) -> list[int]:
    """FSDP2's calls per step from the ledger, in the order of `fsdp2_calls_formula`."""
    replica = calls(records, op="all_reduce", group_size=dp_replicate) if dp_replicate > 1 else 0
    counts = [
        calls(records, op="all_gather_single"),
        calls(records, op="reduce_scatter_single"),
        calls(records, op="all_reduce", group_size=1),
        replica,
    ]
    return [c // STEPS for c in counts]


def check_fsdp2_calls(per_rank: list[dict], n_units: int) -> Verdict:
    """FSDP2's calls per step on every rank vs `fsdp2_calls_formula` (the 2-D-mesh trap's extra all-reduce)."""
    job = per_rank[0]["job"]
    formula = fsdp2_calls_formula(n_units, job.dp_replicate, job.mesh == "dp_mesh")
    return check_counts(
        per_rank[0]["label"],
        [fsdp2_calls(r["records"], job.dp_replicate) for r in per_rank],
        formula,
    )
