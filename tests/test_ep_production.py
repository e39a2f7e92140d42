"""MoE as production routes it: dropless splits, the grouped matmul with alignment padding, a
shared expert, aux-loss-free balancing, the gate weight before the expert. Each on real ranks
equals one process (forward, loss, every gradient, parameters and expert bias after 3 steps);
the all-to-all and all-reduce bytes equal their formulas; DeepEP's layout counts equal what
each rank's dispatch sent."""

import pytest
import torch

from paralab.check import Verdict
from paralab.ep.balance import biased_top_k, updated_bias
from paralab.ep.costs import split_matrix
from paralab.ep.dispatch import run_local_experts
from paralab.ep.grouped import aligned_layout, aligned_sizes, padded_batch, run_grouped_experts
from paralab.ep.model import Expert, MoEConfig, make_model
from paralab.ep.runs import (
    check_bytes,
    check_layout,
    check_params,
    check_step,
    ep_worker,
    reference_run,
)
from paralab.launch import run


def _failures(verdicts: list[Verdict]) -> list[str]:
    return [v.describe() for v in verdicts if not v.passed]


OPTIONS = {
    "grouped matmul": {"grouped_mm": True},
    "shared expert": {"shared_experts": 1},
    "expert bias": {"bias_rate": 0.05},
    "score before experts": {"score_before_experts": True},
    "all four, top-1, capacity 1": {
        "grouped_mm": True,
        "shared_experts": 1,
        "bias_rate": 0.05,
        "score_before_experts": True,
        "top_k": 1,
        "capacity_factor": 1.0,
    },
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_production_option_on_ranks_equals_one_process(name):
    config = MoEConfig(**OPTIONS[name])
    per_rank = run(ep_worker, 4, config, 2, 3, 0)
    ref = reference_run(config, 4, 3, 0)
    verdicts = (
        check_step(per_rank, ref, 2, name)
        + check_params(per_rank, ref, name)
        + check_bytes(per_rank, config, 2, name)
    )
    assert not _failures(verdicts), _failures(verdicts)
    if config.bias_rate is not None:
        assert any(b.abs().sum() > 0 for b in ref["bias"]), "the bias never moved"


def test_dropless_routing_keeps_every_assignment_with_splits_that_vary():
    config = MoEConfig(top_k=2, capacity_factor=None)
    per_rank = run(ep_worker, 4, config, 4, 2, 0)
    assert [int(r["step0"]["keep"].sum()) for r in per_rank] == [config.seq * 2] * 4
    splits = split_matrix([r["step0"]["send_counts"] for r in per_rank], 4)
    assert len(set(splits.reshape(-1).tolist())) > 1, "every split equal: nothing varies"
    assert splits.sum().item() == 4 * config.seq * 2
    ref = reference_run(config, 4, 2, 0)
    verdicts = check_step(per_rank, ref, 4, "dropless") + check_bytes(per_rank, config, 4, "dl")
    assert not _failures(verdicts), _failures(verdicts)
    layout = check_layout(per_rank, ref, config, 4, 2, "2 a node")
    assert not _failures(layout), _failures(layout)
    swapped = check_layout(per_rank[::-1], ref, config, 4, 2, "ranks swapped")
    assert _failures(swapped), "the layout check passes another rank's dispatch"


def test_aligned_sizes_round_up_and_give_an_empty_expert_one_alignment():
    assert aligned_sizes([5, 0, 19], 8) == [8, 8, 24]
    assert aligned_sizes([8, 16, 1], 8) == [8, 16, 8]
    assert aligned_sizes([0, 33], 16) == [16, 48]
    rows = torch.arange(24.0).reshape(12, 2)
    flat, offsets = aligned_layout(rows, [3, 0, 9], 4)
    assert offsets.tolist() == [4, 8, 20] and flat.shape == (20, 2)
    assert torch.equal(flat[:3], rows[:3]) and torch.equal(flat[8:17], rows[3:])
    assert flat[3:8].abs().sum() == 0 and flat[17:].abs().sum() == 0
    assert padded_batch(rows, [3, 0, 9], 4).shape == (3, 12, 2)


@pytest.mark.parametrize("counts", [[5, 0, 19], [1, 30, 2], [0, 0, 3]])
def test_the_grouped_matmul_equals_the_loop_within_rounding(counts):
    """Forward and every gradient within 1e-12 of each tensor's largest magnitude. Bitwise
    equality is not promised: BLAS picks its blocking by the matrix's shape."""
    torch.manual_seed(0)
    experts = [Expert(12, 24).double() for _ in counts]
    params = [p for e in experts for p in e.parameters()]
    rows = torch.randn(sum(counts), 12, dtype=torch.float64, requires_grad=True)
    loop = run_local_experts(experts, rows, counts)
    grouped = run_grouped_experts(experts, rows, counts, 8)
    upstream = torch.randn_like(loop)
    for a, b in zip(
        torch.autograd.grad(loop, [rows, *params], upstream),
        torch.autograd.grad(grouped, [rows, *params], upstream),
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * b.abs().max().item())
    torch.testing.assert_close(loop, grouped, rtol=0, atol=1e-12 * loop.abs().max().item())


def test_torch_grouped_mm_on_the_aligned_layout_equals_the_padded_batch_in_float32():
    """The layout is what torch._grouped_mm takes (float32: it has no float64 kernel)."""
    counts = [5, 0, 19]
    g = torch.Generator().manual_seed(1)
    rows, weight = torch.randn(24, 12, generator=g), torch.randn(3, 12, 24, generator=g)
    flat, offsets = aligned_layout(rows, counts, 8)
    grouped = torch._grouped_mm(flat, weight, offs=offsets)
    batched = torch.bmm(padded_batch(rows, counts, 8), weight)
    starts = [0, *offsets.tolist()[:-1]]
    for e, (start, count) in enumerate(zip(starts, counts)):
        torch.testing.assert_close(grouped[start : start + count], batched[e, :count])
    with pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16"):
        torch._grouped_mm(flat.double(), weight.double(), offs=offsets)


def test_the_bias_steers_the_choice_and_never_the_weights():
    probs = torch.softmax(torch.randn(6, 4, dtype=torch.float64), dim=-1)
    bias = torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    weights, experts = biased_top_k(probs, bias, 2)
    assert (experts[:, 0] == 3).all()
    assert torch.equal(weights, probs.gather(1, experts))


def test_the_bias_moves_against_the_load_and_sums_to_zero():
    bias = torch.zeros(4, dtype=torch.float64)
    new = updated_bias(bias, torch.tensor([10, 2, 6, 6]), 0.1)
    assert new[0] < 0 < new[1] and new[2] == new[3]
    assert abs(new.sum().item()) < 1e-15


def test_score_before_experts_is_another_model_not_a_reordering():
    x = torch.randn(24, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    after, _ = make_model(MoEConfig(), 0).moe(x)
    before, _ = make_model(MoEConfig(score_before_experts=True), 0).moe(x)
    assert (after - before).abs().max() > 1e-3


def test_the_shared_expert_carries_a_token_whose_assignments_were_all_dropped():
    config = MoEConfig(top_k=1, capacity_factor=0.25, shared_experts=1)
    model = make_model(config, 0)
    x = torch.randn(config.seq, config.dim, dtype=torch.float64)
    out, routing = model.moe(x)
    dropped = ~routing.keep.any(dim=1)
    assert dropped.any()
    assert torch.equal(out[dropped], model.moe.shared(x)[dropped])


def test_the_new_pictures_draw_from_plain_inputs():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paralab import viz

    loads = {"a": torch.tensor([[3, 1, 4, 0], [2, 2, 2, 2]]), "b": torch.ones(3, 4)}
    for fig in (viz.plot_load_over_steps(loads), viz.plot_grouped_batch([5, 0, 19], 8)):
        fig.canvas.draw()
        plt.close(fig)


def test_deepep_counts_a_token_once_per_node_and_once_per_rank():
    from paralab.ep.layout import (
        network_assignments,
        network_tokens,
        tokens_per_node,
        tokens_per_rank,
    )

    # E = 8 on 4 ranks, 2 ranks a node: node 0 holds experts 0-3, node 1 experts 4-7
    experts = torch.tensor([[0, 1], [0, 5], [7, -1], [2, 3], [6, 4]])
    assert tokens_per_node(experts, 8, 4, 2).tolist() == [3, 3]
    assert tokens_per_rank(experts, 8, 4).tolist() == [2, 1, 2, 2]
    assert network_tokens(experts, 8, 4, 2, node=0) == 3
    assert network_assignments(experts, 8, 4, 2, node=0) == 4


def test_one_rank_a_node_dedups_a_token_only_where_a_rank_holds_two_of_its_experts():
    """What to try 5: at E = 4 on 4 ranks every rank holds one expert and a top-2 token's
    experts are distinct, so DeepEP sends as many tokens as the lab sends rows; at E = 8 not."""
    from paralab.ep.layout import network_assignments, network_tokens

    def per_rank(experts: int) -> list[tuple[int, int]]:
        routings = reference_run(MoEConfig(experts=experts), 4, 1)["step0"]["routing"]
        return [
            (
                network_assignments(r.experts, experts, 4, 1, rank),
                network_tokens(r.experts, experts, 4, 1, rank),
            )
            for rank, r in enumerate(routings)
        ]

    assert all(rows == tokens for rows, tokens in per_rank(4))
    assert any(rows > tokens for rows, tokens in per_rank(8))


def test_megatrons_update_without_the_mean_drifts_and_routes_the_same():
    """What to try 6: the same choices at every step, a bias whose sum is no longer zero."""
    from paralab.ep.runs import reference_run
    from paralab.patches import patched

    def without_mean(bias, load, rate):
        return bias + rate * torch.sign(load.double().mean() - load.double())

    config = MoEConfig(aux_coef=0.0, bias_rate=0.01)
    centred = reference_run(config, 4, 20)
    with patched({"paralab.ep.balance": {"updated_bias": without_mean}}):
        drifting = reference_run(config, 4, 20)
    for a, b in zip(centred["kept_counts"], drifting["kept_counts"]):
        assert torch.equal(torch.stack(a), torch.stack(b))
    assert max(abs(b.sum().item()) for b in drifting["bias"]) > 0.01
    assert max(abs(b.sum().item()) for b in centred["bias"]) < 1e-12
