"""A pipeline schedule is data: for every rank, the ordered list of what it computes,
each action with the messages it must receive before it and send after it.

An action is a forward `F`, a backward `B`, or, in a zero-bubble schedule, a backward
split in two: `B` computes only the input gradient (what the previous stage waits for)
and `W` the weight gradient (which nobody waits for, so it can fill a bubble). The
schedule functions below write only the compute order; `attach_messages` derives every
send and receive from it and from which rank owns which stage, the same way for all.

| schedule | stages per rank | order on rank r (p ranks, m micro-batches) |
|---|---|---|
| gpipe | 1 | all m forwards, then all m backwards |
| 1f1b | 1 | min(p - r, m) forwards, then one backward and one forward in turn, then the rest of the backwards |
| interleaved | v, looped: r, r + p, ... | 1F1B over the v·m chunk-forwards, depth first in rounds of micro-batches |
| zbh1 | 1 | 1F1B's forwards and input backwards; each weight backward W deferred to fill the cool-down |
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1")


@dataclass(frozen=True)
class Message:
    """One tensor between two ranks: the activation a stage's forward produced (`act`) or the
    input gradient a stage's backward produced (`grad`), for one micro-batch."""

    kind: str
    stage: int
    microbatch: int
    peer: int


@dataclass(frozen=True)
class Action:
    """What a rank computes (`F`, `B` or `W` of one stage on one micro-batch), the messages it
    receives before and sends after."""

    kind: str
    stage: int
    microbatch: int
    recvs: tuple[Message, ...] = ()
    sends: tuple[Message, ...] = ()

    @property
    def name(self) -> str:
        """`F3.1`: forward of stage 3 on micro-batch 1 (torch writes it `3F1`)."""
        return f"{self.kind}{self.stage}.{self.microbatch}"

    def describe(self) -> str:
        """The action with its messages: `recv act0.1 from 0 | F1.1 | send act1.1 to 2`."""
        parts = [f"recv {m.kind}{m.stage}.{m.microbatch} from {m.peer}" for m in self.recvs]
        parts.append(self.name)
        parts += [f"send {m.kind}{m.stage}.{m.microbatch} to {m.peer}" for m in self.sends]
        return " | ".join(parts)


@dataclass(frozen=True)
class Schedule:
    """Every rank's action list, and the facts the executor and the clock need about it."""

    name: str
    pp: int
    microbatches: int
    virtual: int
    owner: tuple[int, ...]
    """owner[stage] = the rank that runs that (virtual) stage."""
    actions: tuple[tuple[Action, ...], ...]
    """actions[rank] = that rank's ordered list."""

    @property
    def n_stages(self) -> int:
        return len(self.owner)

    @property
    def split_backward(self) -> bool:
        """Whether backwards are split into B (input gradient) and W (weight gradient)."""
        return any(a.kind == "W" for rank in self.actions for a in rank)

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.owner) if r == rank]

    def order(self, rank: int) -> list[str]:
        """The compute order of one rank, as names: ['F0.0', 'F0.1', 'B0.0', ...]."""
        return [a.name for a in self.actions[rank]]


Order = list[tuple[str, int, int]]
"""One rank's compute order: (kind, stage, micro-batch) in the order it runs them."""


def gpipe_order(pp: int, microbatches: int) -> list[Order]:
    """GPipe: every forward, then every backward, in micro-batch order."""
    return [
        [("F", r, i) for i in range(microbatches)] + [("B", r, i) for i in range(microbatches)]
        for r in range(pp)
    ]


def one_f_one_b_order(pp: int, microbatches: int) -> list[Order]:
    """1F1B: rank r runs min(pp - r, m) forwards (warm-up), then alternates one backward and
    one forward (steady state), then runs the remaining backwards (cool-down).

    The warm-up leaves at most pp - r micro-batches in flight on rank r, so rank r holds
    at most min(pp - r, m) micro-batches' activations, against m under GPipe.
    """
    ### BEGIN SOLUTION
    orders = []
    for r in range(pp):
        warmup = min(pp - r, microbatches)
        order = [("F", r, i) for i in range(warmup)]
        for i in range(microbatches):
            order.append(("B", r, i))
            if warmup + i < microbatches:
                order.append(("F", r, warmup + i))
        orders.append(order)
    return orders
    ### END SOLUTION


