"""Element-by-element comparison of parallel results with a single-process reference.

`compare` walks two matching structures (a tensor, or nested lists / tuples /
dicts of them; a list at the top is usually one entry per rank) and returns
one `Verdict` per tensor. `assert_match` raises `CheckFailed` with a message a
person can act on: which rank and tensor, shape/dtype mismatch, how many
elements differ, the largest |diff| and the first differing index with its
expected and actual values. `verdict_table` prints the notebook's table.

Exact mode (the default, `atol == rtol == 0`) demands every element be equal
(`==`, so it is bitwise for finite floats apart from the sign of zero).
Tolerance mode accepts `|actual - expected| <= atol + rtol * |expected|`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from paralab.tables import text_table


class CheckFailed(AssertionError):
    """A parallel result differs from its reference; `verdicts` holds the details."""

    def __init__(self, message: str, verdicts: list["Verdict"]) -> None:
        super().__init__(message)
        self.verdicts = verdicts


@dataclass
class Verdict:
    """The comparison of one tensor."""

    path: str
    passed: bool
    exact: bool
    shape: tuple[int, ...]
    dtype: str
    numel: int
    n_diff: int = 0
    max_abs: float = 0.0
    first_index: tuple[int, ...] | None = None
    expected_value: float | None = None
    actual_value: float | None = None
    problem: str | None = None
    observed: str | None = None
    """For a `claim`: what was observed, shown in place of shape and difference."""

    def describe(self) -> str:
        """One line for a failure message.

        Values print at 6 significant digits: the last digits of a float differ
        between CPUs and BLAS kernels, and a committed notebook shows this line.
        """
        if self.observed is not None:
            return f"{self.path}: {'holds' if self.passed else 'does not hold'} ({self.observed})"
        if self.passed:
            return f"{self.path}: ok"
        if self.problem:
            return f"{self.path}: {self.problem}"
        return (
            f"{self.path}: {self.n_diff} of {self.numel} elements differ, max |diff| {self.max_abs:.3g}, "
            f"first at index {self.first_index}: expected {_short(self.expected_value)}, "
            f"got {_short(self.actual_value)}"
        )


def _short(value: float | None) -> str:
    """A float at 6 significant digits, still written as a float (1.0, not 1); others as they are."""
    if not isinstance(value, float):
        return repr(value)
    text = f"{value:.6g}"
    return text if any(c in text for c in ".en") else text + ".0"  # e: exponent; n: inf, nan


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _walk(actual: Any, expected: Any, path: str, rank_level: bool):
    """Yield (path, actual, expected) leaves; a structural mismatch yields a problem string."""
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        yield path, actual, expected
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            yield (
                path or "result",
                f"got a {type(actual).__name__}, expected a dict with keys {sorted(expected)}",
                None,
            )
            return
        for key in expected:
            if key not in actual:
                yield _join(path, key), None, expected[key]
            else:
                yield from _walk(actual[key], expected[key], _join(path, key), False)
        for key in actual:
            if key not in expected:
                yield _join(path, key), actual[key], None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            n = len(actual) if isinstance(actual, (list, tuple)) else type(actual).__name__
            yield path or "result", f"expected {len(expected)} entries, got {n}", None
            return
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _walk(a, e, _join(path, f"rank {i}" if rank_level else i), False)
        return
    yield path, actual, expected


def _compare_tensors(path: str, actual: Any, expected: Any, atol: float, rtol: float) -> Verdict:
    exact = atol == 0 and rtol == 0
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        shape = tuple(expected.shape) if isinstance(expected, torch.Tensor) else ()
        what = "missing" if actual is None else f"a {type(actual).__name__}, not a tensor"
        if expected is None:
            what = "unexpected extra entry"
        return Verdict(path, False, exact, shape, "-", 0, problem=f"{what}")
    shape, dtype = tuple(expected.shape), str(expected.dtype).replace("torch.", "")
    base = dict(path=path, exact=exact, shape=shape, dtype=dtype, numel=expected.numel())
    if tuple(actual.shape) != shape:
        return Verdict(
            passed=False, problem=f"shape {tuple(actual.shape)}, expected {shape}", **base
        )
    if actual.dtype != expected.dtype:
        got = str(actual.dtype).replace("torch.", "")
        return Verdict(passed=False, problem=f"dtype {got}, expected {dtype}", **base)
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        nan_a, nan_e = torch.isnan(a), torch.isnan(e)
        if (nan_a & ~nan_e).any():
            idx = tuple(int(i) for i in torch.nonzero(nan_a & ~nan_e)[0])
            n = int((nan_a & ~nan_e).sum())
            return Verdict(
                passed=False,
                n_diff=n,
                first_index=idx,
                problem=f"{n} NaN values where the reference is finite, first at index {idx}",
                **base,
            )
    if exact:
        differs = (
            ~((a == e) | (torch.isnan(a) & torch.isnan(e))) if a.is_floating_point() else a != e
        )
    else:
        differs = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if a.is_floating_point() or a.is_complex():
        diff = (a - e).abs()
        diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)
        max_abs = float(diff.max()) if diff.numel() else 0.0
    else:
        max_abs = float((a.long() - e.long()).abs().max()) if a.numel() else 0.0
    n_diff = int(differs.sum())
    if n_diff == 0:
        return Verdict(passed=True, max_abs=max_abs, **base)
    idx = tuple(int(i) for i in torch.nonzero(differs)[0])
    return Verdict(
        passed=False,
        n_diff=n_diff,
        max_abs=max_abs,
        first_index=idx,
        expected_value=e[idx].item(),
        actual_value=a[idx].item(),
        **base,
    )


def claim(name: str, holds: bool, observed: str) -> Verdict:
    """A yes/no fact as a verdict row: the claim, and what was observed (no tensor, shape or dtype)."""
    return Verdict(
        name, bool(holds), True, (), "claim", 1, n_diff=0 if holds else 1, observed=observed
    )


def fold(verdicts: list[Verdict], label: str) -> Verdict:
    """One tensor-table row for many verdicts (e.g. all ranks of a job): passes only if all pass.

    No verdicts is an error, never a pass.
    """
    if not verdicts:
        raise ValueError(f"fold({label!r}): no verdicts to fold; an empty check proves nothing")
    failed = [v for v in verdicts if not v.passed]
    first = failed[0] if failed else verdicts[0]
    return Verdict(
        path=label,
        passed=not failed,
        exact=all(v.exact for v in verdicts),
        shape=(len(verdicts),),
        dtype=verdicts[0].dtype,
        numel=sum(v.numel for v in verdicts),
        n_diff=sum(v.n_diff for v in verdicts),
        max_abs=max(v.max_abs for v in verdicts),
        first_index=first.first_index,
        expected_value=first.expected_value,
        actual_value=first.actual_value,
        problem=first.problem if failed else None,
    )


def summary(name: str, verdicts: list[Verdict]) -> Verdict:
    """Many verdicts as one claim row: it holds if every one passes; observed: how many, the worst |diff|."""
    row = fold(verdicts, name)
    passed = sum(v.passed for v in verdicts)
    worst = "0" if row.max_abs == 0 else f"{row.max_abs:.1e}"
    return claim(name, row.passed, f"{passed}/{len(verdicts)} pass, max |diff| {worst}")


def compare(
    actual: Any, expected: Any, *, atol: float = 0.0, rtol: float = 0.0, name: str = ""
) -> list[Verdict]:
    """Compare every tensor of `actual` with `expected`; a top-level list is indexed by rank."""
    verdicts = []
    for path, a, e in _walk(actual, expected, name, rank_level=isinstance(expected, (list, tuple))):
        if isinstance(a, str) and e is None:
            verdicts.append(Verdict(path, False, atol == 0 and rtol == 0, (), "-", 0, problem=a))
        else:
            verdicts.append(_compare_tensors(path or "tensor", a, e, atol, rtol))
    return verdicts


def assert_match(
    actual: Any, expected: Any, *, atol: float = 0.0, rtol: float = 0.0, name: str = ""
) -> list[Verdict]:
    """`compare`, raising `CheckFailed` that lists every failing tensor when any differs."""
    verdicts = compare(actual, expected, atol=atol, rtol=rtol, name=name)
    failed = [v for v in verdicts if not v.passed]
    if failed:
        mode = "exactly" if atol == 0 and rtol == 0 else f"within atol={atol:g}, rtol={rtol:g}"
        lines = [f"{len(failed)} of {len(verdicts)} tensors do not match the reference {mode}:"]
        lines += ["  " + v.describe() for v in failed]
        raise CheckFailed("\n".join(lines), verdicts)
    return verdicts


def _format_diff(v: Verdict) -> str:
    if v.observed is not None:
        return v.observed
    if v.problem:
        return v.problem
    if v.max_abs == 0:
        return "0 (bitwise)" if v.exact or v.n_diff == 0 else "0"
    return f"{v.max_abs:.1e}"


def verdict_table(verdicts: list[Verdict], title: str = "") -> str:
    """A fixed-width, deterministic text table: one row per tensor, or per claim.

    A table of claims only reads as claim → what was observed → verdict; a table
    with tensors keeps shape, dtype and the largest difference.
    """
    if verdicts and all(v.observed is not None for v in verdicts):
        header = ("claim", "observed", "verdict")
        rows = [(v.path, v.observed, "pass" if v.passed else "FAIL") for v in verdicts]
    else:
        header = ("tensor", "shape", "dtype", "max |diff|", "verdict")
        rows = [
            (
                v.path,
                "claim"
                if v.observed is not None
                else "x".join(str(d) for d in v.shape) or "scalar",
                "" if v.observed is not None else v.dtype,
                _format_diff(v),
                "pass"
                if v.passed
                else "FAIL"
                if v.observed is not None or not v.n_diff
                else f"FAIL ({v.n_diff} differ)",
            )
            for v in verdicts
        ]
    out = ([title] if title else []) + [text_table(header, rows)]
    passed = sum(v.passed for v in verdicts)
    out.append(f"{passed}/{len(verdicts)} passed")
    return "\n".join(out)


def closing_table(groups: dict[str, list[Verdict]]) -> str:
    """A lab's closing table: one row per claim group with its check count, then the total.

    It restates the tables above it, so it prints no `N/M passed` line (each check counts once).
    """
    every = [v for found in groups.values() for v in found]
    rows = [
        (name, len(found), "yes" if all(v.passed for v in found) else "NO")
        for name, found in groups.items()
    ]
    rows.append(("all", len(every), "yes" if all(v.passed for v in every) else "NO"))
    return text_table(("section · claim", "checks", "all pass"), rows, align_right=(1,))
