"""Distributed tests for paralab.fsdp on real gloo ranks: broken variants, and a wrong formula.

Lab 01 runs every job of this engine on 2, 4 and 8 ranks (ZeRO-3, ZeRO-2-like, HSDP, DDP, FSDP2
and the 2-D-mesh trap) and checks, in claim tables that nbval re-runs, every rank's parameters
against one process, the first-step loss and gradient, the bitwise 2-rank groups, the bytes sent
and held against their formulas and FSDP2's call counts. These tests run what the lab does not:
each deliberately broken reduction must fail the check the intact run passes.
"""

from __future__ import annotations

import pytest

from paralab.exercises.lab01 import hsdp_divides_twice, no_replica_all_reduce, reduce_sum_not_mean
from paralab.fsdp.checks import check_params
from paralab.fsdp.costs import per_step_sent, traffic_formula
from paralab.fsdp.runs import (
    STEPS,
    Job,
    reference_first_gradient,
    run_jobs,
    train_reference,
    unit_numels,
)
from paralab.launch import run
from paralab.patches import patched

NUMELS = unit_numels()
REFERENCE = {opt: train_reference(opt) for opt in ("adam", "sgd")}


def by_label(per_rank: list[list[dict]]) -> dict[str, list[dict]]:
    return {per_rank[0][j]["label"]: [r[j] for r in per_rank] for j in range(len(per_rank[0]))}


def all_pass(verdicts) -> bool:
    return all(v.passed for v in verdicts)


# ---------------------------------------------------------------- deliberately broken algorithms
BREAKAGES = {  # planted in the module whose globals the engine's backward reads at call time
    "sum instead of mean": {"paralab.fsdp.zero": {"reduce_scatter_grads": reduce_sum_not_mean}},
    "no replica all-reduce": {"paralab.fsdp.zero": {"reduce_scatter_grads": no_replica_all_reduce}},
    "HSDP divides twice": {"paralab.fsdp.zero": {"reduce_scatter_grads": hsdp_divides_twice}},
}


CASES = {  # breakage -> the job it is planted in
    "sum instead of mean": Job("hand", optimizer="sgd"),
    "no replica all-reduce": Job("hand", 2),
    "HSDP divides twice": Job("hand", 2),
}


def _intact_and_broken() -> dict:
    """One launch: the intact jobs, then each job again with its breakage planted (`patched`)."""
    intact = run_jobs([Job("hand"), Job("hand", optimizer="sgd"), Job("hand", 2)])
    broken = {}
    for breakage, job in CASES.items():
        with patched(BREAKAGES[breakage]):
            broken[breakage] = run_jobs([job])[0]
    return {"intact": intact, "broken": broken}


@pytest.fixture(scope="module")
def world4():
    per_rank = run(_intact_and_broken, 4, timeout=120)
    broken = {b: [r["broken"][b] for r in per_rank] for b in CASES}
    return by_label([r["intact"] for r in per_rank]), broken


def test_a_wrong_traffic_formula_is_caught(world4):
    intact, _ = world4
    wrong = traffic_formula(
        "hand", NUMELS, 4, reshard_after_forward=False
    )  # ZeRO-2's formula for a ZeRO-3 run
    assert per_step_sent(intact["ZeRO-3 n=4 adam"][0]["records"], STEPS) != dict(
        sorted(wrong.items())
    )


@pytest.mark.parametrize(
    "breakage, label",
    [
        ("sum instead of mean", "ZeRO-3 n=4 sgd"),
        ("no replica all-reduce", "HSDP 2x2 adam"),
        ("HSDP divides twice", "HSDP 2x2 adam"),
    ],
)
def test_broken_algorithms_fail_the_check(breakage, label, world4):
    intact, broken_runs = world4
    job = intact[label][0]["job"]
    assert all_pass(check_params(intact[label], REFERENCE[job.optimizer], atol=1e-12))  # intact
    broken = broken_runs[breakage]
    assert broken[0]["label"] == label
    verdicts = check_params(broken, REFERENCE[job.optimizer], atol=1e-12)
    assert not all_pass(verdicts)
    assert not all_pass(check_params(broken, reference_first_gradient(), atol=1e-12, key="grads"))
