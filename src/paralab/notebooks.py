"""Build lab notebooks from their sources: `# show:` cells, execution, staleness, measures.

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
import datetime
import hashlib
import importlib
import inspect
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from paralab.notebook_format import nbformat  # first: jupytext and nbclient import it too

# isort: split
import jupytext
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

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
    """Every lab's source or, with `only`, the one lab its folder name (or a unique prefix) names."""
    sources = sorted(LABS.glob("*/*_lab.py"))
    if not only:
        return sources
    exact = [p for p in sources if only in (p.parent.name, p.stem)]
    chosen = exact or [p for p in sources if p.parent.name.startswith(only)]
    known = ", ".join(p.parent.name for p in (chosen if len(chosen) > 1 else sources))
    if not chosen:
        sys.exit(f"no lab named {only!r}; known labs: {known}")
    if len(chosen) > 1:
        sys.exit(f"{only!r} names {len(chosen)} labs: {known}; give more of the name")
    return chosen


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


def _source(obj: object) -> str:
    """A method is shown as a function: the header's patch set hands an edit of it to its class."""
    return textwrap.dedent(inspect.getsource(obj)).rstrip()


def _free_names(source: str) -> list[str]:
    """Global names the shown code reads but does not define itself."""
    tree = ast.parse(source)
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
    }
    defined |= {
        t.attr
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute)
    }
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
            lines.append(
                f"import {value.__name__}"
                if value.__name__ == name
                else f"import {value.__name__} as {name}"
            )
        else:
            from_names.append(name)
    if from_names:
        lines.append(f"from {module.__name__} import {', '.join(from_names)}")
    return lines


def edit_patches(objects: list[tuple[types.ModuleType, str, object]]) -> str:
    """The patch set, as source text, that hands this cell's names to the package's callers."""
    owners: dict[str, list[str]] = {}
    for module, qualname, _ in objects:
        owner, _, name = f"{module.__name__}.{qualname}".rpartition(".")
        owners.setdefault(owner, []).append(name)
    return (
        "{"
        + ", ".join(
            f'"{owner}": {{' + ", ".join(f'"{n}": {n}' for n in names) + "}"
            for owner, names in owners.items()
        )
        + "}"
    )


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
    bodies = [_source(obj) for _, _, obj in objects]
    code = "\n\n\n".join(bodies)
    rel = Path(inspect.getsourcefile(module)).resolve().relative_to(ROOT)
    header = [
        f"# From {rel.as_posix()}: the code the package and its tests run. To run your edit of it,",
        "# hand it over: run(..., patches=EDIT) on the ranks, `with patched(EDIT):` in this kernel,",
        f"# EDIT = {edit_patches(objects)}",
    ]
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
        if cell.metadata.get("jupyter", {}).get("outputs_hidden"):
            cell.metadata["collapsed"] = (
                True  # what JupyterLab writes for a folded output; else the tab opens "modified"
            )
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
    """Drop what changes on every run but teaches nothing: execution timestamps in each cell.
    Rebuilding an unchanged lab then changes only outputs that truly vary.

    `language_info.version` stays: the kernel writes it back the moment JupyterLab
    opens the notebook, so stripping it would mark every lab "modified" on open.
    """
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def volatile_metadata(nb: nbformat.NotebookNode) -> str | None:
    """Why a committed notebook carries volatile or non-JupyterLab metadata, or None."""
    for i, cell in enumerate(nb.cells):
        if "execution" in cell.metadata:
            return f"cell {i} carries execution timestamps"
    if nb.metadata.get("kernelspec") != KERNELSPEC:
        return f"kernelspec is {nb.metadata.get('kernelspec')}, not {KERNELSPEC}"
    return None


def notebook_path(source: Path) -> Path:
    return source.with_suffix(".ipynb")


