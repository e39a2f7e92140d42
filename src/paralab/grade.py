"""Grade a learner's function on real ranks, and grade a whole exercise notebook.

In an exercise notebook, after the learner's version of a function:

    check("merge_partials", merge_partials)

runs the learner's function and the package's solution on the same inputs (on
real ranks through `paralab.launch` when the exercise is distributed), compares
them element by element, and prints a short deterministic report whose first
line is `<exercise>: <VERDICT> — <points>/<max> points`.

From a shell, an instructor grades a student's notebook:

    python -m paralab.grade labs/02_cp_ring_vs_ulysses/cp_ring_vs_ulysses_exercise.ipynb

which executes it headless, reads those first lines, prints a score table and
exits non-zero below full marks.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from paralab.check import Verdict, compare
from paralab.exercises import EXERCISES, Exercise
from paralab.launch import LaunchError, LaunchTimeout, run
from paralab.tables import text_table

NOT_IMPLEMENTED = "not implemented yet"
REPORT_LINE = re.compile(r"^(?P<name>[\w.]+): (?P<verdict>PASS|FAIL|ERROR|TIMEOUT|not implemented yet) — "
                         r"(?P<points>\d+)/(?P<max>\d+) points", re.MULTILINE)


@dataclass
class Outcome:
    verdict: str
    points: int
    details: list[str]


def _run_cases(learner: Callable, solution: Callable, cases: Callable, normalize: Callable,
               rank: int | None = None, world: int | None = None) -> list[tuple[Any, Any]]:
    """Runs on every rank (or in-process): the solution first, then the learner, on fresh inputs."""
    if rank is None:
        rank, world = dist.get_rank(), dist.get_world_size()
    expected = [normalize(solution(*args)) for args in cases(rank, world)]
    actual = []
    for args in cases(rank, world):
        out = learner(*args)
        try:
            actual.append(normalize(out))
        except Exception:  # noqa: BLE001 - a wrong structure is reported by the comparison
            actual.append(out)
    return list(zip(actual, expected))


def _learner_frames(tb: str) -> list[str]:
    """The traceback lines that point into the learner's own code, not into paralab or torch."""
    lines = tb.rstrip().splitlines()
    keep, skip = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith('File "'):
            skip = "site-packages" in stripped or "/paralab/" in stripped or "multiprocessing" in stripped
        if not skip and stripped and not stripped.startswith("Traceback"):
            keep.append("    " + stripped)
    return keep[-8:]


def _compare_world(world: int, per_rank: list[list[tuple[Any, Any]]], exercise: Exercise) -> list[Verdict]:
    actual = [[a for a, _ in rank_pairs] for rank_pairs in per_rank]
    expected = [[e for _, e in rank_pairs] for rank_pairs in per_rank]
    return compare(actual, expected, atol=exercise.atol, rtol=exercise.rtol, name=f"world {world}")


def _describe(v: Verdict) -> str:
    path = v.path.replace("/rank ", ", rank ").replace("/", ", case ", 1).replace("/", ", ")
    return path + ": " + v.describe().split(": ", 1)[1]


