"""One executor for every schedule: it runs a rank's action list on real ranks.

Before each action the rank hands `exchange` the sends its previous action left and the
receives this one needs, as one batch (`batch_isend_irecv`), and waits for the receives
only; the sends complete in the background and are waited for at the end of the step.
So a rank never blocks on a send: it blocks only on data it truly needs, and any list
the logical clock can finish also finishes here (the bug clinic shows what happens when
a send blocks instead).

Gradient accumulation: each micro-batch's loss is its share of the global-batch loss
(`model.microbatch_loss`, over m), and parameter gradients accumulate over the
micro-batches in order. A split backward computes B = d(output)/d(input) with the graph
kept, then W = d(output)/d(weights) from the same graph (recomputing the chain; a real
zero-bubble stage keeps the intermediate gradients instead).

Collectives inside a stage (a tensor-parallel all-reduce, a context-parallel ring) are
labelled with the phase of the action that makes them, in whichever ledger is recording.

Memory is counted as the bytes autograd saves for backward (`saved_tensors_hooks`,
parameters excluded), held from a forward until the action that frees its graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from paralab.ledger import in_phase
from paralab.pp.model import HIDDEN, MICRO_BATCH, SEQ, Stage, microbatch_loss
from paralab.pp.schedules import Action, Message, Schedule


@dataclass
class StepRecord:
    """What one rank did in one step: its actions in run order, their wall-clock spans, memory."""

    executed: list[Action] = field(default_factory=list)
    wall: list[tuple[str, float, float]] = field(default_factory=list)
    """(action name, start, end) in `time.perf_counter` seconds: this machine's clock."""
    saved_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    """(stage, micro-batch) -> bytes its forward saved for backward."""
    peak_saved_bytes: int = 0
    peak_in_flight: int = 0
    """The most (stage, micro-batch) activations held at once."""


def message_tag(message: Message, microbatches: int) -> int:
    """A tag unique within the step: which stage's activation or gradient, for which micro-batch."""
    return 2 * (message.stage * microbatches + message.microbatch) + (message.kind == "grad")


def exchange(
    sends: Sequence[tuple[Message, torch.Tensor]],
    recvs: Sequence[tuple[Message, torch.Tensor]],
    microbatches: int,
) -> list[dist.Work]:
    """Post this rank's pending sends and its next receives as ONE batch; wait for the receives.

    Returns the sends' handles, to wait for at the end of the step. Posting both together is
    what makes the warm-up -> steady-state turn of 1F1B safe: there each neighbour sends to
    the other at the same moment, and gloo's (like NCCL's) send completes only when the peer
    has posted the matching receive.
    """
    ops = [
        dist.P2POp(dist.isend, t, m.peer, tag=message_tag(m, microbatches)) for m, t in sends
    ] + [dist.P2POp(dist.irecv, t, m.peer, tag=message_tag(m, microbatches)) for m, t in recvs]
    if not ops:
        return []
    works = dist.batch_isend_irecv(ops)
    for work in works[len(sends) :]:
        work.wait()
    return works[: len(sends)]


def _buffer(shape: Sequence[int] | None = None) -> torch.Tensor:
    """A receive buffer for one boundary tensor: this package's (b, s, h) unless told another shape."""
    return torch.empty(*(shape or (MICRO_BATCH, SEQ, HIDDEN)), dtype=torch.float64)


