"""Closed forms: bytes per stage boundary, the bubble, and the activations a stage holds.

| quantity | closed form (p ranks, m micro-batches, v stages per rank) |
|---|---|
| bytes per boundary per micro-batch | b·s·h·itemsize forward (the activation) and the same backward (its gradient) |
| bytes a rank sends per step | m · b·s·h·itemsize per boundary it feeds, each way |
| bubble, GPipe and 1F1B | (p-1)/(m+p-1) |
| bubble, interleaved | (p-1)/(v·m+p-1) (m a multiple of p) |
| bubble, ZB-H1 | (p-1)/(3m+p-1) with F = B = W (m >= p) |
| activations held on rank r, GPipe | m micro-batches |
| held, 1F1B | min(p-r, m) |
| held, ZB-H1 | min(p, m): a micro-batch is held until its W |
| held, interleaved | min((v-1)·g + 2(p-1-r) + 1, v·m) chunks of 1/v stage (g = micro-batches per round) |

The bubble forms count time in units of one chunk's forward with a backward twice as
long (B = W = 1 when split); they assume m >= p, below which the warm-up never fills.
"""

from __future__ import annotations

from collections.abc import Sequence

from paralab.pp.model import HIDDEN, MICRO_BATCH, SEQ


def boundary_bytes(
    batch: int = MICRO_BATCH, seq: int = SEQ, hidden: int = HIDDEN, itemsize: int = 8
) -> int:
    """One activation (or its gradient) crossing one stage boundary for one micro-batch: b·s·h."""
    return batch * seq * hidden * itemsize


def step_bytes_sent(owner: Sequence[int], microbatches: int, boundary: int) -> list[dict[str, int]]:
    """Bytes each rank sends in one step, per direction: m boundary-tensors per boundary it feeds.

    Rank r sends forward from every stage it owns whose next stage lives on another rank,
    and backward from every stage it owns, but the first, whose previous one does.
    """
    pp = max(owner) + 1
    sent = [{"forward": 0, "backward": 0} for _ in range(pp)]
    for s, r in enumerate(owner):
        if s + 1 < len(owner) and owner[s + 1] != r:
            sent[r]["forward"] += microbatches * boundary
        if s > 0 and owner[s - 1] != r:
            sent[r]["backward"] += microbatches * boundary
    return sent


def bubble_formula(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The textbook bubble fraction of a schedule: idle rank-time over all rank-time."""
    ### BEGIN SOLUTION
    p, m = pp, microbatches
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (virtual * m + p - 1)
    if schedule == "zbh1":
        return (p - 1) / (3 * m + p - 1)
    raise ValueError(f"no closed form for schedule {schedule!r}")
    ### END SOLUTION


def in_flight_formula(
    schedule: str, pp: int, microbatches: int, rank: int, virtual: int = 1
) -> int:
    """How many (stage, micro-batch) activations rank `rank` holds at its peak, from the
    end of a forward to the backward action that frees it (W when the backward is split)."""
    m = microbatches
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(pp - rank, m)
    if schedule == "zbh1":
        return min(pp, m)
    if schedule == "interleaved":
        per_round = m // max(1, m // pp)
        return min((virtual - 1) * per_round + 2 * (pp - 1 - rank) + 1, virtual * m)
    raise ValueError(f"no closed form for schedule {schedule!r}")
