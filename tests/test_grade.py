"""Classroom mode: every exercise's check, its hidden cases, and the bug variants it must catch."""

import dataclasses
from pathlib import Path

import pytest
import torch.distributed as dist

from paralab.exercises import EXERCISES
from paralab.grade import (
    NOT_IMPLEMENTED,
    WorldRun,
    _both_outputs,
    cases_of,
    grade,
    launch_world,
    report,
    score,
)


def _each_reference_then_learner(runs, rank=None, world=None):
    """On every rank, for each (learner, solution, cases, normalize) in turn: what `grade` runs
    there (the reference, then the learner, on fresh cases: fresh cases build fresh process
    groups, so what one left unreceived never reaches the next)."""
    return [_both_outputs(*run, rank, world) for run in runs]


def grade_together(graded, seed=None):
    """`grade(exercise, learner, seed)` of each (exercise, learner), everything of one world size
    in one launch: a launch costs more than most exercises' cases. Where such a launch fails as a
    whole (a hang, a dead rank), each is graded alone instead, so one's failure is never another's."""
    plans = [
        [(w, False) for w in e.world_sizes]
        + ([(w, True) for w in e.hidden_worlds()] if seed is not None else [])
        for e, _ in graded
    ]
    found = {}
    for world in sorted({w for plan in plans for w, _ in plan}):
        at = [(i, hidden) for i, plan in enumerate(plans) for w, hidden in plan if w == world]
        runs = []
        for i, hidden in at:
            exercise, learner = graded[i]
            cases = cases_of(exercise, hidden, seed or 0)
            runs.append((learner, exercise.reference(), cases, exercise.normalize))
        timeout = sum(graded[i][0].timeout for i, _ in at)
        per_rank, _, _ = launch_world(_each_reference_then_learner, world, (runs,), timeout)
        if per_rank is None:
            return [grade(e, learner, seed) for e, learner in graded]
        for k, (i, hidden) in enumerate(at):
            found[i, world, hidden] = WorldRun(
                world, hidden, [r[k][0] for r in per_rank], [r[k][1] for r in per_rank]
            )
    return [
        score(e, [found[i, w, hidden] for w, hidden in plan])
        for i, ((e, _), plan) in enumerate(zip(graded, plans, strict=True))
    ]


_GRADED: dict[str, dict] = {}


def solutions_graded() -> dict:
    """Every exercise's package solution, graded with the hidden cases of seed 1, by name."""
    if "solutions" not in _GRADED:
        names = sorted(EXERCISES)
        outcomes = grade_together([(EXERCISES[n], _target(EXERCISES[n])) for n in names], seed=1)
        _GRADED["solutions"] = dict(zip(names, outcomes, strict=True))
    return _GRADED["solutions"]


def bugs_graded() -> dict:
    """Every known bug of every exercise, graded on the visible cases, by (exercise, index)."""
    if "bugs" not in _GRADED:
        keys = [(n, j) for n in sorted(EXERCISES) for j in range(len(EXERCISES[n].bugs))]
        outcomes = grade_together([(EXERCISES[n], EXERCISES[n].bugs[j][1]) for n, j in keys])
        _GRADED["bugs"] = dict(zip(keys, outcomes, strict=True))
    return _GRADED["bugs"]


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_package_solution_passes_the_visible_and_the_hidden_cases(name):
    exercise = EXERCISES[name]
    outcome = solutions_graded()[name]
    assert any(c.hidden for c in outcome.cases), f"{name} has no hidden case"
    assert outcome.verdict == "PASS", report(exercise, outcome)
    assert outcome.points == exercise.points


def _target(exercise):
    module_name, _, attr = exercise.target.rpartition(".")
    return getattr(__import__(module_name, fromlist=[attr]), attr)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_known_bug_fails_and_is_located(name):
    exercise = EXERCISES[name]
    assert exercise.bugs, f"{name} has no bug variant to prove its check can fail"
    for j, (what, _, pointer) in enumerate(exercise.bugs):
        outcome = bugs_graded()[name, j]
        text = report(exercise, outcome)
        assert outcome.verdict in ("FAIL", "PARTIAL") and outcome.points < exercise.points, (
            f"{what}: {text}"
        )
        assert pointer in text, f"{what}: the report does not point at {pointer!r}:\n{text}"


def _stub(*args):
    raise NotImplementedError("learner has not written this yet")


def _raises_on_rank_one(*args):
    if dist.get_rank() == 1:
        raise ValueError("index out of range in my code")
    return None


def _collective_on_rank_zero_only(*args):
    import torch

    if dist.get_rank() == 0:
        dist.all_reduce(torch.zeros(1))
    return None


def _distributed_exercise():
    return next(e for e in EXERCISES.values() if any(e.world_sizes))


def test_stub_exception_and_hang_each_get_their_own_words():
    exercise = _distributed_exercise()
    assert grade(exercise, _stub).verdict == NOT_IMPLEMENTED
    error = grade(exercise, _raises_on_rank_one)
    assert (
        error.verdict == "ERROR"
        and "rank 1: ValueError: index out of range in my code" in error.details[0]
    )
    assert "test_grade.py" not in report(exercise, error), (
        "only the learner's own frames (cells) are shown"
    )
    one_world = dataclasses.replace(exercise, timeout=4.0, world_sizes=exercise.world_sizes[:1])
    hang = grade(one_world, _collective_on_rank_zero_only)  # one world: each one waits 4 s
    assert hang.verdict == "TIMEOUT" and "never finished" in hang.details[0]


def _combine_right_for_positive_scales_only(cond_pred, uncond_pred, guidance_scale):
    return uncond_pred + max(guidance_scale, 0.0) * (cond_pred - uncond_pred)


def test_a_function_passing_every_visible_case_can_fail_a_hidden_one_without_seeing_its_data():
    exercise = EXERCISES["cfg_combine"]
    visible = grade(exercise, _combine_right_for_positive_scales_only)
    assert visible.verdict == "PASS"
    hidden = grade(exercise, _combine_right_for_positive_scales_only, seed=3)
    text = report(exercise, hidden)
    # the hidden cases of a world size earn its points together: right in one regime earns nothing
    assert hidden.verdict == "FAIL" and hidden.points == 0, text
    assert "hidden case: another shape, a negative guidance scale (in-process):" in text, text
    assert "output differs from the reference" in text and "expected" not in text, text
    assert "Outcome(" not in text


def test_points_are_split_over_cases_and_world_sizes():
    from paralab.exercises.lab02 import ring_pass_backwards

    exercise = EXERCISES["ring_pass"]
    outcome = grade(
        exercise, ring_pass_backwards
    )  # right in groups of 2 (next = previous), wrong in 4
    text = report(exercise, outcome)
    assert outcome.verdict == "PARTIAL" and outcome.points == round(exercise.points * 3 / 5, 2), (
        text
    )
    assert "the whole world as one cp group of 4 (4 ranks):" in text, text
    assert "the {0,1} and {2,3} cp groups of 2 inside 4 ranks" not in text, text


def test_instructors_table_lists_every_exercise_with_its_points_and_time():
    readme = (Path(__file__).resolve().parents[1] / "labs" / "README.md").read_text()
    for exercise in EXERCISES.values():
        row = next((line for line in readme.splitlines() if f"`{exercise.name}`" in line), "")
        assert f"| {exercise.points} | {exercise.minutes} min |" in row, (
            f"{exercise.name} missing or stale in labs/README.md"
        )
