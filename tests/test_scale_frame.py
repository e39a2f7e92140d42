"""Lab 11's prose against the code: each figure its text types in is the figure the code gives.

A sentence of `labs/11_scale/scale_lab.py` (or its README) that quotes a number no cell prints
is pinned here, computed from the same functions the lab calls, so a change of the model that
moves it fails here instead of leaving a stale sentence behind.
"""

from dataclasses import replace
from pathlib import Path

from paralab.scale import FITTED, Layout, Workload, hardware, load_cases, model, predict
from paralab.scale.__main__ import check_rows
from paralab.scale.axes import ring_hop_seconds
from paralab.scale.heldout import GENERALIZATION, fixed_seconds
from paralab.scale.plan import vae_lb_effect
from paralab.scale.predict import ADAM_BYTES_PER_PARAM

LAB = Path(__file__).resolve().parents[1] / "labs" / "11_scale"
TEXT = " ".join(
    line.lstrip("# ").strip() for line in (LAB / "scale_lab.py").read_text().splitlines()
)
README = " ".join((LAB / "README.md").read_text().split())


def test_the_distilled_rows_are_predicted_as_the_prose_says():
    ratios = {
        r["name"].removeprefix("cosmos-transfer2.5-2b edge distilled 4 steps "): (
            r["predicted"] / r["measured"]
        )
        for r in check_rows(str(GENERALIZATION))
        if "distilled" in r["name"]
    }
    assert len(ratios) == 9 and max(ratios.values()) < 1, ratios
    assert {n for n, v in ratios.items() if v >= 0.75} == {"1 h200-nvl", "4 h200-nvl"}
    assert "(4 steps, one branch) are predicted short on every card" in TEXT
    assert "that brings the 1- and 4-GPU H200 NVL rows inside the band" in TEXT


def test_one_speed_up_per_forward_in_the_lab_and_the_readme():
    cases = {c.name: c for c in load_cases(GENERALIZATION)} | {c.name: c for c in load_cases()}
    forward = {
        hw: fixed_seconds(
            cases[
                "cosmos-transfer2.5-2b edge 35 steps 1 h100-nvl"
                if hw == "h100-nvl"
                else f"cosmos-transfer2.5-2b edge base 35 steps 1 {hw}"
            ],
            cases[f"cosmos-transfer2.5-2b edge distilled 4 steps 1 {hw}"],
        )[0]
        for hw in ("h100-nvl", "h200-nvl")
    }
    ratio = f"{forward['h100-nvl'] / forward['h200-nvl']:.2f}"
    assert ratio == "1.35"
    assert f"{ratio}× faster" in TEXT and f"{ratio}x faster" in README
    assert "1.34x" not in README


def test_the_figures_typed_in_the_lab_are_the_codes():
    assert ADAM_BYTES_PER_PARAM == 28 and "28 bytes of HBM traffic per parameter" in TEXT
    b200 = hardware("b200")
    assert f"NVLink 5 ({b200.intra_busbw / 1e9:.0f} GB/s busbw)" in TEXT
    consisid = model("consisid")
    assert f"about {17776 / 3:,.0f} tokens (17,776 / 3)" in TEXT
    assert f"a model of {consisid.params / 1e9:.1f} B parameters" in TEXT


def test_the_what_to_try_hop_and_exchange_figures():
    h100 = hardware("h100-sxm")
    slow = replace(h100, intra_busbw=h100.intra_busbw / 20)
    hop = ring_hop_seconds(model("llama3.1-8b"), slow, 262144, 8, FITTED["h100-sxm"]["attention"])
    hint = TEXT[TEXT.index("3. Make NVLink slower") : TEXT.index("4. Give lb something")]
    assert f"at {slow.intra_busbw / 1e9:.1f} GB/s" in hint, hop
    assert f"128 MiB hop ({hop['hop'] * 1e3:.0f} ms)" in hint, hop
    assert f"about {hop['attention a hop'] * 1e3:.0f} ms of forward attention" in hint, hop
    videos = [(f, 704, 1280) for f in (121, 29, 93, 29, 121, 61, 29, 29)]
    exchange = [
        vae_lb_effect(hardware("h100-nvl"), Layout(cp=2, lb=lb), 8, videos)[1] for lb in (4, 8)
    ]
    assert [round(s * 1e3) for s in exchange] == [9, 10]
    assert "for 9 to 10 ms of exchange (lb 4 and lb 8)" in TEXT


def test_the_consisid_hint_prediction():
    seconds = predict(
        model("consisid"),
        hardware("h100-sxm"),
        Layout(cp=3, cp_kind="ring", cfgp=2),
        Workload("diffusion", seq=17776, steps=50),
        FITTED["h100-sxm"],
    ).seconds
    assert f"About {seconds:.1f} s, half the measurement" in TEXT


def test_the_held_out_figures_the_lab_types_in():
    from paralab.scale.fit import relative_error

    held = load_cases(GENERALIZATION)
    assert f"{len(held)} rows, none read by the fit" in TEXT
    megatron = [c for c in held if c.name.startswith("megatron-lm")]
    assert max(c.gpus for c in megatron) == 6144 and "weak-scaling table up to 6,144 GPUs" in TEXT
    assert "every row of Megatron-LM's table up to 6,144 GPUs" in TEXT
    deepseek = next(c for c in held if "deepseek-v3" in c.name)
    assert deepseek.gpus == 1024 and relative_error(deepseek) < -0.25
    assert "DeepSeek-V3 on 1,024 H100s runs faster than the model" in TEXT
    qwen = [c for c in held if "qwen3" in c.name]
    assert all(c.model.experts == 128 for c in qwen) and "128 narrow experts" in TEXT
    assert all(relative_error(c) > 1.0 for c in qwen) and "more than twice the measured" in TEXT
