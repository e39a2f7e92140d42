"""Tensor and sequence parallelism by hand on real gloo ranks, against one process.

Every check is element by element in float64: a block's output, input gradient and
parameter gradients; the whole model's logits, loss and gradients; the parameters after
2 SGD steps (also inside FSDP2 over dp); bytes per (phase, collective) = the closed form;
bytes saved for the backward = the closed form. A planted bug (f's backward without its
all-reduce) must be caught.
"""

import pytest
import torch

from paralab.check import compare
from paralab.exercises.lab07 import sum_gradients, tp_clinic_change
from paralab.launch import run
from paralab.tp import reference, train
from paralab.tp.costs import (
    activation_bytes,
    all_gather_bytes,
    all_reduce_bytes,
    block_bytes,
    gathered_logits_bytes,
    step_bytes,
)
from paralab.tp.layout import Split, shard, unshard
from paralab.tp.memory import block_saved_bytes
from paralab.tp.model import CONFIG
from paralab.tp.runs import (
    assemble,
    block_job,
    block_reference,
    check_block,
    check_bytes,
    check_lm,
    check_memory,
    check_train,
    lm_job,
    memory_job,
    one_process_saved_bytes,
)


def _failed(verdicts):
    return [v.describe() for v in verdicts if not v.passed]


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_one_step_equals_one_process_and_bytes_equal_the_formula(tp, sequence_parallel):
    block = run(block_job, tp, sequence_parallel)
    lm = run(lm_job, tp, sequence_parallel)
    verdicts = check_block(block, sequence_parallel) + check_lm(lm, sequence_parallel)
    assert len(verdicts) > 40 and not _failed(verdicts), _failed(verdicts)
    byte_verdicts = check_bytes(lm, sequence_parallel) + check_bytes(
        block, sequence_parallel, block=True
    )
    assert not _failed(byte_verdicts), _failed(byte_verdicts)


def test_odd_tp_runs_too():
    verdicts = check_lm(run(lm_job, 3, True), True)
    assert not _failed(verdicts), _failed(verdicts)


@pytest.mark.parametrize(
    "tp, dp_shard, sequence_parallel", [(2, 1, False), (4, 1, True), (2, 2, False), (2, 2, True)]
)
def test_parameters_after_two_steps_equal_one_process(tp, dp_shard, sequence_parallel):
    per_rank = run(train, tp * dp_shard, tp, dp_shard, sequence_parallel=sequence_parallel)
    verdicts = check_train(per_rank, tp, dp_shard, sequence_parallel)
    assert not _failed(verdicts), _failed(verdicts)
    assert set(per_rank[0]) == set(reference(samples=dp_shard, steps=0))


def test_training_moves_the_parameters():
    """The parameter check is not vacuous: two steps change every parameter."""
    before, after = reference(samples=1, steps=0), reference(samples=1, steps=2)
    assert all(not torch.equal(before[n], after[n]) for n in before)


def test_dropping_fs_backward_all_reduce_leaves_a_partial_input_gradient():
    """The clinic's bug, planted with patches=: the forward still matches, dx does not."""
    correct = run(block_job, 2)
    buggy = run(block_job, 2, patches=tp_clinic_change())
    want = block_reference()
    got = assemble(buggy, sequence_parallel=False)
    out = compare(got["out"], want["out"], atol=1e-12 * want["out"].abs().max().item())
    dx = compare(got["dx"], want["dx"], atol=1e-12 * want["dx"].abs().max().item())
    assert out[0].passed and not dx[0].passed
    assert dx[0].n_diff == dx[0].numel
    assert _failed(check_block(buggy, False)) and not _failed(check_block(correct, False))
    # each rank keeps its own part: the ranks' input gradients now differ from each other
    assert not torch.equal(buggy[0]["dx"], buggy[1]["dx"])
    # the clinic's answer: out and the MLP's four gradients pass, everything further back fails
    passing = {v.path.removeprefix("tp=2 block ") for v in check_block(buggy, False) if v.passed}
    assert passing == {
        "out",
        *(f"grads mlp.{m}.{p}" for m in ("up", "down") for p in ("weight", "bias")),
    }


