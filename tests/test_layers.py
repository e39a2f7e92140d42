"""The package's layers point one way, checked on the import graph of every module, imports inside
functions included:

    core <- axes <- composition <- pictures <- classroom and build

A module imports only its own layer or those below it; the build (`notebooks`, `site`) and the
grader (`grade`) do not import each other. A new subpackage must be given a layer here, so a new
axis is placed on purpose, not by accident.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "paralab"

LAYERS = {
    "core": [
        "__init__",
        "parallel_dims",
        "launch",
        "patches",
        "check",
        "ledger",
        "models",
        "tables",
        "notebook_format",
        "lazy",
    ],
    "axes": ["collectives", "fsdp", "cp", "cfgp", "vae_lb", "tp", "pp", "ep", "scale", "plan"],
    "composition": ["train", "pipeline", "compose"],
    "pictures": ["viz"],
    "classroom": ["exercises", "grade", "stubs", "release"],
    "build": ["notebooks", "site"],
}
RANK = {"core": 0, "axes": 1, "composition": 2, "pictures": 3, "classroom": 4, "build": 4}
NEVER = {("build", "grade"), ("grade", "build")}
"""Pairs (importer, imported) that may not meet even where their ranks allow: by top-level name."""


def _top(module: str) -> str:
    """`paralab.cp.ring` -> `cp`; `paralab` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(top: str) -> str:
    for layer, names in LAYERS.items():
        if top in names:
            return layer
    raise AssertionError(f"paralab.{top} has no layer: add it to LAYERS in {__file__}")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """paralab module -> the paralab modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("paralab")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "paralab":  # `from paralab import viz` names a module
                    found |= {f"paralab.{a.name}" for a in node.names}
                elif target.startswith("paralab"):
                    found.add(target)
        graph[name] = found
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for importer, imported in graph.items():
        here = _layer(_top(importer))
        for target in sorted(imported):
            there = _layer(_top(target))
            pair = (
                "grade" if _top(importer) == "grade" else here,
                "grade" if _top(target) == "grade" else there,
            )
            if RANK[there] > RANK[here] or pair in NEVER:
                wrong.append(f"{importer} ({here}) imports {target} ({there})")
    return wrong


def test_every_import_points_down_the_layers():
    assert not violations(import_graph()), "\n".join(violations(import_graph()))


def test_no_axis_or_composition_imports_the_classroom():
    graph = import_graph()
    offenders = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        if _layer(_top(m)) in ("axes", "composition")
        for t in targets
        if _layer(_top(t)) in ("classroom", "build", "pictures")
    ]
    assert not offenders, "\n".join(offenders)


def test_the_check_sees_a_planted_upward_import():
    """The walk finds imports inside functions, relative ones, and `from paralab import x`."""
    graph = import_graph()
    planted = {
        **graph,
        "paralab.cp.ring": graph["paralab.cp.ring"] | {"paralab.exercises"},
        "paralab.notebooks": graph["paralab.notebooks"] | {"paralab.grade.submission"},
        "paralab.grade": graph["paralab.grade"] | {"paralab.site"},
    }
    found = violations(planted)
    assert any("paralab.cp.ring (axes) imports paralab.exercises" in v for v in found)
    assert any("paralab.notebooks (build) imports paralab.grade.submission" in v for v in found)
    assert any("paralab.grade (classroom) imports paralab.site" in v for v in found)
    assert "paralab.train.runs" in graph and "paralab.patches" in graph["paralab.train.runs"]


def test_viz_re_exports_every_picture_of_its_modules():
    """Labs keep `from paralab import viz`: a picture added to a viz module must be re-exported."""
    import importlib
    import inspect
    import pkgutil

    import paralab.viz as viz

    missing = [
        f"paralab.viz.{info.name}.{name}"
        for info in pkgutil.iter_modules(viz.__path__)
        for name, obj in vars(importlib.import_module(f"paralab.viz.{info.name}")).items()
        if inspect.isfunction(obj)
        and not name.startswith("_")
        and obj.__module__ == f"paralab.viz.{info.name}"
        and getattr(viz, name, None) is not obj
    ]
    assert not missing, "add to paralab/viz/__init__.py: " + ", ".join(missing)
