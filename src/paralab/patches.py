"""Replace named functions of the package for a while: the one way an edit or a planted bug reaches code.

A patch set names, per module (or class), the attributes to replace:

    {"paralab.cp.ring": {"ring_pass": my_ring_pass}}
    {"paralab.parallel_dims.ParallelDims": {"mesh_layouts": my_layouts}}

`patched(patches)` applies it in this process for a `with` block and restores the
originals after, even when the block raises. `paralab.launch.run(fn, n,
patches=...)` does the same on every rank, around `fn`, so the ranks run the
replacement whichever worker they run: a package function looks its helpers up
in its module's globals at call time, and those are what a patch replaces.

A module-level function is replaced wherever the package holds it: in the module
that defines it and in every loaded `paralab` module that imported it by name
(`from paralab.cp.blocks import merge_partials` in `cp/ring.py`), so the key is
always the defining module, as each shown cell's header prints it. The module that
defines the replacement keeps its own copy of the original: a bug variant that wraps
the real function (`ring_backward` with one hop frozen) still calls the real one.

Why it looks the way it does:
- Keys are dotted import paths, not module objects, so a patch set pickles and
  travels to ranks started by spawn or forkserver, and reads the same in a lab,
  a test and the grader.
- Values travel with cloudpickle: a function defined in a notebook cell goes by
  value (its edited body with it), a package function by reference.
- Every key and name is checked before anything is replaced, so a typo fails at
  once in the caller's process, naming what exists, instead of on every rank.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

Patches = Mapping[str, Mapping[str, Any]]
"""Dotted path of a module or class -> {attribute name: replacement}."""


def resolve(target: str) -> Any:
    """The module or class a dotted path names: the longest importable prefix, then attributes."""
    if not isinstance(target, str) or not target:
        raise TypeError(f"patches: a key must be a dotted module or class path, got {target!r}")
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise AttributeError(f"patches: {module_name} has no {attr!r} (in key {target!r})")
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"patches: no module named {parts[0]!r} (in key {target!r})")


def validate(patches: Patches) -> dict[str, dict[str, Any]]:
    """The patch set as plain dicts, after checking that every key resolves and every name exists."""
    if not isinstance(patches, Mapping):
        raise TypeError(
            "patches must map a module path to {name: replacement}, "
            f"e.g. {{'paralab.cp.ring': {{'ring_pass': my_ring_pass}}}}; got {type(patches).__name__}"
        )
    plain: dict[str, dict[str, Any]] = {}
    for target, replacements in patches.items():
        owner = resolve(target)
        if not isinstance(replacements, Mapping):
            raise TypeError(
                f"patches[{target!r}] must map names to replacements, got {type(replacements).__name__}"
            )
        missing = [name for name in replacements if not hasattr(owner, name)]
        if missing:
            public = sorted(n for n in vars(owner) if not n.startswith("_"))
            raise AttributeError(
                f"patches: {target} has no {', '.join(map(repr, missing))} to replace; "
                f"it has {', '.join(public[:30])}"
            )
        plain[target] = dict(replacements)
    return plain


@contextlib.contextmanager
def patched(patches: Patches | None) -> Iterator[None]:
    """Replace the named attributes for the block, then put the originals back (None: no patches)."""
    if not patches:
        yield
        return
    saved: list[tuple[Any, str, Any]] = []
    global _active
    _active += 1
    try:
        for target, replacements in validate(patches).items():
            owner = resolve(target)
            for name, replacement in replacements.items():
                original = vars(owner).get(name, _INHERITED)
                holders = [(owner, name)]
                if isinstance(owner, types.ModuleType):
                    holders += _aliases(original, owner, getattr(replacement, "__module__", None))
                for holder, attr in holders:
                    saved.append((holder, attr, vars(holder).get(attr, _INHERITED)))
                    setattr(holder, attr, replacement)
        yield
    finally:
        _active -= 1
        for owner, name, original in reversed(saved):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_active = 0


def active_patches() -> int:
    """How many `patched` blocks with patches are open in this process: a forkserver forked
    meanwhile would hand their replacements to every later rank (`paralab.launch`)."""
    return _active


def _aliases(
    original: Any, owner: types.ModuleType, keeper: str | None
) -> list[tuple[types.ModuleType, str]]:
    """Every other loaded paralab module attribute bound to `original` (its `from x import`
    copies), except in `keeper`, the module that defines the replacement."""
    if not callable(original) or original is _INHERITED:
        return []
    return [
        (module, attr)
        for module_name, module in list(sys.modules.items())
        if module is not owner
        and module is not None
        and module_name != keeper
        and (module_name == "paralab" or module_name.startswith("paralab."))
        for attr, value in list(vars(module).items())
        if value is original
    ]


_INHERITED = object()
"""Marks an attribute a class only inherited: restoring it deletes the override."""
