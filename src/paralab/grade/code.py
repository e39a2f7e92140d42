"""What counts as a student's code, and the rules it must follow: one copy for the grader and the
notebook's `check` cell, so a PASS in the notebook predicts the grade and a refusal reads the same.

A student's answer is read only from the cells the release marks as theirs to edit (cell metadata
`{"paralab": {"edit": [...]}}`): for each exercise function, its last definition in those cells
plus the statements of those cells that bind the names it needs, nothing else. Package cells
(folded helpers, later cells that redefine a helper) are never taken as the student's.

The rules below are a courtesy, to explain a refusal early and in words. The defence is the
sandbox the grader runs the code in (`paralab.grade.sandbox`): the package copy there holds no
solution, and the code can reach neither the instructor's files nor anyone else's.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import linecache
import symtable
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from paralab.exercises import EXERCISES, Exercise
from paralab.stubs import release_stub_message, stub_regions

EDIT_KEY = "paralab"
"""The cell metadata key of the release: `{"paralab": {"edit": [function names]}}` on a student's
cell, `{"paralab": {"check": exercise}}` on its check cell."""
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
FORBIDDEN_NAMES = {
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
    "system",
    "popen",
    "spawn",
    "fork",
    "kill",
    "load",
    "save",
    "unlink",
    "rmtree",
    "write_text",
    "write_bytes",
    "read_text",
    "read_bytes",
}
"""Names that load or look up code dynamically, or reach files and processes: refused as a bare name
that reaches the builtin or a module's function (`eval(...)`), and as an attribute read from
anything but the student's own data (`torch.os.system`, `torch.load`). Judged by what the name
is bound to, not by its spelling: a local `load`, a parameter `exec`, `self.load = ...` or
`stats.load` on a parameter are the student's own values and load nothing."""
MODULE_NAMES = {"os", "sys", "subprocess", "builtins", "importlib", "shutil", "pathlib", "io"}
"""Modules refused even when taken from an allowed one (`from torch import os`)."""
COPY_MIN_NODES = 30
"""A body this small (a one-line formula) is written alike by everyone: equal to the solution is no proof of a paste."""
MAX_NODES = 5000
"""Beyond this, a definition is refused rather than parsed further (a 10,000-term expression)."""


@functools.cache
def target_names() -> frozenset[str]:
    """The function names the exercises ask for (reading them imports every lab's exercises)."""
    return frozenset(e.target.rsplit(".", 1)[1] for e in EXERCISES.values())


RULE_LIST = (
    "it imports only torch, numpy, paralab and a few helpers of the standard library "
    "(math, itertools, functools, collections, dataclasses, typing, operator)",
    "it neither imports nor calls paralab's own version of an exercise function",
    "it loads no code dynamically and touches no file or process "
    f"({', '.join(sorted(FORBIDDEN_NAMES))}, dunder attributes)",
    "it is not a verbatim copy of the package's solution",
)
RULES = "; ".join(RULE_LIST)
"""What the grader requires of an answer, in one sentence (the check cell quotes it)."""


@dataclass
class Statement:
    """One top-level statement of a code cell, as the student wrote it."""

    cell: int
    start: int
    text: str
    node: ast.stmt
    needed_for: set[str] = field(default_factory=set)
    """The names the grader took this statement for (the ones it binds that the definition needs)."""

    def binds(self) -> set[str]:
        node = self.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {node.name}
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return {(a.asname or a.name).split(".")[0] for a in node.names}
        return {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }

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


def editable(cell: dict) -> bool:
    """Whether the release handed this cell to the student to edit."""
    marks = cell.get("metadata", {}).get(EDIT_KEY)
    return isinstance(marks, dict) and bool(marks.get("edit"))


def _without_magics(source: str) -> list[str]:
    """The cell's lines with IPython magics and shell lines blanked, so line numbers still hold."""
    return ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]


def cell_statements(number: int, source: str) -> list[Statement]:
    """The top-level statements of one cell (IPython magics blanked); none when it does not parse."""
    lines = _without_magics(source)
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []
    found = []
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        found.append(Statement(number, start, "\n".join(lines[start - 1 : node.end_lineno]), node))
    return found


def syntax_errors(cells: Iterable[dict]) -> list[str]:
    """Where the student's cells do not parse, as `syntax error in cell N, line L: ...`: such a
    cell yields no statements, so a definition in it would otherwise read as missing."""
    found = []
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code" or not editable(cell):
            continue
        try:
            ast.parse("\n".join(_without_magics(cell.get("source", ""))))
        except SyntaxError as exc:
            found.append(f"syntax error in cell {number}, line {exc.lineno}: {exc.msg}")
        except (RecursionError, MemoryError, ValueError) as exc:
            found.append(f"cell {number} cannot be parsed ({type(exc).__name__})")
    return found


def statements(cells: Iterable[dict]) -> list[Statement]:
    """Every top-level statement of the cells the student may edit, in notebook order."""
    found = []
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") == "code" and editable(cell):
            found += cell_statements(number, cell.get("source", ""))
    return found


