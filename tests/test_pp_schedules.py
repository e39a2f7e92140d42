"""Pipeline schedules as data, in one process: messages pair up, the logical clock's bubble
equals the closed forms where they apply, a cyclic list is a deadlock, the costs add up."""

import pytest

from paralab.pp import Deadlock, bubble_formula, build_schedule, simulate, step_bytes_sent
from paralab.pp.clock import run_clock
from paralab.pp.costs import (
    boundary_bytes,
    bubble_over_useful_time,
    exposed_link_formula,
    in_flight_formula,
    link_latency,
)
from paralab.pp.schedules import SCHEDULES, attach_messages, stage_owner

CASES = [(name, 2 if name == "interleaved" else 1) for name in SCHEDULES]


@pytest.mark.parametrize("name,virtual", CASES)
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_every_send_has_its_receive_on_the_peer(name, virtual, pp):
    plan = build_schedule(name, pp, 2 * pp, virtual)
    sends = {(r, m) for r, acts in enumerate(plan.actions) for a in acts for m in a.sends}
    recvs = {(r, m) for r, acts in enumerate(plan.actions) for a in acts for m in a.recvs}
    assert {(m.peer, m.__class__(m.kind, m.stage, m.microbatch, r)) for r, m in sends} == recvs


@pytest.mark.parametrize("name,virtual", CASES)
@pytest.mark.parametrize("pp,m", [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8), (4, 16)])
def test_measured_bubble_equals_the_closed_form_when_m_is_a_multiple_of_pp(name, virtual, pp, m):
    measured = simulate(name, pp, m, virtual).bubble_fraction
    assert measured == pytest.approx(bubble_formula(name, pp, m, virtual), abs=1e-15)


@pytest.mark.parametrize("pp,m", [(3, 5), (2, 3), (4, 5)])
def test_gpipe_1f1b_zbh1_match_their_form_for_any_m_at_least_pp(pp, m):
    for name in ("gpipe", "1f1b", "zbh1"):
        assert simulate(name, pp, m).bubble_fraction == pytest.approx(
            bubble_formula(name, pp, m), abs=1e-15
        )


def test_below_pp_micro_batches_the_split_and_interleaved_forms_are_optimistic():
    """m < p: the warm-up never fills; GPipe/1F1B still follow (p-1)/(m+p-1), the others do not."""
    assert simulate("1f1b", 4, 1).bubble_fraction == pytest.approx(3 / 4)
    assert simulate("zbh1", 4, 1).bubble_fraction > bubble_formula("zbh1", 4, 1)
    assert simulate("interleaved", 4, 1, 2).bubble_fraction > bubble_formula("interleaved", 4, 1, 2)


def test_waiting_is_measured_not_assumed():
    """Rank r of 1F1B starts r units late: the clock sees it from the messages alone."""
    timeline = simulate("1f1b", 4, 8)
    assert [timeline.rank_events(r)[0].start for r in range(4)] == [0, 1, 2, 3]
    assert timeline.makespan == 3 * (8 + 3)


def test_a_cyclic_pair_of_lists_is_a_deadlock_naming_both_ranks():
    """Rank 0 runs its backward of micro-batch 0 before the forward rank 1 needs from it."""
    orders = [
        [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)],
        [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1)],
    ]
    owner = stage_owner(2, 1)
    with pytest.raises(Deadlock) as caught:
        run_clock(attach_messages(orders, owner), owner, split_backward=False)
    assert sorted(caught.value.waiting) == [0, 1]


def test_bytes_per_rank_per_step():
    b = boundary_bytes()
    assert b == 2 * 3 * 4 * 8
    assert step_bytes_sent(stage_owner(4, 1), 8, b) == [
        {"forward": 8 * b, "backward": 0},
        {"forward": 8 * b, "backward": 8 * b},
        {"forward": 8 * b, "backward": 8 * b},
        {"forward": 0, "backward": 8 * b},
    ]
    looped = step_bytes_sent(stage_owner(2, 2), 4, b)  # stages 0, 2 on rank 0; 1, 3 on rank 1
    assert looped == [{"forward": 8 * b, "backward": 4 * b}, {"forward": 4 * b, "backward": 8 * b}]