def _kernel_env() -> None:
    """Kernels import this checkout's package, wherever it is (clones, worktrees), and run one
    intra-op thread, as ranks do: two labs run at once, each kernel beside its own ranks, and
    OpenMP threads that outnumber the cores spin instead of working (measured in conftest.py)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    src = str(ROOT / "src")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if src not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([src, *filter(None, paths)])


def execute(nb: nbformat.NotebookNode, cwd: Path) -> tuple[bool, str]:
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        client.execute(
            stderr=subprocess.DEVNULL
        )  # the kernel's own log lines; cell errors still arrive
    except CellExecutionError as exc:
        return False, str(exc).strip().splitlines()[-1][:300]
    tables = [
        (int(p), int(t))
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
        for p, t in CHECKS_LINE.findall(out.get("text", ""))
    ]
    if not tables:
        return False, "no verdict table printed (expected lines like '12/12 passed')"
    passed, total = (
        sum(p for p, _ in tables),
        sum(t for _, t in tables),
    )  # each check is printed once
    ok = all(p == t for p, t in tables)
    return ok, f"{passed}/{total} checks passed"


def stale(source: Path) -> str | None:
    """Why the committed notebook differs from a fresh build, or None."""
    target = notebook_path(source)
    if not target.exists():
        return "notebook missing"
    try:
        committed = nbformat.read(target, as_version=4)
        have = [(c.cell_type, c.source) for c in committed.cells]
    except Exception as exc:  # noqa: BLE001 - truncated, empty, `{}`: whatever the file holds
        return f"corrupt notebook {target}: {type(exc).__name__}: {str(exc)[:200]}"
    fresh = build(source)
    want = [(c.cell_type, c.source) for c in fresh.cells]
    if have != want:
        for i, (h, w) in enumerate(zip(have, want)):
            if h != w:
                return f"cell {i} differs from its source (rebuild with _build_nb.py --execute)"
        return f"{len(have)} cells committed, {len(want)} built"
    if any(
        c.cell_type == "code"
        and c.source.strip()
        and not c.get("outputs")
        and c.get("execution_count") is None
        for c in committed.cells
    ):
        return "not executed (rebuild with _build_nb.py --execute)"
    why = volatile_metadata(committed)
    return f"{why} (rebuild with _build_nb.py --execute)" if why else None


VERDICT_HEADER = re.compile(
    r"^(tensor\s+shape\s+dtype\s+max \|diff\||claim\s+observed)\s+verdict$"
)  # tensors / claims
SHOWN_HEADER = "# From src/"
MAX_VISIBLE_CELL_LINES = 45
"""The longest code cell a reader may meet unfolded: past it, fold plumbing or show less."""


@dataclass
class Measure:
    """How much a reader meets in one executed notebook: visible code, longest cell, verdicts, pictures."""

    lab: str
    code_lines: int
    """Lines of visible code cells (a cell folded with `jupyter.source_hidden` is not visible)."""
    package_lines: int
    """Of those, lines in cells made by `# show:` markers (package source)."""
    longest_cell: int
    """Lines of the longest visible code cell."""
    check_rows: int
    """Rows of verdict tables: lines between a table's header rule and its `N/M passed` line."""
    check_tables: int
    folded_rows: int
    """Of `check_rows`, those in outputs folded with `jupyter.outputs_hidden` (detail kept, not in the way)."""
    pictures: int
    """Image outputs (png, jpeg, svg)."""


def _output_texts(cell: nbformat.NotebookNode):
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            yield out.get("text", "")
        else:
            yield out.get("data", {}).get("text/plain", "")


def verdict_rows(text: str) -> list[int]:
    """Row count of each verdict table (`paralab.check.verdict_table`) printed in `text`."""
    counts, rows = [], None
    for line in text.splitlines():
        if VERDICT_HEADER.match(line.strip()):
            rows = -1  # the dashed rule under the header comes next
        elif rows is not None and CHECKS_LINE.match(line):
            counts.append(rows)
            rows = None
        elif rows is not None:
            rows += 1
    return counts