def definition(stmts: list[Statement], name: str) -> list[Statement] | None:
    """The statements that make `name` what it is at the end of the student's cells, in order."""
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


def _target_source(exercise: Exercise) -> str:
    module_name, _, attr = exercise.target.rpartition(".")
    return textwrap.dedent(inspect.getsource(getattr(importlib.import_module(module_name), attr)))


def _dump(body: list[ast.stmt]) -> str:
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def _mine(stmts: list[Statement], name: str) -> ast.FunctionDef | None:
    return next(
        (s.node for s in stmts if isinstance(s.node, ast.FunctionDef) and s.node.name == name), None
    )


def untouched(stmts: list[Statement], exercise: Exercise, name: str) -> bool:
    """Whether the definition is still the release's stub (then there is nothing to run)."""
    mine = _mine(stmts, name)
    stub = ast.parse(stub_regions(_target_source(exercise), release_stub_message)[0]).body[0]
    return mine is not None and _dump(_body(mine)) == _dump(_body(stub))


def _root(node: ast.AST) -> str:
    """`a` of `a.b.c`."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def paralab_modules(stmts: list[Statement]) -> set[str]:
    """The names the statements bind to paralab modules (`import paralab.cp.ring as ring`)."""
    found = set()
    for s in stmts:
        node = s.node
        if isinstance(node, ast.Import):
            found |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.startswith("paralab")
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paralab"):
            found |= {
                a.asname or a.name for a in node.names if _is_module(f"{node.module}.{a.name}")
            }
    return found


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _direct(node: ast.AST) -> Iterable[ast.AST]:
    """The nodes of `node`'s own scope: nested functions, classes and comprehensions excluded
    (their decorators, defaults and first iterable run in this scope, so they are kept)."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += child.decorator_list + child.args.defaults
            todo += [d for d in child.args.kw_defaults if d is not None]
        elif isinstance(child, ast.Lambda):
            todo += child.args.defaults + [d for d in child.args.kw_defaults if d is not None]
        elif isinstance(child, ast.ClassDef):
            todo += child.decorator_list + child.bases + [k.value for k in child.keywords]
        elif isinstance(child, COMPREHENSIONS):
            todo.append(child.generators[0].iter)
        else:
            todo += ast.iter_child_nodes(child)


def _parameters(node: ast.AST) -> set[str]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return set()
    a = node.args
    every = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
    return {x.arg for x in every}


def _aliases_code(value: ast.AST | None, data: set[str]) -> bool:
    """Whether an assigned value may be a module or a function rather than data: a bare name or
    attribute chain (`t = torch`, `f = torch.load`) not rooted in the student's own data."""
    while isinstance(value, (ast.Attribute, ast.Subscript, ast.Starred)):
        value = value.value
    return isinstance(value, ast.Name) and value.id not in data


def _scope_names(node: ast.AST) -> tuple[set[str], set[str]]:
    """(every name `node`'s scope binds, the ones bound to the student's own data): a parameter, a
    loop or comprehension target, a value computed here, never a bare alias of a global or an import."""
    bound = set(_parameters(node))
    data = set(bound)
    declared: set[str] = set()
    nodes = list(_direct(node))
    if isinstance(node, COMPREHENSIONS):
        nodes = [n for g in node.generators for n in ast.walk(g.target)] + nodes
        data |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    aliases: set[str] = set()
    for n in nodes:
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared |= set(n.names)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
            data.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound.add(n.id)
            data.add(n.id)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if _aliases_code(n.value, _parameters(node)):
                aliases |= {
                    t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)
                }
    return bound - declared, data - declared - aliases


def _scoped_nodes(tree: ast.Module, module: tuple[set[str], set[str]]):
    """Every node of `tree` with the names its enclosing scopes bind: (node, bound, data)."""
    todo: list[tuple[ast.AST, list[tuple[set[str], set[str]]]]] = [(tree, [module])]
    while todo:
        scope, chain = todo.pop()
        bound = set().union(*(b for b, _ in chain))
        data = set().union(*(d for _, d in chain))
        for node in _direct(scope):
            yield node, bound, data
            if isinstance(node, SCOPES + COMPREHENSIONS):
                # A class body's names are not visible in the functions it defines.
                visible = chain[:-1] if isinstance(scope, ast.ClassDef) else chain
                todo.append((node, [*visible, _scope_names(node)]))


