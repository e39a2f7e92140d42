"""Lab 06's pipeline: the pieces the lab does not already run (its nbval run executes the 4- and 8-rank layouts)."""

import pytest
import torch

from paralab import ParallelDims
from paralab.exercises.lab06 import skip_uncond_whenever_guidance_is_one
from paralab.launch import run
from paralab.pipeline import costs, generate, inference, runs


@pytest.fixture(scope="module")
def reference():
    return generate(None, steps=2, guidance_scale=5.0, seed=3)


def test_reference_is_deterministic_and_depends_on_the_seed(reference):
    assert reference.shape == (inference.BATCH, 3, 4, 16, 16)
    assert torch.equal(generate(None, steps=2, guidance_scale=5.0, seed=3), reference)
    assert not torch.equal(generate(None, steps=2, guidance_scale=5.0, seed=4), reference)


def test_guidance_one_is_exactly_the_cond_prediction():
    cond, uncond = (
        torch.randn(1, 8, 4, dtype=torch.float64),
        torch.randn(1, 8, 4, dtype=torch.float64),
    )
    assert inference.guided_velocity(cond, uncond, 1.0) is cond
    assert torch.equal(inference.guided_velocity(cond, uncond, 3.0), uncond + 3.0 * (cond - uncond))


def test_only_a_process_outside_fsdp_may_skip_the_uncond_forward():
    sharded = ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)
    replicated = ParallelDims(
        4, dp_shard=1, dp_replicate=4, cfgp=2, cp=2, enable_inference_mode=True
    )
    assert inference.should_skip_uncond(1.0, None)
    assert not inference.should_skip_uncond(5.0, None)
    assert not inference.should_skip_uncond(1.0, sharded)
    assert inference.should_skip_uncond(1.0, replicated)
    assert skip_uncond_whenever_guidance_is_one(
        1.0, sharded
    )  # the clinic's bug ignores the sharding


def test_generate_refuses_dp_replicas_in_inference_naming_the_axis():
    pd = ParallelDims(4, dp_shard=2, cfgp=2, cp=2, enable_inference_mode=True)
    with pytest.raises(ValueError, match="dp_replicate=2"):
        generate(pd)


def test_a_batch_that_does_not_split_over_the_sample_groups_is_refused():
    pd = ParallelDims(16, cfgp=2, enable_inference_mode=True)  # 8 sample groups for 4 samples
    with pytest.raises(ValueError, match="8 sample groups"):
        inference.samples_of_rank(pd, 0)


def test_memory_formula_keeps_the_whole_padded_model_without_resharding():
    model = inference.make_denoiser()
    shards = costs.unit_shard_bytes(model, 8)
    keep, free = costs.memory(model, 8, False), costs.memory(model, 8, True)
    assert keep["gathered between steps"] == keep["gathered peak"] == 8 * sum(shards.values())
    assert free["gathered between steps"] == 0
    assert free["gathered peak"] < keep["gathered peak"]
    assert (
        sum(p.numel() for p in model.parameters()) * 8 <= keep["gathered peak"]
    )  # padding only adds


def test_no_lb_no_lb_bytes():
    assert set(
        costs.lb_bytes(ParallelDims(4, cfgp=2, cp=2, enable_inference_mode=True)).values()
    ) == {0}


def test_two_ranks_fsdp_alone_and_with_cfgp_match_one_process_bitwise(reference):
    """Layouts the lab does not run: dp_shard 2 with both branches on every rank, and with cfgp 2 (no cp)."""
    layouts = {"fsdp only": {}, "cfgp": {"cfgp": 2}}
    out = run(
        runs.pipeline_job, 2, layouts, {"v": dict(steps=2, guidance_scale=5.0, seed=3)}, timeout=120
    )
    for layout in layouts:
        for rank, per_rank in enumerate(out):
            result = per_rank[(layout, "v")]
            assert torch.equal(result["output"], reference), (layout, rank)
            pd = ParallelDims(2, enable_inference_mode=True, **layouts[layout])
            for step in (1, 2):
                expected = costs.denoising_step_bytes(
                    inference.make_denoiser(), pd, "ulysses", True, step
                )
                measured = runs.sent_by_group(result, f"step {step}")
                assert {g: measured[g] for g in expected} == expected, (layout, rank, step)


@pytest.mark.parametrize("steps", [0, -1, 1.5, None])
def test_generate_refuses_steps_that_are_not_a_positive_int(steps):
    with pytest.raises(
        ValueError, match=rf"generate: steps must be an int >= 1, got steps={steps!r}"
    ):
        generate(steps=steps)
