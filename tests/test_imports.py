"""The package's modules import each other without a cycle, and each imports on its own."""

import ast
import subprocess
import sys
from pathlib import Path

import paralab

PACKAGE = Path(paralab.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the paralab modules it imports anywhere in its source (function-level imports included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = "done", stack.pop()
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n))), None)


def test_no_import_cycle_between_paralab_modules():
    cycle = _cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


FIRST_IMPORT_OF_EACH = """
import importlib, sys
for module in sys.argv[1:]:
    for name in [n for n in sys.modules if n == "paralab" or n.startswith("paralab.")]:
        del sys.modules[name]
    print(module, flush=True)
    importlib.import_module(module)
"""
"""Each module imported first, in one fresh interpreter: before each, every paralab module is
forgotten (torch, which no paralab cycle involves, stays: an interpreter for each paid its
import again)."""


def test_an_exercise_module_and_the_grader_each_import_first_in_a_fresh_interpreter():
    modules = ["paralab.exercises.lab02", "paralab.grade"]
    done = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORT_OF_EACH, *modules],
        capture_output=True,
        text=True,
        timeout=120,
    )
    module = done.stdout.split()[-1] if done.stdout.split() else "python"
    assert done.returncode == 0, f"import {module} alone fails:\n{done.stderr[-2000:]}"
    assert done.stdout.split() == modules
