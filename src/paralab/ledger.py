"""Count what crosses the wire: every `torch.distributed` call, its group and its bytes.

    with Ledger() as led:
        with led.phase("forward"):
            out = model(x)
        with led.phase("backward"):
            out.sum().backward()
    led.summary()          # {(phase, op): Tally(calls, bytes_sent, bytes_received)}

The ledger replaces the functions in `torch.distributed` (and in
`torch.distributed.distributed_c10d`, where torch's own helpers look them up)
for the duration of the `with` block, so calls made by torch internals —
FSDP2 looks `dist.all_gather_single` up at call time — are counted too. Only
the outermost call is counted: `all_gather_object` is one record, not one
plus the `all_gather` it makes inside. Calls inside `unrecorded()` (a guard that
ranks agree on their inputs) are left out.

Bytes follow one fixed cost model, per rank, with `n` the group size and `S`
the bytes of the tensor named: ring all-reduce, all-gather and reduce-scatter
(bandwidth-optimal for those), direct all-to-all and point-to-point, and a
flat tree for broadcast / scatter / reduce / gather, where the root sends or
receives every other rank's share itself. The flat tree is simple to count,
not bandwidth-optimal: a pipelined or tree broadcast puts far less than
(n-1) S on the root's link.

| op | bytes sent by this rank |
|---|---|
| all_reduce(S) | 2 (n-1)/n S |
| all_gather*(input S) | (n-1) S |
| reduce_scatter*(input S, output S/n) | (n-1)/n S |
| all_to_all*(input S) | S minus the part kept for itself |
| broadcast / scatter (root) | (n-1) S at the root, 0 elsewhere |
| reduce / gather (non-root) | S from every rank but the root |
| send / isend (S) | S (recv / irecv: 0 sent, S received) |

gloo emulates some collectives (its reduce-scatter is an all-reduce), so these
are the bytes the algorithm needs, counted at the API, not what a given
backend happens to move.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from paralab.tables import text_table

COUNTED_OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
)


@dataclass(frozen=True)
class Record:
    """One call made by this rank."""

    op: str
    phase: str
    group_ranks: tuple[int, ...]
    bytes_sent: int
    bytes_received: int
    peer: int | None = None

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)


@dataclass
class Tally:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def add(self, r: Record) -> None:
        self.calls += 1
        self.bytes_sent += r.bytes_sent
        self.bytes_received += r.bytes_received


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _group_ranks(group: Any) -> tuple[int, ...]:
    group = group if group is not None else dist.group.WORLD
    return tuple(dist.get_process_group_ranks(group))


def _group_rank(group: Any) -> int:
    return dist.get_rank(group if group is not None else dist.group.WORLD)


def _all_to_all_single_sent(a: dict, n: int, me: int) -> int:
    inp = a["input"]
    splits = a.get("input_split_sizes")
    if not splits:
        return _nbytes(inp) * (n - 1) // n
    row = _nbytes(inp) // max(inp.shape[0], 1)
    return row * (sum(splits) - splits[me])


def _bytes(op: str, a: dict, n: int, me: int) -> tuple[int, int]:
    """(sent, received) for one call; `a` holds its bound arguments."""
    if op == "all_reduce":
        s = 2 * (n - 1) * _nbytes(a["tensor"]) // n
        return s, s
    if op in ("all_gather_into_tensor", "all_gather_single", "_all_gather_base"):
        key = "input_tensor" if "input_tensor" in a else "input"
        s = (n - 1) * _nbytes(a[key])
        return s, s
    if op == "all_gather":
        s = (n - 1) * _nbytes(a["tensor"])
        return s, s
    if op in ("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base"):
        s = (n - 1) * _nbytes(a["input"]) // n
        return s, s
    if op == "reduce_scatter":
        s = sum(_nbytes(t) for i, t in enumerate(a["input_list"]) if i != me)
        return s, (n - 1) * _nbytes(a["output"])
    if op == "all_to_all_single":
        out_splits = a.get("output_split_sizes")
        out = a["output"]
        if out_splits:
            received = _nbytes(out) // max(out.shape[0], 1) * (sum(out_splits) - out_splits[me])
        else:
            received = _nbytes(out) * (n - 1) // n
        return _all_to_all_single_sent(a, n, me), received
    if op == "all_to_all":
        sent = sum(_nbytes(t) for i, t in enumerate(a["input_tensor_list"]) if i != me)
        received = sum(_nbytes(t) for i, t in enumerate(a["output_tensor_list"]) if i != me)
        return sent, received
    if op in ("broadcast", "scatter"):
        root = _root(a, "src")
        t = a["tensor"]
        return ((n - 1) * _nbytes(t), 0) if me == root else (0, _nbytes(t))
    if op in ("reduce", "gather"):
        root = _root(a, "dst")
        t = a["tensor"]
        return (0, (n - 1) * _nbytes(t)) if me == root else (_nbytes(t), 0)
    if op in ("send", "isend"):
        return _nbytes(a["tensor"]), 0
    if op in ("recv", "irecv"):
        return 0, _nbytes(a["tensor"])
    if op == "all_gather_object":
        s = (n - 1) * len(pickle.dumps(a["obj"]))
        return s, s
    if op == "broadcast_object_list":
        size = len(pickle.dumps(a["object_list"]))
        return ((n - 1) * size, 0) if me == _root(a, "src") else (0, size)
    return 0, 0


def _root(a: dict, key: str) -> int:
    """The root's rank inside its group (torch takes global `src`/`dst` or `group_src`/`group_dst`)."""
    group_key = f"group_{key}"
    if a.get(group_key) is not None:
        return a[group_key]
    ranks = _group_ranks(a.get("group"))
    return ranks.index(a.get(key) or 0)


