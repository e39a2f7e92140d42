"""Grade handed-in notebooks without trusting them, and without one hurting another.

Nothing a notebook prints, and none of its outputs, count, and the notebook is never run as a
whole. A submission is

1. read once, into the grader's memory, before any student code runs;
2. read from the cells the release marks as the student's (`paralab.grade.code`): for each
   exercise function, its definition there and the statements of those cells it needs;
3. screened by the rules the notebook's check cell applies too (a refusal scores 0, with its rule);
4. run in a sandbox (`paralab.grade.sandbox`) against its own throwaway copy of the package with
   every solution stubbed, all of the lab's exercises in one process, within one time budget:
   the visible cases and the hidden ones, drawn from a seed derived from the grading seed (the
   grading seed itself never reaches the student's process);
5. judged in the grader's own process: the raw outputs come back over a pipe the grader opened,
   are checked against the grader's plan (every planned world, every case, nothing else), are
   refused when they are not plain tensors and containers, and are compared with the outputs of
   this package's solutions, computed by the grader.

Tracebacks name the student's cell (`File "<cell 12>", line 5, in ring_pass`).
"""

from __future__ import annotations

import argparse
import ast
import compileall
import functools
import hashlib
import io
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from paralab.exercises import EXERCISES, Exercise, for_lab
from paralab.grade import (
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
from paralab.grade.code import (
    cell_statements,
    definition,
    load,
    refusal,
    statements,
    syntax_errors,
)
from paralab.grade.sandbox import (
    INSIDE_PACKAGE,
    MEMORY_BYTES,
    RESULT_BYTES,
    Zygote,
    bwrap,
    gibibytes,
    run_sandboxed,
)
from paralab.launch import start_forkserver
from paralab.stubs import stub_package

WORKER = "paralab.grade.submission"
FRAME = struct.Struct(">Q")
UNREADABLE = object()
"""A result frame the grader's safe loader refused."""
MAX_NODES = 100_000
MAX_DEPTH = 32
MAX_TEXT = 2000
STARTED = {"paralab": "the student's code begins"}
"""The sandboxed process's first result frame, sent before any student code runs. A process that
died without it died in the grader's own start (interpreter, imports): its output holds no case
and says why. Once the student's code ran, the output may hold hidden cases' data, and the
process could have rewritten any part of it, so it is never quoted."""
CAUSE_LINES = 6
"""How many of its last output lines say why a grading process died."""
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


@dataclass
class Submission:
    """A handed-in notebook as the grader read it, before any of it ran."""

    path: Path
    student: str
    lab: str | None
    cells: list[dict] = field(default_factory=list)
    unreadable: str = ""


@dataclass
class Graded:
    submission: Submission
    rows: list[Row]
    feedback: list[str]
    seconds: float = 0.0
    stopped: str = ""
    """Why its grading process gave no result at all (with its last output lines), else empty."""


def lab_of(path: Path) -> str | None:
    """The lab a notebook belongs to, from its file name (never from its metadata)."""
    labs = sorted({e.lab for e in EXERCISES.values()})
    name = path.name.lower()
    found = [lab for lab in labs if lab.split("_", 1)[1] in name or name.startswith(lab)]
    return found[0] if len(found) == 1 else None


def student_of(path: Path) -> str:
    """A submission's folder names the student when the file keeps the lab's name."""
    return path.parent.name if lab_of(path) and path.stem.endswith("_lab") else path.stem


def read_submission(path: Path, lab: str | None) -> Submission:
    """The notebook's cells, in memory: later changes to the file (by anyone) change nothing."""
    from paralab.notebook_format import nbformat  # here, not at the top: the sandboxed worker
    # never reads a notebook, and would pay for the import once per submission

    submission = Submission(path, student_of(path), lab or lab_of(path))
    try:
        nb = nbformat.reads(path.read_text(), as_version=4)
        submission.cells = [
            {
                "cell_type": str(c.get("cell_type", "")),
                "source": str(c.get("source", "")),
                "metadata": dict(c.get("metadata", {})),
            }
            for c in nb.cells
        ]
    except Exception as exc:  # noqa: BLE001 - not a notebook at all
        submission.unreadable = f"is not a readable notebook ({type(exc).__name__})"
    return submission


def hidden_seed(seed: int, exercise: Exercise) -> int:
    """The seed the hidden cases of one exercise are drawn from: it reveals nothing of `seed`."""
    digest = hashlib.sha256(f"paralab hidden cases:{seed}:{exercise.name}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def plan_of(exercise: Exercise) -> list[tuple[int, bool]]:
    """Every (world size, hidden) the grader runs, in order: a result must match it exactly."""
    return [(w, False) for w in exercise.world_sizes] + [
        (w, True) for w in exercise.hidden_worlds()
    ]


def expected(exercise: Exercise, world: int, hidden: bool, seed: int) -> list:
    """The package solution's outputs, computed once per batch in the grader's own process."""
    key = _expected_key(exercise, world, hidden, seed)
    if key not in _EXPECTED:
        _EXPECTED[key] = reference_world(exercise, world, hidden, key[3] or 0)
    return _EXPECTED[key]


def _expected_key(exercise: Exercise, world: int, hidden: bool, seed: int) -> tuple:
    return (exercise.name, world, hidden, hidden_seed(seed, exercise) if hidden else None)


def _each_case_outputs(
    runs: list[tuple], rank: int | None = None, world: int | None = None
) -> list:
    """On every rank: `case_outputs` of each (solution, cases, normalize) in turn, on fresh cases."""
    return [case_outputs(*run, rank, world) for run in runs]


def expect_all(exercises: list[Exercise], seed: int) -> None:
    """`expected` of every planned world of `exercises`, the missing references of one world size
    computed in one launch (a launch of ranks costs more than most references). Where that launch
    or a reference in it fails, each is computed alone, so the error names its exercise."""
    missing: dict[int, list[tuple[Exercise, bool]]] = {}
    for exercise in exercises:
        for world, hidden in plan_of(exercise):
            if world and _expected_key(exercise, world, hidden, seed) not in _EXPECTED:
                missing.setdefault(world, []).append((exercise, hidden))
    for world, planned in missing.items():
        runs = [
            (
                e.reference(),
                cases_of(e, hidden, _expected_key(e, world, hidden, seed)[3] or 0),
                e.normalize,
            )
            for e, hidden in planned
        ]
        timeout = sum(max(4 * e.timeout, 120) for e, _ in planned)
        per_rank, _, _ = launch_world(_each_case_outputs, world, (runs,), timeout)
        for k, (exercise, hidden) in enumerate(planned):
            outputs = [rank[k] for rank in per_rank] if per_rank else None
            if outputs and all(ok for rank in outputs for ok, _ in rank):
                key = _expected_key(exercise, world, hidden, seed)
                _EXPECTED[key] = [[out for _, out in rank] for rank in outputs]
    for exercise in exercises:
        for world, hidden in plan_of(exercise):
            expected(exercise, world, hidden, seed)


# --------------------------------------------------------------------------- what comes back
class Refused(ValueError):
    """A result the grader will not compare: not the grader's plan, or not plain values."""


def plain(value: Any, budget: list[int], depth: int = 0) -> Any:
    """`value` if it is plain tensors (strided, not a subclass) in plain containers, else Refused."""
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise Refused("the result is too large or too deeply nested")
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor:
            raise Refused(f"the result holds a tensor subclass ({type(value).__name__})")
        if value.layout != torch.strided:
            raise Refused(f"the result holds a non-strided tensor ({value.layout})")
        return value.detach()
    if isinstance(value, (bool, int, float, complex, str, type(None))):
        return value
    if isinstance(value, dict):
        return {plain(k, budget, depth + 1): plain(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, budget, depth + 1) for v in value]
    raise Refused(f"the result holds a {type(value).__name__}")


def accept(frame: Any, exercise: Exercise, seed: int) -> list[WorldRun]:
    """The frame's worlds, checked against the grader's plan and made plain, else Refused."""
    planned = plan_of(exercise)
    if not isinstance(frame, dict) or frame.get("exercise") != exercise.name:
        raise Refused("the result is not the one the grader asked for")
    worlds = frame.get("worlds")
    if not isinstance(worlds, list) or len(worlds) != len(planned):
        raise Refused("the result's worlds do not match the grader's plan")
    budget, runs = [MAX_NODES], []
    for got, (world, hidden) in zip(worlds, planned, strict=True):
        if not isinstance(got, dict) or (got.get("world"), got.get("hidden")) != (world, hidden):
            raise Refused("the result's worlds do not match the grader's plan")
        failure = got.get("failure") or ""
        if not isinstance(failure, str):
            raise Refused("the result's failure is not text")
        if failure:
            verdict = "TIMEOUT" if got.get("verdict") == "TIMEOUT" else "ERROR"
            runs.append(
                WorldRun(world, hidden, failure=failure[:MAX_TEXT], failure_verdict=verdict)
            )
            continue
        want = expected(exercise, world, hidden, seed)
        actual = got.get("actual")
        if not isinstance(actual, list) or len(actual) != len(want):
            raise Refused(f"the result has the wrong number of ranks at world {world}")
        checked = []
        for rank_results, rank_want in zip(actual, want, strict=True):
            if not isinstance(rank_results, list) or len(rank_results) != len(rank_want):
                raise Refused(f"the result's cases do not match the grader's plan at world {world}")
            row = []
            for item in rank_results:
                if (
                    not isinstance(item, (list, tuple))
                    or len(item) != 2
                    or item[0]
                    not in (
                        True,
                        False,
                    )
                ):
                    raise Refused("a case's result is not (ok, value)")
                ok, value = bool(item[0]), item[1]
                if not ok:
                    row.append((False, value[:MAX_TEXT] if isinstance(value, str) else "failed"))
                    continue
                try:
                    row.append((True, plain(value, budget)))
                except Refused as exc:
                    row.append((False, f"the result has the wrong form ({exc})"))
            checked.append(row)
        runs.append(WorldRun(world, hidden, checked, want))
    return runs


def frames(data: bytes) -> list[Any]:
    """The length-prefixed results in what came back; a broken tail is dropped."""
    found, at = [], 0
    while at + FRAME.size <= len(data):
        (size,) = FRAME.unpack_from(data, at)
        at += FRAME.size
        if size > RESULT_BYTES or at + size > len(data):
            break
        try:
            found.append(torch.load(io.BytesIO(data[at : at + size]), weights_only=True))
        except Exception:  # noqa: BLE001 - weights_only refuses any class but plain ones
            found.append(UNREADABLE)
        at += size
    return found


# --------------------------------------------------------------------------- one submission
def _zero(sub: Submission, exercise: Exercise, verdict: str, reason: str) -> Row:
    return Row(sub.student, sub.lab or "?", exercise.name, 0, exercise.points, verdict, reason)


OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "bad_alloc")
"""How running out of the address-space cap shows, in Python, in torch's allocator, in C++."""


def _stopped(run: Any, budget_s: float, memory_bytes: int) -> tuple[str, str]:
    """Why the sandbox gave no result for an exercise (never its output, which may hold data)."""
    if run.timed_out:
        return "TIMEOUT", f"the submission's time budget of {budget_s:g} s ran out"
    if run.overflowed:
        return "ERROR", "the result is larger than the grader reads"
    if any(marker in run.output_tail for marker in OUT_OF_MEMORY):
        return "ERROR", f"the grading process ran out of memory{_memory_cap(memory_bytes)}"
    code = run.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        hint = {"SIGXFSZ": " (over the output cap)", "SIGKILL": " (killed)"}.get(name, "")
        return "ERROR", f"the grading process was stopped by {name}{hint}"
    if code is None:
        return "ERROR", "the grading process never started, or ended without a word"
    return "ERROR", f"the grading process stopped (exit {code}) before this exercise's result"


def _cause(run: Any, began: bool) -> str:
    """Why the grading process died, where that may be shown: its last output lines when it died
    before any student code ran (see `STARTED`)."""
    if began:
        return "it died after your code began; its output is not shown (it may hold hidden cases)"
    lines = [line for line in run.output_tail.splitlines() if line.strip()]
    if not lines:
        return "it wrote nothing"
    return "its last output lines:\n" + "\n".join("  | " + line for line in lines[-CAUSE_LINES:])


def _memory_cap(memory_bytes: int) -> str:
    return f" (each of its processes may use {gibibytes(memory_bytes)}: the grader's --memory)"


def _with_memory_cap(reason: str, memory_bytes: int) -> str:
    """A case that failed to allocate says what the cap was, and which flag sets it."""
    if any(marker in reason for marker in OUT_OF_MEMORY):
        return reason + _memory_cap(memory_bytes)
    return reason


def grade_submission(
    sub: Submission,
    seed: int,
    budget_s: float,
    pristine: Path,
    memory_bytes: int = MEMORY_BYTES,
    zygote: Zygote | None = None,
) -> Graded:
    """Rows and feedback for one submission, graded in its own throwaway copy of the package
    (forked from `zygote`, if given)."""
    if sub.lab is None:
        return Graded(sub, [], [f"{sub.path}: cannot tell the lab from the file name; pass --lab"])
    exercises = for_lab(sub.lab)
    rows: dict[str, Row] = {}
    jobs = []
    stopped = ""
    stmts = statements(sub.cells) if not sub.unreadable else []
    unparsed = syntax_errors(sub.cells) if not sub.unreadable else []
    if not sub.unreadable and not any(
        c["cell_type"] == "code" and c["metadata"].get("paralab") for c in sub.cells
    ):
        sub.unreadable = "has no cell marked for your answers: hand in the release's notebook"
    for exercise in exercises:
        name = exercise.target.rsplit(".", 1)[1]
        if sub.unreadable:
            rows[exercise.name] = _zero(sub, exercise, "ERROR", f"the notebook {sub.unreadable}")
            continue
        try:
            found = definition(stmts, name)
            refused = refusal(found, exercise, name, unparsed)
        except (RecursionError, MemoryError, SyntaxError, ValueError) as exc:
            found, refused = None, ("REFUSED", f"cannot be read ({type(exc).__name__})")
        if refused is not None:
            rows[exercise.name] = _zero(sub, exercise, *refused)
            continue
        jobs.append(
            {
                "exercise": exercise.name,
                "module": EXERCISES.module_of(exercise.name),
                "function": name,
                "statements": [[s.cell, s.start, s.text] for s in found],
                "plan": plan_of(exercise),
                "case_seed": hidden_seed(seed, exercise),
            }
        )
    feedback: dict[str, str] = {}
    seconds = 0.0
    if jobs:
        # the references first: the grader's plan of cases
        expect_all([EXERCISES[job["exercise"]] for job in jobs], seed)
        # beside the pristine package, under the folder the zygote's sandbox binds
        with tempfile.TemporaryDirectory(prefix="submission-", dir=pristine.parent) as tmp:
            package = copy_package(pristine, Path(tmp) / "src")
            withhold_alternatives(package, sub.lab)
            run = run_sandboxed(
                package,
                WORKER,
                json.dumps({"jobs": jobs}).encode(),
                budget_s,
                memory_bytes,
                zygote,
            )
        seconds = run.seconds
        got = frames(run.result)
        began = bool(got) and isinstance(got[0], dict) and got[0] == STARTED
        got = got[1:] if began else got  # then one per job, in the order of the jobs
        if not got:
            stopped = f"{_stopped(run, budget_s, memory_bytes)[1]}; {_cause(run, began)}"
        for i, job in enumerate(jobs):
            exercise = EXERCISES[job["exercise"]]
            if i >= len(got):
                verdict, why = _stopped(run, budget_s, memory_bytes)
                if stopped and not run.timed_out:
                    why += f"; {_cause(run, began)}"
                rows[exercise.name] = _zero(sub, exercise, verdict, why)
                continue
            try:
                if got[i] is UNREADABLE:
                    raise Refused(
                        "the result holds objects the grader does not load (a class of your own, "
                        "such as a tensor subclass)"
                    )
                outcome = score(exercise, accept(got[i], exercise, seed))
            except Refused as exc:
                rows[exercise.name] = _zero(sub, exercise, "REFUSED", str(exc))
                continue
            outcome.details = [_with_memory_cap(d, memory_bytes) for d in outcome.details]
            feedback[exercise.name] = report(exercise, outcome)
            rows[exercise.name] = Row(
                sub.student,
                sub.lab,
                exercise.name,
                outcome.points,
                exercise.points,
                outcome.verdict,
                "\n".join(outcome.details),
            )
    ordered = [rows[e.name] for e in exercises]
    texts = [
        feedback.get(r.exercise)
        or f"{r.exercise}: {r.verdict} — {r.points:g}/{r.max_points} points\n  {r.reason}"
        for r in ordered
    ]
    return Graded(sub, ordered, texts, seconds, stopped)


def grade_safely(
    sub: Submission,
    seed: int,
    budget_s: float,
    pristine: Path,
    memory_bytes: int = MEMORY_BYTES,
    zygote: Zygote | None = None,
) -> Graded:
    """`grade_submission`, where anything that still goes wrong is this student's zero rows."""
    try:
        return grade_submission(sub, seed, budget_s, pristine, memory_bytes, zygote)
    except Exception as exc:  # noqa: BLE001 - one submission must never stop the batch
        why = f"the grader could not grade it ({type(exc).__name__})"
        rows = [_zero(sub, e, "ERROR", why) for e in for_lab(sub.lab or "")]
        return Graded(sub, rows, [f"{r.exercise}: ERROR — 0/{r.max_points}\n  {why}" for r in rows])


ALTERNATIVES = {
    "ring_pass": ("paralab.collectives.ring._exchange",),
    "exchange_prediction": (
        "paralab.cfgp.sampling.exchange_prediction_all_gather",
        "paralab.collectives.ring._exchange",  # in a group of two, one hop is the swap
    ),
    "predict_groups": (
        "paralab.parallel_dims.ParallelDims.group_ranks",
        "paralab.parallel_dims.ParallelDims.build_meshes",
    ),
    "sample_and_positions": (
        "paralab.train.runs.sample_index",
        "paralab.train.model.SequenceShard.positions",
        "paralab.cp.layout.shard_sequence",
        "paralab.cp.layout.chunk_ids",
    ),
    "latent_ranks": ("paralab.pipeline.inference.samples_of_rank",),
    # a Grid's coords, group, stride and rank_of each answer both lab 10 exercises: no Grid is built
    "rank_coordinates": (
        "paralab.compose.grid.Grid.__post_init__",
        "paralab.compose.grid.Grid.rank_of",
    ),
    "pipeline_neighbours": (
        "paralab.compose.grid.Grid.__post_init__",
        "paralab.compose.grid.Grid.rank_of",
    ),
}
"""Package functions that answer an exercise whole (another implementation of it, a private
helper that does its whole job, or the real thing the exercise predicts by arithmetic), private
ones included: withheld in the copy a submission of its lab runs against, like the solution
itself, and with them every function that calls them (`ring_shift` calls `_exchange`).
`paralab.grade.substitutes` finds the ones a test must add here."""


def withhold_alternatives(package: Path, lab: str) -> None:
    """In a submission's own package copy, the alternatives to its lab's exercises raise."""
    for exercise in for_lab(lab):
        for dotted in ALTERNATIVES.get(exercise.name, ()):
            parts = dotted.split(".")
            split = next(
                i
                for i in range(len(parts), 0, -1)
                if (package / Path(*parts[:i])).with_suffix(".py").exists()
            )
            path = (package / Path(*parts[:split])).with_suffix(".py")
            text = _withhold(path.read_text(), parts[split:])
            path.unlink()  # a hard link to the pristine package's file (`copy_package`): replaced,
            path.write_text(text)  # never written through


def _withhold(code: str, names: list[str]) -> str:
    """The body of `names` (a function, or a class and its method) raises the withheld error."""
    scope: list[ast.stmt] = ast.parse(code).body
    node = None
    for name in names:
        node = next(
            n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name
        )
        scope = node.body
    lines = code.splitlines()
    first = node.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start = first.end_lineno if has_doc else first.lineno - 1
    indent = " " * first.col_offset
    message = f"paralab's own {'.'.join(names)} {WITHHELD}"
    lines[start : node.end_lineno] = [f"{indent}raise NotImplementedError({message!r})"]
    return "\n".join(lines) + "\n"


def copy_package(source: Path, target: Path) -> Path:
    """`source` copied to `target`, for one submission. Under bubblewrap, which binds the copy
    read-only, its files are hard links to `source`'s (0.03 CPU-s instead of 0.25: no file's bytes
    are copied, and the times are the same, so the bytecode holds); without bubblewrap, where the
    student's process can write its copy, a real copy."""
    shutil.copytree(source, target, copy_function=_link_or_copy if bwrap() else shutil.copy2)
    return target


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)


