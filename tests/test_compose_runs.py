"""`compose.train` on real ranks: the cheaper rows of lab 10, element by element in float64.

In the tests: 8 ranks dp_shard 2 × tp 2 × pp 2 (1F1B, m = 4; parameters and the ledger's
bytes per group and phase), the same with tp outermost and in torchtitan's order (the same
bits), 8 ranks dp_shard 2 × cp 2 × tp 2 through the public `train`, the bug clinic on 8 ranks
with replicas, and the MoE row dp_shard 4 × tp 2 with ep 2 (through `train`, and its bytes
from the routed counts; a known-wrong expert reduction; its MoE layers under SP, with two
known-wrong mirrors checked against the intact run's reference). The 16-rank row
dp_replicate 2 × cp 2 × tp 2 × pp 2 runs in the lab (`labs/10_four_d_composition`).

Every row runs in one 8-rank launch (`ROWS`, each row under its own patches, its own groups and
model), and each test reads the rows it checks: a launch costs each rank its start-up, a row
only its steps.
"""

from __future__ import annotations

import traceback

import pytest
import torch

from paralab.compose import TORCHTITAN_ORDER, TP_OUTERMOST, Grid, reference, train
from paralab.compose.costs import group_phase_bytes
from paralab.compose.model import CONFIG
from paralab.compose.runs import (
    check_bytes,
    check_params,
    compose_worker,
    cross_node_bytes,
    measured_bytes,
    moe_worker,
    padded_batch,
)
from paralab.exercises.lab10 import per_rank_means, replica_setup
from paralab.launch import groups_freed, run
from paralab.patches import patched
from paralab.tp.mappings import reduce_scatter_seq


def all_pass(verdicts) -> None:
    failed = [v.describe() for v in verdicts if not v.passed]
    assert verdicts and not failed, failed


PP = Grid(8, dp_shard=2, tp=2, pp=2)
MOE = Grid(8, dp_shard=4, tp=2, ep=2, etp=2)
MOE_PP = Grid(8, dp_shard=2, tp=2, pp=2, ep=2, etp=2)
"""The MoE row on a pipeline: dp_shard 2 x tp 2 x pp 2, ep 2, m = 4, under SP."""
CLINIC = Grid(8, dp_replicate=2, dp_shard=2, tp=2)
CP_TP = Grid(8, dp_shard=2, cp=2, tp=2)
MOE_TRAIN = dict(dp_shard=4, tp=2, ep=2)

ROWS = {
    "pp": (compose_worker, (PP,), {}, None),
    "tp outermost": (
        compose_worker,
        (Grid(8, dp_shard=2, tp=2, pp=2, order=TP_OUTERMOST),),
        {},
        None,
    ),
    "torchtitan order": (
        compose_worker,
        (Grid(8, dp_shard=2, tp=2, pp=2, order=TORCHTITAN_ORDER),),
        {},
        None,
    ),
    "reshard after forward": (compose_worker, (PP,), dict(reshard_after_forward=True), None),
    "interleaved": (compose_worker, (PP,), dict(virtual=2), None),
    "clinic": (compose_worker, (CLINIC,), {}, replica_setup()),
    "per-rank means": (compose_worker, (CP_TP,), {}, per_rank_means()),
    "public train": (train, (8,), dict(dp_shard=2, cp=2, tp=2), None),
    "wrong world": (train, (4,), dict(tp=2), None),
    "moe train": (train, (8,), MOE_TRAIN, None),
    "moe experts as dense": (
        train,
        (8,),
        MOE_TRAIN,
        {"paralab.compose.moe": {"is_expert": lambda name: False}},
    ),
    "moe": (moe_worker, (MOE,), {}, None),
    "moe pp": (moe_worker, (MOE_PP,), {}, None),
    "moe pp gather backward reduce-scattered": (
        moe_worker,
        (MOE_PP,),
        {},
        {"paralab.tp.mappings": {"duplicated_gather_backward": reduce_scatter_seq}},
    ),
    "moe pp biases summed over tp": (
        moe_worker,
        (MOE_PP,),
        {},
        {"paralab.compose.moe": {"saw_every_token": lambda name: False}},
    ),
    "moe pp aux without 1/m": (
        moe_worker,
        (MOE_PP,),
        {},
        {"paralab.compose.runs": {"aux_loss_grad": lambda coef, m, ranks: coef / ranks}},
    ),
}
"""name -> (worker, args, kwargs, patches): every run of this file, on the same 8 ranks."""


class RowFailed(Exception):
    """A row raised on its ranks; the text is rank 0's traceback."""


