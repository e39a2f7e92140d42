"""`python -m paralab.scale check [CASES.toml] [--json FILE]` and `python -m paralab.scale fit`.

`check` prints each case's prediction, measurement and signed error (predicted - measured) /
measured, and exits 1 if any |error| exceeds 25 %. `fit` re-derives the fitted efficiencies
from the cases and prints them next to the ones the predictor uses.
"""

from __future__ import annotations

import argparse
import json
import sys

from paralab.scale.cases import SHIPPED, Case, load_cases
from paralab.scale.fit import FITTED, fit, predicted_value
from paralab.scale.hardware import GiB
from paralab.scale.memory import train_memory
from paralab.tables import text_table

TOLERANCE = 0.25


def predicted_memory_gib(case: Case) -> float:
    """A training case's peak allocated memory per GPU (`paralab.scale.memory`); its
    `micro_batch` is the sequences each dp rank runs a step."""
    local = case.workload.micro_batch
    return sum(train_memory(case.model, case.layout, case.workload, local).values()) / GiB


def check_rows(path: str) -> list[dict]:
    rows = []
    for case in load_cases(path):
        predicted = predicted_value(case)
        row = {
            "name": case.name,
            "measure": case.measure,
            "predicted": predicted,
            "measured": case.measured,
            "relative_error": (predicted - case.measured) / case.measured,
        }
        if case.memory_gib is not None and case.workload.kind == "train":
            memory = predicted_memory_gib(case)
            row["measured_memory_gib"] = case.memory_gib
            row["predicted_memory_gib"] = memory
            row["memory_relative_error"] = (memory - case.memory_gib) / case.memory_gib
        rows.append(row)
    return rows


def error_table(rows: list[dict], heading: str = "case") -> str:
    """`check_rows` as a table: prediction, measurement and signed error per case."""
    return text_table(
        (heading, "predicted", "measured", "error"),
        [
            (
                r["name"],
                f"{r['predicted']:.4g}",
                f"{r['measured']:.4g}",
                f"{r['relative_error']:+.1%}",
            )
            for r in rows
        ],
        align_right=(1, 2, 3),
    )


def print_constants() -> None:
    print("fitted efficiencies (share of peak), per fit group:")
    for group, effs in FITTED.items():
        print(
            f"  {group:10s} GEMM {effs['gemm']:.2f}  attention {effs['attention']:.2f}"
            f"  VAE conv {effs['conv']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paralab.scale")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="predicted vs measured on a case file")
    check.add_argument("cases", nargs="?", default=str(SHIPPED))
    check.add_argument("--json", dest="json_path")
    refit = sub.add_parser("fit", help="re-derive the fitted efficiencies")
    refit.add_argument("cases", nargs="?", default=str(SHIPPED))
    args = parser.parse_args(argv)

    if args.command == "fit":
        print("refitted:", fit(load_cases(args.cases)))
        print_constants()
        return 0
    rows = check_rows(args.cases)
    print_constants()
    width = max(len(r["name"]) for r in rows)
    print(f"{'case':{width}s} {'measure':>21s} {'predicted':>11s} {'measured':>11s} {'error':>7s}")
    for r in rows:
        print(
            f"{r['name']:{width}s} {r['measure']:>21s} {r['predicted']:11.4g} "
            f"{r['measured']:11.4g} {r['relative_error']:+7.1%}"
        )
    worst = max(abs(r["relative_error"]) for r in rows)
    failed = [r["name"] for r in rows if abs(r["relative_error"]) > TOLERANCE]
    print(
        f"{len(rows) - len(failed)}/{len(rows)} within {TOLERANCE:.0%} (largest |error| {worst:.1%})"
    )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(
                [{k: v for k, v in r.items() if k != "measure"} for r in rows],
                f,
                indent=2,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
