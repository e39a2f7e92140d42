"""Build the lab notebooks from their sources, and optionally execute them.

    python _build_nb.py                 # labs/*/*_lab.py -> .ipynb (no outputs)
    python _build_nb.py --execute       # build and run every lab, store outputs
    python _build_nb.py --check         # fail if a committed notebook is stale
    python _build_nb.py --lab 01_fsdp_hsdp --execute

A lab source is a jupytext percent-format file, the only hand-edited form. A
code cell whose first line is

    # show: paralab.cp.ring_attention paralab.cp.merge_partials

is replaced by the source of those package objects, preceded by the imports
they need, so the notebook runs exactly the code the package (and the tests)
use, and a reader can edit the cell and re-run it. The algorithm lives once,
in `src/paralab/`.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import os
import re
import sys
import time
import types
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent
LABS = ROOT / "labs"
SHOW_MARKER = re.compile(r"^#\s*show:\s*(.+)$")
CHECKS_LINE = re.compile(r"^(\d+)/(\d+) passed\b", re.MULTILINE)
CELL_TIMEOUT_S = 600


def lab_sources(only: str | None = None) -> list[Path]:
    sources = sorted(LABS.glob("*/*_lab.py"))
    if only:
        sources = [p for p in sources if p.parent.name == only or p.stem == only]
        if not sources:
            known = ", ".join(p.parent.name for p in sorted(LABS.glob("*/*_lab.py")))
            sys.exit(f"no lab named {only!r}; known labs: {known}")
    return sources


def _resolve(dotted: str) -> tuple[types.ModuleType, str, object]:
    module_name, _, attr = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise SystemExit(f"# show: {dotted} does not exist in {module_name}")
    return module, attr, getattr(module, attr)


def _free_names(source: str) -> list[str]:
    """Global names the shown code reads but does not define itself."""
    tree = ast.parse(source)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
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


def show_cell(spec: str, shown: set[str] | None = None) -> str:
    """The code cell that replaces a `# show:` marker.

    `shown` holds the names earlier show cells of the notebook define: they are
    not imported again, so an edited earlier cell stays in effect on Run All.
    """
    objects = [_resolve(d) for d in spec.replace(",", " ").split()]
    modules = {m.__name__: m for m, _, _ in objects}
    if len(modules) != 1:
        raise SystemExit(f"# show: {spec} mixes modules; use one marker per module")
    module = next(iter(modules.values()))
    bodies = [inspect.getsource(obj).rstrip() for _, _, obj in objects]
    code = "\n\n\n".join(bodies)
    rel = Path(inspect.getsourcefile(module)).resolve().relative_to(ROOT)
    header = [f"# From {rel.as_posix()}: the code the package and its tests run. Edit and re-run to experiment."]
    header += _import_lines(module, [n for n in _free_names(code) if n not in (shown or set())])
    if shown is not None:
        shown.update(attr for _, attr, _ in objects)
    return "\n".join(header) + "\n\n\n" + code


def build(source: Path) -> nbformat.NotebookNode:
    nb = jupytext.read(source, fmt="py:percent")
    shown: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        match = SHOW_MARKER.match(first)
        if match:
            cell.source = show_cell(match.group(1), shown)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.pop("jupytext", None)
    return nb


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
        client.execute()
    except CellExecutionError as exc:
        return False, str(exc).strip().splitlines()[-1][:300]
    passed = total = 0
    failures = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for p, t in CHECKS_LINE.findall(text):
                passed, total = passed + int(p), total + int(t)
                failures += int(p) < int(t)
    if total == 0:
        return False, "no verdict table printed (expected lines like '12/12 passed')"
    ok = failures == 0
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
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execute", action="store_true", help="run each notebook and store its outputs")
    parser.add_argument("--check", action="store_true", help="fail if a committed notebook is stale")
    parser.add_argument("--lab", help="one lab, by folder name (e.g. 00_parallel_dims)")
    args = parser.parse_args(argv)
    sources = lab_sources(args.lab)
    if args.check:
        problems = [(s, stale(s)) for s in sources]
        for s, why in problems:
            print(f"{s.parent.name:<24} {'stale: ' + why if why else 'up to date'}")
        return 1 if any(why for _, why in problems) else 0
    _kernel_env()
    all_ok = True
    for source in sources:
        start = time.monotonic()
        nb = build(source)
        verdict = "built"
        if args.execute:
            ok, verdict = execute(nb, source.parent)
            all_ok &= ok
            verdict = ("ok    " if ok else "FAILED ") + verdict
        nbformat.write(nb, notebook_path(source))
        print(f"{source.parent.name:<24} {verdict:<40} {time.monotonic() - start:6.1f} s", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
