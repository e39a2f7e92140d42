"""Lab 03: CFG parallelism. Pure logic first, then real 2-rank runs against the one-process sampler."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from paralab import ParallelDims
from paralab.cfgp import (
    cfg_combine,
    draw_noise,
    initial_latent,
    predict_branches,
    predict_branches_batched,
    sample,
    sample_on_rank,
    timesteps,
)
from paralab.cfgp.runs import EXCHANGE_VARIANTS, sample_variants
from paralab.check import CheckFailed, assert_match
from paralab.exercises.lab03 import SAMPLER_BUGS, noise_per_rank_seed, wrong_sign
from paralab.launch import LaunchError, run
from paralab.ledger import calls, received, sent
from paralab.models import CondDenoiser, make_text_embedding, null_text_embedding

STEPS, W, SEED = 4, 4.0, 7


@pytest.fixture(scope="module")
def setup():
    model = CondDenoiser()
    cond = make_text_embedding(1)
    uncond = null_text_embedding(cond)
    reference = sample(model, cond, uncond, steps=STEPS, guidance_scale=W, seed=SEED)
    return model, cond, uncond, reference


# ------------------------------------------------------------------ pure logic
def test_cfg_combine_endpoints_and_sign():
    c, u = torch.tensor([3.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    assert cfg_combine(c, u, 0.0).item() == 1.0  # w = 0: unconditional
    assert cfg_combine(c, u, 1.0).item() == 3.0  # w = 1: conditional
    assert cfg_combine(c, u, 5.0).item() == 11.0  # w > 1: extrapolate past cond
    assert wrong_sign(c, u, 5.0).item() != cfg_combine(c, u, 5.0).item()


def test_timesteps_go_from_noise_to_clean():
    ts = timesteps(4)
    assert ts == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_draw_noise_ignores_global_rng_state():
    torch.manual_seed(123)
    a = draw_noise((1, 8, 4), seed=5)
    torch.manual_seed(456)
    b = draw_noise((1, 8, 4), seed=5)
    assert torch.equal(a, b) and a.dtype == torch.float64


def test_sampler_is_deterministic_and_guidance_matters(setup):
    model, cond, uncond, reference = setup
    again = sample(model, cond, uncond, steps=STEPS, guidance_scale=W, seed=SEED)
    assert_match(again, reference)
    unguided = sample(model, cond, uncond, steps=STEPS, guidance_scale=1.0, seed=SEED)
    assert (unguided - reference).abs().max() > 1e-3


def test_batched_branches_agree_to_rounding(setup):
    """One batch-2 forward may sum in another order (the lab shows it does here); never by more than rounding."""
    model, cond, uncond, _ = setup
    x = draw_noise(model.latent_shape, SEED)
    separate = predict_branches(model, x, 1.0, cond, uncond)
    batched = predict_branches_batched(model, x, 1.0, cond, uncond)
    assert_match(list(batched), list(separate), atol=1e-12)


def test_model_on_a_shard_uses_global_positions(setup):
    """Per-token ops on a shard with its global positions give the rows of the full output
    (attention aside): the property cp relies on. Identity 'attention' keeps tokens independent."""
    model, cond, _, _ = setup
    x = draw_noise(model.latent_shape, SEED)
    own = lambda q, k, v: v  # noqa: E731 - a token-local stand-in for attention
    full = model(x, 0.5, cond, attention=own)
    half = x.shape[1] // 2
    second = model(x[:, half:], 0.5, cond, attention=own, positions=torch.arange(half, x.shape[1]))
    assert_match(second, full[:, half:], atol=1e-12)
    restarted = model(x[:, half:], 0.5, cond, attention=own)
    assert (restarted - full[:, half:]).abs().max() > 1e-3


def test_parallel_dims_inference_only_rules():
    with pytest.raises(ValueError, match="cfgp=2 needs enable_inference_mode=True"):
        ParallelDims(world_size=2, cfgp=2)
    with pytest.raises(ValueError, match="cfgp=3"):
        ParallelDims(world_size=6, cfgp=3, enable_inference_mode=True)
    assert ParallelDims(world_size=2, cfgp=2, enable_inference_mode=True).cfgp == 2


# ------------------------------------------------------------------ real ranks
def _broadcast_probe(shape, seed):
    """Each rank first scrambles its global RNG differently, as real code does between launches."""
    torch.manual_seed(1000 + dist.get_rank())
    pd = ParallelDims(dist.get_world_size(), cfgp=2, enable_inference_mode=True)
    pd.build_meshes("cpu")
    return {
        "broadcast": initial_latent(shape, seed, pd),
        "per_rank_seed": noise_per_rank_seed(shape, seed, pd),
    }


def test_noise_is_broadcast_over_the_cfgp_group():
    shape = (1, 8, 4)
    out = run(_broadcast_probe, 2, shape, SEED)
    expected = draw_noise(shape, SEED)
    assert_match([o["broadcast"] for o in out], [expected, expected])
    with pytest.raises(CheckFailed, match="rank 1:"):
        assert_match([o["per_rank_seed"] for o in out], [expected, expected])


@pytest.fixture(scope="module")
def cfgp_runs(setup):
    """Per rank: the two exchanges in one launch, then each sampler bug in a launch of its own."""
    model, cond, uncond, _ = setup
    kw = dict(steps=STEPS, guidance_scale=W, seed=SEED)
    per_rank = run(sample_variants, 2, model, cond, uncond, {"cfgp": 2}, EXCHANGE_VARIANTS, **kw)
    for name, bug in SAMPLER_BUGS.items():
        buggy = run(sample_on_rank, 2, model, cond, uncond, {"cfgp": 2}, patches=bug, **kw)
        for rank, result in zip(per_rank, buggy):
            rank[name] = result
    return per_rank


@pytest.mark.parametrize("exchange", ["p2p", "all_gather"])
def test_cfgp2_matches_single_process_bit_for_bit(setup, cfgp_runs, exchange):
    reference = setup[3]
    assert [r[exchange]["cfgp_rank"] for r in cfgp_runs] == [0, 1]
    assert_match([r[exchange]["latent"] for r in cfgp_runs], [reference, reference])


@pytest.mark.parametrize("broken", ["per_rank_seed", "wrong_sign"])
def test_broken_variants_fail_the_check(setup, cfgp_runs, broken):
    reference = setup[3]
    with pytest.raises(CheckFailed):
        assert_match([r[broken]["latent"] for r in cfgp_runs], [reference, reference], atol=1e-12)


def test_ledger_one_latent_each_way_per_step(setup, cfgp_runs):
    model = setup[0]
    latent_bytes = torch.zeros(model.latent_shape, dtype=torch.float64).nbytes
    for rank, r in enumerate(cfgp_runs):
        p2p, gathered = r["p2p"]["records"], r["all_gather"]["records"]
        assert (
            sent(p2p, op="isend", peer=1 - rank)
            == received(p2p, op="irecv", peer=1 - rank)
            == STEPS * latent_bytes
        )
        assert calls(p2p, op="isend") == calls(p2p, op="irecv") == STEPS
        assert (
            calls(gathered, op="all_gather") == STEPS
            and sent(gathered, op="all_gather") == STEPS * latent_bytes
        )
        assert calls(p2p, op="broadcast") == 1 and sent(p2p, op="broadcast") == (
            latent_bytes if rank == 0 else 0
        )


def test_batched_branches_rejected_under_cfgp(setup):
    model, cond, uncond, _ = setup
    with pytest.raises(LaunchError, match="batch_branches needs both branches on one rank"):
        run(
            sample_on_rank,
            2,
            model,
            cond,
            uncond,
            {"cfgp": 2},
            steps=1,
            guidance_scale=W,
            seed=0,
            batch_branches=True,
        )