def _rows(rows: dict) -> dict:
    """On every rank: each row in turn under its patches, its groups destroyed after it, as
    ("ok", result) or ("failed", traceback): a row that raises (a world or argument refused,
    on every rank alike before any collective) leaves the later rows to run."""
    out = {}
    for name, (worker, args, kwargs, patches) in rows.items():
        try:
            with groups_freed(), patched(patches):
                out[name] = ("ok", worker(*args, **kwargs))
        except Exception:
            out[name] = ("failed", traceback.format_exc())
    return out


@pytest.fixture(scope="module")
def rows():
    per_rank = run(_rows, 8, ROWS, timeout=300)

    def row(name: str) -> list:
        """Every rank's result of row `name`; RowFailed if it raised."""
        status, got = per_rank[0][name]
        if status == "failed":
            raise RowFailed(got)
        return [r[name][1] for r in per_rank]

    return row


def test_dp_tp_pp_parameters_equal_one_process(rows):
    all_pass(check_params([o[0] for o in rows("pp")], PP))


def test_dp_tp_pp_bytes_per_group_and_phase_equal_the_closed_form(rows):
    out = rows("pp")
    all_pass(check_bytes([o[1] for o in out], PP))
    stage0 = group_phase_bytes(PP, 0, CONFIG, 4)
    assert {g for g, _ in stage0} == {"tp", "pp", "dp_shard_cp", "dp_cp"}  # no cp, no replicas
    assert stage0[("dp_cp", "token count")] == 8  # one int64 all-reduced over 2 ranks
    shard = CONFIG.batch // 4 * CONFIG.seq // 2 * CONFIG.hidden * 8  # SP: seq / tp tokens
    assert measured_bytes(out[0][1], PP, 0)[("pp", "forward")] == 4 * shard
    without_sp = group_phase_bytes(PP, 0, CONFIG, 4, sequence_parallel=False)
    assert without_sp[("pp", "forward")] == 2 * 4 * shard  # tp times what Megatron sends


def test_tp_outermost_gives_the_same_bits(rows):
    wrong = ROWS["tp outermost"][1][0]
    assert wrong.stride("tp") == 4
    moved = rows("tp outermost")
    for a, b in zip(moved, rows("pp")):
        assert all(torch.equal(a[0][k], b[0][k]) for k in b[0])
    all_pass(check_bytes([o[1] for o in moved], wrong))


def test_torchtitan_order_gives_the_same_bits(rows):
    """Chapter 1: `Grid(order=TORCHTITAN_ORDER)` (pp outermost) computes the same bits."""
    titan = ROWS["torchtitan order"][1][0]
    assert titan.stride("pp") == 4 and titan.stride("dp_shard") == 2
    moved = rows("torchtitan order")
    for a, b in zip(moved, rows("pp")):
        assert all(torch.equal(a[0][k], b[0][k]) for k in b[0])
    all_pass(check_bytes([o[1] for o in moved], titan))


def test_the_clinic_hsdp_run_as_fsdp_passes_the_params_and_fails_the_bytes(rows):
    """The lab's bug clinic on 8 ranks (dp_replicate 2 x dp_shard 2 x tp 2, two 4-rank nodes):
    `replica_setup()` shards over dp_cp, the replicas forgotten. The parameters still equal one
    process; the bytes per group and phase do not, and the gradient traffic crosses the nodes."""
    changed = rows("clinic")
    all_pass(check_params([p for p, _ in changed], CLINIC))
    assert not all(v.passed for v in check_bytes([r for _, r in changed], CLINIC))
    tp = CLINIC.group(0, "tp")  # SP's replicated gradients, summed over tp in the same phase
    used = {r.group_ranks for r in changed[0][1] if r.phase == "grad sync" and r.group_ranks != tp}
    assert used == {CLINIC.group(0, "dp_cp")} == {(0, 2, 4, 6)}
    assert cross_node_bytes(changed[0][1], CLINIC, 0, gpus_per_node=4)


def test_dp_shard_cp_tp_through_the_public_train(rows):
    got = rows("public train")
    all_pass(check_params(got, CP_TP))
    assert set(got[0]) == set(reference(samples=2))


def test_train_refuses_a_world_it_is_not_run_on(rows):
    with pytest.raises(RowFailed, match="world=4"):
        rows("wrong world")


def test_moe_dp4_tp2_with_ep2_carved_from_dp_equals_one_process(rows):
    """The public `train` with experts: its expert model, its grid, equal to one process."""
    assert MOE.group(0, "ep") == (0, 2) and MOE.group(0, "dp_shard_mod_ep") == (0, 4)
    got = rows("moe train")
    all_pass(check_params(got, MOE, moe=True))
    assert any(".mlp.moe.experts.3.fc1.weight" in k for k in got[0])


