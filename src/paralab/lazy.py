"""A package's entry points, imported when first asked for.

A subpackage re-exports its `train` and `reference` from `runs.py`, which imports the engines it
drives (DTensor, FSDP2, dynamo: about a second of CPU). Imported eagerly, every reader of the
package's light modules paid for them too: the planner reading `tp.costs`, a grading sandbox
importing one lab's exercises, each rank of a lab that never trains. With `entry_points`,
`from paralab.tp import train` still works, and `import paralab.tp.costs` imports no engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def entry_points(package: str, homes: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: each name in `homes` from its module (`runs`)."""

    def __getattr__(name: str) -> object:
        if name in homes:
            return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