def measure(nb: nbformat.NotebookNode, lab: str = "") -> Measure:
    """Visible code, longest visible cell, verdict-table rows and pictures of an executed notebook."""
    visible = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and c.source.strip()
        and not c.metadata.get("jupyter", {}).get("source_hidden")
    ]
    sizes = [len(c.source.splitlines()) for c in visible]
    tables = [
        (n, bool(c.metadata.get("jupyter", {}).get("outputs_hidden")))
        for c in nb.cells
        if c.cell_type == "code"
        for t in _output_texts(c)
        for n in verdict_rows(t)
    ]
    pictures = sum(
        1
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.get("outputs", [])
        if any(k.startswith("image/") for k in out.get("data", {}))
    )
    return Measure(
        lab,
        sum(sizes),
        sum(n for c, n in zip(visible, sizes) if c.source.startswith(SHOWN_HEADER)),
        max(sizes, default=0),
        sum(n for n, _ in tables),
        len(tables),
        sum(n for n, folded in tables if folded),
        pictures,
    )


def measure_labs(sources: list[Path]) -> str:
    """The measuring table for the committed notebooks of `sources`."""
    from paralab.tables import text_table

    rows = []
    for source in sources:
        m = measure(nbformat.read(notebook_path(source), as_version=4), source.parent.name)
        rows.append(
            (
                m.lab,
                f"{m.code_lines} ({m.package_lines} package)",
                f"{m.longest_cell}"
                + (" (too long)" if m.longest_cell > MAX_VISIBLE_CELL_LINES else ""),
                f"{m.check_rows} in {m.check_tables} tables"
                + (f" ({m.folded_rows} folded)" if m.folded_rows else ""),
                m.pictures,
            )
        )
    return text_table(
        ("lab", "code lines shown", "longest code cell", "check rows", "pictures"),
        rows,
        align_right=(2, 4),
    )


def build_labs(sources: list[Path], run: bool, jobs: int = 1) -> bool:
    """Build (and with `run`, execute) each lab notebook, one line per lab, in the labs' order;
    True if every run passed. With `jobs` > 1 that many labs run at once, each in its own
    process and kernel: a lab leaves cores idle while its kernel plots or waits on ranks."""
    _kernel_env()
    all_ok = True
    if jobs > 1 and len(sources) > 1:
        context = multiprocessing.get_context("spawn")  # never fork a process that ran kernels
        with ProcessPoolExecutor(min(jobs, len(sources)), mp_context=context) as pool:
            for ok, line in pool.map(_build_one, sources, [run] * len(sources)):
                all_ok &= ok
                print(line, flush=True)
        return all_ok
    for source in sources:
        ok, line = _build_one(source, run)
        all_ok &= ok
        print(line, flush=True)
    return all_ok


def _build_one(source: Path, run: bool) -> tuple[bool, str]:
    """One lab built (and executed), written, and its line: folder, verdict, seconds."""
    start = time.monotonic()
    nb = build(source)
    ok, verdict = True, "built"
    if run:
        ok, verdict = execute(nb, source.parent)
        verdict = ("ok    " if ok else "FAILED ") + verdict
    nbformat.write(strip_volatile(nb), notebook_path(source))
    return ok, f"{source.parent.name:<24} {verdict:<40} {time.monotonic() - start:6.1f} s"


@dataclass
class Profile:
    """Where one lab's run time goes, measured by executing it once."""

    lab: str
    total: float
    kernel_start: float
    first_cell: float
    launches: list[tuple[int, float]]
    slowest: list[tuple[float, int, str]]
    """(seconds, cell index, the cell's first code line), slowest first."""


def _cell_seconds(cell: nbformat.NotebookNode) -> tuple[float, float] | None:
    timing = cell.metadata.get("execution", {})
    begin, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (begin and end):
        return None
    parse = datetime.datetime.fromisoformat
    return parse(begin.replace("Z", "+00:00")).timestamp(), parse(
        end.replace("Z", "+00:00")
    ).timestamp()