def grade(exercise: Exercise, learner: Callable) -> Outcome:
    """Run `learner` against the solution at every world size; the first problem decides."""
    solution = exercise.reference()
    checked = 0
    for world in exercise.world_sizes:
        try:
            if world == 0:
                per_rank = [_run_cases(learner, solution, exercise.cases, exercise.normalize, 0, 1)]
            else:
                per_rank = run(_run_cases, world, learner, solution, exercise.cases, exercise.normalize,
                               timeout=exercise.timeout)
        except NotImplementedError:
            return Outcome(NOT_IMPLEMENTED, 0, [f"hint: {exercise.hint}"])
        except LaunchTimeout as exc:
            return Outcome("TIMEOUT", 0, [
                f"world {world}: ranks {exc.hung_ranks} never finished within {exercise.timeout:g} s — "
                "is there a collective or a send/recv that only some ranks call?"])
        except LaunchError as exc:
            text = str(exc)
            if "NotImplementedError" in text:
                return Outcome(NOT_IMPLEMENTED, 0, [f"hint: {exercise.hint}"])
            return Outcome("ERROR", 0, [f"world {world}: " + _summarize_launch_error(text)])
        except Exception as exc:  # noqa: BLE001 - the learner's own exception, in this process
            return Outcome("ERROR", 0, [f"{type(exc).__name__}: {exc}", *_learner_frames(traceback.format_exc())])
        verdicts = _compare_world(world or 1, per_rank, exercise)
        failed = [v for v in verdicts if not v.passed]
        if failed:
            return Outcome("FAIL", 0, [_describe(v) for v in failed[:3]]
                           + ([f"... and {len(failed) - 3} more tensors"] if len(failed) > 3 else []))
        checked += len(verdicts)
    sizes = ", ".join(str(w) for w in exercise.world_sizes if w) or "in-process"
    return Outcome("PASS", exercise.points, [f"{checked} tensors equal the reference (world sizes: {sizes})"])


def _summarize_launch_error(text: str) -> str:
    """`rank N raised X: msg` plus the learner's traceback lines from the launcher's message."""
    first = next((line for line in text.splitlines() if " raised " in line or " died " in line), text.splitlines()[0])
    first = first.split("; ", 1)[-1]
    tb = text.split("--- traceback of rank", 1)[-1].split("\n", 1)[-1] if "--- traceback" in text else ""
    tb = tb.split("--- output of rank", 1)[0]
    return "\n".join([first, *_learner_frames(tb)])


def report(exercise: Exercise, outcome: Outcome) -> str:
    head = f"{exercise.name}: {outcome.verdict} — {outcome.points}/{exercise.points} points"
    return "\n".join([head, *("  " + d for d in outcome.details)])


def check(name: str, fn: Callable) -> Outcome:
    """Grade the learner's `fn` for exercise `name` and print the report."""
    if name not in EXERCISES:
        raise KeyError(f"no exercise named {name!r}; known: {', '.join(sorted(EXERCISES))}")
    exercise = EXERCISES[name]
    outcome = grade(exercise, fn)
    print(report(exercise, outcome))
    return outcome


# --------------------------------------------------------------------------- notebook grading
def grade_notebook(path: Path, timeout: int = 600) -> list[tuple[str, int, int, str]]:
    """Execute a student's notebook headless; (exercise, points, max, verdict) per exercise of its lab."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute(stderr=subprocess.DEVNULL)
    text = "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", [])
                     if out.get("output_type") == "stream")
    found = {m["name"]: (int(m["points"]), m["verdict"]) for m in REPORT_LINE.finditer(text)}
    lab = nb.metadata.get("paralab", {}).get("lab")
    expected = [e for e in EXERCISES.values() if e.lab == lab] or [EXERCISES[n] for n in found if n in EXERCISES]
    rows = []
    for exercise in expected:
        points, verdict = found.get(exercise.name, (0, "no result (check cell missing or not reached)"))
        rows.append((exercise.name, points, exercise.points, verdict))
    return rows


def score_table(rows: list[tuple[str, int, int, str]]) -> str:
    """One row per exercise (points earned / possible, verdict), then the total."""
    total, most = sum(r[1] for r in rows), sum(r[2] for r in rows)
    body = [(name, f"{points}/{possible}", verdict) for name, points, possible, verdict in rows]
    return text_table(("exercise", "points", "verdict"), [*body, ("total", f"{total}/{most}", "")], align_right=(1,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade paralab exercise notebooks (executes them headless).")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    full = True
    for path in args.notebooks:
        rows = grade_notebook(path)
        print(f"{path}\n{score_table(rows)}\n")
        full &= bool(rows) and all(points == most for _, points, most, _ in rows)
    return 0 if full else 1


if __name__ == "__main__":
    sys.exit(main())
