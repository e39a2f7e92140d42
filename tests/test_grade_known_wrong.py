"""Over 20 grading seeds, every known-wrong version of every exercise scores 0 on the hidden cases,
even with every visible case passed: no hidden draw is degenerate enough to let it through.

In-process exercises run here; the distributed ones run all seeds and all their known-wrong
versions in one launch per hidden world size, every exercise hidden at that size together (4
launches instead of 18; the checks themselves, not the launches, take most of the time).
"""

import functools

import pytest

from paralab.check import compare
from paralab.exercises import EXERCISES
from paralab.grade import CaseResult, case_outputs, share
from paralab.launch import run

SEEDS = range(20)


def hidden_passes(name: str, seeds: list[int], rank: int | None = None, world: int | None = None):
    """On every rank: (bug, seed) -> whether each hidden case's output matches the reference."""
    exercise = EXERCISES[name]
    found = {}
    for seed in seeds:
        cases = functools.partial(exercise.hidden, seed=seed)
        expected = [
            out
            for _, out in case_outputs(exercise.reference(), cases, exercise.normalize, rank, world)
        ]
        for what, bug, _ in exercise.bugs:
            got = case_outputs(bug, cases, exercise.normalize, rank, world)
            found[(what, seed)] = [
                ok
                and all(
                    v.passed for v in compare([out], [want], atol=exercise.atol, rtol=exercise.rtol)
                )
                for (ok, out), want in zip(got, expected, strict=True)
            ]
    return found


def hidden_passes_of(names: list[str], seeds: list[int]) -> dict[str, dict]:
    """On every rank: `hidden_passes` of each exercise in turn, by name."""
    return {name: hidden_passes(name, seeds) for name in names}


_LAUNCHED: dict[int, list[dict[str, dict]]] = {}


def launched(world: int) -> list[dict[str, dict]]:
    """Per rank, by exercise: one launch of every exercise whose hidden cases run at `world`."""
    if world not in _LAUNCHED:
        names = sorted(n for n, e in EXERCISES.items() if e.hidden and world in e.hidden_worlds())
        timeout = sum(4 * EXERCISES[n].timeout for n in names)
        _LAUNCHED[world] = run(hidden_passes_of, world, names, list(SEEDS), timeout=timeout)
    return _LAUNCHED[world]


@pytest.mark.parametrize("name", sorted(n for n, e in EXERCISES.items() if e.hidden))
def test_every_known_wrong_version_scores_zero_over_twenty_seeds(name):
    exercise = EXERCISES[name]
    cases: dict[tuple[str, int], list[CaseResult]] = {}
    for world in exercise.hidden_worlds():
        if world == 0:
            per_rank = [hidden_passes(name, list(SEEDS), 0, 1)]
        else:
            per_rank = [rank[name] for rank in launched(world)]
        for key in per_rank[0]:
            flags = [all(rank[key][c] for rank in per_rank) for c in range(len(per_rank[0][key]))]
            cases.setdefault(key, []).extend(
                CaseResult(world, f"case {c}", True, ok) for c, ok in enumerate(flags)
            )
    visible = [CaseResult(0, "visible", False, True)]
    earned = {key: share(exercise.points, visible + found) for key, found in cases.items()}
    assert not {key: points for key, points in earned.items() if points}, (
        f"{name}: a known-wrong version earns points at these (bug, seed): {earned}"
    )
