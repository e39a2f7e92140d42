"""Pipeline parallelism by hand: the model cut by depth into stages, one per rank (or v per
rank, interleaved), micro-batches flowing forward and their gradients back by send/recv.

- `schedules`: a schedule is data, every rank's ordered list of F / B / W actions with
  their sends and receives (GPipe, 1F1B, interleaved 1F1B, ZB-H1).
- `executor`: one executor runs any such list on real ranks, batching each action's
  receives with the previous action's sends, so no schedule deadlocks.
- `clock`: the same lists on a logical clock (F = 1, B = 2, or B = W = 1) with a link of
  some latency: the bubble and the exposed link time, measured from the waiting it records.
- `costs`: bytes per stage boundary; the closed forms of the bubble, the held activations
  and the exposed link time.
- `runs`: the per-rank job, `train`, the one-process `reference`, the checks.
- `dp`: pp × dp, dp copies of the pipeline whose gradient sum waits for the last
  micro-batch (or, naively, follows every one), checked against one process.
"""

from paralab.pp.clock import Deadlock, Timeline, simulate
from paralab.pp.costs import (
    bubble_formula,
    exposed_link_formula,
    in_flight_formula,
    step_bytes_sent,
)
from paralab.pp.runs import reference, train
from paralab.pp.schedules import SCHEDULES, Action, Message, Schedule, build_schedule

__all__ = [
    "SCHEDULES",
    "Action",
    "Deadlock",
    "Message",
    "Schedule",
    "Timeline",
    "bubble_formula",
    "build_schedule",
    "exposed_link_formula",
    "in_flight_formula",
    "reference",
    "simulate",
    "step_bytes_sent",
    "train",
]