def test_what_to_try_2_g_backward_summing_doubles_the_down_projection_gradient():
    bad = run(block_job, 2, patches={"paralab.tp.mappings": {"g_backward": sum_gradients}})
    passing = {v.path.removeprefix("tp=2 block ") for v in check_block(bad, False) if v.passed}
    assert passing == {"out", "grads mlp.down.bias", "dx, every rank the same/rank 0"}
    got = assemble(bad, False)["grads"]["mlp.down.weight"]
    want = block_reference()["grads"]["mlp.down.weight"]
    assert torch.allclose(got, 2 * want, rtol=0, atol=1e-12 * want.abs().max().item())


def test_what_to_try_3_the_clinic_change_is_invisible_under_sp():
    per_rank = run(block_job, 2, True, patches=tp_clinic_change())
    assert not _failed(check_block(per_rank, True))


def test_what_to_try_1_a_block_and_its_memory_hold_at_tp_3():
    for sp in (False, True):
        block = run(block_job, 3, sp)
        verdicts = check_block(block, sp) + check_bytes(block, sp, block=True)
        assert not _failed(verdicts), _failed(verdicts)
    measured = {(3, sp): run(memory_job, 3, sp) for sp in (False, True)}
    assert not _failed(check_memory(measured)), _failed(check_memory(measured))


def test_the_numbers_the_prose_quotes():
    """README, section 6, What to try 4 and 5, chapter 2: each number from the checked formulas."""
    saved = {
        k: block_saved_bytes(CONFIG, *k)
        for k in ((1, False), (2, False), (2, True), (4, False), (4, True))
    }
    assert [sum(v.values()) for v in saved.values()] == [113664, 75648, 56832, 56640, 28416]
    one_process = sum(saved[(1, False)].values())
    for tp in (2, 3, 4):  # Korthikanti's accounting: under SP a rank saves 1/tp of one process
        assert sum(block_saved_bytes(CONFIG, tp, True).values()) * tp == one_process
    sp4 = saved[(4, True)]
    assert sp4["column inputs"] == 4608
    gathered_kept = sum(sp4.values()) - sp4["column inputs"] + 4 * sp4["column inputs"]
    assert gathered_kept == 42240
    regathers = block_bytes(activation_bytes(CONFIG), 4, True)[("backward", "all_gather_single")]
    assert regathers[1] - 2 * all_gather_bytes(activation_bytes(CONFIG), 4) == 13824
    assert activation_bytes(CONFIG) == 9216
    assert 3 * all_reduce_bytes(CONFIG.batch * CONFIG.seq * 8, 2) == 576
    assert gathered_logits_bytes(CONFIG, 2) == 4608
    # a real model: b·s·h = 8·4096·8192 in bf16 at tp = 8, one block per step
    a = 8 * 4096 * 8192 * 2
    assert a == 512 * 2**20
    assert sum(b for _, b in block_bytes(a, 8, False).values()) == 3.5 * 2**30
    assert sum(b for _, b in block_bytes(a, 8, True).values()) == 4.375 * 2**30
    # the loss against a gather of the logits: V = 131072, b·s = 8·4096, float32, tp = 8
    assert 3 * all_reduce_bytes(8 * 4096 * 4, 8) == 672 * 2**10
    assert all_gather_bytes(8 * 4096 * 131072 * 4, 8) == 14 * 2**30


def test_sp_sends_what_tp_sends_plus_one_regather_per_column_linear_and_no_logits():
    a = activation_bytes(CONFIG)
    for tp in (2, 3, 4):
        tp_only, sp = step_bytes(CONFIG, tp, False), step_bytes(CONFIG, tp, True)

        def activations(table):
            return sum(b for (phase, op), (_, b) in table.items() if phase != "grad sync")

        column_linears = 2 * CONFIG.blocks + 1  # q/k/v and MLP up per block, and the head
        regathers = column_linears * all_gather_bytes(a, tp)
        assert activations(sp) - activations(tp_only) == regathers
        loss = 3 * 2 * (tp - 1) * CONFIG.batch * CONFIG.seq * 8 // tp
        assert loss < gathered_logits_bytes(CONFIG, tp)


def test_activation_bytes_saved_for_backward_equal_the_closed_form():
    measured = {(1, False): [one_process_saved_bytes()]}
    for tp in (2, 4):
        for sp in (False, True):
            measured[(tp, sp)] = run(memory_job, tp, sp)
    assert not _failed(check_memory(measured)), _failed(check_memory(measured))
    assert measured[(4, True)][0] < measured[(4, False)][0] < measured[(1, False)][0]
    assert 4 * measured[(4, True)][0] == measured[(1, False)][0]


