"""Read a handed-in notebook without trusting it.

Nothing a notebook prints, and none of its metadata, counts. A submission is

1. executed headless in a fresh kernel, each cell within a timeout: a notebook
   that hangs or kills its kernel scores zeros, with the reason;
2. read from its cell sources: for each exercise function of the lab, the
   student's last top-level definition of it, plus the top-level statements
   that bind the names it needs (imports, constants, helpers), nothing else;
3. screened: a definition that imports or names paralab's own version of an
   exercise function, imports modules other than torch and a few helpers of the
   standard library, loads code dynamically (`exec`, `getattr`, `open`, dunder
   attributes), or is a verbatim copy of the package's solution scores 0, with
   the reason;
4. run in a fresh process of its own (`python -m paralab.grade.submission`) against a
   copy of the package whose solutions raise, on the visible cases and on hidden
   ones drawn from the grading seed; its outputs come back as plain tensors and
   are compared, in the grader's own process, with the outputs of this
   package's solutions.

Tracebacks name the student's cell (`File "<cell 12>", line 5, in ring_pass`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import symtable
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import nbformat
import torch

from paralab.exercises import EXERCISES, Exercise, for_lab
from paralab.grade import (
    NOT_IMPLEMENTED,
    WITHHELD,
    WorldRun,
    case_outputs,
    cases_of,
    launch_world,
    learner_frames,
    reference_world,
    report,
    score,
)
from paralab.stubs import release_stub_message, stub_package, stub_regions

ALLOWED_IMPORTS = {
    "torch",
    "math",
    "numpy",
    "itertools",
    "functools",
    "collections",
    "dataclasses",
    "typing",
    "operator",
    "__future__",
    "paralab",
}
FORBIDDEN_CALLS = {
    "exec",
    "eval",
    "compile",
    "__import__",
    "open",
    "getattr",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "breakpoint",
    "input",
}
COPY_MIN_NODES = 30
"""A body this small (a one-line formula) is written alike by everyone: equal to the solution is no proof of a paste."""
TARGET_NAMES = {e.target.rsplit(".", 1)[1]: e for e in EXERCISES.values()}
_EXPECTED: dict[tuple, list] = {}


@dataclass
class Row:
    """One student × exercise line of the results."""

    student: str
    lab: str
    exercise: str
    points: float
    max_points: int
    verdict: str
    reason: str


def lab_of(path: Path) -> str | None:
    """The lab a notebook belongs to, from its file name (never from its metadata)."""
    labs = sorted({e.lab for e in EXERCISES.values()})
    name = path.name.lower()
    found = [lab for lab in labs if lab.split("_", 1)[1] in name or name.startswith(lab)]
    return found[0] if len(found) == 1 else None


def student_of(path: Path) -> str:
    """A submission's folder names the student when the file keeps the lab's name."""
    return path.parent.name if lab_of(path) and path.stem.endswith("_lab") else path.stem


@dataclass
class Statement:
    """One top-level statement of a code cell, as the student wrote it."""

    cell: int
    start: int
    text: str
    node: ast.stmt

    def binds(self) -> set[str]:
        node = self.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {node.name}
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return {(a.asname or a.name).split(".")[0] for a in node.names}
        targets = {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        return targets

    needed_for: set[str] = field(default_factory=set)
    """The names the grader took this statement for (the ones it binds that the definition needs)."""

    def uses(self) -> set[str]:
        """The global names the statement reads when it runs or when its functions are called."""
        table = symtable.symtable(self.text, f"<cell {self.cell}>", "exec")
        names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
        scopes = list(table.get_children())
        while scopes:
            scope = scopes.pop()
            names |= {
                s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced()
            }
            scopes += scope.get_children()
        return names


def statements(nb: nbformat.NotebookNode) -> list[Statement]:
    """Every top-level statement of every code cell, in notebook order (IPython magics blanked)."""
    found = []
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code":
            continue
        lines = [
            "" if line.lstrip().startswith(("%", "!")) else line
            for line in cell.source.splitlines()
        ]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        for node in tree.body:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found.append(
                Statement(number, start, "\n".join(lines[start - 1 : node.end_lineno]), node)
            )
    return found


def definition(stmts: list[Statement], name: str) -> list[Statement] | None:
    """The statements that make `name` what it is at the end of the notebook, in notebook order."""
    last: dict[str, int] = {}
    for i, s in enumerate(stmts):
        for bound in s.binds():
            last[bound] = i
    if name not in last:
        return None
    needed: dict[int, Statement] = {}
    todo = [name]
    while todo:
        wanted = todo.pop()
        index = last.get(wanted)
        if index is None:
            continue
        if index in needed:
            needed[index].needed_for.add(wanted)
            continue
        needed[index] = dataclasses.replace(stmts[index], needed_for={wanted})
        todo += sorted(stmts[index].uses() - set(dir(builtins)))
    return [needed[i] for i in sorted(needed)]


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The function's statements without its docstring."""
    first = fn.body[0]
    has_doc = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    return fn.body[1:] if has_doc else fn.body