def _peer(op: str, a: dict) -> int | None:
    if op in ("send", "isend"):
        return a.get("dst") if a.get("dst") is not None else a.get("group_dst")
    if op in ("recv", "irecv"):
        return a.get("src") if a.get("src") is not None else a.get("group_src")
    return None


class Ledger:
    """Records the `torch.distributed` calls this rank makes inside `with Ledger():`."""

    _active: Ledger | None = None

    def __init__(self, phase: str = "main") -> None:
        self.records: list[Record] = []
        self._phase = phase
        self._originals: dict[tuple[Any, str], Callable] = {}
        self._depth = 0

    # ---------------------------------------------------------------- phases
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label the calls made inside the block (e.g. "forward", "backward")."""
        previous, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = previous

    # ---------------------------------------------------------------- patching
    def __enter__(self) -> "Ledger":
        if Ledger._active is not None:
            raise RuntimeError("a Ledger is already recording in this process; nest phases instead")
        Ledger._active = self
        for name in COUNTED_OPS:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapper = self._wrap(name, original)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    self._originals[(module, name)] = original
                    setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for (module, name), original in self._originals.items():
            setattr(module, name, original)
        self._originals.clear()
        Ledger._active = None

    def _wrap(self, name: str, original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                self._record(name, bound.arguments)
            self._depth += 1
            try:
                if name == "batch_isend_irecv":
                    _rebind_p2p_ops(args[0] if args else kwargs["p2p_op_list"])
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def _record(self, name: str, a: dict) -> None:
        if name == "batch_isend_irecv":
            for p2p in a["p2p_op_list"]:
                op = "isend" if "send" in p2p.op.__name__ else "irecv"
                sent, received = _bytes(op, {"tensor": p2p.tensor}, 2, 0)
                self.records.append(
                    Record(op, self._phase, _group_ranks(p2p.group), sent, received, peer=p2p.peer)
                )
            return
        group = a.get("group")
        ranks = _group_ranks(group)
        sent, received = _bytes(name, a, len(ranks), _group_rank(group))
        self.records.append(Record(name, self._phase, ranks, sent, received, peer=_peer(name, a)))

    # ---------------------------------------------------------------- summaries
    def summary(self, by: tuple[str, ...] = ("phase", "op")) -> dict[tuple, Tally]:
        return summarize(self.records, by)

    def total_sent(self, **match: Any) -> int:
        """Bytes sent by the records whose fields equal `match` (e.g. phase="forward")."""
        return sent(self.records, **match)


@contextlib.contextmanager
def in_phase(name: str) -> Iterator[None]:
    """Label the calls made inside the block in whichever Ledger is recording, if any.

    For code that runs under a ledger it does not own: a training loop, or a
    checkpoint's recompute inside the backward.
    """
    ledger = Ledger._active
    with ledger.phase(name) if ledger is not None else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Leave the calls made inside the block out of whichever Ledger is recording, if any.

    For a guard such as ranks agreeing on their inputs before an algorithm starts:
    the tables count the algorithm's traffic, and a guard is not part of it.
    """
    ledger = Ledger._active
    if ledger is not None:
        ledger._depth += 1
    try:
        yield
    finally:
        if ledger is not None:
            ledger._depth -= 1


