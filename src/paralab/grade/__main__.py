"""`python -m paralab.grade NOTEBOOK...`: grade handed-in notebooks; see `paralab.grade`."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from paralab.exercises import EXERCISES, for_lab
from paralab.grade.submission import Row, grade_submission, grading_copy, lab_of
from paralab.tables import text_table


def score_table(rows: list[Row]) -> str:
    table = [(r.exercise, f"{r.points:g}/{r.max_points}", r.verdict) for r in rows]
    table.append(
        ("total", f"{sum(r.points for r in rows):g}/{sum(r.max_points for r in rows)}", "")
    )
    return text_table(("exercise", "points", "verdict"), table)


def write_results(rows: list[Row], json_path: Path | None, csv_path: Path | None) -> None:
    """One row per student × exercise, then one `TOTAL` row per student."""
    totals = {}
    for r in rows:
        t = totals.setdefault(r.student, Row(r.student, r.lab, "TOTAL", 0.0, 0, "", ""))
        t.points = round(t.points + r.points, 2)
        t.max_points += r.max_points
    everything = rows + list(totals.values())
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in everything], indent=1) + "\n")
    if csv_path:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(
                f, fieldnames=list(asdict(everything[0])) if everything else ["student"]
            )
            writer.writeheader()
            writer.writerows(asdict(r) for r in everything)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paralab.grade",
        description="Grade handed-in paralab notebooks (executes them headless: "
        "untrusted code, see labs/README.md's safety note).",
    )
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument(
        "--lab", help="the lab of every notebook (default: inferred from each file name)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="draws the hidden cases (keep it to yourself)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds each notebook cell may run"
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
    if args.lab and not for_lab(args.lab):
        parser.error(
            f"no exercises for lab {args.lab!r}; labs: {', '.join(sorted({e.lab for e in EXERCISES.values()}))}"
        )
    rows: list[Row] = []
    full = True
    with grading_copy() as package:
        for path in args.notebooks:
            start = time.monotonic()
            student, lab, mine, reports, run_s = grade_submission(
                path, args.lab or lab_of(path), args.seed, args.timeout, package
            )
            text = (
                f"{path}  (student {student}, lab {lab}; graded in {time.monotonic() - start:.0f} s, "
                f"{run_s:.0f} s of it re-running the notebook)\n{score_table(mine)}\n"
            )
            print(text, flush=True)
            target = (args.feedback or path.parent) / f"{path.stem}.feedback.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text + "\n" + "\n\n".join(reports) + "\n")
            rows += mine
            full &= bool(mine) and all(r.points == r.max_points for r in mine)
    write_results(rows, args.json, args.csv)
    return 0 if full else 1


if __name__ == "__main__":
    sys.exit(main())
