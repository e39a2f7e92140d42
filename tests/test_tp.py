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
from paralab.exercises.lab07 import tp_clinic_change
from paralab.launch import run
from paralab.tp import reference, train
from paralab.tp.costs import gathered_logits_bytes, step_bytes
from paralab.tp.layout import Split, shard, unshard
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


def test_sp_sends_what_tp_sends_and_the_loss_never_gathers_logits():
    for tp in (2, 3, 4):
        tp_only, sp = step_bytes(CONFIG, tp, False), step_bytes(CONFIG, tp, True)

        def activations(table):
            return sum(b for (phase, op), (_, b) in table.items() if phase != "grad sync")

        assert activations(tp_only) == activations(sp)
        loss = 3 * 2 * (tp - 1) * CONFIG.batch * CONFIG.seq * 8 // tp
        assert loss < gathered_logits_bytes(CONFIG, tp)


def test_activation_bytes_saved_for_backward_equal_the_closed_form():
    measured = {(1, False): [one_process_saved_bytes()]}
    for tp in (2, 4):
        for sp in (False, True):
            measured[(tp, sp)] = run(memory_job, tp, sp)
    assert not _failed(check_memory(measured)), _failed(check_memory(measured))
    assert measured[(4, True)][0] < measured[(4, False)][0] < measured[(1, False)][0]


@pytest.mark.parametrize("split", [Split(0), Split(0, 3), Split(1), None])
def test_shard_and_unshard_are_inverse(split):
    full = torch.arange(108.0).reshape(18, 6)
    full = full.T.contiguous() if split == Split(1) else full
    for tp in (2, 3):
        assert torch.equal(unshard([shard(full, split, r, tp) for r in range(tp)], split), full)