def profile(source: Path) -> Profile:
    """Execute one lab with per-cell timing and a log of every `launch.run` its kernel makes."""
    _kernel_env()
    nb = build(source)
    with tempfile.TemporaryDirectory(prefix="paralab-profile-") as tmp:
        log = Path(tmp) / "launches.tsv"
        os.environ["PARALAB_LAUNCH_LOG"] = str(log)
        try:
            client = NotebookClient(
                nb,
                timeout=CELL_TIMEOUT_S,
                kernel_name="python3",
                resources={"metadata": {"path": str(source.parent)}},
                record_timing=True,
            )
            started = time.time()
            client.execute(stderr=subprocess.DEVNULL)
            total = time.time() - started
        finally:
            del os.environ["PARALAB_LAUNCH_LOG"]
        launches = [
            (int(world), float(seconds))
            for world, seconds in (
                line.split("\t")
                for line in (log.read_text() if log.exists() else "").split("\n")
                if line
            )
        ]
    spans = [
        (i, span)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (span := _cell_seconds(c))
    ]
    cells = sorted(
        (
            (
                end - begin,
                i,
                next(
                    (
                        ln
                        for ln in nb.cells[i].source.splitlines()
                        if ln.strip() and not ln.startswith("#")
                    ),
                    "",
                )[:50],
            )
            for i, (begin, end) in spans
        ),
        reverse=True,
    )
    first_begin = spans[0][1][0] if spans else started
    first_cell = spans[0][1][1] - spans[0][1][0] if spans else 0.0
    return Profile(
        source.parent.name, total, first_begin - started, first_cell, launches, cells[:3]
    )


_FORK_PROBE = """
import os, time
started = time.monotonic()
import torch
imported = time.monotonic() - started
forks = []
for _ in range(9):
    started = time.monotonic()
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    forks.append(time.monotonic() - started)
print(imported, sorted(forks)[4])
"""


def machine_yardstick(additions: int = 5_000_000, repeats: int = 3) -> str:
    """How fast this machine is now: timings taken on two machines compare only through this.

    The suite's wall time has differed twofold between two sessions' 2-core VMs. A pure-Python
    loop measures the CPU; `import torch` in a fresh interpreter, and forking that interpreter
    (what each rank's launch pays), measure the memory and the kernel. Each is the best of
    `repeats`; a fork is the median of nine.
    """
    loops, imports, forks = [], [], []
    for _ in range(repeats):
        started, total = time.process_time(), 0
        for i in range(additions):
            total += i
        loops.append(time.process_time() - started)
        probe = [sys.executable, "-c", _FORK_PROBE]
        imported, forked = subprocess.run(probe, check=True, capture_output=True).stdout.split()
        imports.append(float(imported))
        forks.append(float(forked))
    return (
        f"machine yardstick: {additions:,} Python additions {min(loops):.2f} s of CPU, "
        f"`import torch` {min(imports):.2f} s, a fork of that process {min(forks) * 1e3:.1f} ms"
    )


def profile_labs(sources: list[Path]) -> str:
    """The table of where each lab's time goes: kernel start, imports, launches, slowest cells."""
    from paralab.tables import text_table

    rows, grand = [], 0.0
    for source in sources:
        p = profile(source)
        grand += p.total
        launched = sum(s for _, s in p.launches)
        worlds = sorted({w for w, _ in p.launches})
        rows.append(
            [
                p.lab,
                f"{p.total:.1f}",
                f"{p.kernel_start:.1f}",
                f"{p.first_cell:.1f}",
                f"{len(p.launches)} x {launched / max(len(p.launches), 1):.2f}"
                + (f" (w {','.join(map(str, worlds))})" if worlds else ""),
                f"{launched:.1f}",
                "; ".join(f"[{i}] {s:.1f} s {line}" for s, i, line in p.slowest),
            ]
        )
        print(f"profiled {p.lab} ({p.total:.1f} s)", file=sys.stderr, flush=True)
    header = [
        "lab",
        "total s",
        "kernel s",
        "imports s",
        "launches",
        "in launches s",
        "slowest cells",
    ]
    total = f"all labs, one after another: {grand:.1f} s"
    return "\n".join([text_table(header, rows), total, machine_yardstick()])