def _solution_body(exercise: Exercise) -> tuple[str, int]:
    """The package function's body as an AST dump, and its number of nodes."""
    module_name, _, attr = exercise.target.rpartition(".")
    body = _body(
        ast.parse(inspect.getsource(getattr(importlib.import_module(module_name), attr))).body[0]
    )
    return ast.dump(ast.Module(body=body, type_ignores=[])), sum(
        1 for s in body for _ in ast.walk(s)
    )


def untouched(stmts: list[Statement], exercise: Exercise, name: str) -> bool:
    """Whether the definition is still the release's stub (then there is nothing to run)."""
    mine = next(
        (s.node for s in stmts if isinstance(s.node, ast.FunctionDef) and s.node.name == name), None
    )
    module_name, _, attr = exercise.target.rpartition(".")
    source = inspect.getsource(getattr(importlib.import_module(module_name), attr))
    stub = ast.parse(stub_regions(textwrap.dedent(source), release_stub_message)[0]).body[0]
    return mine is not None and ast.dump(ast.Module(_body(mine), [])) == ast.dump(
        ast.Module(_body(stub), [])
    )


def screen(stmts: list[Statement], exercise: Exercise, name: str) -> str | None:
    """Why this definition scores 0 without being run, or None."""
    for s in stmts:
        for node in ast.walk(s.node):
            where = f"cell {s.cell}, line {getattr(node, 'lineno', s.start)}"
            if isinstance(
                node, (ast.Import, ast.ImportFrom)
            ):  # only the names the definition needs count
                taken = [
                    a for a in node.names if (a.asname or a.name).split(".")[0] in s.needed_for
                ]
                modules = (
                    [a.name for a in taken]
                    if isinstance(node, ast.Import)
                    else [node.module or ""] * bool(taken)
                )
                for module in modules:
                    if module.split(".")[0] not in ALLOWED_IMPORTS or getattr(node, "level", 0):
                        return (
                            f"imports `{module}` ({where}); exercise code may import only "
                            f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}"
                        )
                for alias in taken:
                    if isinstance(node, ast.ImportFrom) and alias.name in TARGET_NAMES:
                        return f"imports paralab's own `{alias.name}` ({where}), the solution of an exercise"
            elif isinstance(node, ast.Attribute):
                if node.attr in TARGET_NAMES:
                    return (
                        f"uses paralab's own `{node.attr}` ({where}), the solution of an exercise"
                    )
                if node.attr.startswith("__") and node.attr.endswith("__"):
                    return f"reaches into `{node.attr}` ({where}); exercise code may not"
            elif isinstance(node, ast.Name) and node.id in FORBIDDEN_CALLS:
                return f"uses `{node.id}` ({where}); exercise code may not load or look up code dynamically"
    mine = next(
        (s.node for s in stmts if isinstance(s.node, ast.FunctionDef) and s.node.name == name), None
    )
    if mine is None:
        return (
            f"`{name}` is not a function defined in the notebook (a `def {name}(...)` is expected)"
        )
    solution, size = _solution_body(exercise)
    if (
        size >= COPY_MIN_NODES
        and ast.dump(ast.Module(body=_body(mine), type_ignores=[])) == solution
    ):
        return f"`{name}` is a verbatim copy of paralab's solution"
    return None


