"""Build lab notebooks from their sources: `# show:` cells, exercise stubs, execution, staleness.

A lab source is a jupytext percent-format file, the only hand-edited form. A
code cell whose first line is

    # show: paralab.cp.ring_attention paralab.cp.merge_partials

is replaced by the source of those package objects, preceded by the imports
they need, so the notebook runs exactly the code the package (and the tests)
use, and a reader can edit the cell and re-run it. The algorithm lives once,
in `src/paralab/`. `_build_nb.py` at the repository root is the command line.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from paralab.exercises import for_lab

# The checkout this package is loaded from (src/paralab/notebooks.py -> the repository root).
ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "labs"
SHOW_MARKER = re.compile(r"^#\s*show:\s*(.+)$")
CHECKS_LINE = re.compile(r"^(\d+)/(\d+) passed\b", re.MULTILINE)
CELL_TIMEOUT_S = 600
# What JupyterLab writes for the ipykernel kernel: committing exactly this keeps
# a notebook from being marked modified as soon as it is opened.
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def lab_sources(only: str | None = None) -> list[Path]:
    sources = sorted(LABS.glob("*/*_lab.py"))
    if only:
        sources = [p for p in sources if p.parent.name == only or p.stem == only]
        if not sources:
            known = ", ".join(p.parent.name for p in sorted(LABS.glob("*/*_lab.py")))
            sys.exit(f"no lab named {only!r}; known labs: {known}")
    return sources


def _resolve(dotted: str) -> tuple[types.ModuleType, str, object]:
    """`pkg.module.name` or `pkg.module.Class.method` -> (module, qualified name, object)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        obj: object = module
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise SystemExit(f"# show: {dotted}: {attr!r} not found")
            obj = getattr(obj, attr)
        return module, ".".join(parts[cut:]), obj
    raise SystemExit(f"# show: {dotted}: no such module")


def _source(qualname: str, obj: object) -> str:
    """A method is shown as a function and re-attached, so editing the cell patches the class."""
    code = textwrap.dedent(inspect.getsource(obj)).rstrip()
    if "." in qualname:
        owner, name = qualname.rsplit(".", 1)
        code += f"\n\n\n{owner}.{name} = {name}"
    return code


def _free_names(source: str) -> list[str]:
    """Global names the shown code reads but does not define itself."""
    tree = ast.parse(source)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    defined |= {t.attr for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(tree):  # names bound locally anywhere are not globals of interest
        if isinstance(node, ast.arg):
            used.discard(node.arg)
    return sorted(used - defined - set(dir(builtins)))


def _import_lines(module: types.ModuleType, names: list[str]) -> list[str]:
    lines, from_names = [], []
    for name in names:
        if not hasattr(module, name):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}")
        else:
            from_names.append(name)
    if from_names:
        lines.append(f"from {module.__name__} import {', '.join(from_names)}")
    return lines


def show_cell(spec: str, shown_before: set[str] = frozenset()) -> tuple[str, set[str]]:
    """The code cell that replaces a `# show:` marker, and the names it defines.

    Names shown by an earlier cell are not imported again, so a reader's edit of
    that cell stays in force for the code shown after it.
    """
    objects = [_resolve(d) for d in spec.replace(",", " ").split()]
    modules = {m.__name__: m for m, _, _ in objects}
    if len(modules) != 1:
        raise SystemExit(f"# show: {spec} mixes modules; use one marker per module")
    module = next(iter(modules.values()))
    bodies = [_source(qualname, obj) for _, qualname, obj in objects]
    code = "\n\n\n".join(bodies)
    rel = Path(inspect.getsourcefile(module)).resolve().relative_to(ROOT)
    header = [f"# From {rel.as_posix()}: the code the package and its tests run. Edit and re-run to experiment."]
    if any("." in qualname for _, qualname, _ in objects):
        header.append("# Methods are re-attached to their class in this kernel; ranks import the package's copy.")
    header += _import_lines(module, [n for n in _free_names(code) if n not in shown_before])
    defined = {qualname for _, qualname, _ in objects if "." not in qualname}
    return "\n".join(header) + "\n\n\n" + code, defined


def build(source: Path) -> nbformat.NotebookNode:
    nb = jupytext.read(source, fmt="py:percent")
    shown: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        match = SHOW_MARKER.match(first)
        if match:
            cell.source, defined = show_cell(match.group(1), shown)
            shown |= defined
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.pop("jupytext", None)
    stable_cell_ids(nb)
    return nb


