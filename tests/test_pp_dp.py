"""PP × DP on 4 gloo ranks (pp = dp = 2): every schedule, the dp sync deferred to the last
micro-batch or run after every one; gradients and parameters equal one process (bitwise the
replica-grouped sums when deferred), the dp all-reduces and their bytes equal the formula,
m times fewer deferred; a sync one micro-batch early leaves the last one's gradient local."""

import pytest

from paralab.launch import run
from paralab.pp.costs import dp_sync_bytes, dp_sync_collectives, stage_parameters
from paralab.pp.dp import check_pp_dp, dp_sync_record, pp_dp_ranks, pp_dp_sweep
from paralab.pp.runs import SWEEP

CONFIGS = [(name, 4, v, deferred) for name, v in SWEEP for deferred in (True, False)]


@pytest.fixture(scope="module")
def swept():
    return run(pp_dp_sweep, 4, 2, CONFIGS, timeout=120)


def _failed(verdicts):
    return [v.describe() for v in verdicts if not v.passed]


def test_megatron_order_puts_dp_groups_on_neighbours_and_pipelines_across():
    assert pp_dp_ranks(4, 2) == ([[0, 2], [1, 3]], [[0, 1], [2, 3]])
    assert pp_dp_ranks(8, 4) == ([[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]])
    with pytest.raises(ValueError, match="pp = 3"):
        pp_dp_ranks(4, 3)


def test_every_schedule_and_sync_equals_one_process_and_its_bytes_the_formula(swept):
    for index, config in enumerate(CONFIGS):
        assert not _failed(check_pp_dp([r[index] for r in swept], 2, config)), config


def test_deferred_sync_makes_m_times_fewer_all_reduces_of_the_same_size(swept):
    """1F1B, m = 4: one all-reduce of a stage's 196 gradients (1568 B at dp = 2) per rank,
    against four; interleaved v = 2: one per chunk, against eight."""
    for index, (name, m, v, deferred) in enumerate(CONFIGS):
        record = dp_sync_record([r[index] for r in swept])
        calls = dp_sync_collectives(m, v, deferred)
        assert record == [(calls, 1568 * (1 if deferred else m))] * 4, (name, deferred)
    assert stage_parameters(0, 2) == 196
    assert dp_sync_bytes([196], 2, 4, deferred=False) == 4 * dp_sync_bytes([196], 2, 4)


def test_a_sync_one_micro_batch_early_fails_the_deferred_rows_and_not_the_counts():
    """What to try 6: the last micro-batch's gradients stay on their replica, so the deferred
    rows fail on gradients while their all-reduces and bytes still equal the formula; the rows
    that sync after every micro-batch still pass."""

    def dp_grad_sync_early(stages, group, microbatches, deferred):
        from paralab.pp.dp import sync_stage_grads

        done = dict.fromkeys(stages, 0)

        def after_grads(stage, microbatch):
            done[stage] += 1
            if not deferred or done[stage] == microbatches - 1:
                sync_stage_grads(stages[stage], group)

        return after_grads

    configs = [(name, 4, v, deferred) for name, v in SWEEP[1:3] for deferred in (True, False)]
    early = {"paralab.pp.dp": {"dp_grad_sync": dp_grad_sync_early}}
    per_rank = run(pp_dp_sweep, 4, 2, configs, timeout=60, patches=early)
    for index, config in enumerate(configs):
        failed = _failed(check_pp_dp([r[index] for r in per_rank], 2, config))
        deferred = config[3]
        assert any("grad 0" in line for line in failed) == deferred, config
        assert not any("dp all-reduces" in line for line in failed), config