# --------------------------------------------------------------------------- the package without its solutions
@contextlib.contextmanager
def grading_copy() -> Iterator[Path]:
    """A copy of this package whose exercise solutions raise: the student's code runs against it."""
    with tempfile.TemporaryDirectory(prefix="paralab-grading-") as tmp:
        src = Path(tmp) / "src"
        stub_package(src / "paralab", lambda fn: f"paralab's own {fn} {WITHHELD}")
        yield src


# --------------------------------------------------------------------------- execution
def execute_headless(
    nb: nbformat.NotebookNode, cwd: Path, cell_timeout: float, package: Path
) -> str | None:
    """Run every cell in a fresh kernel (errors allowed); why the notebook could not be run through, or None."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    current = {"index": 0}
    client = NotebookClient(
        nb,
        timeout=cell_timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.on_cell_start = lambda cell, cell_index: current.update(index=cell_index + 1)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(package), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    try:
        client.execute(stderr=subprocess.DEVNULL, env=env)
    except CellTimeoutError:
        return f"hangs: cell {current['index']} did not finish within {cell_timeout:g} s"
    except DeadKernelError:
        return f"crashes: the kernel died in cell {current['index']}"
    except Exception as exc:  # noqa: BLE001 - any other reason the notebook cannot be run through
        return f"could not be run: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def run_definition(
    exercise: Exercise, name: str, stmts: list[Statement], seed: int, package: Path
) -> list:
    """Run the student's definition in a fresh process against the stubbed package; its WorldRuns (no reference yet)."""
    plan = [(w, False) for w in exercise.world_sizes] + [
        (w, True) for w in exercise.hidden_worlds()
    ]
    with tempfile.TemporaryDirectory(prefix="paralab-student-") as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.pt"
        job.write_text(
            json.dumps(
                {
                    "exercise": exercise.name,
                    "function": name,
                    "seed": seed,
                    "plan": plan,
                    "statements": [[s.cell, s.start, s.text] for s in stmts],
                }
            )
        )
        env = {**os.environ, "PYTHONPATH": str(package)}
        budget = exercise.timeout * len(plan) + 60
        try:
            done = subprocess.run(
                [sys.executable, "-m", "paralab.grade.submission", str(job), str(result)],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=budget,
            )
        except subprocess.TimeoutExpired:
            return [
                WorldRun(
                    w,
                    h,
                    failure=f"the grading process never finished within {budget:g} s",
                    failure_verdict="TIMEOUT",
                )
                for w, h in plan
            ]
        try:
            outcome = torch.load(result, weights_only=True)
        except Exception:  # noqa: BLE001 - no readable result: the student's code broke the process
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return [
                WorldRun(
                    w, h, failure=f"the grading process stopped (exit {done.returncode}): {tail[0]}"
                )
                for w, h in plan
            ]
    if isinstance(outcome, str):  # the definition could not even be loaded
        return [WorldRun(w, h, failure=outcome) for w, h in plan]
    return [
        WorldRun(
            r["world"],
            r["hidden"],
            r["actual"],
            failure=r["failure"],
            failure_verdict=r["verdict"] or "ERROR",
        )
        for r in outcome
    ]


def expected(exercise: Exercise, world: int, hidden: bool, seed: int) -> list:
    """The package solution's outputs, computed once per batch in the grader's own process."""
    key = (exercise.name, world, hidden, seed if hidden else None)
    if key not in _EXPECTED:
        _EXPECTED[key] = reference_world(exercise, world, hidden, seed)
    return _EXPECTED[key]


