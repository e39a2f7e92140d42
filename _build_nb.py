"""Build the lab notebooks from their sources, and optionally execute them.

    python _build_nb.py                 # labs/*/*_lab.py -> .ipynb (no outputs)
    python _build_nb.py --execute       # build and run every lab, store outputs (2 at a time)
    python _build_nb.py --execute --jobs 1   # one lab after another
    python _build_nb.py --check         # fail if a committed notebook is stale
    python _build_nb.py --lab 01_fsdp_hsdp --execute
    python _build_nb.py --measure       # what a reader meets in each committed notebook
    python _build_nb.py --profile       # where each lab's run time goes (runs every lab once)
    python _build_nb.py --student       # the students' hand-out -> student/ and student.zip
    python _build_nb.py --site          # the READMEs, chapters and notebooks as a static site -> site/

The work is done by `paralab.notebooks` (how `# show:` cells and exercise stubs
are made); this file is only its command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Build with this checkout's package, whichever paralab is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from paralab import notebooks  # noqa: E402


def _why_stale(source: Path) -> str | None:
    """`notebooks.stale`, where a lab that cannot be checked is reported and the others still are."""
    try:
        return notebooks.stale(source)
    except Exception as exc:  # noqa: BLE001 - one broken lab must not hide the others' state
        return f"cannot check {source}: {type(exc).__name__}: {str(exc)[:200]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--execute", action="store_true", help="run each notebook and store its outputs"
    )
    parser.add_argument(
        "--check", action="store_true", help="fail if a committed notebook is stale"
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="print code lines, longest cell, check rows, pictures per notebook",
    )
    parser.add_argument(
        "--student",
        action="store_true",
        help="write the students' hand-out: labs with solutions stubbed, the stubbed package, checks",
    )
    parser.add_argument(
        "--out", type=Path, default=notebooks.ROOT / "student", help="folder of the hand-out"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run each lab once and print where its time goes (kernel, imports, launches, cells)",
    )
    parser.add_argument("--lab", help="one lab, by folder name or its unique start (e.g. 05)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="labs executed at once (default: 2, or 1 on a one-core machine); lines stay in order",
    )
    parser.add_argument(
        "--site", action="store_true", help="build the static site (paralab.site) into site/"
    )
    args = parser.parse_args(argv)
    if args.site:
        from paralab.site import SITE
        from paralab.site import build as build_site

        print(f"site: {SITE} ({build_site():.1f} s)")
        return 0
    sources = notebooks.lab_sources(args.lab)
    if args.profile:
        print(notebooks.profile_labs(sources))
        return 0
    if args.measure:
        print(notebooks.measure_labs(sources))
        return 0
    if args.student:
        from paralab.release import write_student

        archive = write_student(args.out, args.lab)
        print(f"student release: {args.out}/ and {archive}")
        return 0
    if args.check:
        problems = [(s, _why_stale(s)) for s in sources]
        for s, why in problems:
            print(f"{s.parent.name:<24} {'stale: ' + why if why else 'up to date'}")
        return 1 if any(why for _, why in problems) else 0
    return 0 if notebooks.build_labs(sources, run=args.execute, jobs=args.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
