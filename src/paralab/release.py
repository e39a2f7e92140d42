"""The student release: each lab with its solution regions stubbed in place, a check after each exercise.

`python _build_nb.py --student` writes it (`write_student`): the labs' committed
notebooks turned into hand-outs (`student_notebook`), the package with every
solution region stubbed (`paralab.stubs`), and the reference outputs of the
visible checks, computed by the grader's own `reference_world`.
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

import torch

from paralab.exercises import for_lab
from paralab.grade import reference_world
from paralab.grade.code import EDIT_KEY, RULE_LIST
from paralab.notebook_format import nbformat
from paralab.notebooks import ROOT, lab_sources, notebook_path, stable_cell_ids
from paralab.stubs import (
    PACKAGE,
    contract_docstrings,
    exercise_contracts,
    release_stub_message,
    stub_package,
    stub_regions,
)


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute a piece of code reads."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
    return names


def _package_files() -> tuple[tuple[Path, int, int], ...]:
    """Each package source with its size and modification time: what `_package_reads` keys on."""
    return tuple(
        (path, stat.st_size, stat.st_mtime_ns)
        for path in sorted(PACKAGE.rglob("*.py"))
        for stat in [path.stat()]
    )


@functools.lru_cache(maxsize=1)
def _package_reads(files: tuple[tuple[Path, int, int], ...]) -> dict[str, set[str]]:
    """Top-level package function or class -> the names it reads. Parsing the package takes most
    of a second, and a release or a grading test asks once per lab: it is parsed again only
    when a file changes. Callers must not modify the sets."""
    reads: dict[str, set[str]] = {}
    for path, _, _ in files:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                reads.setdefault(node.name, set()).update(_names(node) - {node.name})
    return reads


def package_needs(targets: set[str]) -> dict[str, set[str]]:
    """Top-level package functions and classes -> the exercise functions they end up calling."""
    reads = _package_reads(_package_files())
    needs = {t: {t} for t in targets}
    changed = True
    while changed:
        changed = False
        for name, used in reads.items():
            found = set().union(*(needs.get(u, set()) for u in used)) | needs.get(name, set())
            if found != needs.get(name, set()):
                needs[name], changed = found, True
    return needs


def student_notebook(nb: nbformat.NotebookNode, lab: str) -> nbformat.NotebookNode:
    """The lab itself for a student: solution regions stubbed in place, a check cell after each exercise,
    and every cell that runs a student's function saying so (its output, the reference's, removed)."""
    exercises = {e.target.rsplit(".", 1)[1]: e for e in for_lab(lab)}
    needs = package_needs(set(exercises))
    cells = []
    for cell in nbformat.from_dict(nb).cells:
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        tree = ast.parse(
            "\n".join(
                "" if line.lstrip().startswith(("%", "!")) else line
                for line in cell.source.splitlines()
            )
        )
        defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        mine = [fn for fn in exercises if fn in defined and "### BEGIN SOLUTION" in cell.source]
        bound = {
            t.id
            for n in tree.body
            for t in ast.walk(n)
            if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
        }
        for name, node in defined.items():  # a cell's definitions need what their bodies call
            needs[name] = set().union(*(needs.get(u, set()) for u in _names(node) - {name})) | (
                {name} if name in exercises else set()
            )
        if mine:
            cell.source = contract_docstrings(
                stub_regions(cell.source, release_stub_message)[0], exercise_contracts()
            ).rstrip()
            cell.outputs, cell.execution_count = [], None
            cell.metadata[EDIT_KEY] = {"edit": mine}  # the only cells the grader reads
            for fn in mine:
                e = exercises[fn]
                cells.append(
                    nbformat.v4.new_markdown_cell(
                        f"**Exercise `{fn}`** ({e.points} point{'s' if e.points != 1 else ''}, about {e.minutes} min). "
                        f"{e.prompt}\n\nWrite it where it raises `NotImplementedError` in the next cell, run the cell, "
                        "then run the check under it."
                    )
                )
            cells.append(cell)
            cells += [
                nbformat.v4.new_code_cell(
                    f'from paralab.grade import check\n\ncheck("{exercises[fn].name}", {fn})',
                    metadata={EDIT_KEY: {"check": exercises[fn].name}},
                )
                for fn in mine
            ]
            continue
        runs = [
            n
            for n in tree.body
            if not isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))
        ]
        wanted = (
            set().union(*(needs.get(u, set()) for n in runs for u in _names(n))) if runs else set()
        )
        for name in bound:
            needs[name] = set().union(*(needs.get(u, set()) for n in tree.body for u in _names(n)))
        if wanted:
            names = ", ".join(f"`{fn}`" for fn in sorted(wanted))
            until = "they are" if len(wanted) > 1 else "it is"
            note = f"# Runs your {names}: it raises NotImplementedError until {until} written."
            lines = cell.source.splitlines()
            keep = 1 if lines and lines[0].startswith("# NBVAL") else 0
            cell.source = "\n".join(lines[:keep] + [note] + lines[keep:])
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    student = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    stable_cell_ids(student)
    return student


STUDENT_README = """# paralab labs: your copy

Each lab is one notebook, `labs/NN_name/*_lab.ipynb`: the whole lesson, with exercises in it.
Each lab's folder has a README listing its exercises.