def grade_submission(path: Path, lab: str | None, seed: int, cell_timeout: float, package: Path):
    """(student, lab, rows, feedback per exercise, seconds spent re-running the notebook) for one submission."""
    student = student_of(path)
    if lab is None:
        return (
            student,
            "?",
            [],
            [f"{path}: cannot tell the lab from the file name; pass --lab"],
            0.0,
        )
    exercises = for_lab(lab)
    why_zero = None
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - not a notebook at all
        why_zero = f"is not a readable notebook ({type(exc).__name__})"
    started = time.monotonic()
    if why_zero is None:
        why_zero = execute_headless(
            nbformat.from_dict(nb), path.parent.resolve(), cell_timeout, package
        )
    run_s = time.monotonic() - started
    rows, feedback = [], []
    for exercise in exercises:
        name = exercise.target.rsplit(".", 1)[1]
        if why_zero:
            row = Row(
                student, lab, exercise.name, 0, exercise.points, "ERROR", f"the notebook {why_zero}"
            )
        elif (found := definition(statements(nb), name)) is None:
            row = Row(
                student,
                lab,
                exercise.name,
                0,
                exercise.points,
                "MISSING",
                f"no definition of `{name}`",
            )
        elif (refused := screen(found, exercise, name)) is not None:
            row = Row(student, lab, exercise.name, 0, exercise.points, "REFUSED", refused)
        elif untouched(found, exercise, name):
            row = Row(
                student,
                lab,
                exercise.name,
                0,
                exercise.points,
                NOT_IMPLEMENTED,
                f"still the release's stub; hint: {exercise.hint}",
            )
        else:
            runs = run_definition(exercise, name, found, seed, package)
            for w in runs:
                if not w.failure:
                    w.expected = expected(exercise, w.world, w.hidden, seed)
            outcome = score(exercise, runs)
            text = report(exercise, outcome)
            row = Row(
                student,
                lab,
                exercise.name,
                outcome.points,
                exercise.points,
                outcome.verdict,
                "\n".join(outcome.details),
            )
            feedback.append(text)
            rows.append(row)
            continue
        feedback.append(
            f"{exercise.name}: {row.verdict} — 0/{exercise.points} points\n  {row.reason}"
        )
        rows.append(row)
    return student, lab, rows, feedback, run_s


# --------------------------------------------------------------------------- the fresh process
def _only_stubs(result: dict) -> bool:
    return bool(result["actual"]) and all(
        not ok and out.startswith("NotImplementedError")
        for rank in result["actual"]
        for ok, out in rank
    )


def _worker(job_path: Path, result_path: Path) -> None:
    """Load the student's statements, run their function on every planned world, save plain outputs."""
    job = json.loads(job_path.read_text())
    exercise = EXERCISES[job["exercise"]]
    # A real module (dataclasses look their class's module up), whose functions and classes still
    # travel to the ranks by value: the ranks cannot import it.
    module = types.ModuleType("__student__")
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    try:
        for cell, start, text in job["statements"]:
            exec(compile("\n" * (start - 1) + text, f"<cell {cell}>", "exec"), module.__dict__)  # noqa: S102
        fn = module.__dict__[job["function"]]
    except Exception as exc:  # noqa: BLE001 - the student's cell fails on its own
        import traceback

        torch.save(
            "\n".join(
                [
                    f"defining it raised {type(exc).__name__}: {exc}",
                    *learner_frames(traceback.format_exc()),
                ]
            ),
            result_path,
        )
        return
    results: list[dict] = []
    for world, hidden in job["plan"]:
        if results and _only_stubs(
            results[0]
        ):  # an untouched stub raises everywhere: no need to launch again
            results.append(
                {
                    **results[0],
                    "world": world,
                    "hidden": hidden,
                    "actual": None,
                    "failure": results[0]["actual"][0][0][1].splitlines()[0],
                    "verdict": "ERROR",
                }
            )
            continue
        per_rank, why, verdict = launch_world(
            case_outputs,
            world,
            (fn, cases_of(exercise, hidden, job["seed"]), exercise.normalize),
            exercise.timeout,
        )
        results.append(
            {
                "world": world,
                "hidden": hidden,
                "actual": per_rank,
                "failure": why,
                "verdict": verdict,
            }
        )
    torch.save(results, result_path)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
