"""Pure-logic tests for paralab.fsdp: shards, the optimizer steps, the formulas, one-process training."""

from __future__ import annotations

import pytest
import torch

from paralab.check import CheckFailed, assert_match, compare, fold
from paralab.fsdp import (
    HandFSDP,
    ShardOptimizer,
    adam_step,
    flat_shard,
    padded_size,
    sgd_momentum_step,
    shard_unit,
    unflatten,
)
from paralab.fsdp.checks import check_counts
from paralab.fsdp.costs import ITEMSIZE, memory_formula, traffic_formula
from paralab.fsdp.runs import (
    GLOBAL_BATCH,
    Job,
    mse,
    train_reference,
    unit_numels,
)
from paralab.models import make_mlp_stack, regression_data


def test_padded_size_rounds_up_to_a_multiple():
    assert [padded_size(82, n) for n in (1, 2, 4, 8)] == [82, 82, 84, 88]
    assert padded_size(6, 8) == 8 and padded_size(0, 4) == 0


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_shards_concatenate_to_the_padded_flat_parameters(n):
    unit = make_mlp_stack().blocks[0]  # 82 parameters, with biases
    flat = torch.cat([p.detach().reshape(-1) for p in unit.parameters()])
    shards = [flat_shard(unit, n, r) for r in range(n)]
    assert len({s.numel() for s in shards}) == 1
    joined = torch.cat(shards)
    assert torch.equal(joined[: flat.numel()], flat)
    assert torch.equal(
        joined[flat.numel() :],
        torch.zeros(padded_size(flat.numel(), n) - flat.numel(), dtype=flat.dtype),
    )


def test_a_rank_can_hold_only_padding():
    head = make_mlp_stack().head  # 6 parameters over 8 ranks
    assert [flat_shard(head, 8, r).numel() for r in range(8)] == [1] * 8
    assert torch.equal(flat_shard(head, 8, 7), torch.zeros(1, dtype=torch.float64))


def test_unflatten_gives_views_with_the_module_shapes():
    unit = make_mlp_stack().blocks[1]
    expected = {k: p.detach().clone() for k, p in unit.named_parameters()}
    flat_unit = shard_unit(unit, None)
    views = unflatten(flat_unit, flat_unit.shard.detach())
    assert_match(views, expected)
    assert all(v.data_ptr() >= flat_unit.shard.data_ptr() for v in views.values())
    assert next(unit.parameters()).device.type == "meta"  # the module dropped its own numbers


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_optimizer_steps_equal_torch_optim_bitwise(kind):
    g = torch.Generator().manual_seed(3)
    p_ref = torch.nn.Parameter(torch.randn(37, generator=g, dtype=torch.float64))
    p_ours = p_ref.detach().clone()
    ref = (
        torch.optim.SGD([p_ref], lr=0.1, momentum=0.9, foreach=False)
        if kind == "sgd"
        else torch.optim.Adam([p_ref], lr=0.05, foreach=False)
    )
    state: dict = {}
    for _ in range(4):
        grad = torch.randn(37, generator=g, dtype=torch.float64)
        p_ref.grad = grad.clone()
        ref.step()
        if kind == "sgd":
            sgd_momentum_step(p_ours, grad, state, 0.1, 0.9)
        else:
            adam_step(p_ours, grad, state, 0.05, (0.9, 0.999), 1e-8)
    assert_match(p_ours, p_ref.detach())


def test_a_broken_adam_is_caught():
    p_ref = torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    p_ref.grad = torch.full((5,), 0.5, dtype=torch.float64)
    torch.optim.Adam([p_ref], lr=0.05, foreach=False).step()
    p_ours = torch.ones(5, dtype=torch.float64)
    adam_step(
        p_ours, torch.full((5,), 0.5, dtype=torch.float64), {}, 0.05, (0.9, 0.999), 1e-6
    )  # wrong eps
    with pytest.raises(CheckFailed):
        assert_match(p_ours, p_ref.detach())


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_stepping_shards_equals_stepping_the_full_tensor(kind):
    g = torch.Generator().manual_seed(5)
    full = torch.randn(24, generator=g, dtype=torch.float64)
    shards = [s.clone() for s in full.chunk(4)]
    opt_full, opt_shards = ShardOptimizer([full], kind), ShardOptimizer(shards, kind)
    for _ in range(3):
        grad = torch.randn(24, generator=g, dtype=torch.float64)
        full.grad = grad
        for s, gs in zip(shards, grad.chunk(4)):
            s.grad = gs.clone()
        opt_full.step()
        opt_shards.step()
    assert_match(torch.cat(shards), full)
    assert (
        opt_shards.state_bytes()
        == opt_full.state_bytes()
        == (1 if kind == "sgd" else 2) * 24 * ITEMSIZE
    )


def test_optimizer_kind_is_validated():
    with pytest.raises(ValueError, match="kind='lamb'"):
        ShardOptimizer([torch.zeros(1)], "lamb")


