"""The exercises of every lab, by name. Each lab's module lists its own.

An exercise names a package function whose body holds a solution region,
marked with these comment lines (nbgrader's spelling):

    ### BEGIN SOLUTION
    ...
    ### END SOLUTION

The lab notebook shows the full function; `_build_nb.py --student` writes the
students' copy of each lab where each region is a stub raising
`NotImplementedError`, followed by a `paralab.grade.check` cell.

An exercise's `bugs` are known wrong versions the grader must catch; each
stands where a learner's function stands. Where the package keeps a decision
in a small function of its own (`ParallelDims.mesh_layouts`,
`fsdp.zero.gradient_divide_factors`), a variant is the solution run with that
one function swapped by `paralab.patches.patched`; where the exercise is itself a few lines
(a ring hop, the guidance combine), a variant is a wrong few-line version.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Exercise:
    """One function a learner writes, and how to check it against the package's solution.

    `cases(rank, world)` returns a list of argument tuples; each is passed to the
    learner's function and to `solution` (which defaults to the package
    function named by `target`). `world_sizes` of 0 means "in this process, no
    ranks". Outputs go through `normalize` before the element-wise comparison.
    """

    name: str
    lab: str
    target: str
    prompt: str
    hint: str
    cases: Callable[[int, int], list[tuple]]
    world_sizes: tuple[int, ...] = (0,)
    points: int = 2
    minutes: int = 15
    atol: float = 0.0
    rtol: float = 0.0
    solution: Callable | None = None
    normalize: Callable[[Any], Any] = field(default=lambda out: out)
    timeout: float = 30.0
    bugs: list[tuple[str, Callable, str]] = field(default_factory=list)
    """Known wrong versions: (what is wrong, the function, text the report must contain to point at it)."""
    kinds: Callable[[int], list[str]] | None = None
    """What each visible case is at a world size, for reports (e.g. "the {2,3} cp group inside 4 ranks")."""
    hidden: Callable[[int, int, int], list[tuple]] | None = None
    """Instructor-only cases, `(rank, world, seed) -> argument tuples`: other shapes drawn from the seed."""
    hidden_kinds: Callable[[int], list[str]] | None = None
    hidden_world_sizes: tuple[int, ...] = ()
    """World sizes for the hidden cases (empty: the visible ones)."""

    def case_kinds(self, world: int, hidden: bool = False) -> list[str] | None:
        """The description of every case at `world`, or None when the exercise gives none."""
        describe = self.hidden_kinds if hidden else self.kinds
        return describe(world) if describe else None

    def hidden_worlds(self) -> tuple[int, ...]:
        return (self.hidden_world_sizes or self.world_sizes) if self.hidden else ()

    def reference(self) -> Callable:
        if self.solution is not None:
            return self.solution
        module_name, _, attr = self.target.rpartition(".")
        return getattr(__import__(module_name, fromlist=[attr]), attr)


def _collect() -> dict[str, tuple[str, Exercise]]:
    found: dict[str, tuple[str, Exercise]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for exercise in getattr(module, "EXERCISES", []):
            if exercise.name in found:
                raise ValueError(f"two exercises named {exercise.name!r}")
            found[exercise.name] = (module.__name__, exercise)
    return found


class Registry(Mapping[str, Exercise]):
    """Every lab's exercises by name, read from the lab modules when first used.

    Lazy because a lab's module imports its axis (an exercise on FSDP imports torch's FSDP and
    dynamo: a second of CPU), and a grading sandbox, started once per submission, needs only its
    own lab's module: it asks `in_module`, which imports that one."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[str, Exercise]] | None = None

    def _all(self) -> dict[str, tuple[str, Exercise]]:
        if self._found is None:
            self._found = _collect()
        return self._found

    def __getitem__(self, name: str) -> Exercise:
        return self._all()[name][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def module_of(self, name: str) -> str:
        """The module that declares exercise `name` (what `in_module` takes)."""
        return self._all()[name][0]

    @staticmethod
    def in_module(module: str, name: str) -> Exercise:
        """Exercise `name` from its own module, importing no other lab's."""
        declared = importlib.import_module(module).EXERCISES
        return next(e for e in declared if e.name == name)


EXERCISES = Registry()


def for_lab(lab: str) -> list[Exercise]:
    """The exercises of one lab, in the order its module lists them."""
    return [e for e in EXERCISES.values() if e.lab == lab]
