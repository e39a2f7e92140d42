"""Grade a learner's function on real ranks, case by case, and grade handed-in notebooks.

In a lab notebook, after the learner's version of a function:

    check("merge_partials", merge_partials)

rebuilds the learner's function from its own cell and applies the grader's rules to it
(`paralab.grade.code`), then runs it on every visible case of the exercise (on real ranks
through `paralab.launch` when the exercise is distributed), compares each output element by
element with the reference, and prints a report whose first line is
`<exercise>: <VERDICT> — <points>/<max> points`. On the visible cases, points are split evenly
over the cases (every world size counts), so a function right on 2 ranks but wrong on 4 earns
part of them.

From a shell, an instructor grades handed-in notebooks:

    python -m paralab.grade submissions/*/cp_ring_vs_ulysses_lab.ipynb --seed 7 --csv scores.csv

which never trusts what a notebook prints or holds: it reads each submission's answer cells,
runs them in a sandbox (`paralab.grade.sandbox`) against a package copy without solutions, on
the visible cases and on hidden ones drawn from `--seed`, and judges the returned outputs itself
(`paralab.grade.submission`). There the hidden cases carry the points: each hidden world size
earns its share when all its hidden cases pass, and the visible cases, whose reference outputs
the hand-out ships, scale that by at most `VISIBLE_SHARE`. `paralab.grade.__main__` is the
command line.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from paralab.check import Verdict, compare
from paralab.exercises import EXERCISES, Exercise
from paralab.launch import LaunchError, LaunchTimeout, run

NOT_IMPLEMENTED = "not implemented yet"
WITHHELD = "is withheld while grading"
"""Text of the stubs that replace the package's solutions in the process that runs a student's code."""


VISIBLE_SHARE = 0.1
"""Where hidden cases are graded, the visible ones (whose reference outputs the hand-out ships)
earn at most this share of the points, and only in proportion to the hidden points earned: outputs
looked up from the shipped references earn nothing."""


@dataclass
class CaseResult:
    """One case at one world size: what it is, and whether the learner's output matched."""

    world: int
    kind: str
    hidden: bool
    passed: bool
    why: str = ""
    failure: str = ""
    """How it failed: differs, raised, timeout, not implemented, withheld (the package's solution was called)."""

    def label(self) -> str:
        where = "in-process" if self.world == 0 else f"{self.world} ranks"
        return f"{'hidden case: ' if self.hidden else ''}{self.kind} ({where})"


@dataclass
class Outcome:
    verdict: str
    points: float
    details: list[str]
    cases: list[CaseResult] = field(default_factory=list)


@dataclass
class WorldRun:
    """The learner's outputs at one world size (per rank, per case: (ok, output or error text)),
    the reference outputs, or why the whole world failed."""

    world: int
    hidden: bool
    actual: list[list[tuple[bool, Any]]] | None = None
    expected: list[list[Any]] | None = None
    failure: str = ""
    failure_verdict: str = "ERROR"


# --------------------------------------------------------------------------- on every rank
def case_outputs(
    fn: Callable,
    cases: Callable,
    normalize: Callable,
    rank: int | None = None,
    world: int | None = None,
) -> list[tuple[bool, Any]]:
    """Runs on every rank (or in-process): `fn` on each case; (True, output) or (False, what went wrong)."""
    if rank is None:
        rank, world = dist.get_rank(), dist.get_world_size()
    results: list[tuple[bool, Any]] = []
    for args in cases(rank, world):
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the learner's own exception, reported per case
            results.append(
                (
                    False,
                    f"{type(exc).__name__}: {exc}\n"
                    + "\n".join(learner_frames(traceback.format_exc())),
                )
            )
            continue
        try:
            results.append((True, _plain(normalize(out))))
        except Exception as exc:  # noqa: BLE001 - a result of the wrong form
            results.append((False, f"the result has the wrong form ({type(exc).__name__}: {exc})"))
    return results


