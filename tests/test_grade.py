"""Classroom mode: every exercise's check, its hidden cases, and the bug variants it must catch."""

import dataclasses
from pathlib import Path

import pytest
import torch.distributed as dist

from paralab.exercises import EXERCISES
from paralab.grade import (
    NOT_IMPLEMENTED,
    WorldRun,
    case_outputs,
    grade,
    launch_world,
    report,
    score,
)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_package_solution_passes_the_visible_and_the_hidden_cases(name):
    exercise = EXERCISES[name]
    outcome = grade(exercise, _target(exercise), seed=1)
    assert any(c.hidden for c in outcome.cases), f"{name} has no hidden case"
    assert outcome.verdict == "PASS", report(exercise, outcome)
    assert outcome.points == exercise.points


def _target(exercise):
    module_name, _, attr = exercise.target.rpartition(".")
    return getattr(__import__(module_name, fromlist=[attr]), attr)


def _reference_then_each(learners, solution, cases, normalize, rank=None, world=None):
    """On every rank: the reference's outputs, then each learner's, each on fresh inputs (fresh
    cases build fresh process groups: what one learner left unreceived never reaches the next)."""
    expected = [out for _, out in case_outputs(solution, cases, normalize, rank, world)]
    return [case_outputs(fn, cases, normalize, rank, world) for fn in learners], expected


def grade_each(exercise, learners):
    """`grade(exercise, learner)` of each learner (visible cases), every learner of a world size in
    one launch: a launch costs more than most bugs' cases. Where that launch fails as a whole (a
    hang, a dead rank), each learner is graded alone instead, so one's failure is never another's."""
    runs = [[] for _ in learners]
    for world in exercise.world_sizes:
        args = (learners, exercise.reference(), exercise.cases, exercise.normalize)
        both, _, _ = launch_world(
            _reference_then_each, world, args, exercise.timeout * len(learners)
        )
        if both is None:
            return [grade(exercise, learner) for learner in learners]
        for i, found in enumerate(runs):
            found.append(
                WorldRun(world, False, [each[i] for each, _ in both], [e for _, e in both])
            )
    return [score(exercise, found) for found in runs]


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_known_bug_fails_and_is_located(name):
    exercise = EXERCISES[name]
    assert exercise.bugs, f"{name} has no bug variant to prove its check can fail"
    outcomes = grade_each(exercise, [bug for _, bug, _ in exercise.bugs])
    for (what, _, pointer), outcome in zip(exercise.bugs, outcomes, strict=True):
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
