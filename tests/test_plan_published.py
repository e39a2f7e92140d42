"""The planner's search as published runs use it (gradient accumulation, uneven pipeline
splits), and where each published training row's own degrees rank when the planner is asked
its question."""

import pytest

from paralab.scale import FITTED, Layout, Workload, hardware, model, predict
from paralab.scale.plan import (
    TrainQuestion,
    accumulation_choices,
    check_layout,
    describe,
    fits,
    plan_train,
    train_row,
)

PART = hardware("h100-96gb-500w")
EIGHT_B = model("llama3.1-8b")


def test_accumulated_passes_repeat_everything_but_the_optimizer_step():
    q = TrainQuestion(EIGHT_B, PART, 8, 8192, 16)
    row = train_row(q, Layout(dp_shard=8, microbatches=2), "none")
    one = predict(
        EIGHT_B, PART, Layout(dp_shard=8), Workload("train", 8192, 1, ac="none"), FITTED["h100-sxm"]
    )
    optimizer = one.breakdown["optimizer (HBM)"]
    assert row.prediction.seconds == pytest.approx(2 * (one.seconds - optimizer) + optimizer)
    assert row.prediction.breakdown["optimizer (HBM)"] == optimizer
    # the step carries twice the tokens of one pass: 16 sequences of 8192 over 8 GPUs
    tokens_per_gpu = 16 * 8192 / 8
    assert row.prediction.tokens_per_s_per_gpu == pytest.approx(
        tokens_per_gpu / row.prediction.seconds
    )
    # memory is one pass's: a sequence a GPU
    single = train_row(TrainQuestion(EIGHT_B, PART, 8, 8192, 8), Layout(dp_shard=8), "none")
    assert row.memory == single.memory
    assert describe(row.layout, "none") == "dp_shard 8 [accumulate 2, AC none]"


def test_each_ac_mode_gets_the_fewest_passes_it_fits_in():
    q = TrainQuestion(EIGHT_B, PART, 8, 8192, 32)  # 4 sequences a GPU
    choices = accumulation_choices(q, Layout(dp_shard=8))
    passes = [lo.microbatches or 1 for lo, _ in choices]
    assert passes == sorted(passes, reverse=True) and len(set(passes)) == len(passes)
    for lo, ac in choices:
        assert fits(q, lo, ac)
        fewer = (lo.microbatches or 1) // 2
        if fewer:
            assert not fits(q, Layout(dp_shard=8, microbatches=fewer), ac)
    # no AC needs a sequence a pass; full AC fits all four at once
    assert choices[0] == (Layout(dp_shard=8, microbatches=4), "none")
    assert choices[-1] == (Layout(dp_shard=8), "full")


def test_pipelines_split_layers_unevenly_as_published_runs_do():
    deepseek = model("deepseek-v3")
    q = TrainQuestion(deepseek, hardware("h800"), 2048, 4096, 16384)
    # 61 layers over 16 stages: DeepSeek-V3's PP 16 (the busiest stage holds 4)
    assert check_layout(q, Layout(dp_shard=128, pp=16, microbatches=16)) == ""
    assert "stages for 61 layers" in check_layout(q, Layout(dp_shard=16, pp=128))


def test_planned_layouts_use_every_gpu_and_rank_by_step():
    rows = plan_train(EIGHT_B, PART, 8, 8192, 16)
    fitting = [r for r in rows if not r.oom]
    assert all(r.layout.world == 8 for r in rows)
    assert [r.score for r in fitting] == sorted(r.score for r in fitting)
    assert any(r.layout.pp == 1 and r.layout.microbatches > 1 for r in fitting)


def test_a_question_is_asked_in_its_engines_ac_modes(capsys):
    from paralab.scale.plan import main

    gpt = model("gpt-1.7b")
    megatron = plan_train(gpt, hardware("h100-sxm"), 8, 4096, 64, engine="megatron")
    torchtitan = plan_train(gpt, hardware("h100-sxm"), 8, 4096, 64)
    assert {r.ac for r in megatron} <= {"none", "attention", "full"}
    assert {r.ac for r in torchtitan} <= {"none", "selective", "full"}
    assert megatron[0].prediction.seconds != torchtitan[0].prediction.seconds
    args = ["--model", "gpt-1.7b", "--hardware", "h100-sxm", "--gpus", "8", "--seq", "4096"]
    assert main([*args, "--train", "--engine", "megatron", "--top", "1"]) == 0
    assert "wins" in capsys.readouterr().out
