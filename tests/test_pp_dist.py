"""The executor on real gloo ranks: `train` returns the full parameters; the clinic's blocking
exchange deadlocks 1F1B (not GPipe); torch.distributed.pipelining gives the same gradients and,
where it writes the same schedule, the same order per rank. Every schedule's sweep against one
process and the formulas runs in lab 08 (below)."""

import pytest

from paralab.check import compare
from paralab.exercises.lab08 import p2p_clinic_change, warmup_one_short
from paralab.launch import LaunchError, LaunchTimeout, run
from paralab.pp import build_schedule, reference, train
from paralab.pp.runs import check_training, pp_worker, reference_run
from paralab.pp.upstream import TORCH_SCHEDULES, torch_jobs, torch_sweep

WARMUP_ONE_SHORT = {"paralab.pp.schedules": {"one_f_one_b_order": warmup_one_short}}


# Every hand-written schedule at pp = 2 and 4, m = 1, pp and 2 pp (`sweep_configs`), two steps
# on real ranks, is checked once, in lab 08: its section 4 launch runs that sweep and its claim
# tables pin gradients and parameters bitwise against one process and the accumulated gradients
# against one backward (section 4), the ranks' executed lists and their clock against
# `simulate` (section 5), held activations (section 6) and ledger bytes (section 7) against the
# formulas, every run and rank; nbval re-runs it and compares those tables.


def _failed(verdicts):
    return [v.describe() for v in verdicts if not v.passed]


def test_train_returns_the_full_parameters_on_every_rank():
    per_rank = run(train, 2, 2, schedule="zbh1", microbatches=4, timeout=60)
    want = reference(microbatches=4)
    for params in per_rank:
        assert not _failed(compare(params, want))


def test_clinic_blocking_sends_deadlock_1f1b_at_the_turn_and_name_both_ranks():
    with pytest.raises(LaunchTimeout) as caught:
        run(pp_worker, 2, "1f1b", 4, 1, 1, timeout=3, patches=p2p_clinic_change())
    assert caught.value.hung_ranks == [0, 1]
    assert "ranks [0, 1]" in str(caught.value)


def test_clinic_blocking_sends_deadlock_zbh1_too():
    """What to try 5: ZB-H1 has 1F1B's F and B order, so the same turn hangs both ranks."""
    with pytest.raises(LaunchTimeout) as caught:
        run(pp_worker, 2, "zbh1", 4, 1, 1, timeout=3, patches=p2p_clinic_change())
    assert caught.value.hung_ranks == [0, 1]


def test_warmup_one_short_fails_on_the_last_rank_with_no_saved_forward():
    """What to try 1: rank 1 runs B1.0 before F1.0 (KeyError (1, 0)); its peer fails after it."""
    with pytest.raises(LaunchError) as caught:
        run(pp_worker, 2, "1f1b", 1, 1, 1, timeout=30, patches=WARMUP_ONE_SHORT)
    assert "rank 1 raised KeyError: (1, 0)" in str(caught.value)
    assert caught.value.failed_ranks == [0, 1]


def test_clinic_blocking_sends_still_run_gpipe():
    """GPipe never has two neighbours sending to each other at once: the same change runs."""
    per_rank = run(pp_worker, 2, "gpipe", 4, 1, 1, timeout=30, patches=p2p_clinic_change())
    assert not _failed(check_training(per_rank, "gpipe", 4, steps=1))


@pytest.fixture(scope="module")
def torch_runs():
    return run(torch_sweep, 2, torch_jobs(4), timeout=120)


def test_every_torch_schedule_runs_on_gloo_with_the_same_gradients(torch_runs):
    """All six classes run on CPU; with loss/m per micro-batch and scale_grads=False, bitwise."""
    want = reference_run(4, 1)[1][0]
    for index in range(len(TORCH_SCHEDULES) + 1):
        got = {}
        for r in torch_runs:
            got.update(r[index]["grads"])
        assert not _failed(compare(dict(sorted(got.items())), want)), index


def _names(order):
    return [f"{k}{s}.{i}" for k, s, i in order]