def _rounds(pp: int, microbatches: int) -> int:
    """Micro-batches per round of the interleaved schedule (torch's rule: m // max(1, m // pp))."""
    rounds = max(1, microbatches // pp)
    if microbatches % rounds:
        raise ValueError(
            f"interleaved: m = {microbatches} must be a multiple of max(1, m // pp) = {rounds}"
        )
    return microbatches // rounds


def interleaved_order(pp: int, microbatches: int, virtual: int) -> list[Order]:
    """Interleaved 1F1B: rank r owns stages r, r + pp, ..., r + (v-1)·pp.

    Its k-th forward runs local chunk (k // g) % v, g micro-batches per round (g = pp when
    m is a multiple of pp): a round of micro-batches goes through chunk 0, then chunk 1, ...
    (depth first). Warm-up: (v-1)·g + 2(pp-1-r) forwards (capped at v·m), then 1F1B over the
    chunk-forwards; backwards visit the chunks last to first.
    """
    g = _rounds(pp, microbatches)
    total = virtual * microbatches
    orders = []
    for r in range(pp):
        warmup = min((virtual - 1) * g + 2 * (pp - 1 - r), total)
        forwards = [(k // g) % virtual for k in range(total)]
        backwards = [virtual - 1 - (k // g) % virtual for k in range(total)]
        kinds = ["F"] * warmup
        for _ in range(total - warmup):
            kinds += ["F", "B"]
        kinds += ["B"] * warmup
        count = {"F": [0] * virtual, "B": [0] * virtual}
        chunks = {"F": iter(forwards), "B": iter(backwards)}
        order: Order = []
        for kind in kinds:
            chunk = next(chunks[kind])
            order.append((kind, chunk * pp + r, count[kind][chunk]))
            count[kind][chunk] += 1
        orders.append(order)
    return orders


def zbh1_order(pp: int, microbatches: int) -> list[Order]:
    """ZB-H1 (zero bubble, same memory as 1F1B): 1F1B's order with each backward split into
    B (input gradient, on 1F1B's slot) and W (weight gradient).

    Rank r runs min(pp - r, m) forwards, then B, F in turn; it runs a micro-batch's W
    right after its B once more than r are pending (rank 0 at once, the last rank holds
    p-1 back). B alone is half a full backward, so the input gradients reach rank 0
    sooner, and the held-back W's of the later ranks fill what would have been idle: the
    bubble falls from (p-1)/(m+p-1) to (p-1)/(3m+p-1) with F = B = W.
    """
    orders = []
    for r in range(pp):
        warmup = min(pp - r, microbatches)
        order: Order = [("F", r, i) for i in range(warmup)]
        pending: list[int] = []
        for i in range(microbatches):
            order.append(("B", r, i))
            pending.append(i)
            if len(pending) > r:
                order.append(("W", r, pending.pop(0)))
            if warmup + i < microbatches:
                order.append(("F", r, warmup + i))
        order += [("W", r, i) for i in pending]
        orders.append(order)
    return orders


def stage_owner(pp: int, virtual: int) -> tuple[int, ...]:
    """Looped placement: stage s runs on rank s % pp (v = 1: stage s on rank s)."""
    return tuple(s % pp for s in range(pp * virtual))


def attach_messages(orders: list[Order], owner: tuple[int, ...]) -> tuple[tuple[Action, ...], ...]:
    """Every action with its receives and sends, derived from the order and the owners.

    A forward of stage s > 0 receives s-1's activation; one of stage s < last sends its
    own to stage s+1's owner. An input backward (B) of stage s < last receives the gradient
    of its output; one of stage s > 0 sends its input gradient back. W exchanges nothing.
    Between two stages on the same rank nothing crosses the wire.
    """
    last = len(owner) - 1
    ranks = []
    for rank, order in enumerate(orders):
        actions = []
        for kind, s, i in order:
            recvs, sends = [], []
            if kind == "F":
                if s > 0 and owner[s - 1] != rank:
                    recvs.append(Message("act", s - 1, i, owner[s - 1]))
                if s < last and owner[s + 1] != rank:
                    sends.append(Message("act", s, i, owner[s + 1]))
            elif kind == "B":
                if s < last and owner[s + 1] != rank:
                    recvs.append(Message("grad", s + 1, i, owner[s + 1]))
                if s > 0 and owner[s - 1] != rank:
                    sends.append(Message("grad", s, i, owner[s - 1]))
            actions.append(Action(kind, s, i, tuple(recvs), tuple(sends)))
        ranks.append(tuple(actions))
    return tuple(ranks)


def build_schedule(name: str, pp: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The named schedule as data: `gpipe`, `1f1b`, `interleaved` (v >= 2) or `zbh1`."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    if (virtual != 1) != (name == "interleaved"):
        raise ValueError(
            f"{name}: virtual = {virtual}; only 'interleaved' takes v > 1 (and needs it)"
        )
    if name == "gpipe":
        orders = gpipe_order(pp, microbatches)
    elif name == "1f1b":
        orders = one_f_one_b_order(pp, microbatches)
    elif name == "interleaved":
        orders = interleaved_order(pp, microbatches, virtual)
    else:
        orders = zbh1_order(pp, microbatches)
    owner = stage_owner(pp, virtual)
    return Schedule(name, pp, microbatches, virtual, owner, attach_messages(orders, owner))


def addressed(plan: Schedule, pp_ranks: tuple[int, ...]) -> Schedule:
    """The same schedule with every message's peer the global rank of that pipeline rank, for
    a pipeline that is one of several (pp × dp, pp × tp ...): pp_ranks[r] runs pipeline rank r."""

    def readdress(messages: tuple[Message, ...]) -> tuple[Message, ...]:
        return tuple(dataclasses.replace(m, peer=pp_ranks[m.peer]) for m in messages)

    actions = tuple(
        tuple(
            dataclasses.replace(a, recvs=readdress(a.recvs), sends=readdress(a.sends))
            for a in rank_actions
        )
        for rank_actions in plan.actions
    )
    return dataclasses.replace(plan, actions=actions)