## Install

Python 3.10 or later; a laptop CPU is enough (the "ranks" are processes on your machine).

    python -m venv .venv && . .venv/bin/activate
    pip install -r requirements.txt
    jupyter lab labs/

`requirements.txt` holds only what the hand-out runs: torch, numpy, matplotlib, cloudpickle,
JupyterLab, and this folder's `paralab` package. torch is pinned to one version; on Linux,
pip's default torch wheel is the CUDA build (several GB, it runs on a CPU too), so the file
points pip at PyTorch's CPU index and pip takes the CPU-only build (about 200 MB). On macOS the
torch wheel is CPU-only (with MPS) either way.

## Work

Where a lab asks you to write a function, its cell raises `NotImplementedError`. Write the
function there, run the cell, then run the `check(...)` cell under it: it runs your function
on real ranks and compares it, element by element, with the reference outputs shipped in
`src/paralab/exercises/expected/`. Cells that run your function say so on their first line.

## Hand in

The lab notebook file itself, under its own name (`cp_ring_vs_ulysses_lab.ipynb`). The
instructor's grader runs your functions again, on further cases you have not seen (other shapes
and world sizes): those carry the points; the visible cases add at most a tenth.

## What the grader refuses

The grader reads your answer only from the cells that held a `NotImplementedError` stub (the
notebook marks them); everything else in your notebook is ignored (the package's own helpers stay
available, as the package defines them), so a helper of your own goes in that cell. It runs your
code in a sandbox, without the package's solutions, and scores 0, with the reason, an answer that
breaks one of these rules:

{rules}

The `check` cell applies the same rules, so a refusal shows up there first, with the rule it broke.
""".format(rules="\n".join(f"- {rule[0].upper()}{rule[1:]}." for rule in RULE_LIST))
STUDENT_REQUIREMENTS = """# What the student hand-out runs, nothing more (no build, test, lint or site tools).
# On Linux, pip's default torch==2.13.0 is the CUDA build (several GB); this index serves the
# CPU-only build, which pip then prefers. On macOS the wheel is CPU-only either way.
--extra-index-url https://download.pytorch.org/whl/cpu
torch==2.13.0
numpy>=1.26
matplotlib>=3.8
cloudpickle>=3.0
jupyterlab>=4.0
-e .
"""


def student_lab_readme(lab: Path, notebook: str) -> str:
    """A lab's README for the hand-out: its title, the notebook to open, its exercises, how to
    hand in (the instructor's README speaks of sources, chapters and commands the hand-out lacks)."""
    readme = lab / "README.md"
    heading = next(
        (line[2:].strip() for line in readme.read_text().splitlines() if line.startswith("# ")),
        lab.name,
    )
    lines = [
        f"# {heading}",
        "",
        f"Open `{notebook}` (`jupyter lab` in this folder) and run it from the top: it is the "
        "whole lesson. Its exercises:",
        "",
    ]
    for e in for_lab(lab.name):
        fn = e.target.rsplit(".", 1)[1]
        lines.append(
            f"- `{fn}` ({e.points} point{'s' if e.points != 1 else ''}, about {e.minutes} min): "
            f"{e.hint}."
        )
    lines += [
        "",
        "For each, write the function where its cell raises `NotImplementedError`, run that cell, "
        "then the `check(...)` cell under it. Put everything your answer needs in that cell: it "
        'is all the grader reads (the hand-out\'s README, section "What the grader refuses", '
        "says why).",
        "",
        f"Hand in `{notebook}` itself, under this name.",
        "",
    ]
    return "\n".join(lines)


def write_student(out: Path, only: str | None = None) -> Path:
    """The hand-out: `out/` (labs, the package with solution regions stubbed, reference outputs of the
    visible checks, requirements) and `out.zip` with the same content. Returns the archive."""
    if out.exists():
        if not (out / ".paralab-student").exists():
            raise SystemExit(f"{out} exists and is not a student release; choose another --out")
        shutil.rmtree(out)
    labs = [source.parent.name for source in lab_sources(only) if for_lab(source.parent.name)]
    stub_package(out / "src" / "paralab", release_stub_message, contracts=True)
    expected_dir = out / "src" / "paralab" / "exercises" / "expected"
    expected_dir.mkdir()
    for lab in labs:
        for exercise in for_lab(lab):
            torch.save(
                {w: reference_world(exercise, w) for w in exercise.world_sizes},
                expected_dir / f"{exercise.name}.pt",
            )
        source = next(s for s in lab_sources(lab))
        (out / "labs" / lab).mkdir(parents=True)
        committed = nbformat.read(notebook_path(source), as_version=4)
        nbformat.write(
            student_notebook(committed, lab), out / "labs" / lab / notebook_path(source).name
        )
        (out / "labs" / lab / "README.md").write_text(
            student_lab_readme(source.parent, notebook_path(source).name)
        )
    shutil.copy(ROOT / "pyproject.toml", out / "pyproject.toml")
    (out / "requirements.txt").write_text(STUDENT_REQUIREMENTS)
    (out / "README.md").write_text(STUDENT_README)
    (out / ".paralab-student").write_text("written by python _build_nb.py --student\n")
    return Path(shutil.make_archive(str(out), "zip", out.parent, out.name))