def test_held_activations_formulas_follow_the_lists():
    """The closed forms of `in_flight_formula` equal the peak forward-to-free count of each list."""
    for name, virtual in CASES:
        for pp, m in [(2, 1), (2, 4), (3, 5), (4, 4), (4, 8)]:
            if name == "interleaved" and m % max(1, m // pp):
                continue
            plan = build_schedule(name, pp, m, virtual)
            free = "W" if plan.split_backward else "B"
            for r, actions in enumerate(plan.actions):
                live = peak = 0
                for a in actions:
                    live += (a.kind == "F") - (a.kind == free)
                    peak = max(peak, live)
                assert peak == in_flight_formula(name, pp, m, r, virtual), (name, pp, m, r)


def test_only_interleaved_takes_v():
    with pytest.raises(ValueError):
        build_schedule("1f1b", 2, 4, 2)
    with pytest.raises(ValueError):
        build_schedule("interleaved", 2, 4, 1)


def test_pictures_draw_from_the_clock():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paralab import viz

    figures = [
        viz.plot_pipeline_timeline([(n, simulate(n, 4, 8, v)) for n, v in CASES]),
        viz.plot_bubble_vs_m(
            {"1f1b": [(4, simulate("1f1b", 4, 4).bubble_fraction)]},
            lambda name, m: bubble_formula(name, 4, m),
            4,
            8,
        ),
    ]
    for fig in figures:
        fig.canvas.draw()
        plt.close(fig)


def test_zbh1_below_pp_micro_batches_measures_what_the_lab_hints():
    """What to try 2: at p = 4, m = 1, 2, 3 the clock gives 2/3, 5/11, 4/13, above the form."""
    for m, want in [(1, 2 / 3), (2, 5 / 11), (3, 4 / 13)]:
        assert simulate("zbh1", 4, m).bubble_fraction == pytest.approx(want, abs=1e-15)
        assert want > bubble_formula("zbh1", 4, m)


def test_interleaving_v4_follows_its_form_and_feeds_more_boundaries():
    """What to try 3, and the chapters' boundary count: v·p - 1 boundaries instead of p - 1."""
    assert simulate("interleaved", 4, 8, 4).bubble_fraction == pytest.approx(3 / 35, abs=1e-15)
    b = boundary_bytes()
    for virtual, forward in [(1, [1, 1, 1, 0]), (2, [2, 2, 2, 1]), (4, [4, 4, 4, 3])]:
        sent = step_bytes_sent(stage_owner(4, virtual), 8, b)
        assert [s["forward"] for s in sent] == [f * 8 * b for f in forward]
        assert sum(s["forward"] for s in sent) == (4 * virtual - 1) * 8 * b


def test_warmup_one_short_is_a_deadlock_on_the_clock_naming_the_last_rank():
    """What to try 1: the last rank's list starts with B3.0 before its forward."""
    from paralab.exercises.lab08 import warmup_one_short
    from paralab.patches import patched

    with patched({"paralab.pp.schedules": {"one_f_one_b_order": warmup_one_short}}):
        with pytest.raises(Deadlock) as caught:
            simulate("1f1b", 4, 8)
    assert caught.value.waiting[3] == "F3.0 before B3.0"


def test_tensor_parallel_sends_224_activations_where_the_pipeline_sends_2():
    """Chapter 3: L = 32 blocks at t = 8 send 8(t-1)/t · L · A; SP's re-gathers make it 10(t-1)/t."""
    from paralab.tp.costs import block_bytes

    a = 8 * 1024
    for sp, activations in ((False, 224), (True, 280)):
        per_block = sum(nbytes for _, nbytes in block_bytes(a, 8, sp).values())
        assert 32 * per_block == activations * a
    assert sum(step_bytes_sent(stage_owner(4, 1), 1, a)[1].values()) == 2 * a


# --------------------------------------------------------------------------- the link
def _exposed(name, pp, m, virtual, latency):
    return (
        simulate(name, pp, m, virtual, latency).makespan - simulate(name, pp, m, virtual).makespan
    )


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
def test_exposed_link_time_equals_the_closed_form(pp):
    """GPipe and 1F1B at any latency; interleaved (v = 2, 3) and ZB-H1 up to the slack they hide."""
    for latency in (0.125, 0.25, 0.5, 1.0, 2.0):
        for m in range(1, 4 * pp + 1):
            for name in ("gpipe", "1f1b"):
                assert _exposed(name, pp, m, 1, latency) == pytest.approx(
                    exposed_link_formula(name, pp, m, latency), abs=1e-12
                ), (name, pp, m, latency)
    for latency in (0.125, 0.25, 1 / 3, 0.5):
        for m in range(pp, 4 * pp + 1):
            assert _exposed("zbh1", pp, m, 1, latency) == pytest.approx(
                exposed_link_formula("zbh1", pp, m, latency), abs=1e-12
            )
            for virtual in (2, 3):
                if m % pp == 0 and latency <= 1 / virtual:
                    assert _exposed("interleaved", pp, m, virtual, latency) == pytest.approx(
                        exposed_link_formula("interleaved", pp, m, latency, virtual), abs=1e-12
                    )


def test_past_its_slack_zbh1_pays_per_micro_batch_and_the_form_refuses():
    assert _exposed("zbh1", 4, 16, 1, 1.0) > _exposed("zbh1", 4, 8, 1, 1.0)
    with pytest.raises(ValueError, match="ZB-H1"):
        exposed_link_formula("zbh1", 4, 16, 1.0)


def test_chapter_3_numbers_at_p4_d_quarter():
    """1F1B: +4, +7, +13 at m = 8, 16, 32 and its bubble at m = 32 from 0.086 to 0.186;
    GPipe 2(p-1)d = 1.5 whatever m; interleaved 3.5 and ZB-H1 3 from m = 8 on."""
    assert [_exposed("1f1b", 4, m, 1, 0.25) for m in (8, 16, 32)] == [4, 7, 13]
    assert round(simulate("1f1b", 4, 32).bubble_fraction, 3) == 0.086
    assert round(simulate("1f1b", 4, 32, latency=0.25).bubble_fraction, 3) == 0.186
    for m in (8, 16, 32):
        assert _exposed("gpipe", 4, m, 1, 0.25) == 1.5
        assert _exposed("interleaved", 4, m, 2, 0.25) == 3.5
        assert _exposed("zbh1", 4, m, 1, 0.25) == 3.0


def test_no_latency_is_the_old_clock_and_transfers_are_recorded():
    plain, linked = simulate("1f1b", 4, 8), simulate("1f1b", 4, 8, latency=0.5)
    assert plain.transfers == ()
    assert len(linked.transfers) == 2 * 3 * 8  # every boundary, each way, every micro-batch
    assert all(t.arrived - t.sent == 0.5 for t in linked.transfers)


def test_link_latency_adds_bytes_over_bandwidth():
    assert link_latency(1e-5, 10**6, 1e11, 1e-3) == pytest.approx((1e-5 + 1e-5) / 1e-3)


def test_the_papers_bubble_divides_by_useful_time():
    """(p-1)/m: 0.375 at p = 4, m = 8, against this lab's (p-1)/(m+p-1) = 0.273."""
    assert bubble_over_useful_time("1f1b", 4, 8) == 0.375
    assert round(bubble_formula("1f1b", 4, 8), 3) == 0.273
    assert bubble_over_useful_time("zbh1", 4, 8) == pytest.approx(3 / 24)


def test_torch_exports_seven_schedule_classes_and_the_lab_runs_six():
    """torch.distributed.pipelining's __all__: six run bitwise in the lab, ScheduleLoopedBFS apart."""
    from torch.distributed import pipelining

    from paralab.pp.upstream import LEFT_OUT, TORCH_SCHEDULES

    classes = {name for name in pipelining.__all__ if name.startswith("Schedule")}
    assert len(classes) == 7 and len(TORCH_SCHEDULES) == 6
    assert classes - set(TORCH_SCHEDULES) == set(LEFT_OUT) == {"ScheduleLoopedBFS"}


# --------------------------------------------------------------------------- real stages
def test_idle_time_with_unequal_f_b_w_equals_the_closed_form():
    """ZB-H1: (p-1)·max(F+B-W, F, B); 1F1B and GPipe: (p-1)(F+B+W); on a grid of p, m, F, B, W."""
    from paralab.pp.clock import action_times
    from paralab.pp.costs import idle_time_formula

    values = (0.25, 0.5, 1.0, 1.5, 2.0)
    for pp, m in [(2, 2), (3, 7), (4, 8), (5, 12)]:
        for f in (0.5, 1.0, 2.0):
            for b in values:
                for w in values:
                    for name in ("gpipe", "1f1b", "zbh1"):
                        plan = build_schedule(name, pp, m)
                        times = action_times(plan.split_backward, f, b, w)
                        timeline = run_clock(
                            plan.actions, plan.owner, plan.split_backward, durations=times
                        )
                        idle = timeline.makespan - m * (f + b + w)
                        assert idle == pytest.approx(
                            idle_time_formula(name, pp, f, b, w), abs=1e-12
                        ), (name, pp, m, f, b, w)


def test_megatron_splits_layers_as_get_num_layers_to_build():
    from paralab.pp.costs import megatron_layers_per_stage as split

    assert split(32, 4) == [8, 8, 8, 8]
    assert split(32, 4, last=5) == [9, 9, 9, 5]
    assert split(32, 4, first=9, last=5) == [9, 9, 9, 5]
    assert split(30, 4, account_for_embedding=True, account_for_loss=True) == [7, 8, 8, 7]
    assert split(31, 4, account_for_loss=True) == [8, 8, 8, 7]
    with pytest.raises(ValueError, match="34"):
        split(32, 4, account_for_embedding=True, account_for_loss=True)
    with pytest.raises(ValueError, match="divide"):
        split(32, 4, last=6)
    with pytest.raises(ValueError, match="exclude"):
        split(32, 4, last=5, account_for_loss=True)


def test_uneven_stages_numbers_the_lab_states():
    """Section 11: Llama 3.1 8B's head is 2.41 blocks; 1F1B at pp = 4, m = 8 with it on the
    last of 8-block stages has bubble 0.358; Megatron's last = 5 cuts the step per block 11%."""
    from paralab.pp.clock import action_times
    from paralab.pp.costs import megatron_layers_per_stage
    from paralab.scale.models import lm_layer_matmul, model

    llama = model("llama3.1-8b")
    head = llama.vocab * llama.hidden / lm_layer_matmul(llama)
    assert round(head, 2) == 2.41

    def step(layers):
        scale = [(n + (head if s == 3 else 0)) / 8 for s, n in enumerate(layers)]
        plan = build_schedule("1f1b", 4, 8)
        times = action_times(False, stage_scale=scale)
        return run_clock(plan.actions, plan.owner, False, durations=times)

    even, moved = (
        step(megatron_layers_per_stage(32, 4)),
        step(megatron_layers_per_stage(32, 4, last=5)),
    )
    assert round(even.bubble_fraction, 3) == 0.358 and round(moved.bubble_fraction, 3) == 0.282
    assert round(1 - moved.makespan / even.makespan, 2) == 0.11


def test_stage_saved_bytes_from_shapes_equal_what_autograd_saves():
    """672 B per block per micro-batch (b·s·(h + 2f)·8), plus the loss's 2·b·s·h·8 on the last."""
    import torch

    from paralab.pp.costs import stage_saved_bytes
    from paralab.pp.model import Stage, make_blocks, microbatch_loss

    blocks = make_blocks()
    params = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    for n_stages in (2, 3, 4, 8):
        for s in range(n_stages):
            saved = []

            def count(t, saved=saved):
                if t.untyped_storage().data_ptr() not in params:
                    saved.append(t.numel() * t.element_size())
                return t

            x = torch.randn(2, 3, 4, dtype=torch.float64).requires_grad_(s > 0)
            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                y = Stage(blocks, s, n_stages)(x)
                if s == n_stages - 1:
                    microbatch_loss(y, torch.zeros_like(y), 4)
            assert sum(saved) == stage_saved_bytes(s, n_stages), (n_stages, s)
    assert stage_saved_bytes(0, 8) == 672


def test_peak_bytes_from_the_list_are_the_count_times_a_stage_and_interleaved_differs():
    """v = 1: the held count × one stage's bytes. Interleaved at pp = 4, m = 8: chunks of one
    block (672 B); rank 0 holds 11 of them, more than 1F1B's 4 stages of two; the last rank
    holds one last chunk (its F and B run back to back), the loss's 384 B on top of it."""
    from paralab.pp.costs import peak_held_bytes, stage_saved_bytes

    for name, virtual in CASES:
        for pp, m in [(2, 1), (2, 4), (3, 6), (4, 4), (4, 8)]:
            plan = build_schedule(name, pp, m, virtual)
            for r in range(pp):
                if virtual == 1:
                    want = in_flight_formula(name, pp, m, r) * stage_saved_bytes(r, pp)
                    assert peak_held_bytes(plan, r) == want, (name, pp, m, r)
    plan = build_schedule("interleaved", 4, 8, 2)
    assert [peak_held_bytes(plan, r) for r in range(4)] == [11 * 672, 9 * 672, 7 * 672, 3744]
    assert 3744 == 4 * 672 + (672 + 384) > 5 * 672
    assert peak_held_bytes(build_schedule("1f1b", 4, 8), 0) == 4 * 2 * 672
