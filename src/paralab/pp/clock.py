"""The logical clock: run every rank's action list with F = 1, B = 2 (or B = W = 1 when
split; each 1/v of that for one of v stages per rank) and a link of `latency` (0: messages
take no time), and record when each action starts and ends.

An action starts when its rank is free AND everything it needs has arrived: the
messages it receives (`latency` after the sending action ended; the sender does not
wait), the stage before it on the same rank, its own forward (for a backward). Nothing
about the bubble is assumed: a rank that waits shows as a gap, and the bubble fraction is
the share of rank × time spent in gaps; the link time a schedule cannot hide is the
makespan with a latency minus the makespan without. A schedule whose lists wait on
each other in a cycle never finishes: the clock raises `Deadlock`, naming the waiting ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paralab.pp.schedules import Action, build_schedule


class Deadlock(RuntimeError):
    """No rank can start its next action; `waiting` maps each stuck rank to what it waits for."""

    def __init__(self, waiting: dict[int, str]) -> None:
        lines = "; ".join(f"rank {r} waits for {what}" for r, what in waiting.items())
        super().__init__(f"deadlock: ranks {sorted(waiting)} wait on each other ({lines})")
        self.waiting = waiting


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str
    stage: int
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Transfer:
    """One message on the link: sent when `src`'s action ended, arrived at `dst` `latency` later."""

    src: int
    dst: int
    sent: float
    arrived: float


@dataclass(frozen=True)
class Timeline:
    """Per-rank events on one clock; what the pipeline picture draws and the bubble is read from."""

    pp: int
    events: tuple[Event, ...]
    label: str = "logical clock: F = 1, B = 2, split B = W = 1 (1/v each for v stages per rank)"
    transfers: tuple[Transfer, ...] = ()

    @property
    def makespan(self) -> float:
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def busy(self, rank: int) -> float:
        return sum(e.end - e.start for e in self.events if e.rank == rank)

    @property
    def bubble_fraction(self) -> float:
        """Idle rank-time over all rank-time, from the first start to the last end."""
        return 1 - sum(self.busy(r) for r in range(self.pp)) / (self.pp * self.makespan)

    def rank_events(self, rank: int) -> list[Event]:
        return sorted((e for e in self.events if e.rank == rank), key=lambda e: e.start)


def cost(kind: str, split_backward: bool, virtual: int = 1) -> float:
    """Logical duration of one action: F = 1; a full backward B = 2; split, B = W = 1.

    With v stages per rank each stage holds 1/v of a rank's blocks, so its actions take 1/v
    of that: the clock's unit stays one rank's forward, whatever the schedule."""
    units = 1 if kind == "F" or split_backward else 2
    return units / virtual


def _needs(action: Action, owner: Sequence[int], split: bool) -> list[tuple[str, int, int]]:
    """Every (kind, stage, micro-batch) that must be done before `action` starts."""
    s, i = action.stage, action.microbatch
    if action.kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if action.kind == "W":
        return [("B", s, i)]
    needs = [("F", s, i)]
    return needs + ([("B", s + 1, i)] if s + 1 < len(owner) else [])


Durations = Callable[[str, int], float]
"""How long an action takes on the clock, from its kind and (virtual) stage."""


def action_times(
    split_backward: bool,
    forward: float = 1.0,
    backward: float = 1.0,
    weight: float = 1.0,
    stage_scale: Sequence[float] = (),
) -> Durations:
    """Durations for `run_clock` when F, B and W differ, or stages do: F = `forward`,
    B = `backward` (the input gradient), W = `weight`, an unsplit backward B + W;
    `stage_scale[s]` multiplies every action of stage s (a stage with more layers)."""
    units = {"F": forward, "W": weight, "B": backward if split_backward else backward + weight}
    return lambda kind, stage: units[kind] * (stage_scale[stage] if stage_scale else 1.0)


def _deadlock(actions, cursor, done, owner, split) -> Deadlock:
    waiting = {}
    for r, acts in enumerate(actions):
        if cursor[r] < len(acts):
            action = acts[cursor[r]]
            missing = [n for n in _needs(action, owner, split) if n not in done]
            waiting[r] = f"{'/'.join(f'{k}{s}.{i}' for k, s, i in missing)} before {action.name}"
    return Deadlock(waiting)


def _label(latency: float, durations: Durations | None) -> str:
    label = Timeline.label if durations is None else "logical clock: the given action times"
    return label + (f", link latency {latency:g}" if latency else "")


def run_clock(
    actions: Sequence[Sequence[Action]],
    owner: Sequence[int],
    split_backward: bool,
    latency: float = 0.0,
    durations: Durations | None = None,
) -> Timeline:
    """Run the lists on the logical clock; raise `Deadlock` if they wait on each other.

    A result made on another rank arrives `latency` after its action ended; one made on
    the same rank is there at once. `durations(kind, stage)` replaces the default costs."""
    pp, virtual = len(actions), len(owner) // len(actions)
    length = durations or (lambda kind, _: cost(kind, split_backward, virtual))
    done: dict[tuple[str, int, int], float] = {}
    free, cursor = [0.0] * pp, [0] * pp
    events, transfers = [], []
    while any(cursor[r] < len(actions[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while cursor[r] < len(actions[r]):
                action = actions[r][cursor[r]]
                needs = _needs(action, owner, split_backward)
                if any(n not in done for n in needs):
                    break
                arrivals = []
                for kind, s, i in needs:
                    hop = latency if owner[s] != r else 0.0
                    arrivals.append(done[(kind, s, i)] + hop)
                    if hop:
                        transfers.append(Transfer(owner[s], r, done[(kind, s, i)], arrivals[-1]))
                start = max([free[r], *arrivals])
                end = start + length(action.kind, action.stage)
                done[(action.kind, action.stage, action.microbatch)] = end
                events.append(Event(r, action.kind, action.stage, action.microbatch, start, end))
                free[r], cursor[r], progressed = end, cursor[r] + 1, True
        if not progressed:
            raise _deadlock(actions, cursor, done, owner, split_backward)
    return Timeline(pp, tuple(events), _label(latency, durations), tuple(transfers))


def simulate(
    schedule: str, pp: int, microbatches: int, virtual: int = 1, latency: float = 0.0
) -> Timeline:
    """The named schedule's action lists (`build_schedule`) run on the logical clock, with
    `latency` (in units of one rank's forward) on every message between two ranks."""
    plan = build_schedule(schedule, pp, microbatches, virtual)
    return run_clock(plan.actions, plan.owner, plan.split_backward, latency)