def pristine_package(root: Path) -> Path:
    """The package with every solution withheld, copied once per batch, then once per submission.

    Compiled to bytecode here, once: a sandbox may not write bytecode, so without it every
    process and every rank of every submission compiled the package from source again (0.15 s
    each, tens of ranks per lab). The copies keep the sources' times, so the bytecode holds."""
    stub_package(root / "paralab", lambda fn: f"paralab's own {fn} {WITHHELD}")
    shown_as = f"{INSIDE_PACKAGE}/paralab" if bwrap() else None  # the path tracebacks name
    compileall.compile_dir(root / "paralab", quiet=1, ddir=shown_as)
    return root


# --------------------------------------------------------------------------- the sandboxed process
def _only_stubs(result: dict) -> bool:
    return bool(result["actual"]) and all(
        not ok and out.startswith("NotImplementedError")
        for rank in result["actual"]
        for ok, out in rank
    )


@dataclass(frozen=True)
class CellFunction:
    """The student's function as the ranks get it: its cells, defined again on each rank.
    Sent by value, its code would reach the ranks renamed `<dynamic-code>` (cloudpickle drops the
    file name), and a traceback on a rank would no longer name the student's cell."""

    exercise: str
    module: str
    function: str
    statements: tuple[tuple[int, int, str], ...]

    def __call__(self, *args: Any) -> Any:
        return _defined(self)(*args)