def test_sp_backward_regathers_each_column_input_before_its_reduce_scatter_on_every_rank():
    """Down's mirror, up's re-gather and reduce-scatter, proj's mirror, q/k/v's pair; one order."""
    per_rank = run(block_job, 2, True)
    want = ["all_gather", "all_gather", "reduce_scatter"] * 2
    for r in per_rank:
        got = [x.op.removesuffix("_single") for x in r["records"] if x.phase == "backward"]
        assert got == want


@pytest.mark.parametrize("split", [Split(0), Split(0, 3), Split(1), None])
def test_shard_and_unshard_are_inverse(split):
    full = torch.arange(108.0).reshape(18, 6)
    full = full.T.contiguous() if split == Split(1) else full
    for tp in (2, 3):
        assert torch.equal(unshard([shard(full, split, r, tp) for r in range(tp)], split), full)


@pytest.mark.parametrize("tp, sequence_parallel", [(2, False), (4, True)])
def test_grad_norm_counts_replicated_gradients_once_and_equals_one_process(tp, sequence_parallel):
    """Megatron's `param_is_not_tensor_parallel_duplicate`: a replicated gradient counted on one
    tp rank only; counted on every rank, the norm is larger (by less than sqrt(tp): only the
    replicated part repeats). The lab's README quotes the three norms."""
    from paralab.tp.runs import grad_norm_job, one_process_grad_norm

    want = one_process_grad_norm()
    assert f"{want:.6f}" == "1.688902"
    for norms in run(grad_norm_job, tp, sequence_parallel):
        assert abs(norms["counted once"] - want) <= 1e-12 * want
        assert want < norms["counted on every rank"] < tp**0.5 * want
        assert f"{norms['counted on every rank']:.6f}" == {2: "1.718299", 4: "1.775635"}[tp]


def test_training_clipped_across_tp_equals_one_process_with_clip_grad_norm():
    per_rank = run(train, 2, 2, sequence_parallel=True, max_norm=1.0)
    assert not _failed(check_train(per_rank, 2, 1, True, max_norm=1.0))
    unclipped = reference(samples=1, steps=2)
    clipped = reference(samples=1, steps=2, max_norm=1.0)
    assert not torch.equal(clipped["blocks.0.mlp.up.weight"], unclipped["blocks.0.mlp.up.weight"])


def test_sp_sums_the_replicated_gradients_in_one_flattened_all_reduce():
    """As Megatron's finalize_model_grads: one collective for all norm and bias gradients."""
    for r in run(lm_job, 2, True):
        sync = [x for x in r["records"] if x.phase == "grad sync"]
        assert [x.op for x in sync] == ["all_reduce"]


@pytest.mark.parametrize("tp, sequence_parallel", [(2, False), (4, True)])
def test_dropout_with_the_rng_tracker_equals_the_reference_masks(tp, sequence_parallel):
    """Megatron's tracker: head masks differ across ranks; the residual's agree under TP
    (every rank holds it whole) and differ under SP (each rank's tokens)."""
    from paralab.tp.dropout import dropout_job, dropout_reference

    per_rank = run(dropout_job, tp, sequence_parallel)
    want = dropout_reference(tp, sequence_parallel)
    assert torch.equal(torch.cat([r["probs"] for r in per_rank], dim=1), want["probs"])
    if sequence_parallel:
        residual = torch.cat([r["residual"] for r in per_rank], dim=1)
    else:
        residual = per_rank[0]["residual"]
        assert all(torch.equal(r["residual"], residual) for r in per_rank)
    assert torch.equal(residual, want["residual"])
    heads = [r["probs"] == 0 for r in per_rank]
    assert not any(torch.equal(heads[0], m) for m in heads[1:])
    untracked = [r["probs"] == 0 for r in run(dropout_job, tp, sequence_parallel, tracked=False)]
    assert all(torch.equal(untracked[0], m) for m in untracked[1:])


@pytest.mark.parametrize("groups, tp", [(4, 2), (2, 2), (2, 4), (1, 4)])
def test_gqa_with_megatrons_layout_equals_one_process_even_with_fewer_kv_heads_than_tp(groups, tp):
    """Megatron's per-group fused q/k/v: a contiguous cut when kv heads divide by tp; else the
    q/k/v output all-gathered and this rank's group sliced out. Forward and backward."""
    from paralab.tp.gqa import check_gqa, gqa_job

    verdicts = check_gqa(run(gqa_job, tp, groups), groups)
    assert len(verdicts) == 4 and not _failed(verdicts), _failed(verdicts)