def _refused_node(
    node: ast.AST,
    s: Statement,
    modules: set[str],
    bound: set[str] = frozenset(),
    data: set[str] = frozenset(),
) -> str | None:
    where = f"cell {s.cell}, line {getattr(node, 'lineno', s.start)}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):  # only the names the definition needs count
        taken = [a for a in node.names if (a.asname or a.name).split(".")[0] in s.needed_for]
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
            if isinstance(node, ast.ImportFrom) and alias.name in target_names():
                return (
                    f"imports paralab's own `{alias.name}` ({where}), the solution of an exercise"
                )
            if isinstance(node, ast.ImportFrom) and (
                alias.name in MODULE_NAMES or alias.name in FORBIDDEN_NAMES
            ):
                return (
                    f"imports `{alias.name}` from `{node.module}` ({where}); exercise code may not"
                )
    elif isinstance(node, ast.Attribute):
        if node.attr in target_names() and _root(node) in modules:
            return f"uses paralab's own `{node.attr}` ({where}), the solution of an exercise"
        if node.attr.startswith("__") and node.attr.endswith("__"):
            return f"reaches into `{node.attr}` ({where}); exercise code may not"
        own = isinstance(node.ctx, (ast.Store, ast.Del)) or _root(node) in data
        if (node.attr in FORBIDDEN_NAMES or node.attr in MODULE_NAMES) and not own:
            return f"uses `.{node.attr}` ({where}); exercise code may not load code or touch files"
    elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        if isinstance(node.ctx, ast.Load) and node.id not in bound:
            return (
                f"uses `{node.id}` ({where}); exercise code may not load or look up code "
                "dynamically"
            )
    return None


def screen(stmts: list[Statement], exercise: Exercise, name: str) -> str | None:
    """Why this definition scores 0 without being run, or None."""
    modules = paralab_modules(stmts)
    for s in stmts:
        if sum(1 for _ in ast.walk(s.node)) > MAX_NODES:
            return f"cell {s.cell}, line {s.start}: over {MAX_NODES} syntax nodes in one statement"
    module = _scope_names(ast.Module(body=[s.node for s in stmts], type_ignores=[]))
    for s in stmts:
        tree = ast.Module(body=[s.node], type_ignores=[])
        for node, bound, data in _scoped_nodes(tree, module):
            if (why := _refused_node(node, s, modules, bound, data)) is not None:
                return why
    mine = _mine(stmts, name)
    if mine is None:
        return f"`{name}` is not a function defined in your cells (a `def {name}(...)` is expected)"
    solution = _body(ast.parse(_target_source(exercise)).body[0])
    size = sum(1 for s in solution for _ in ast.walk(s))
    if size >= COPY_MIN_NODES and _dump(_body(mine)) == _dump(solution):
        return f"`{name}` is a verbatim copy of paralab's solution"
    return None


def refusal(
    stmts: list[Statement] | None,
    exercise: Exercise,
    name: str,
    unparsed: Iterable[str] = (),
) -> tuple[str, str] | None:
    """(verdict, reason) when the grader gives this definition 0 without running it, or None.
    `unparsed` is what `syntax_errors` found: the likely reason a definition is missing."""
    if stmts is None:
        if unparsed := list(unparsed):
            return "ERROR", f"{'; '.join(unparsed)} (no `{name}` can be read from your cells)"
        return "MISSING", f"no definition of `{name}` in the cells marked for your answers"
    try:
        why = screen(stmts, exercise, name)
    except (RecursionError, MemoryError, SyntaxError, ValueError) as exc:
        why = f"cannot be read ({type(exc).__name__})"
    if why is not None:
        return "REFUSED", why
    if untouched(stmts, exercise, name):
        return "not implemented yet", f"still the release's stub; hint: {exercise.hint}"
    return None


def load(stmts: list[Statement], exercise: Exercise, module_name: str = "__student__") -> dict:
    """Run the statements as the grader runs them: in a fresh module that starts as a copy of the
    exercise's own package module (the names the lab's package cells show come from there, never
    from those cells), with the student's cells run on top."""
    import sys
    import types

    import cloudpickle

    module = types.ModuleType(module_name)
    home = importlib.import_module(exercise.target.rpartition(".")[0])
    module.__dict__.update({k: v for k, v in vars(home).items() if not k.startswith("__")})
    sys.modules[module_name] = module
    # A real module (dataclasses look their class's module up), whose functions and classes still
    # travel to the ranks by value: the ranks cannot import it.
    cloudpickle.register_pickle_by_value(module)
    for s in stmts:
        code = compile("\n" * (s.start - 1) + s.text, f"<cell {s.cell}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - the student's own cell, the point of grading
    return module.__dict__


def as_graded(fn: Callable, exercise: Exercise) -> tuple[Callable | None, str | None]:
    """In the student's kernel: `fn` rebuilt from its own cell alone, as the grader will build it,
    or (None, why it scores 0). Where its source cannot be found, `fn` itself."""
    name = exercise.target.rsplit(".", 1)[1]
    filename = getattr(getattr(fn, "__code__", None), "co_filename", "")
    lines = linecache.getlines(filename)
    if not lines or getattr(fn, "__name__", "") != name:
        return fn, None
    stmts = cell_statements(0, "".join(lines))
    for s in stmts:
        s.cell = 0
    found = definition(stmts, name)
    refused = refusal(found, exercise, name)
    if refused is not None:
        return None, f"{refused[0]}: {refused[1]}".replace("cell 0, ", "")
    try:
        namespace = load(found, exercise, "__student_check__")
    except Exception as exc:  # noqa: BLE001 - the cell fails on its own, as it would when graded
        return None, f"ERROR: your cell, run on its own, raises {type(exc).__name__}: {exc}"
    return namespace[name], None