def _plain(value: Any) -> Any:
    """Tensors detached to the CPU, in plain containers, so they travel and compare cleanly."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _both_outputs(
    learner: Callable,
    solution: Callable,
    cases: Callable,
    normalize: Callable,
    rank: int | None = None,
    world: int | None = None,
) -> tuple[list, list]:
    """Runs on every rank: the reference first, then the learner, on fresh inputs."""
    expected = [out for _, out in case_outputs(solution, cases, normalize, rank, world)]
    return case_outputs(learner, cases, normalize, rank, world), expected


def learner_frames(tb: str) -> list[str]:
    """The traceback lines that point into the learner's own code (cells), not into paralab or torch."""
    keep, skip = [], False
    for line in tb.rstrip().splitlines():
        stripped = line.strip()
        if stripped.startswith('File "'):
            skip = not stripped.startswith('File "<cell ') and not stripped.startswith(
                'File "<ipython'
            )
        if not skip and stripped and not stripped.startswith("Traceback"):
            keep.append("    " + stripped)
    return keep[-8:]


# --------------------------------------------------------------------------- worlds
def cases_of(exercise: Exercise, hidden: bool, seed: int) -> Callable[[int, int], list[tuple]]:
    return functools.partial(exercise.hidden, seed=seed) if hidden else exercise.cases


def launch_world(
    fn: Callable, world: int, args: tuple, timeout: float
) -> tuple[list | None, str, str]:
    """`fn(*args)` on `world` ranks (0: in this process): (per-rank results, or None with why and verdict)."""
    try:
        if world == 0:
            return [fn(*args, 0, 1)], "", ""
        return run(fn, world, *args, timeout=timeout), "", ""
    except LaunchTimeout as exc:
        return (
            None,
            (
                f"ranks {exc.hung_ranks} never finished within {timeout:g} s — is there a collective "
                "or a send/recv that only some ranks call?"
            ),
            "TIMEOUT",
        )
    except LaunchError as exc:
        return None, summarize_launch_error(str(exc)), "ERROR"


def summarize_launch_error(text: str) -> str:
    """`rank N raised X: msg` plus the learner's traceback lines from the launcher's message."""
    first = next(
        (line for line in text.splitlines() if " raised " in line or " died " in line),
        text.splitlines()[0],
    )
    first = first.split("; ", 1)[-1]
    tb = (
        text.split("--- traceback of rank", 1)[-1].split("\n", 1)[-1]
        if "--- traceback" in text
        else ""
    )
    tb = tb.split("--- output of rank", 1)[0]
    return "\n".join([first, *learner_frames(tb)])


def _stored_expected(exercise: Exercise) -> dict | None:
    """A student copy of the package ships the reference outputs of the visible cases instead of the solution."""
    from paralab import exercises

    path = Path(exercises.__file__).parent / "expected" / f"{exercise.name}.pt"
    return torch.load(path, weights_only=True) if path.exists() else None


def reference_world(
    exercise: Exercise, world: int, hidden: bool = False, seed: int = 0
) -> list[list[Any]]:
    """The package solution's outputs at one world size, per rank and case."""
    # A generous timeout: the reference never deadlocks, only a loaded machine can make it slow.
    per_rank, why, _ = launch_world(
        case_outputs,
        world,
        (exercise.reference(), cases_of(exercise, hidden, seed), exercise.normalize),
        max(4 * exercise.timeout, 120),
    )
    if per_rank is None:
        raise RuntimeError(f"{exercise.name}: the reference failed at world {world}: {why}")
    for rank_results in per_rank:
        for ok, out in rank_results:
            if not ok:
                raise RuntimeError(f"{exercise.name}: the reference failed at world {world}: {out}")
    return [[out for _, out in rank_results] for rank_results in per_rank]


