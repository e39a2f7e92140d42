"""`python -m paralab.grade NOTEBOOK...`: grade handed-in notebooks; see `paralab.grade`."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import secrets
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from paralab.exercises import EXERCISES, for_lab
from paralab.grade.sandbox import (
    MEMORY_BYTES,
    MIN_MEMORY_BYTES,
    gibibytes,
    isolation,
    preflight,
    shared_zygote,
)
from paralab.grade.submission import (
    Graded,
    Row,
    grade_safely,
    lab_of,
    pristine_package,
    read_submission,
)
from paralab.tables import text_table


def score_table(rows: list[Row]) -> str:
    table = [(r.exercise, f"{r.points:g}/{r.max_points}", r.verdict) for r in rows]
    table.append(
        ("total", f"{sum(r.points for r in rows):g}/{sum(r.max_points for r in rows)}", "")
    )
    return text_table(("exercise", "points", "verdict"), table)


def exercise_table(lab: str | None = None) -> str:
    """Every exercise the grader knows (of `lab`, or of every lab): what it grades and how."""
    exercises = for_lab(lab) if lab else sorted(EXERCISES.values(), key=lambda e: e.lab)
    rows = [
        (
            e.lab,
            e.name,
            e.target,
            e.points,
            ", ".join(str(w) if w else "in-process" for w in e.world_sizes),
            ", ".join(str(w) if w else "in-process" for w in e.hidden_worlds()) or "-",
            len(e.bugs),
        )
        for e in exercises
    ]
    head = ("lab", "exercise", "target", "points", "world sizes", "hidden", "known-wrong")
    labs = len({r[0] for r in rows})
    total = f"{len(rows)} exercises in {labs} lab{'s' if labs != 1 else ''}"
    return f"{text_table(head, rows)}\n{total}; grade with: python -m paralab.grade NOTEBOOK..."


UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def memory_size(text: str) -> int:
    """`3G`, `1500M`, `2.5G` or a number of bytes, as the address space a process may use."""
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in UNITS:
        number, unit = number[:-1], number[-1]
    try:
        size = int(float(number) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write it as 3G, 1500M or a number of bytes"
        ) from None
    if size < MIN_MEMORY_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is below {gibibytes(MIN_MEMORY_BYTES)}: a submission's process needs about "
            "0.9 GiB to import torch and start its ranks"
        )
    return size


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a score file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.partial")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_results(rows: list[Row], json_path: Path | None, csv_path: Path | None) -> None:
    """One row per student × exercise, then one `TOTAL` row per student."""
    totals = {}
    for r in rows:
        t = totals.setdefault(r.student, Row(r.student, r.lab, "TOTAL", 0.0, 0, "", ""))
        t.points = round(t.points + r.points, 2)
        t.max_points += r.max_points
    everything = rows + list(totals.values())
    if json_path:
        _write(json_path, json.dumps([asdict(r) for r in everything], indent=1) + "\n")
    if csv_path:
        table = io.StringIO()
        writer = csv.DictWriter(
            table, fieldnames=list(asdict(everything[0])) if everything else ["student"]
        )
        writer.writeheader()
        writer.writerows(asdict(r) for r in everything)
        _write(csv_path, table.getvalue())


def grader_fault(graded: list[Graded]) -> str:
    """When every submission's grading process died the same way before any result, that is the
    grader's environment, not the students' work: said once, for the instructor and each student."""
    causes = {g.stopped for g in graded}
    if len(graded) < 2 or len(causes) != 1 or not next(iter(causes)):
        return ""
    return (
        f"GRADER ERROR: all {len(graded)} submissions stopped the same way before any result, so "
        "the fault is the grader's environment, not the students' work; these scores do not "
        f"count (fix it and grade again). The cause: {next(iter(causes))}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paralab.grade",
        description="Grade handed-in paralab notebooks: each submission's cells run in a sandbox "
        "of their own (untrusted code, see labs/README.md's safety note).",
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="handed-in notebooks; without any, list every lab's exercises",
    )
    parser.add_argument(
        "--lab", help="the lab of every notebook (default: inferred from each file name)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="draws the hidden cases (keep it to yourself; default: a random one, printed)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=600,
        help="seconds one submission may run, all its exercises together",
    )
    parser.add_argument(
        "--memory",
        type=memory_size,
        default=MEMORY_BYTES,
        help="address space each process of a submission may use, e.g. 3G (the default) or "
        "1500M; a submission over it fails, and its feedback says so",
    )
    parser.add_argument(
        "--json", type=Path, help="write every row (student × exercise, and totals) as JSON"
    )
    parser.add_argument(
        "--csv", type=Path, help="write every row (student × exercise, and totals) as CSV"
    )
    parser.add_argument(
        "--feedback",
        type=Path,
        help="folder for the feedback files (default: beside each notebook)",
    )
    args = parser.parse_args(argv)
    labs = ", ".join(sorted({e.lab for e in EXERCISES.values()}))
    if args.lab and not for_lab(args.lab):
        parser.error(f"no exercises for lab {args.lab!r}; labs: {labs}")
    if not args.notebooks:
        print(exercise_table(args.lab))
        return 0
    missing = [str(path) for path in args.notebooks if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)} (nothing was graded or written)")
    if not args.lab:
        unnamed = [str(path) for path in args.notebooks if lab_of(path) is None]
        if unnamed:
            parser.error(
                f"cannot tell the lab of {', '.join(unnamed)} from the file name; pass --lab "
                f"(one of {labs})"
            )
    if why := preflight():
        print(f"python -m paralab.grade: cannot grade here: {why}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else secrets.randbelow(10**9)
    drawn = "" if args.seed is not None else f" (drawn at random: --seed {seed} grades these again)"
    print(f"seed {seed}{drawn}")
    print(isolation().describe(), flush=True)
    print(f"each submission: {args.budget:g} s, {gibibytes(args.memory)} per process", flush=True)
    submissions = [read_submission(path, args.lab) for path in args.notebooks]  # before any runs
    graded: list[Graded] = []
    zygote = shared_zygote()  # the batch's folder lies in its root, which its sandbox binds
    with tempfile.TemporaryDirectory(prefix="batch-", dir=zygote.root) as tmp:
        pristine = pristine_package(Path(tmp) / "src")
        for sub in submissions:
            result = grade_safely(sub, seed, args.budget, pristine, args.memory, zygote)
            print(
                f"{sub.path}  (student {sub.student}, lab {sub.lab}; its code ran "
                f"{result.seconds:.0f} s)\n{score_table(result.rows)}\n",
                flush=True,
            )
            graded.append(result)
    ours = grader_fault(graded)
    if ours:
        print(ours, file=sys.stderr, flush=True)
    # Every sandbox is gone (each took its processes with it): only now is anything written.
    for result in graded:
        sub = result.submission
        target = (args.feedback or sub.path.parent) / f"{sub.path.stem}.feedback.txt"
        _write(
            target,
            f"{sub.path}\n{ours + chr(10) * 2 if ours else ''}{score_table(result.rows)}\n\n"
            + "\n\n".join(result.feedback)
            + "\n",
        )
    rows = [r for result in graded for r in result.rows]
    write_results(rows, args.json, args.csv)
    if ours:
        return 2
    full = all(bool(g.rows) and all(r.points == r.max_points for r in g.rows) for g in graded)
    return 0 if full else 1


if __name__ == "__main__":
    sys.exit(main())