def test_moe_bytes_per_group_and_phase_equal_the_formula_from_the_routed_counts(rows):
    out = rows("moe")
    all_pass(check_params([p for p, _, _ in out], MOE, moe=True))
    all_pass(check_bytes([r for _, r, _ in out], MOE, send_counts=[c for _, _, c in out]))
    groups = {g for g, _ in measured_bytes(out[0][1], MOE, 0)}
    assert {"ep", "dp_shard_mod_ep", "tp", "dp_shard_cp"} <= groups


def test_moe_experts_reduced_as_dense_parameters_fail_the_check(rows):
    """Known-wrong: experts averaged over dp_shard_cp like the dense weights (ranks that hold other
    experts): the element-wise check must catch it."""
    got = rows("moe experts as dense")
    assert not all(v.passed for v in check_params(got, MOE, moe=True))


def test_moe_layers_under_sp_take_the_whole_gradient_and_wrong_mirrors_fail(rows):
    """The MoE rows run TP with SP: rank 0's pipeline sends are sequence shards, and each MoE
    layer gathers the tp group's tokens. Known-wrong: the gather's backward a reduce-scatter (SP's
    column-linear mirror), which adds up tp equal copies; the layer's router and expert biases
    summed over tp with the partial gradients. The check fails each."""
    out = rows("moe pp")  # its parameters are checked by the pp row's test below
    shard = CONFIG.batch // 4 * CONFIG.seq // MOE_PP.tp * CONFIG.hidden * 8
    assert measured_bytes(out[0][1], MOE_PP, 0)[("pp", "forward")] == 4 * shard
    for name in ("moe pp gather backward reduce-scattered", "moe pp biases summed over tp"):
        wrong = rows(name)  # the intact run's steps
        assert not all(v.passed for v in check_params([p for p, _, _ in wrong], MOE_PP, moe=True))


def test_unequal_tokens_need_the_global_count_and_per_rank_means_fail(rows):
    """The padded batch gives dp ranks 28 and 24 counted tokens (and the zigzag cp ranks unequal
    shares): the loss over the global count equals one process, the mean of per-rank means not."""
    _, targets = padded_batch(2, 0)
    assert [int((targets[r * 4 : r * 4 + 4] != -100).sum()) for r in range(2)] == [28, 24]
    wrong = rows("per-rank means")
    assert not all(v.passed for v in check_params([p for p, _ in wrong], CP_TP))


def test_fsdp_resharding_after_forward_under_pp_gathers_2m_times_and_stays_exact(rows):
    """FSDP's reshard_after_forward=True on the pp row: each micro-batch's forward and backward
    refill the freed parameters (a wrong refill would break the check), 2m = 8 gathers per step
    against the kept row's one; ledger = formula on every rank."""
    kept, out = rows("pp"), rows("reshard after forward")
    all_pass(check_params([o[0] for o in out], PP))
    all_pass(check_bytes([o[1] for o in out], PP, reshard_after_forward=True))
    gather = ("dp_shard_cp", "param gather")
    for rank in range(8):
        once = measured_bytes(kept[rank][1], PP, rank)[gather]
        assert measured_bytes(out[rank][1], PP, rank)[gather] == 8 * once > 0


def test_interleaved_pp_row_equals_one_process_and_its_bytes_the_formula(rows):
    """pp 2 with 2 virtual stages per rank on the 2-block model: the embedding and the head each
    count as a layer, so the 4 stages run [embed], [block 0], [block 1], [norm, head]; rank 0
    holds stages 0 and 2 and sends forward from both (stage 3 is its peer's)."""
    out = rows("interleaved")
    all_pass(check_params([o[0] for o in out], PP))
    all_pass(check_bytes([o[1] for o in out], PP, virtual=2))
    once = group_phase_bytes(PP, 0, CONFIG, 4)[("pp", "forward")]
    assert measured_bytes(out[0][1], PP, 0)[("pp", "forward")] == 2 * once


def test_moe_with_pp_carries_the_aux_loss_from_stage_0_and_a_missing_1_over_m_fails(rows):
    """The MoE row on a pipeline (dp_shard 2 x tp 2 x pp 2, ep 2, m = 4): stage 0's aux losses
    reach the loss through `AuxLossAutoScaler`, exact against one process routing each
    micro-batch; the ledger equals the formula from the routed counts. Known-wrong: the aux
    gradient not divided by the micro-batches."""
    out = rows("moe pp")
    all_pass(check_params([p for p, _, _ in out], MOE_PP, moe=True))
    all_pass(check_bytes([r for _, r, _ in out], MOE_PP, send_counts=[c for _, _, c in out]))
    assert len(out[0][2]) == 1 and len(out[0][2][0]) == 4  # one block per stage, 4 micro-batches
    wrong = rows("moe pp aux without 1/m")
    assert not all(v.passed for v in check_params([p for p, _, _ in wrong], MOE_PP, moe=True))