def run_actions(
    plan: Schedule,
    rank: int,
    stages: dict[int, Stage],
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    *,
    loss: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
    boundary_shape: Sequence[int] | None = None,
    after_grads: Callable[[int, int], None] | None = None,
) -> StepRecord:
    """Run rank `rank`'s list of `plan` once: one training step's forwards and backwards.

    `inputs` and `targets` are the m micro-batches (only the first and last stage read them).
    Parameter gradients accumulate into `.grad` of the stages' parameters. Another model
    passes its own `loss(output, target, m)` (default `microbatch_loss`) and the shape of
    the tensor crossing a boundary (default this package's (b, s, h)). `after_grads(stage, i)`,
    if given, runs once micro-batch i's parameter gradients of that stage are accumulated
    (after B, or after W when the backward is split): where a data-parallel wrapper syncs.
    """
    loss = loss or microbatch_loss
    m, last = plan.microbatches, plan.n_stages - 1
    record = StepRecord()
    param_storage = {
        p.untyped_storage().data_ptr() for st in stages.values() for p in st.parameters()
    }
    stage_input: dict[tuple[int, int], torch.Tensor] = {}
    stage_output: dict[tuple[int, int], torch.Tensor] = {}
    local: dict[tuple[str, int, int], torch.Tensor] = {}
    pending: list[tuple[Message, torch.Tensor]] = []
    pending_phase = "forward"
    send_works: list[dist.Work] = []
    live = 0

    def release(key: tuple[int, int]) -> None:
        nonlocal live
        live -= record.saved_bytes[key]
        del stage_input[key], stage_output[key]

    for action in plan.actions[rank]:
        s, i = action.stage, action.microbatch
        key = (s, i)
        received = {msg: _buffer(boundary_shape) for msg in action.recvs}
        with in_phase(pending_phase):
            send_works += exchange(pending, list(received.items()), m)
        pending = []
        start = time.perf_counter()
        if action.kind == "F":
            if s == 0:
                x = inputs[i]
            elif action.recvs:
                x = received[action.recvs[0]]
            else:
                x = local.pop(("act", s - 1, i))
            x = x.detach().requires_grad_(s > 0)
            saved = 0

            def count(t: torch.Tensor) -> torch.Tensor:
                nonlocal saved
                if t.untyped_storage().data_ptr() not in param_storage:
                    saved += t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t), in_phase("forward"):
                y = stages[s](x)
                out = loss(y, targets[i], m) if s == last else y
            record.saved_bytes[key] = saved
            live += saved
            stage_input[key], stage_output[key] = x, out
            if s < last:
                produced = y.detach()
                pending = [(msg, produced) for msg in action.sends]
                if not action.sends:
                    local[("act", s, i)] = produced
            pending_phase = "forward"
        elif action.kind == "B":
            x, out = stage_input[key], stage_output[key]
            if s == last:
                grad_out = None
            elif action.recvs:
                grad_out = received[action.recvs[0]]
            else:
                grad_out = local.pop(("grad", s + 1, i))
            if plan.split_backward:
                stage_output[key] = (out, grad_out)
                with in_phase("backward"):
                    grad_in = (
                        torch.autograd.grad(out, x, grad_out, retain_graph=True)[0]
                        if s > 0
                        else None
                    )
            else:
                with in_phase("backward"):
                    torch.autograd.backward(out, grad_out)
                grad_in = x.grad if s > 0 else None
                release(key)
                if after_grads:
                    after_grads(s, i)
            if s > 0:
                pending = [(msg, grad_in) for msg in action.sends]
                if not action.sends:
                    local[("grad", s, i)] = grad_in
            pending_phase = "backward"
        else:  # W: the weight gradient, from the graph B kept
            out, grad_out = stage_output[key]
            params = list(stages[s].parameters())
            with in_phase("backward"):
                weight_grads = torch.autograd.grad(out, params, grad_out)
            for p, g in zip(params, weight_grads):
                p.grad = g if p.grad is None else p.grad.add_(g)
            release(key)
            if after_grads:
                after_grads(s, i)
        record.wall.append((action.name, start, time.perf_counter()))
        record.executed.append(action)
        record.peak_saved_bytes = max(record.peak_saved_bytes, live)
        record.peak_in_flight = max(record.peak_in_flight, len(stage_input))
    with in_phase(pending_phase):
        send_works += exchange(pending, [], m)
    for work in send_works:
        work.wait()
    return record