@functools.cache
def _defined(cells: CellFunction) -> Callable:
    """The function, defined once per rank process from its cells (compiled as `<cell N>`)."""
    stmts = [
        s
        for cell, start, text in cells.statements
        for s in cell_statements(cell, "\n" * (start - 1) + text)
    ]
    return load(stmts, EXERCISES.in_module(cells.module, cells.exercise))[cells.function]


def _run_job(job: dict) -> dict:
    """One exercise in the sandbox: define the student's function, run it on every planned world."""
    exercise = EXERCISES.in_module(job["module"], job["exercise"])
    from paralab.grade.code import Statement

    stmts: list[Statement] = []
    for cell, start, text in job["statements"]:
        for s in cell_statements(cell, "\n" * (start - 1) + text):
            stmts.append(s)
    try:
        fn = load(stmts, exercise)[job["function"]]
    except Exception as exc:  # noqa: BLE001 - the student's cell fails on its own
        why = "\n".join(
            [
                f"defining it raised {type(exc).__name__}: {exc}",
                *learner_frames(traceback.format_exc()),
            ]
        )
        return {
            "exercise": exercise.name,
            "worlds": [
                {"world": w, "hidden": h, "actual": None, "failure": why, "verdict": "ERROR"}
                for w, h in job["plan"]
            ],
        }
    cells = tuple((cell, start, text) for cell, start, text in job["statements"])
    results: list[dict] = []
    for world, hidden in job["plan"]:
        if results and _only_stubs(results[0]):  # an untouched stub raises everywhere
            first = results[0]["actual"][0][0][1].splitlines()[0]
            results.append(
                {"world": world, "hidden": hidden, "actual": None, "failure": first, "verdict": ""}
            )
            continue
        on_ranks = (
            fn if world == 0 else CellFunction(exercise.name, job["module"], job["function"], cells)
        )
        per_rank, why, verdict = launch_world(
            case_outputs,
            world,
            (on_ranks, cases_of(exercise, hidden, job["case_seed"]), exercise.normalize),
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
    return {"exercise": exercise.name, "worlds": results}


def _frame(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return FRAME.pack(len(buffer.getvalue())) + buffer.getvalue()


def _worker(result_fd: int) -> None:
    """Read the jobs from stdin; write one length-prefixed result per exercise to the pipe."""
    jobs = json.loads(sys.stdin.read())["jobs"]
    if any(world for job in jobs for world, _ in job["plan"]):
        start_forkserver()  # forked before any student cell runs: its ranks inherit none of it
    with os.fdopen(result_fd, "wb", buffering=0) as pipe:
        pipe.write(_frame(STARTED))
        for job in jobs:
            buffer = io.BytesIO()
            result = _run_job(job)
            try:
                torch.save(result, buffer)
            except Exception as exc:  # noqa: BLE001 - an output that cannot travel
                why = f"the result could not be sent back ({type(exc).__name__})"
                buffer = io.BytesIO()
                torch.save(
                    {
                        "exercise": result["exercise"],
                        "worlds": [
                            {**w, "actual": None, "failure": why, "verdict": "ERROR"}
                            for w in result["worlds"]
                        ],
                    },
                    buffer,
                )
            pipe.write(FRAME.pack(len(buffer.getvalue())) + buffer.getvalue())


if __name__ == "__main__":
    # Run as the package's module, not as `__main__`: what the ranks get (a `CellFunction`) then
    # pickles by reference to `paralab.grade.submission`, which they import (ranks never import
    # the parent's `__main__`).
    from paralab.grade import submission

    parser = argparse.ArgumentParser()
    parser.add_argument("--result-fd", type=int, required=True)
    submission._worker(parser.parse_args().result_fd)
