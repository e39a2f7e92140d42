"""Which package functions answer an exercise whole, in the package a submission runs against.

A student may call the package's helpers, but not one that does the exercise's whole job: that
earns the points without the understanding. Run inside a copy of the package as the sandbox has it
(every solution stubbed, `ALTERNATIVES` withheld), `substitutes` calls every function the package
defines, private ones included, on a prefix of each visible case's arguments, and reports those
whose output is the reference's (as returned, or once the exercise's `normalize` took it). A new
exercise is thereby covered as soon as it is declared: a helper that answers it fails the test
that runs this, until it is withheld.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import warnings
from collections.abc import Callable
from typing import Any

from paralab.check import compare
from paralab.exercises import EXERCISES, Exercise

NOT_CANDIDATES = (
    "paralab.exercises",
    "paralab.grade",
    "paralab.launch",
    "paralab.viz",
    "paralab.release",
    "paralab.notebooks",
    "paralab.notebook_format",
    "paralab.site",
    "paralab.stubs",
    "paralab.patches",
    "paralab.check",
    "paralab.tables",
    "paralab.ledger",
)
"""The classroom's and the launcher's own machinery (which plot, launch ranks or write files): no
exercise's answer, and not safe to call with a case's arguments."""
UNSAFE = {"__main__", "runs"}
"""Modules that launch ranks or run a command line when called (`paralab.cp.runs`)."""


def candidates() -> dict[str, Callable]:
    """Every function defined at the top of a package module, by dotted name, private included."""
    import paralab

    found: dict[str, Callable] = {}
    for info in pkgutil.walk_packages(paralab.__path__, "paralab."):
        if info.name.startswith(NOT_CANDIDATES) or info.name.rsplit(".", 1)[1] in UNSAFE:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def _prefixes(fn: Callable, args: tuple) -> list[tuple]:
    """The prefixes of `args` (longest first) that `fn`'s signature accepts."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    fits = []
    for k in range(len(args), 0, -1):
        try:
            signature.bind(*args[:k])
        except TypeError:
            continue
        fits.append(args[:k])
    return fits


def _matches(out: Any, want: Any, exercise: Exercise) -> bool:
    from paralab.grade import _plain

    for shown in (out, exercise.normalize(out)):
        try:
            verdicts = compare([_plain(shown)], [want], atol=exercise.atol, rtol=exercise.rtol)
        except Exception:  # noqa: BLE001 - an output of another form answers nothing
            continue
        if all(v.passed for v in verdicts):
            return True
    return False


def answering(
    exercise_name: str,
    expected: list[list[Any]],
    rank: int | None = None,
    world: int | None = None,
) -> list[str]:
    """Runs in the package copy, on every rank (or in-process with rank 0 of world 0): the
    functions other than the exercise's own whose output is the reference's on every visible
    case (`expected`: per rank, per case)."""
    import torch.distributed as dist

    if rank is None:
        rank, world = dist.get_rank(), dist.get_world_size()
    exercise = EXERCISES[exercise_name]
    expected = expected[rank]
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        functions = sorted(candidates().items())
    drawn = exercise.cases(rank, world) if world == 0 else None
    for dotted, fn in functions:
        if dotted == exercise.target:
            continue
        # Fresh cases for each: on ranks, fresh process groups (what one candidate left
        # unreceived on a group never reaches the next); in-process, one draw whose arguments
        # `_answers` copies for each call (some exercises build a model to draw a case).
        cases = drawn if drawn is not None else exercise.cases(rank, world)
        ok = bool(cases)
        for args, want in zip(cases, expected, strict=True):
            ok = ok and any(_answers(fn, prefix, want, exercise) for prefix in _prefixes(fn, args))
            if not ok:
                break
        if ok:
            found.append(dotted)
    return found


def _answers(fn: Callable, args: tuple, want: Any, exercise: Exercise) -> bool:
    fresh = copy.deepcopy(args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _matches(fn(*fresh), want, exercise)
    except (Exception, SystemExit):  # noqa: BLE001 - raised (withheld, wrong arguments, a
        return False  # command line's usage error): answers nothing