# --------------------------------------------------------------------------- scoring
def score(exercise: Exercise, runs: list[WorldRun]) -> Outcome:
    """Split the exercise's points evenly over every case at every world size, visible and hidden."""
    cases: list[CaseResult] = []
    for w in runs:
        kinds = exercise.case_kinds(w.world, w.hidden)
        if w.failure:
            n = len(kinds) if kinds else 1
            kinds = kinds or ["every case"]
            how = "timeout" if w.failure_verdict == "TIMEOUT" else _how(w.failure)
            why = without_data(w.failure) if w.hidden else w.failure  # its kind, never its data
            why = f"world {w.world}: {why}" if w.world else why
            cases += [CaseResult(w.world, kinds[i], w.hidden, False, why, how) for i in range(n)]
            continue
        n_cases = len(w.expected[0])
        kinds = (kinds or []) + [f"case {i}" for i in range(len(kinds or []), n_cases)]
        for c in range(n_cases):
            cases.append(CaseResult(w.world, kinds[c], w.hidden, *_judge_case(exercise, w, c)))
    if not cases:  # nothing was run: never a pass
        return Outcome("ERROR", 0, ["no case was run, so there is nothing to grade"], cases)
    passed = sum(c.passed for c in cases)
    points = share(exercise.points, cases)
    failed = [c for c in cases if not c.passed]
    if not failed:
        worlds = ", ".join(str(w) for w in sorted({c.world for c in cases}) if w) or "in-process"
        return Outcome(
            "PASS", exercise.points, [f"all {len(cases)} cases pass (world sizes: {worlds})"], cases
        )
    passed = passed if points else 0
    verdict = _verdict(failed, passed)
    if verdict == NOT_IMPLEMENTED:
        return Outcome(NOT_IMPLEMENTED, 0, [f"hint: {exercise.hint}"], cases)
    if verdict == "REFUSED":
        return Outcome(
            "REFUSED",
            0,
            [
                "calls paralab's own solution: "
                + next(c.why for c in failed if WITHHELD in c.why).splitlines()[0]
            ],
            cases,
        )
    details = []
    for c in failed[:4]:
        details.append(f"{c.label()}:\n    " + c.why.replace("\n", "\n    "))
    if len(failed) > 4:
        details.append(f"... and {len(failed) - 4} more failing cases")
    return Outcome(verdict, points, details, cases)


def share(points: int, cases: list[CaseResult]) -> float:
    """The points earned. Without hidden cases: split evenly over the cases. With them: each hidden
    world size earns its share only when every hidden case there passes (they are the exercise's
    regimes together, so a version right in the easy regime only earns nothing), and the visible
    cases scale that by at most `VISIBLE_SHARE`."""
    hidden = [c for c in cases if c.hidden]
    if not hidden:
        return round(points * sum(c.passed for c in cases) / len(cases), 2) if cases else 0.0
    visible = [c for c in cases if not c.hidden]
    seen = sum(c.passed for c in visible) / len(visible) if visible else 1.0
    worlds = {c.world for c in hidden}
    right = [w for w in worlds if all(c.passed for c in hidden if c.world == w)]
    fraction = len(right) / len(worlds) * (1 - VISIBLE_SHARE + VISIBLE_SHARE * seen)
    return round(points * fraction, 2)


def _verdict(failed: list[CaseResult], passed: int) -> str:
    how = {c.failure for c in failed}
    if "withheld" in how:
        return "REFUSED"
    if how == {"not implemented"} and not passed:
        return NOT_IMPLEMENTED
    if passed:
        return "PARTIAL"
    if "timeout" in how:
        return "TIMEOUT"
    return "FAIL" if how == {"differs"} else "ERROR"


def without_data(why: str) -> str:
    """What went wrong in a hidden case, without its message (which may quote the case's data):
    `rank 1 raised ValueError: <data>` -> `rank 1 raised ValueError`."""
    first = why.splitlines()[0] if why else ""
    if WITHHELD in first:
        return first
    return first.split(": ", 1)[0] if ": " in first else first


def _how(why: str) -> str:
    if WITHHELD in why:
        return "withheld"
    return "not implemented" if "NotImplementedError" in why.split("\n")[0] else "raised"