def test_torch_orders_equal_ours_where_it_writes_the_same_schedule(torch_runs):
    classes = list(TORCH_SCHEDULES)
    ours = {
        "ScheduleGPipe": build_schedule("gpipe", 2, 4),
        "ScheduleInterleaved1F1B": build_schedule("interleaved", 2, 4, 2),
    }
    for name, plan in ours.items():
        for rank, r in enumerate(torch_runs):
            assert _names(r[classes.index(name)]["order"]) == plan.order(rank), name
    zb_one_stage = len(classes)  # ScheduleInterleavedZeroBubble with one stage per rank: ZB-H1
    for rank, r in enumerate(torch_runs):
        assert _names(r[zb_one_stage]["order"]) == build_schedule("zbh1", 2, 4).order(rank)


def test_torch_1f1b_describes_its_last_rank_one_micro_batch_late(torch_runs):
    """Schedule1F1B runs our order (same gradients), but the action list it describes itself
    with (`_get_pipeline_order`) numbers the last rank's forwards from 1 to m: one late."""
    ours = build_schedule("1f1b", 2, 4)
    r0, r1 = (r[list(TORCH_SCHEDULES).index("Schedule1F1B")]["order"] for r in torch_runs)
    assert _names(r0) == ours.order(0)
    assert _names(r1) == ["F1.1", "B1.0", "F1.2", "B1.1", "F1.3", "B1.2", "F1.4", "B1.3"]
    assert ours.order(1) == ["F1.0", "B1.0", "F1.1", "B1.1", "F1.2", "B1.2", "F1.3", "B1.3"]


def test_zbv_splits_every_backward_and_dualpipev_only_some(torch_runs):
    """ZBV: eight I and eight W per rank at p = 2, m = 4; DualPipeV: eight backwards, of which its
    OVERLAP_F_B pairs keep most full, W on three of them on rank 0 and two on rank 1."""
    classes = list(TORCH_SCHEDULES)

    def counts(name):
        return [
            [sum(k == kind for k, _, _ in r[classes.index(name)]["order"]) for kind in "FBW"]
            for r in torch_runs
        ]

    assert counts("ScheduleZBVZeroBubble") == [[8, 8, 8], [8, 8, 8]]
    assert counts("ScheduleDualPipeV") == [[8, 8, 3], [8, 8, 2]]


def test_looped_bfs_runs_backwards_last_first_so_its_sums_are_equal_only_to_rounding():
    """The seventh class, left out of the lab's bitwise table: it runs on gloo, but each stage's
    backwards go micro-batch m-1 first, so `.grad` adds the same terms in another order."""
    per_rank = run(torch_sweep, 2, [("ScheduleLoopedBFS", 4)], timeout=60)
    got = {}
    for r in per_rank:
        got.update(r[0]["grads"])
    want = reference_run(4, 1)[1][0]
    assert _failed(compare(dict(sorted(got.items())), want))
    assert not _failed(compare(dict(sorted(got.items())), want, atol=1e-15))
    assert _names(per_rank[0][0]["order"])[8:12] == ["B2.3", "B2.2", "B2.1", "B2.0"]


def test_gradient_norm_across_stages_is_one_processs_with_one_scalar_all_reduce():
    """Each rank's sum of squares, all-reduced over the pipeline: the global norm, 12 B a rank."""
    from paralab.pp.runs import grad_norm_worker, reference_grad_norm

    per_rank = run(grad_norm_worker, 4, "1f1b", 8, timeout=60)
    assert len({r["norm"] for r in per_rank}) == 1
    assert per_rank[0]["norm"] == pytest.approx(reference_grad_norm(8), abs=1e-15)
    assert [r["bytes"] for r in per_rank] == [2 * 3 * 8 // 4] * 4


def test_tied_ends_need_their_all_reduce_and_then_equal_one_process():
    """First and last stage share a matrix; each holds half its gradient until the 2-rank all-reduce."""
    from paralab.pp.runs import reference_tied, tied_worker

    per_rank = run(tied_worker, 4, "1f1b", 8, timeout=60)
    want = reference_tied(8)
    blocks = {k: g for r in per_rank for k, g in r["grads"].items() if k != "tied"}
    assert not _failed(
        compare(dict(sorted(blocks.items())), {k: g for k, g in want.items() if k != "tied"})
    )
    assert (per_rank[0]["partial"] - want["tied"]).abs().max() > 0.1
    for r in (per_rank[0], per_rank[3]):
        assert not _failed(compare([r["grads"]["tied"]], [want["tied"]], atol=1e-15))
    assert [r["bytes"] for r in per_rank] == [4 * 4 * 8, 0, 0, 4 * 4 * 8]
