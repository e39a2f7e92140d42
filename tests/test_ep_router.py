"""Expert parallelism in one process: the router, capacity and drops, the permutation, the costs."""

import torch

from paralab.ep.costs import layer_bytes, split_matrix
from paralab.ep.dispatch import expert_permutation
from paralab.ep.model import MoEConfig, make_model
from paralab.ep.router import capacity, capacity_keep, switch_aux_loss, top_k_route


def test_ties_go_to_the_lower_expert_and_renormalize_is_an_option():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.4, 0.1]], dtype=torch.float64)
    weights, experts = top_k_route(probs, 2)
    assert experts.tolist() == [[0, 1], [1, 2]]
    assert torch.equal(weights, torch.tensor([[0.25, 0.25], [0.4, 0.4]], dtype=torch.float64))
    renormalized, _ = top_k_route(probs, 2, renormalize=True)
    assert torch.equal(renormalized, torch.full((2, 2), 0.5, dtype=torch.float64))


def test_capacity_is_c_tokens_k_over_e_and_first_choices_go_first():
    assert capacity(24, 4, 2, 1.0) == 12 and capacity(24, 8, 1, 1.25) == 4
    assert capacity(24, 4, 2, None) is None
    experts = torch.tensor([[0, 1], [0, 2], [1, 0], [0, 3]])  # expert 0: first choices of 0, 1, 3
    keep = capacity_keep(experts, 4, 2)
    assert keep.tolist() == [[True, True], [True, True], [True, False], [False, True]]
    assert capacity_keep(experts, 4, None).all()


def test_a_token_whose_choices_are_all_dropped_leaves_as_the_residual():
    config = MoEConfig(top_k=1, capacity_factor=0.25)
    model = make_model(config, 0)
    x = torch.randn(config.seq, config.dim, dtype=torch.float64)
    out, routing = model.moe(x)
    dropped = ~routing.keep.any(dim=1)
    assert dropped.any() and routing.keep.any()
    assert torch.equal(out[dropped], torch.zeros_like(out[dropped]))
    assert (out[~dropped] != 0).any(dim=1).all()


def test_the_switch_loss_is_one_for_a_uniform_load_and_larger_for_a_skewed_one():
    uniform = torch.full((8, 4), 0.25, dtype=torch.float64)
    assert torch.isclose(
        switch_aux_loss(uniform, torch.arange(8).reshape(4, 2) % 4),
        torch.tensor(1.0, dtype=torch.float64),
    )
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 4, dtype=torch.float64)
    assert switch_aux_loss(skewed, torch.zeros(4, 1, dtype=torch.long)) > 2


def test_the_permutation_groups_by_expert_stably_and_its_inverse_undoes_it():
    keys = torch.tensor([2, 0, 2, 1, 0, 2])
    order, inverse = expert_permutation(keys)
    assert order.tolist() == [1, 4, 3, 0, 2, 5]
    rows = torch.arange(6.0)
    assert torch.equal(rows[order][inverse], rows)


def test_bytes_follow_the_split_matrix_and_the_backward_mirrors_the_forward():
    counts = [torch.tensor([3, 1, 4, 0]), torch.tensor([2, 2, 0, 5])]
    splits = split_matrix(counts, 2)
    assert splits.tolist() == [[4, 4], [4, 5]]
    b = layer_bytes(splits, 1, dim=12, experts=4)
    assert b == {
        "counts": 16,
        "dispatch": 4 * 96,
        "combine": 4 * 96,
        "combine backward": 4 * 96,
        "dispatch backward": 4 * 96,
    }
    b = layer_bytes(torch.tensor([[1, 7], [2, 0]]), 0, dim=12, experts=4)
    assert (b["dispatch"], b["combine"]) == (7 * 96, 2 * 96)
    assert (b["combine backward"], b["dispatch backward"]) == (b["dispatch"], b["combine"])


def test_the_pictures_draw_from_plain_inputs():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paralab import viz

    experts = [torch.tensor([0, 3, 1, 1, 2, 0]), torch.tensor([2, 2, 3, 0, 1, 3])]
    counts = torch.tensor([[3, 1, 4, 0], [2, 2, 0, 5]])
    for fig in (
        viz.plot_token_journey(experts, 2, 4),
        viz.plot_tokens_per_expert(counts, 2, slots=3),
        viz.plot_drop_rate([0.5, 1.0, 2.0], {"top-1": [0.5, 0.2, 0.0]}),
        viz.plot_split_matrix(split_matrix(list(counts), 2)),
        viz.plot_balance_history({"aux 0": [1.4, 1.4], "aux 0.5": [1.4, 1.1]}),
    ):
        fig.canvas.draw()
        plt.close(fig)


def test_the_switch_loss_is_not_bounded_below_by_one():
    """Uniform load gives 1, but load on experts of low mean probability gives less."""
    probs = torch.tensor(
        [[0.34, 0.33, 0.33], [0.34, 0.33, 0.33], [0.0, 0.5, 0.5]], dtype=torch.float64
    )
    assert switch_aux_loss(probs, torch.tensor([[0], [0], [1]])) < 0.9


def test_kept_weights_are_not_renormalized_after_drops():
    config = MoEConfig(top_k=2, capacity_factor=0.5, renormalize=True)
    model = make_model(config, 0)
    x = torch.randn(
        config.seq, config.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    out, routing = model.moe(x)
    half = torch.nonzero(routing.keep.sum(dim=1) == 1).flatten()
    assert half.numel() > 0, "no token lost exactly one of its two assignments"
    for t in half.tolist():
        choice = int(routing.keep[t].int().argmax())
        expert = model.moe.experts[str(int(routing.experts[t, choice]))]
        weight = routing.weights[t, choice]
        assert weight < 1
        assert torch.allclose(out[t], weight * expert(x[t : t + 1])[0], rtol=0, atol=1e-14)


def test_a_renormalized_top1_router_gets_no_gradient_from_the_task_loss():
    from paralab.ep.runs import reference_run

    def gate_grad(renormalize):
        config = MoEConfig(top_k=1, renormalize=renormalize, aux_coef=0.0)
        return reference_run(config, 2, 1)["step0"]["grads"]["moe.gate.weight"].abs().max().item()

    assert gate_grad(True) < 1e-15 and gate_grad(False) > 1e-2
