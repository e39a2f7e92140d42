"""torch's own tensor parallelism (DTensor) on gloo, CPU: which styles run, and parity with the package.

Pinned for torch 2.13: `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel` and
`loss_parallel` all run forward and backward on gloo ranks on the CPU, and the same
model under them, alone or inside FSDP2 over a dp mesh (dp 2 x tp 2), reaches the
parameters of one process after 2 steps.
"""

import pytest
import torch.nn.functional as F

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


def _dtensor_step_under_the_ledger(sequence_parallel):
    """One forward and backward under torch's TP on tp = 2: the ledger's records and the
    placements of the replicated gradients."""
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from paralab.ledger import Ledger
    from paralab.tp.dtensor import head_aligned_qkv, tp_plan
    from paralab.tp.layout import owned_range
    from paralab.tp.model import build_model
    from paralab.tp.runs import build_mesh, global_batch

    tp_mesh = build_mesh(2)["tp"]
    model = build_model(0)
    head_aligned_qkv(model, 2)
    parallelize_module(model, tp_mesh, tp_plan(model, sequence_parallel))
    for block in model.blocks:
        block.attn.heads //= 2
    if sequence_parallel:
        model.pos_offset = owned_range(model.sizes.seq, tp_mesh.get_local_rank(), 2)[0]
    ids, targets = global_batch(1, 0)
    with Ledger() as led:
        with loss_parallel():
            F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
    norms = {
        n: str(getattr(p.grad, "placements", None))
        for n, p in model.named_parameters()
        if "norm" in n
    }
    return len(led.records), norms


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_the_ledger_sees_none_of_dtensors_traffic_and_sp_leaves_norm_grads_partial(
    sequence_parallel,
):
    """Chapter 2: DTensor's collectives go through functional collectives, which the ledger
    does not count; under SequenceParallel the backward leaves the norms' gradients Partial."""
    per_rank = run(_dtensor_step_under_the_ledger, 2, sequence_parallel, timeout=120)
    for records, norms in per_rank:
        assert records == 0
        want = "(Partial(sum),)" if sequence_parallel else "None"
        assert norms and set(norms.values()) == {want}, norms


def test_torch_sp_saves_the_gathered_column_inputs():
    """Chapter 2 §1 and lab section 9: torch's TP saves what the package's TP saves; under SP,
    `ColwiseParallel(input_layouts=Shard(1))` keeps the gathered input (b·s·h per column
    linear) where the package's Megatron-style linear keeps its shard."""
    from paralab.tp.dtensor import dtensor_memory_job
    from paralab.tp.memory import block_saved_bytes
    from paralab.tp.model import CONFIG
    from paralab.tp.runs import memory_job

    measured = {}
    for tp in (2, 4):
        for sp in (False, True):
            measured[(tp, sp)] = (run(memory_job, tp, sp), run(dtensor_memory_job, tp, sp))
            megatron, torch_tp = measured[(tp, sp)]
            assert megatron == [sum(block_saved_bytes(CONFIG, tp, sp).values())] * tp
            gathered = block_saved_bytes(CONFIG, tp, sp, saves_gathered_input=True)
            assert torch_tp == [sum(gathered.values())] * tp
    assert {tp: measured[(tp, True)][1][0] for tp in (2, 4)} == {2: 66048, 4: 42240}
    assert {tp: measured[(tp, True)][0][0] for tp in (2, 4)} == {2: 56832, 4: 28416}
    assert all(measured[(tp, False)][0] == measured[(tp, False)][1] for tp in (2, 4))


def _rows_and_warnings():
    """fsdp_rows' shard, and what torch's DTensor logs while the model trains and is gathered."""
    import logging

    from paralab.tp.dtensor import dtensor_train, fsdp_rows

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("torch.distributed.tensor").addHandler(handler)
    dtensor_train(2, 2, sequence_parallel=True)
    return fsdp_rows(2, 2), logged


def test_fsdp_over_tp_shards_are_strided_and_gathered_without_a_warning():
    """Lab section 8: FSDP2 cuts each rank's TP rows, so rank (d, t) of a (dp 2, tp 2) mesh
    holds rows t·48 + d·24 onwards of the 96-row MLP-up weight; `gather_dp_then_tp` gathers
    one axis at a time, and torch logs nothing (`full_tensor()` warns of 2 sequential
    all-gathers)."""
    per_rank = run(_rows_and_warnings, 4, timeout=120)
    for rank, (rows, logged) in enumerate(per_rank):
        d, t = divmod(rank, 2)
        assert rows == list(range(t * 48 + d * 24, t * 48 + d * 24 + 24)), (rank, rows)
        assert logged == [], logged
