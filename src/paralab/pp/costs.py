"""Closed forms: bytes per stage boundary, the bubble, the activations a stage holds, and the
link time a schedule cannot hide.

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
| bytes a stage saves per micro-batch | blocks · (b·s·h + 2·b·s·f) · itemsize, + 2·b·s·h · itemsize (loss) on the last |
| peak bytes held on rank r | held × a stage's bytes (v = 1); interleaved: walk the list, chunks differ |
| dp sync, collectives per rank per step | v (deferred to the last micro-batch), m·v (after every one) |
| dp sync, bytes per rank per step | 2(dp-1)/dp · gradient bytes of its stages, once (deferred) or m times |
| link time exposed, GPipe | 2(p-1)·d, once: the fill and the drain |
| exposed, 1F1B | 2d·(m + p - 3 - floor((m-2)/p)): about 2(p-1)d/p on every micro-batch |
| exposed, interleaved | 2(v·p-1)·d while d <= 1/v (one chunk's forward) |
| exposed, ZB-H1 | 4(p-1)·d (2(2p-3)·d at m = p) while d <= 1/2 |
| idle time per rank, GPipe and 1F1B, F, B, W apart | (p-1)(F+B+W) |
| idle, ZB-H1 | (p-1)·max(F+B-W, F, B): (p-1)(F+B-W) only while W <= F and W <= B |

The bubble forms count time in units of one rank's forward with a backward twice as
long (B = W = 1 when split); they assume m >= p, below which the warm-up never fills.
Two normalisations of "the bubble" are in use. This lab's is idle rank-time over all
rank-time: (p-1)/(m+p-1) for 1F1B, as in the Zero Bubble README's table (whose ZB1P entry,
a third of that, keeps 1F1B's step as the denominator). The Megatron paper divides the
idle time by the ideal (useful) time instead: (p-1)/m for 1F1B, 0.375 at p = 4, m = 8
against 0.273 here (`bubble_over_useful_time`).
The exposed link time is what a per-message latency d (in forwards; `link_latency`)
adds to the makespan; `simulate(..., latency=d)` measures it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from paralab.pp.model import FFN, HIDDEN, MICRO_BATCH, SEQ, stage_blocks
from paralab.pp.schedules import Schedule


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
    """The bubble fraction of a schedule, as this lab counts it: idle rank-time over all
    rank-time (the Megatron paper's (p-1)/m divides by the useful time instead)."""
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
    end of a forward to the backward action that frees it (W when the backward is split).

    1F1B and ZB-H1 hold their warm-up plus one; interleaved the same from Megatron's
    warm-up count, (p-1-r)·2 + (v-1)·g (`get_pp_rank_microbatches`)."""
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


def bubble_over_useful_time(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The Megatron paper's normalisation: idle time over useful time, (p-1)/m for GPipe and
    1F1B, (p-1)/(v·m) interleaved, and on the same footing (p-1)/3m for ZB-H1."""
    work = {"interleaved": virtual, "zbh1": 3}.get(schedule, 1) * microbatches
    return (pp - 1) / work


def link_latency(
    seconds: float, message_bytes: int, link_bytes_per_s: float, forward_seconds: float
) -> float:
    """One message's time on the link in units of one rank's forward: its latency plus its
    bytes over the link's bandwidth, what `simulate(..., latency=...)` takes."""
    return (seconds + message_bytes / link_bytes_per_s) / forward_seconds


def one_f_one_b_exposed_latency(pp: int, microbatches: int, latency: float) -> float:
    """How much a per-message latency d lengthens a 1F1B step, on the lab's clock (F = 1).

    Rank r keeps at most p - r micro-batches in flight, so rank 0 cannot start its next
    forward before the gradient of a micro-batch p earlier is back: a round trip of
    2(p-1) hops, paid again every p micro-batches, about 2(p-1)d/p on each."""
    ### BEGIN SOLUTION
    p, m, d = pp, microbatches, latency
    return 2 * d * (m + p - 3 - (m - 2) // p)
    ### END SOLUTION


def exposed_link_formula(
    schedule: str, pp: int, microbatches: int, latency: float, virtual: int = 1
) -> float:
    """How much a per-message latency d lengthens the step, on the lab's clock (F = 1).

    GPipe pays every hop once, filling and draining; 1F1B pays on every micro-batch
    (`one_f_one_b_exposed_latency`). Interleaved and ZB-H1 have slack that hides a short
    latency (one chunk's forward, half a forward) and then pay only a constant."""
    p, m, d = pp, microbatches, latency
    if schedule == "gpipe":
        return 2 * (p - 1) * d
    if schedule == "1f1b":
        return one_f_one_b_exposed_latency(p, m, d)
    if schedule == "interleaved" and d <= 1 / virtual and m % p == 0:
        return 2 * (virtual * p - 1) * d
    if schedule == "zbh1" and d <= 0.5 and m >= p:
        return (2 * (2 * p - 3) if m == p else 4 * (p - 1)) * d
    raise ValueError(
        f"no closed form for the exposed link time of {schedule!r} at p = {p}, m = {m}, "
        f"v = {virtual}, latency = {d}: interleaved needs m a multiple of p and latency <= 1/v, "
        "ZB-H1 m >= p and latency <= 1/2"
    )


def idle_time_formula(
    schedule: str, pp: int, forward: float = 1.0, backward: float = 1.0, weight: float = 1.0
) -> float:
    """Idle time of each rank in a step of m >= p micro-batches, when F, B (input gradient)
    and W (weight gradient) take different times; a full backward is B + W.

    1F1B waits (p-1) full rounds of F + B + W. ZB-H1 slides each rank's held-back W's into
    the cool-down: (p-1)(F+B-W), the zero-bubble paper's form, 2W less than 1F1B per stage
    boundary, but no less than the chain itself allows: the first input gradient still needs
    p-1 forwards to start and p-1 input backwards to come back, so never below (p-1)·max(F, B)."""
    p, f, b, w = pp, forward, backward, weight
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) * (f + b + w)
    if schedule == "zbh1":
        return (p - 1) * max(f + b - w, f, b)
    raise ValueError(f"no closed form for the idle time of schedule {schedule!r}")


def megatron_layers_per_stage(
    layers: int,
    pp: int,
    first: int | None = None,
    last: int | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
) -> list[int]:
    """Transformer layers on each of pp stages as Megatron splits them (`get_num_layers_to_build`):
    `first`/`last` are `num_layers_in_first/last_pipeline_stage`, the rest split evenly; or the
    embedding and the loss each counted as one layer (`account_for_*_in_pipeline_split`), so
    the first and last stages build one layer fewer. Raises where Megatron asserts."""
    if (first is not None or last is not None) and (account_for_embedding or account_for_loss):
        raise ValueError(
            "Megatron: uneven first/last stages exclude account_for_*_in_pipeline_split"
        )
    if first is not None or last is not None:
        rest, middle = (
            layers - (first or 0) - (last or 0),
            pp - (first is not None) - (last is not None),
        )
        if middle and rest % middle:
            raise ValueError(f"Megatron: {rest} layers left do not divide over {middle} stages")
        split = [rest // middle if middle else 0] * pp
        split[0] = split[0] if first is None else first
        split[-1] = split[-1] if last is None else last
        return split
    counted = layers + account_for_embedding + account_for_loss
    if counted % pp:
        raise ValueError(f"Megatron: num_layers = {counted} (with embedding/loss) % pp = {pp} != 0")
    split = [counted // pp] * pp
    split[0] -= account_for_embedding
    split[-1] -= account_for_loss
    return split


def stage_saved_bytes(
    stage: int,
    n_stages: int,
    batch: int = MICRO_BATCH,
    seq: int = SEQ,
    hidden: int = HIDDEN,
    ffn: int = FFN,
    itemsize: int = 8,
) -> int:
    """Bytes autograd saves for one micro-batch's backward on one stage, from the shapes.

    Each block saves fc1's input (b·s·h), tanh's output and fc2's input (b·s·f each: the
    same values, saved twice); the last stage's loss saves its output and target (2·b·s·h)."""
    per_block = batch * seq * (hidden + 2 * ffn) * itemsize
    loss = 2 * batch * seq * hidden * itemsize if stage == n_stages - 1 else 0
    return len(stage_blocks(stage, n_stages)) * per_block + loss


def peak_held_bytes(
    plan: Schedule, rank: int, stage_bytes: Callable[[int], int] | None = None
) -> int:
    """The most bytes rank `rank` holds for backward at once, from its action list and the
    model's shapes, without running it: a forward adds its stage's bytes (`stage_saved_bytes`
    of that virtual stage unless `stage_bytes` says otherwise), the action that frees its graph
    (B, or W when split) takes them away. With v = 1 that is `in_flight_formula` times one
    stage's bytes; interleaved chunks differ (the last one saves the loss), so the list decides."""
    per_stage = stage_bytes or (lambda s: stage_saved_bytes(s, plan.n_stages))
    freeing = "W" if plan.split_backward else "B"
    held = peak = 0
    for action in plan.actions[rank]:
        if action.kind == "F":
            held += per_stage(action.stage)
            peak = max(peak, held)
        elif action.kind == freeing:
            held -= per_stage(action.stage)
    return peak


def stage_parameters(stage: int, n_stages: int, hidden: int = HIDDEN, ffn: int = FFN) -> int:
    """Parameters of one (virtual) stage: per block fc1 (h·f + f) and fc2 (f·h + h)."""
    return len(stage_blocks(stage, n_stages)) * (2 * hidden * ffn + ffn + hidden)


def dp_sync_collectives(microbatches: int, virtual: int = 1, deferred: bool = True) -> int:
    """All-reduces a rank makes over dp in one step: one per stage it owns, once (deferred to
    the last micro-batch) or after every micro-batch's backward."""
    return virtual * (1 if deferred else microbatches)


def dp_sync_bytes(
    stage_params: Sequence[int],
    dp: int,
    microbatches: int,
    deferred: bool = True,
    itemsize: int = 8,
) -> int:
    """Bytes a rank sends in one step to sum its stages' gradients over dp: per stage one ring
    all-reduce of its flattened gradients, 2(dp-1)/dp of their bytes (the ledger rounds each
    call down), once per step when deferred, after every micro-batch when not."""
    ### BEGIN SOLUTION
    per_sync = sum(2 * (dp - 1) * (n * itemsize) // dp for n in stage_params)
    return per_sync * (1 if deferred else microbatches)
    ### END SOLUTION