@pytest.mark.parametrize("reshard", [True, False])
def test_one_process_engine_equals_plain_autograd_bitwise(reshard):
    """With no split (no group) the engine must be plain training: same ops, same bits."""
    engine = HandFSDP.wrap(make_mlp_stack().units(), None, reshard_after_forward=reshard)
    opt = ShardOptimizer(engine.shards(), "adam", lr=0.05)
    x, y = regression_data(GLOBAL_BATCH)
    for _ in range(3):
        opt.zero_grad()
        loss = mse(engine(x), y)
        held = engine.gathered_bytes()
        loss.backward()
        assert engine.gathered_bytes() == 0  # everything freed after backward
        opt.step()
    full_bytes = sum(unit_numels()) * ITEMSIZE
    assert held == (0 if reshard else full_bytes)  # between forward and backward
    assert engine.peak_gathered_bytes == (82 * ITEMSIZE if reshard else full_bytes)
    reference = train_reference("adam")
    assert_match(
        [u.shard.detach() for u in engine.units], [flat_shard(u, 1, 0) for u in reference.units()]
    )


def test_traffic_formula_values():
    numels = unit_numels()  # 3 x 82 + 6 = 252 parameters, 2016 bytes
    assert traffic_formula("ddp", numels, 2) == {"all_reduce": 2016}
    zero3 = traffic_formula("hand", numels, 2)
    assert sum(zero3.values()) == 3 * 2016 // 2  # 3 (n-1)/n Psi, no padding at n=2
    assert sum(traffic_formula("hand", numels, 8).values()) == 3 * 7 * (3 * 88 + 8) * ITEMSIZE // 8
    assert (
        sum(traffic_formula("hand", numels, 2, reshard_after_forward=False).values()) == 2016
    )  # = DDP
    hsdp = traffic_formula("hand", numels, 8, dp_replicate=2)
    assert hsdp["all_reduce"] == (3 * 84 + 8) * ITEMSIZE // 4  # 2 (r-1)/r * shard, r = 2
    assert traffic_formula("hand", numels, 8, dp_replicate=8) == {
        "all_gather_into_tensor": 0,
        "reduce_scatter_tensor": 0,
        "all_reduce": 2 * 7 * 2016 // 8,
    }  # HSDP 8x1 = DDP


def test_memory_formula_values():
    numels = unit_numels()
    assert memory_formula("ddp", numels, 8, "adam") == {
        "params": 2016,
        "grads": 2016,
        "optimizer": 4032,
        "gathered peak": 0,
    }
    zero3 = memory_formula("hand", numels, 8, "adam")
    assert zero3 == {"params": 272, "grads": 272, "optimizer": 544, "gathered peak": 704}
    assert memory_formula("hand", numels, 8, "sgd")["optimizer"] == 272
    assert (
        memory_formula("hand", numels, 8, "adam", reshard_after_forward=False)["gathered peak"]
        == 2176
    )
    assert memory_formula("hand", numels, 8, "adam", dp_replicate=2) == memory_formula(
        "hand", numels, 4, "adam"
    )


def test_job_labels():
    assert Job("hand").label(8) == "ZeRO-3 n=8 adam"
    assert Job("hand", 2).label(8) == "HSDP 2x4 adam"
    assert Job("hand", reshard_after_forward=False).label(4) == "ZeRO-2-like n=4 adam"
    assert Job("fsdp2", mesh="dp_mesh").label(4) == "FSDP2 n=4 on (1,4) dp_mesh adam"
    assert Job("ddp").strategy == "DDP"


def test_fold_and_count_checks_can_fail():
    good = compare(torch.ones(3), torch.ones(3))
    bad = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
    assert fold(good + good, "ok").passed
    row = fold(good + bad, "broken")
    assert not row.passed and row.n_diff == 1 and row.max_abs == 0.5
    assert check_counts("x", [[1, 2], [1, 2]], [1, 2]).passed
    assert not check_counts("x", [[1, 2], [1, 3]], [1, 2]).passed


def test_lab01_plots_build():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paralab.viz import plot_memory, plot_shard_layout, plot_traffic

    numels = unit_numels()
    figs = [
        plot_shard_layout(numels, 8, 2),
        plot_traffic(
            {
                "ZeRO-3": {2: (3024, 3024), 4: (4680, 4680)},
                "DDP": {2: (2016, 2016)},
                "HSDP": {4: (3024, 1008, 4032)},
            }
        ),  # one panel per strategy; HSDP split within / across
        plot_memory(
            {"ZeRO-3 n=8": memory_formula("hand", numels, 8, "adam")}, {"ZeRO-3 n=8": 1792}
        ),
    ]
    assert [len(f.axes) for f in figs] == [1, 3, 1]
    for f in figs:
        plt.close(f)


def test_hsdp_keeping_parameters_has_its_own_label():
    job = Job("hand", 2, reshard_after_forward=False)
    assert (job.strategy, job.label(8)) == ("HSDP ZeRO-2-like", "HSDP 2x4 ZeRO-2-like adam")
    assert (Job("hand", 2).strategy, Job("hand").strategy) == ("HSDP", "ZeRO-3")