def stable_cell_ids(nb: nbformat.NotebookNode) -> None:
    """Cell ids from each cell's content (nbformat draws random ones), so a rebuild
    of an unchanged lab keeps them and an edit changes only the edited cell's id."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


def strip_volatile(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes on every run or machine but teaches nothing: execution
    timestamps in each cell, and the Python patch version of the building machine.
    Rebuilding an unchanged lab then changes only outputs that truly vary."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata.get("language_info", {}).pop("version", None)
    return nb


def volatile_metadata(nb: nbformat.NotebookNode) -> str | None:
    """Why a committed notebook carries volatile or non-JupyterLab metadata, or None."""
    for i, cell in enumerate(nb.cells):
        if "execution" in cell.metadata:
            return f"cell {i} carries execution timestamps"
    if "version" in nb.metadata.get("language_info", {}):
        return "language_info carries the building machine's Python version"
    if nb.metadata.get("kernelspec") != KERNELSPEC:
        return f"kernelspec is {nb.metadata.get('kernelspec')}, not {KERNELSPEC}"
    return None


SOLUTION_REGION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION\n", re.DOTALL | re.MULTILINE)


def stub_out(code: str, name: str, hint: str) -> str:
    """Each solution region becomes a stub that raises, as nbgrader would make it."""
    def stub(match: re.Match) -> str:
        indent = match.group("indent")
        return f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError({f'{name}: {hint}'!r})\n"

    stubbed, count = SOLUTION_REGION.subn(stub, code + "\n")
    if count == 0:
        raise SystemExit(f"exercise {name}: its target has no ### BEGIN SOLUTION / ### END SOLUTION region")
    return stubbed.rstrip()


def exercise_notebook(lab: str, filename: str, solved: bool = False) -> nbformat.NotebookNode:
    """The student notebook of one lab: per exercise, the prompt, the function to fill in, its check."""
    exercises = for_lab(lab)
    cells = [nbformat.v4.new_markdown_cell(
        f"# Exercises — lab {lab}\n\n"
        "Fill in every function below where it raises `NotImplementedError`, then run the check cell "
        "under it: it runs your function on real ranks, compares it element by element with the "
        "reference and tells you what differs. The lab notebook beside this one explains the ideas. "
        f"Grade the whole notebook with `python -m paralab.grade {filename}`."
    ), nbformat.v4.new_code_cell("from paralab.grade import check")]
    for number, exercise in enumerate(exercises, 1):
        code, _ = show_cell(exercise.target)
        code = code.split("\n", 1)[1]  # drop the "From src/...: edit and re-run" line
        name = exercise.target.rsplit(".", 1)[1]
        if not solved:
            code = stub_out(code, exercise.name, exercise.hint)
        cells += [
            nbformat.v4.new_markdown_cell(
                f"## Exercise {number}: `{name}` ({exercise.points} point{'s' if exercise.points != 1 else ''}, about {exercise.minutes} min)\n\n"
                f"{exercise.prompt}"),
            nbformat.v4.new_code_cell(code),
            nbformat.v4.new_code_cell(f'check("{exercise.name}", {name})'),
        ]
    nb = nbformat.v4.new_notebook(cells=cells)
    stable_cell_ids(nb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["paralab"] = {"lab": lab}
    return nb


def write_exercises(only: str | None = None) -> list[Path]:
    written = []
    for source in lab_sources(only):
        lab = source.parent.name
        if not for_lab(lab):
            continue
        target = source.with_name(source.stem.removesuffix("_lab") + "_exercise.ipynb")
        nbformat.write(exercise_notebook(lab, target.name), target)
        written.append(target)
    return written


def notebook_path(source: Path) -> Path:
    return source.with_suffix(".ipynb")


def _kernel_env() -> None:
    """Kernels import this checkout's package, wherever it is (clones, worktrees)."""
    src = str(ROOT / "src")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if src not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([src, *filter(None, paths)])


def execute(nb: nbformat.NotebookNode, cwd: Path) -> tuple[bool, str]:
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log lines; cell errors still arrive
    except CellExecutionError as exc:
        return False, str(exc).strip().splitlines()[-1][:300]
    tables = [(int(p), int(t)) for cell in nb.cells for out in cell.get("outputs", [])
              if out.get("output_type") == "stream" for p, t in CHECKS_LINE.findall(out.get("text", ""))]
    if not tables:
        return False, "no verdict table printed (expected lines like '12/12 passed')"
    passed, total = sum(p for p, _ in tables), sum(t for _, t in tables)  # each check is printed once
    ok = all(p == t for p, t in tables)
    return ok, f"{passed}/{total} checks passed"


def stale(source: Path) -> str | None:
    """Why the committed notebook differs from a fresh build, or None."""
    target = notebook_path(source)
    if not target.exists():
        return "notebook missing"
    committed = nbformat.read(target, as_version=4)
    fresh = build(source)
    have = [(c.cell_type, c.source) for c in committed.cells]
    want = [(c.cell_type, c.source) for c in fresh.cells]
    if have != want:
        for i, (h, w) in enumerate(zip(have, want)):
            if h != w:
                return f"cell {i} differs from its source (rebuild with _build_nb.py --execute)"
        return f"{len(have)} cells committed, {len(want)} built"
    if any(c.cell_type == "code" and c.source.strip() and not c.get("outputs") and c.get("execution_count") is None
           for c in committed.cells):
        return "not executed (rebuild with _build_nb.py --execute)"
    why = volatile_metadata(committed)
    return f"{why} (rebuild with _build_nb.py --execute)" if why else None


def build_labs(sources: list[Path], run: bool) -> bool:
    """Build (and with `run`, execute) each lab notebook, one line per lab; True if every run passed."""
    _kernel_env()
    all_ok = True
    for source in sources:
        start = time.monotonic()
        nb = build(source)
        verdict = "built"
        if run:
            ok, verdict = execute(nb, source.parent)
            all_ok &= ok
            verdict = ("ok    " if ok else "FAILED ") + verdict
        nbformat.write(strip_volatile(nb), notebook_path(source))
        print(f"{source.parent.name:<24} {verdict:<40} {time.monotonic() - start:6.1f} s", flush=True)
    return all_ok