def _rebind_p2p_ops(ops: Iterable[Any]) -> None:
    """`batch_isend_irecv` tells sends from receives by identity with `isend`: keep them in step."""
    for p2p in ops:
        p2p.op = c10d.isend if "send" in p2p.op.__name__ else c10d.irecv


def _matches(r: Record, match: dict) -> bool:
    return all(getattr(r, k) == v for k, v in match.items())


def sent(records: Iterable[Record], **match: Any) -> int:
    """Bytes sent by the records whose fields equal `match`: `sent(recs, op="all_gather", phase="forward")`.

    Any `Record` field works as a key (op, phase, group_ranks, group_size, peer).
    """
    return sum(r.bytes_sent for r in records if _matches(r, match))


def received(records: Iterable[Record], **match: Any) -> int:
    """Bytes received by the records whose fields equal `match` (the receiving side of `sent`)."""
    return sum(r.bytes_received for r in records if _matches(r, match))


def calls(records: Iterable[Record], **match: Any) -> int:
    """How many records match: the number of calls of that kind."""
    return sum(1 for r in records if _matches(r, match))


def summarize(
    records: Iterable[Record], by: tuple[str, ...] = ("phase", "op")
) -> dict[tuple, Tally]:
    """Tally records grouped by the named `Record` fields (any of op, phase, group_ranks, group_size, peer)."""
    out: dict[tuple, Tally] = defaultdict(Tally)
    for r in records:
        out[tuple(getattr(r, k) for k in by)].add(r)
    return dict(out)


def merge(
    per_rank: Iterable[Iterable[Record]], by: tuple[str, ...] = ("phase", "op")
) -> dict[tuple, list[Tally]]:
    """Per-rank tallies side by side: {key: [tally of rank 0, tally of rank 1, ...]}."""
    per_rank = [summarize(records, by) for records in per_rank]
    keys = sorted({k for s in per_rank for k in s}, key=str)
    return {k: [s.get(k, Tally()) for s in per_rank] for k in keys}


def format_tally(t: Tally) -> str:
    """`3 calls, 4608 B` (bytes sent); a tally that only receives shows what it received,
    `8 calls, 2304 B received`, since `0 B` would read as "nothing arrived"."""
    if t.bytes_sent == 0 and t.bytes_received > 0:
        return f"{t.calls} calls, {t.bytes_received} B received"
    return f"{t.calls} calls, {t.bytes_sent} B"


def format_table(
    per_rank: Iterable[Iterable[Record]], by: tuple[str, ...] = ("phase", "op")
) -> str:
    """A deterministic text table of calls and bytes sent (received, for receives), one column per rank."""
    merged = merge(per_rank, by)
    n_ranks = max((len(v) for v in merged.values()), default=0)
    header = [*by, *(f"rank {r}" for r in range(n_ranks))]
    rows = [[*(str(x) for x in k), *(format_tally(t) for t in v)] for k, v in merged.items()]
    return text_table(header, rows)