def _judge_case(exercise: Exercise, w: WorldRun, c: int) -> tuple[bool, str, str]:
    failures = [
        (rank, out)
        for rank, rank_results in enumerate(w.actual)
        for ok, out in [rank_results[c]]
        if not ok
    ]
    if (
        failures
    ):  # an exception on one rank is the cause of a wrong form on another: report it first
        rank, out = min(
            failures, key=lambda f: (f[1].startswith("the result has the wrong form"), f[0])
        )
        where = "" if w.world == 0 else f"world {w.world}, rank {rank}: "
        how = _how(out)
        return False, where + (without_data(out) if w.hidden else out), how
    actual = [rank_results[c][1] for rank_results in w.actual]
    expected = [rank_expected[c] for rank_expected in w.expected]
    failed = [
        v for v in compare(actual, expected, atol=exercise.atol, rtol=exercise.rtol) if not v.passed
    ]
    if not failed:
        return True, "", ""
    if w.hidden:  # say what kind of case failed, never its data
        return (
            False,
            "output differs from the reference"
            + (" (wrong shape, dtype or structure)" if any(v.problem for v in failed) else ""),
            "differs",
        )
    lines = [_describe(v, w.world, c) for v in failed[:2]] + (
        [f"... and {len(failed) - 2} more tensors"] if len(failed) > 2 else []
    )
    return False, "\n".join(lines), "differs"


def _describe(v: Verdict, world: int, case: int) -> str:
    """`world 4, rank 2, case 1, out: 3 of 90 elements differ, ...` (in-process: `case 1, out: ...`)."""
    rank, _, tensor = v.path.partition("/")
    where = f"world {world}, {rank}, " if world else ""
    return (
        f"{where}case {case}"
        + (f", {tensor}: " if tensor else ": ")
        + v.describe().split(": ", 1)[1]
    )


# --------------------------------------------------------------------------- in the learner's kernel
def grade(exercise: Exercise, learner: Callable, seed: int | None = None) -> Outcome:
    """Run `learner` on every case at every world size (and the hidden cases when `seed` is given)."""
    stored = _stored_expected(exercise)
    solution = None if stored else exercise.reference()
    runs = []
    plan = [(w, False) for w in exercise.world_sizes]
    if seed is not None:
        plan += [(w, True) for w in exercise.hidden_worlds()]
    for world, hidden in plan:
        cases = cases_of(exercise, hidden, seed or 0)
        if stored is not None:
            per_rank, why, verdict = launch_world(
                case_outputs, world, (learner, cases, exercise.normalize), exercise.timeout
            )
            expected = stored[world]
        else:
            both, why, verdict = launch_world(
                _both_outputs,
                world,
                (learner, solution, cases, exercise.normalize),
                exercise.timeout,
            )
            per_rank = [a for a, _ in both] if both else None
            expected = [e for _, e in both] if both else None
        runs.append(WorldRun(world, hidden, per_rank, expected, why, verdict or "ERROR"))
    return score(exercise, runs)


def report(exercise: Exercise, outcome: Outcome) -> str:
    head = f"{exercise.name}: {outcome.verdict} — {outcome.points:g}/{exercise.points} points"
    if outcome.cases:
        how = (
            "the hidden cases of each world size earn its points together"
            if any(c.hidden for c in outcome.cases)
            else "points split evenly"
        )
        head += f" ({sum(c.passed for c in outcome.cases)}/{len(outcome.cases)} cases pass, {how})"
    return "\n".join([head, *("  " + d for d in outcome.details)])


def check(name: str, fn: Callable) -> None:
    """Grade the learner's `fn` for exercise `name` on the visible cases and print the report.

    `fn` is first rebuilt from its own cell alone and screened by the grader's rules
    (`paralab.grade.code`), so what passes here is what the grader runs, and a refusal here is
    the grader's refusal, with the rule it broke."""
    from paralab.grade.code import RULES, as_graded

    if name not in EXERCISES:
        raise KeyError(f"no exercise named {name!r}; known: {', '.join(sorted(EXERCISES))}")
    exercise = EXERCISES[name]
    graded, why = as_graded(fn, exercise)
    if graded is None:
        verdict, _, reason = why.partition(": ")
        print(
            f"{exercise.name}: {verdict} — 0/{exercise.points} points (as the grader will score it)\n"
            f"  {reason}\n  The grader reads only the cells that held a stub, and requires that {RULES}."
        )
        return
    outcome = grade(exercise, graded)
    print(report(exercise, outcome))
    if exercise.hidden:
        print("  (visible cases only: the grader's hidden cases, other shapes, carry the points)")
    if any("NameError" in c.why for c in outcome.cases):
        print(
            "  (the grader runs this cell on its own, on top of the exercise's package module: "
            "a helper of yours defined in another cell is not there)"
        )
