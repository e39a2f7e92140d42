"""Classroom mode: exercise notebooks, the grader, and the bug variants every check must catch."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from paralab.exercises import EXERCISES
from paralab.grade import NOT_IMPLEMENTED, grade, report
from paralab.notebooks import exercise_notebook

LABS = sorted({e.lab for e in EXERCISES.values()})


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_package_solution_passes(name):
    exercise = EXERCISES[name]
    outcome = grade(exercise, _target(exercise))
    assert outcome.verdict == "PASS", report(exercise, outcome)
    assert outcome.points == exercise.points


def _target(exercise):
    module_name, _, attr = exercise.target.rpartition(".")
    return getattr(__import__(module_name, fromlist=[attr]), attr)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_known_bug_fails_and_is_located(name):
    exercise = EXERCISES[name]
    assert exercise.bugs, f"{name} has no bug variant to prove its check can fail"
    for what, bug, pointer in exercise.bugs:
        outcome = grade(exercise, bug)
        text = report(exercise, outcome)
        assert outcome.verdict == "FAIL" and outcome.points == 0, f"{what}: {text}"
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
    assert error.verdict == "ERROR" and "rank 1 raised ValueError: index out of range in my code" in error.details[0]
    short = type(exercise)(**{**exercise.__dict__, "timeout": 8.0})
    hang = grade(short, _collective_on_rank_zero_only)
    assert hang.verdict == "TIMEOUT" and "never finished" in hang.details[0]


@pytest.mark.parametrize("lab", LABS)
def test_exercise_notebooks_grade_zero_as_shipped_and_full_when_solved(lab, tmp_path):
    stub_nb = tmp_path / "stub.ipynb"
    solved_nb = tmp_path / "solved.ipynb"
    import nbformat

    nbformat.write(exercise_notebook(lab, stub_nb.name), stub_nb)
    nbformat.write(exercise_notebook(lab, solved_nb.name, solved=True), solved_nb)
    stub = subprocess.run([sys.executable, "-m", "paralab.grade", str(stub_nb)], capture_output=True, text=True,
                          timeout=300)
    assert stub.returncode == 1, stub.stdout + stub.stderr
    n = sum(e.lab == lab for e in EXERCISES.values())
    assert stub.stdout.count(NOT_IMPLEMENTED) == n, stub.stdout
    total = sum(e.points for e in EXERCISES.values() if e.lab == lab)
    assert re.search(rf"^total\s+0/{total}\s*$", stub.stdout, re.MULTILINE), stub.stdout
    solved = subprocess.run([sys.executable, "-m", "paralab.grade", str(solved_nb)], capture_output=True, text=True,
                            timeout=300)
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert re.search(rf"^total\s+{total}/{total}\s*$", solved.stdout, re.MULTILINE), solved.stdout


def test_instructors_table_lists_every_exercise_with_its_points_and_time():
    readme = (Path(__file__).resolve().parents[1] / "labs" / "README.md").read_text()
    for exercise in EXERCISES.values():
        row = next((line for line in readme.splitlines() if f"`{exercise.name}`" in line), "")
        assert f"| {exercise.points} | {exercise.minutes} min |" in row, f"{exercise.name} missing or stale in labs/README.md"
