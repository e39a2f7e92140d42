"""Solution regions: find them in the package, stub them, and copy the package with them stubbed.

An exercise's target function holds its solution between two comment lines
(nbgrader's spelling), `### BEGIN SOLUTION` and `### END SOLUTION`. The student
release (`paralab.release`) and the grader (`paralab.grade`) both stub them
here, so the two can never disagree on what a student was handed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

from paralab.exercises import EXERCISES

SOLUTION_REGION = re.compile(
    r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION\n", re.DOTALL | re.MULTILINE
)
PACKAGE = Path(__file__).resolve().parent
LABS = PACKAGE.parents[1] / "labs"


def stub_regions(code: str, message: Callable[[str], str]) -> tuple[str, int]:
    """Each solution region becomes `raise NotImplementedError(message(enclosing function))`."""

    def stub(match: re.Match) -> str:
        indent = match.group("indent")
        enclosing = re.findall(r"^[ \t]*def (\w+)\(", code[: match.start()], re.MULTILINE)
        return f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError({message(enclosing[-1])!r})\n"

    return SOLUTION_REGION.subn(stub, code if code.endswith("\n") else code + "\n")


def contract_docstrings(code: str, contracts: dict[str, str]) -> str:
    """The docstring of each named function becomes its contract: what it returns, never how."""
    lines = code.splitlines()
    tree = ast.parse(code)
    for node in sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in contracts),
        key=lambda n: -n.lineno,
    ):
        first = node.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            indent = lines[first.lineno - 1][: first.col_offset]
            text = textwrap.fill(contracts[node.name], 96 - len(indent), subsequent_indent=indent)
            lines[first.lineno - 1 : first.end_lineno] = [f'{indent}"""{text}"""']
    return "\n".join(lines) + ("\n" if code.endswith("\n") else "")


def exercise_contracts() -> dict[str, str]:
    """Each exercise function's contract (its hint as a sentence), by function name."""
    return {
        e.target.rsplit(".", 1)[1]: e.hint[0].upper() + e.hint[1:] + "." for e in EXERCISES.values()
    }


def withhold_bugs(code: str, names: set[str]) -> str:
    """The bodies of the named functions (known-wrong versions, often one decision from the answer) raise."""
    lines = code.splitlines()
    for node in sorted(
        (n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name in names),
        key=lambda n: -n.lineno,
    ):
        first = node.body[0]
        has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        start = first.end_lineno if has_doc else first.lineno - 1
        indent = " " * node.body[-1].col_offset
        lines[start : node.end_lineno] = [
            f'{indent}raise NotImplementedError("a known-wrong version, not in the student copy")'
        ]
    return "\n".join(lines) + ("\n" if code.endswith("\n") else "")


def _bugs_no_lab_uses() -> dict[Path, set[str]]:
    """Per exercise module, the bug variants that no lab source imports (the labs' bug clinics keep theirs)."""
    imported = {
        alias.name
        for path in LABS.glob("*/*_lab.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paralab.exercises")
        for alias in node.names
    }
    found: dict[Path, set[str]] = {}
    for exercise in EXERCISES.values():
        for _, bug, _ in exercise.bugs:
            if bug.__name__ not in imported:
                found.setdefault(Path(inspect.getsourcefile(bug)).resolve(), set()).add(
                    bug.__name__
                )
    return found


def _target_files() -> set[Path]:
    """The package files holding an exercise's solution region."""
    files = set()
    for exercise in EXERCISES.values():
        module_name, _, attr = exercise.target.rpartition(".")
        files.add(Path(inspect.getsourcefile(importlib.import_module(module_name))).resolve())
    return files


def stub_package(destination: Path, message: Callable[[str], str], contracts: bool = False) -> Path:
    """Copy this package to `destination` with every exercise's solution region stubbed. With
    `contracts` (the students' copy) each exercise function's docstring becomes its contract and
    the known-wrong versions no lab uses are withheld too."""
    shutil.copytree(PACKAGE, destination, ignore=shutil.ignore_patterns("__pycache__", "expected"))
    for source in _target_files():
        copy = destination / source.relative_to(PACKAGE)
        stubbed, count = stub_regions(copy.read_text(), message)
        if count == 0:
            raise SystemExit(
                f"{source}: an exercise's target has no ### BEGIN SOLUTION / ### END SOLUTION region"
            )
        copy.write_text(
            contract_docstrings(stubbed, exercise_contracts()) if contracts else stubbed
        )
    if contracts:
        for source, names in _bugs_no_lab_uses().items():
            copy = destination / source.relative_to(PACKAGE)
            copy.write_text(withhold_bugs(copy.read_text(), names))
    return destination


def release_stub_message(function: str) -> str:
    """The student release's stub message: the exercise and its contract (never the formula)."""
    exercise = next(e for e in EXERCISES.values() if e.target.rsplit(".", 1)[1] == function)
    return f"{exercise.name}: {exercise.hint}"
