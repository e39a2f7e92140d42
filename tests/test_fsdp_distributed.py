"""Distributed tests for paralab.fsdp on real gloo ranks: exactness, ledger bytes, memory, FSDP2, broken variants."""

from __future__ import annotations

import pytest

from paralab.check import compare
from paralab.exercises.lab01 import hsdp_divides_twice, no_replica_all_reduce, reduce_sum_not_mean
from paralab.fsdp.checks import (
    check_fsdp2_calls,
    check_memory,
    check_params,
    check_traffic,
    fsdp2_calls,
)
from paralab.fsdp.costs import per_step_sent, traffic_formula
from paralab.fsdp.runs import (
    STEPS,
    Job,
    reference_first_gradient,
    reference_first_loss,
    run_jobs,
    train_reference,
    train_reference_rank_by_rank,
    unit_numels,
)
from paralab.launch import run

NUMELS = unit_numels()
REFERENCE = {opt: train_reference(opt) for opt in ("adam", "sgd")}


def by_label(per_rank: list[list[dict]]) -> dict[str, list[dict]]:
    return {per_rank[0][j]["label"]: [r[j] for r in per_rank] for j in range(len(per_rank[0]))}


@pytest.fixture(scope="module")
def world4():
    jobs = [
        Job("hand"),
        Job("hand", optimizer="sgd"),
        Job("hand", 2),
        Job("hand", reshard_after_forward=False),
        Job("ddp"),
        Job("fsdp2"),
        Job("fsdp2", 2),
        Job("fsdp2", mesh="dp_mesh"),
    ]
    return by_label(run(run_jobs, 4, jobs, timeout=120))


@pytest.fixture(scope="module")
def world2_and_8():
    two = by_label(run(run_jobs, 2, [Job("hand"), Job("ddp"), Job("fsdp2")], timeout=120))
    eight = by_label(
        run(
            run_jobs, 8, [Job("hand"), Job("hand", 2), Job("hand", 2, optimizer="sgd")], timeout=120
        )
    )
    return {**two, **eight}


def all_pass(verdicts) -> bool:
    return all(v.passed for v in verdicts)


def test_every_rank_matches_the_global_batch_reference_within_1e12(world4, world2_and_8):
    for label, res in {**world4, **world2_and_8}.items():
        verdicts = check_params(res, REFERENCE[res[0]["job"].optimizer], atol=1e-12)
        assert all_pass(verdicts), (label, [v.describe() for v in verdicts if not v.passed])


def test_first_step_loss_is_bitwise_and_gradient_within_1e12(world4, world2_and_8):
    gradient = reference_first_gradient()
    for label, res in {**world4, **world2_and_8}.items():
        world = res[0]["world"]
        assert all_pass(
            compare(
                [r["loss"] for r in res], [reference_first_loss(r, world) for r in range(world)]
            )
        ), label
        assert all_pass(check_params(res, gradient, atol=1e-12, key="grads")), label


@pytest.mark.parametrize(
    "label",
    ["ZeRO-3 n=2 adam", "DDP n=2", "FSDP2 n=2 adam", "HSDP 2x2 adam", "FSDP2 HSDP 2x2 adam"],
)
def test_two_rank_groups_are_bitwise_equal_to_the_rank_by_rank_reference(
    label, world4, world2_and_8
):
    res = {**world4, **world2_and_8}[label]
    job, world = res[0]["job"], res[0]["world"]
    assert all_pass(
        check_params(res, train_reference_rank_by_rank(world, job.dp_replicate, job.optimizer))
    )


def test_bytes_per_step_and_memory_equal_the_formulas_on_every_rank(world4, world2_and_8):
    for _label, res in {**world4, **world2_and_8}.items():
        if res[0]["job"].engine != "fsdp2":
            assert check_traffic(res, NUMELS).passed, check_traffic(res, NUMELS).describe()
            assert check_memory(res, NUMELS).passed, check_memory(res, NUMELS).describe()


def test_two_d_mesh_trap_adds_one_single_rank_all_reduce_per_unit_per_step(world4):
    for label in ("FSDP2 n=4 on (1,4) dp_mesh adam", "FSDP2 n=4 adam", "FSDP2 HSDP 2x2 adam"):
        assert check_fsdp2_calls(world4[label], len(NUMELS)).passed, label
    trap = fsdp2_calls(world4["FSDP2 n=4 on (1,4) dp_mesh adam"][0]["records"], 1)
    assert trap[2] == len(NUMELS) and fsdp2_calls(world4["FSDP2 n=4 adam"][0]["records"], 1)[2] == 0


def test_a_wrong_traffic_formula_is_caught(world4):
    wrong = traffic_formula(
        "hand", NUMELS, 4, reshard_after_forward=False
    )  # ZeRO-2's formula for a ZeRO-3 run
    assert per_step_sent(world4["ZeRO-3 n=4 adam"][0]["records"], STEPS) != dict(
        sorted(wrong.items())
    )


# ---------------------------------------------------------------- deliberately broken algorithms
BREAKAGES = {  # planted in the module whose globals the engine's backward reads at call time
    "sum instead of mean": {"paralab.fsdp.zero": {"reduce_scatter_grads": reduce_sum_not_mean}},
    "no replica all-reduce": {"paralab.fsdp.zero": {"reduce_scatter_grads": no_replica_all_reduce}},
    "HSDP divides twice": {"paralab.fsdp.zero": {"reduce_scatter_grads": hsdp_divides_twice}},
}


@pytest.mark.parametrize(
    "breakage, label",
    [
        ("sum instead of mean", "ZeRO-3 n=4 sgd"),
        ("no replica all-reduce", "HSDP 2x2 adam"),
        ("HSDP divides twice", "HSDP 2x2 adam"),
    ],
)
def test_broken_algorithms_fail_the_check(breakage, label, world4):
    job = world4[label][0]["job"]
    assert all_pass(
        check_params(world4[label], REFERENCE[job.optimizer], atol=1e-12)
    )  # the intact run passes
    broken = [r[0] for r in run(run_jobs, 4, [job], timeout=60, patches=BREAKAGES[breakage])]
    verdicts = check_params(broken, REFERENCE[job.optimizer], atol=1e-12)
    assert not all_pass(verdicts)
    assert not all_pass(check_params(broken, reference_first_gradient(), atol=1e-12, key="grads"))
