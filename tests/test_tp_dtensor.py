"""torch's own tensor parallelism (DTensor) on gloo, CPU: which styles run, and parity with the package.

Pinned for torch 2.13: `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel` and
`loss_parallel` all run forward and backward on gloo ranks on the CPU, and the same
model under them, alone or inside FSDP2 over a dp mesh (dp 2 x tp 2), reaches the
parameters of one process after 2 steps.
"""

import pytest

from paralab.launch import run
from paralab.tp.dtensor import dtensor_train
from paralab.tp.runs import check_train


@pytest.mark.parametrize(
    "tp, dp_shard, sequence_parallel",
    [(2, 1, False), (2, 1, True), (2, 2, True)],
    ids=["colwise+rowwise+loss_parallel", "+SequenceParallel", "fully_shard(dp 2) x tp 2 +SP"],
)
def test_dtensor_tp_reaches_the_one_process_parameters(tp, dp_shard, sequence_parallel):
    per_rank = run(
        dtensor_train, tp * dp_shard, tp, dp_shard, sequence_parallel=sequence_parallel, timeout=120
    )
    failed = [
        v.describe() for v in check_train(per_rank, tp, dp_shard, sequence_parallel) if not v.passed
    ]
    assert not failed, failed
