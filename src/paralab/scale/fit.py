"""The only fitted constants: one efficiency per (hardware, kernel class): GEMM, attention, and
the convolutions of a video VAE.

Fitted on the shipped (visible) cases, per fit group, over a grid of 0.01: the values whose
largest |log(predicted / measured)| is smallest (the check's criterion is the largest error),
ties broken by the sum of squares. Per fit group (`Hardware.efficiency_from`): the h100-sxm
group holds the torchtitan, xDiT and ring-flash-attention rows (H800 is the same die) and the
Wan2.1 VAE's encode and decode on an A800 (FastVAE's), the h100-nvl group the Cosmos rows. The
VAE rows time the convolutions alone, so `conv` is fitted on them first, and the other rows
are fitted with it. `FITTED` is what the predictor uses; `tests/test_scale.py` re-runs the fit
on the shipped cases and checks these values are its result, so they cannot drift or be
hand-tuned.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from paralab.scale.cases import Case
from paralab.scale.predict import FLOP_COUNTS, Prediction, predict

FITTED: dict[str, dict[str, float]] = {
    "h100-sxm": {"gemm": 0.52, "attention": 0.25, "conv": 0.23},
    "h100-nvl": {"gemm": 0.52, "attention": 0.32, "conv": 0.23},
}
GRID = [round(0.2 + 0.01 * i, 2) for i in range(81)]


def efficiencies(case: Case, fitted: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    return (fitted or FITTED)[case.hardware.efficiency_from]


def predict_case(case: Case, fitted: dict[str, dict[str, float]] | None = None) -> Prediction:
    return predict(
        case.model, case.hardware, case.layout, case.workload, efficiencies(case, fitted)
    )


def predicted_value(case: Case, fitted: dict[str, dict[str, float]] | None = None) -> float:
    """The prediction in the case's measure; TFLOP/s and MFU from the predicted tokens/s with a
    token's FLOPs counted as the source counts them (`case.flops`)."""
    p = predict_case(case, fitted)
    if case.measure not in ("tflops_per_gpu", "mfu"):
        return p.value(case.measure)
    flops = p.tokens_per_s_per_gpu * FLOP_COUNTS[case.flops](case.model, case.workload.seq)
    return flops / 1e12 if case.measure == "tflops_per_gpu" else flops / case.hardware.peak_bf16


def relative_error(case: Case, fitted: dict[str, dict[str, float]] | None = None) -> float:
    """(predicted - measured) / measured."""
    return (predicted_value(case, fitted) - case.measured) / case.measured


FREE = {"h100-sxm": ("gemm", "attention", "conv"), "h100-nvl": ("attention",)}
"""What each group's cases can tell apart. The Cosmos rows spend 72-89 % of their time in
attention, so they cannot fix a GEMM efficiency: h100-nvl takes h100-sxm's (the same die), and
its VAE convolutions' too (no case times them on an NVL card)."""
BORROWS = {"h100-nvl": "h100-sxm"}


def _best(members: list[Case], group: str, trials: Iterable[dict[str, float]]) -> dict[str, float]:
    best = None
    for effs in trials:
        errors = [math.log(predicted_value(c, {group: effs}) / c.measured) for c in members]
        loss = (round(max(abs(e) for e in errors), 9), sum(e * e for e in errors))
        if best is None or loss < best[0]:
            best = (loss, effs)
    return best[1]


def _fit_group(members: list[Case], group: str, start: dict[str, float]) -> dict[str, float]:
    free = FREE[group]
    vae = [c for c in members if c.workload.kind == "vae"]
    rest = [c for c in members if c.workload.kind != "vae"]
    conv = start["conv"]
    if "conv" in free and vae:
        conv = _best(vae, group, ({**start, "conv": c} for c in GRID))["conv"]
    if not rest:  # nothing here times GEMMs or attention: keep what the group starts from
        return {**start, "conv": conv}
    trials = (
        {"gemm": g, "attention": a, "conv": conv}
        for g in (GRID if "gemm" in free else [start["gemm"]])
        for a in (GRID if "attention" in free else [start["attention"]])
    )
    return _best(rest, group, trials)


def fit(cases: Iterable[Case]) -> dict[str, dict[str, float]]:
    """Per fit group, the free efficiencies on the grid with the smallest largest log error."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.hardware.efficiency_from, []).append(case)
    out: dict[str, dict[str, float]] = {}
    for group in sorted(groups, key=lambda g: g in BORROWS):
        start = out.get(BORROWS.get(group, ""), {"gemm": 0.0, "attention": 0.0, "conv": 0.0})
        out[group] = _fit_group(groups[group], group, start)
    return out
