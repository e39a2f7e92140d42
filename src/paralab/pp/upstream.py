"""The same stages under `torch.distributed.pipelining`: PipelineStage plus one of torch's
schedule classes, on the ranks of a launch, for parity with the hand-written executor.

torch's schedule (`step`) splits the batch into m micro-batches itself and calls the loss
function on each; with `loss_fn = microbatch_loss(·, ·, m)` and `scale_grads=False` it
accumulates the same per-micro-batch gradients as `executor.run_actions`. Its schedule is data
too: each class exposes its per-rank action list (`pipeline_order`), which `torch_worker` reads
back, compute only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import pipelining

from paralab.pp.model import Stage, global_batch, make_blocks, microbatch_loss

TORCH_SCHEDULES = {
    "ScheduleGPipe": "single",
    "Schedule1F1B": "single",
    "ScheduleInterleaved1F1B": "looped",
    "ScheduleInterleavedZeroBubble": "looped",
    "ScheduleZBVZeroBubble": "v_shape",
    "ScheduleDualPipeV": "v_shape",
}
"""torch's schedule classes the lab runs bitwise, and how each places stages: one per rank,
v = 2 looped (r, r + p), or v = 2 in a V (r and 2p - 1 - r)."""

LEFT_OUT = {"ScheduleLoopedBFS": "looped"}
"""The seventh class torch exports. It runs here too, but its backwards go last micro-batch
first, so its gradients are one process's summed in another order: equal to rounding only."""


def torch_stage_indices(placement: str, rank: int, pp: int) -> list[int]:
    if placement in ("single", "one_in_list"):
        return [rank]
    if placement == "looped":
        return [rank, rank + pp]
    return [rank, 2 * pp - 1 - rank]


def _compute_actions(order: list) -> list[tuple[str, int, int]]:
    """torch's actions of one rank, compute only: I (input backward) written B, as here."""
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    out = []
    for action in order:
        if action is None:
            continue
        subs = action.sub_actions or (action,)
        for a in subs:
            kind = a.computation_type.value
            if kind in kinds:
                out.append((kinds[kind], a.stage_index, a.microbatch_index))
    return out


def torch_worker(
    class_name: str, microbatches: int, seed: int = 0, one_stage: bool = False
) -> dict[str, Any]:
    """On every rank: one step of `class_name`; this rank's gradients and its compute order.

    `one_stage` runs a multi-stage class with one stage per rank (ScheduleInterleavedZeroBubble
    with v = 1 is ZB-H1)."""
    rank, pp = dist.get_rank(), dist.get_world_size()
    placement = "one_in_list" if one_stage else {**TORCH_SCHEDULES, **LEFT_OUT}[class_name]
    indices = torch_stage_indices(placement, rank, pp)
    n_stages = pp * len(indices)
    blocks = make_blocks(seed)
    modules = [Stage(blocks, s, n_stages) for s in indices]
    stages = [
        pipelining.PipelineStage(mod, s, n_stages, torch.device("cpu"))
        for mod, s in zip(modules, indices)
    ]
    schedule_class = getattr(pipelining, class_name)
    schedule = schedule_class(
        stages[0] if placement == "single" else stages,
        microbatches,
        loss_fn=lambda out, target: microbatch_loss(out, target, microbatches),
        scale_grads=False,
    )
    x, y = global_batch(microbatches, 0, seed)
    args = (x,) if 0 in indices else ()
    schedule.step(*args, target=y if n_stages - 1 in indices else None)
    grads = {k: p.grad.clone() for mod in modules for k, p in mod.named_model_parameters().items()}
    order = (
        schedule.pipeline_order[rank]
        if hasattr(schedule, "pipeline_order")
        else schedule._get_pipeline_order()[rank]
    )
    return {"grads": grads, "order": _compute_actions(order), "stages": indices}


def torch_jobs(microbatches: int = 4) -> list[tuple]:
    """`torch_worker` arguments for every class, then ScheduleInterleavedZeroBubble on one stage per rank."""
    return [(name, microbatches) for name in TORCH_SCHEDULES] + [
        ("ScheduleInterleavedZeroBubble", microbatches, 0, True)
    ]


def torch_sweep(jobs: list[tuple]) -> list[dict[str, Any]]:
    """On every rank: `torch_worker(*job)` for each job, in one launch."""
    return [torch_worker(*job) for job in jobs]
