"""Lab 11 exercises: the seconds outside the denoiser, from two rows on the same GPUs; and the
activation bytes a layer keeps per token, under an AC mode, tp and SP.

`paralab.scale.heldout.fixed_seconds` reads a base row (35 steps of two branches) against a
distilled row (4 steps of one) and solves the two equations `measured = fixed + forwards *
forward` for the seconds a forward and the seconds outside the forwards. Its bug variants are
the two readings that look right on one row at a time: forwards counted in steps (the branches
forgotten), and the base row taken as denoiser time only.

The lab's bug clinic, `edge_table_clinic`, is a patch set over `paralab.scale.cases.load_cases`:
the Cosmos rows read with another labelling of the same table. Kept here so it is written once.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from paralab.exercises import Exercise
from paralab.patches import Patches
from paralab.scale.cases import SHIPPED, Case
from paralab.scale.cases import load_cases as package_load_cases
from paralab.scale.heldout import GENERALIZATION
from paralab.scale.memory import ACT, layer_tensors
from paralab.scale.models import ModelShape, llama_ffn, model

LAB = "11_scale"
COSMOS = "cosmos-transfer2.5-2b edge"


def _cosmos_rows() -> dict[tuple[str, int, str], Case]:
    """Every Cosmos Edge row of both case files, by (hardware, GPUs, "base" or "distilled")."""
    rows = {}
    for case in package_load_cases(SHIPPED) + package_load_cases(GENERALIZATION):
        if case.name.startswith(COSMOS):
            kind = "distilled" if "distilled" in case.name else "base"
            rows[(case.hardware.name, case.gpus, kind)] = case
    return rows


# ------------------------------------------------------------------ exercise: fixed_seconds
PAIRS = [("h100-nvl", 1), ("h200-nvl", 1), ("b200", 8)]


def _pair_cases(rank: int, world: int) -> list[tuple]:
    """The published pairs: Cosmos base against distilled on the same GPUs."""
    rows = _cosmos_rows()
    return [(rows[(hw, n, "base")], rows[(hw, n, "distilled")]) for hw, n in PAIRS]


def _row(like: Case, steps: int, branches: int, measured: float) -> Case:
    return dataclasses.replace(
        like,
        model=dataclasses.replace(like.model, branches=branches),
        workload=dataclasses.replace(like.workload, steps=steps),
        measured=measured,
    )


def _hidden_pair_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Pairs drawn from the seed: a forward's seconds and the fixed seconds, the base's steps
    (two branches) and the distilled steps (one branch, or two in the second case)."""
    draw = random.Random(seed)
    rows = _cosmos_rows()
    base, distilled = rows[("h100-nvl", 1, "base")], rows[("h100-nvl", 1, "distilled")]
    cases = []
    for distilled_branches in (1, 2):
        forward, fixed = draw.uniform(0.5, 12.0), draw.uniform(5.0, 80.0)
        steps, few = draw.randint(20, 60), draw.randint(1, 8)
        cases.append(
            (
                _row(base, steps, 2, fixed + 2 * steps * forward),
                _row(
                    distilled, few, distilled_branches, fixed + distilled_branches * few * forward
                ),
            )
        )
    return cases


def _as_seconds(result: tuple[float, float]) -> dict[str, torch.Tensor]:
    forward, fixed = result
    return {
        "seconds a forward": torch.tensor(float(forward), dtype=torch.float64),
        "seconds outside the forwards": torch.tensor(float(fixed), dtype=torch.float64),
    }


def forwards_as_steps(base: Case, distilled: Case) -> tuple[float, float]:
    """Bug: a step counted as one forward; the base row's two branches forgotten."""
    forward = (base.measured - distilled.measured) / (
        base.workload.steps - distilled.workload.steps
    )
    return forward, distilled.measured - distilled.workload.steps * forward


def base_row_all_denoiser(base: Case, distilled: Case) -> tuple[float, float]:
    """Bug: the base row taken as denoiser time only, so a forward is its time over its forwards."""
    forward = base.measured / (base.workload.steps * base.model.branches)
    return (
        forward,
        distilled.measured - distilled.workload.steps * distilled.model.branches * forward,
    )


# ------------------------------------------------------------------ exercise: layer bytes
LAYER_CASES = [
    ("llama3.1-8b", "selective", 1, False),
    ("llama3.1-70b", "full", 8, True),
    ("llama3.1-70b", "none", 8, False),
    ("llama3.1-405b", "selective", 8, True),
]


def _layer_cases(rank: int, world: int) -> list[tuple]:
    return [(model(name), ac, tp, sp) for name, ac, tp, sp in LAYER_CASES]


def _hidden_layer_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Llama-shaped models drawn from the seed, under every AC mode with and without SP, tp drawn:
    each known-wrong version differs from the answer on one side of SP, so both are drawn."""
    draw = random.Random(seed)
    cases = []
    for ac, sp in [(ac, sp) for ac in ("none", "selective", "full") for sp in (False, True)]:
        heads = draw.choice([16, 32, 48, 64])
        hidden = heads * draw.choice([64, 128])
        shape = ModelShape(
            f"drawn-{ac}-{'sp' if sp else 'no-sp'}",
            "lm",
            draw.randint(2, 40),
            hidden,
            heads,
            hidden // heads,
            kv_heads=draw.choice([4, 8, 16]),
            ffn=llama_ffn(hidden, draw.choice([1.0, 1.3]), 256),
            vocab=32000,
        )
        cases.append((shape, ac, draw.choice([2, 4, 8]), sp))
    return cases


def _as_layer_bytes(result: float) -> dict[str, torch.Tensor]:
    return {"bytes a token a layer": torch.tensor(float(result), dtype=torch.float64)}


def sp_ignored(m: ModelShape, ac: str, tp: int, sp: bool) -> float:
    """Bug: the tensors outside the TP regions kept whole on every rank, SP or not."""
    outside, inside = layer_tensors(m)[ac]
    return ACT * (outside + inside / tp)


def everything_over_tp(m: ModelShape, ac: str, tp: int, sp: bool) -> float:
    """Bug: every tensor cut over tp, as if SP were always on."""
    outside, inside = layer_tensors(m)[ac]
    return ACT * (outside + inside) / tp


# ------------------------------------------------------------------ the bug clinic
def load_cases_first_edge_table(path=SHIPPED) -> list[Case]:
    """The clinic's variant: the Cosmos base and distilled rows on the same GPUs swap their
    measurements; every other row, and every other field, as the package reads it."""
    rows = _cosmos_rows()
    out = []
    for case in package_load_cases(path):
        if case.name.startswith(COSMOS):
            kind = "distilled" if "distilled" in case.name else "base"
            other = "base" if kind == "distilled" else "distilled"
            case = dataclasses.replace(
                case, measured=rows[(case.hardware.name, case.gpus, other)].measured
            )
        out.append(case)
    return out


def edge_table_clinic() -> Patches:
    """The lab's bug clinic, a patch set for `paralab.patches.patched`: the case files' loader."""
    return {"paralab.scale.cases": {"load_cases": load_cases_first_edge_table}}


EXERCISES = [
    Exercise(
        name="fixed_seconds",
        lab=LAB,
        target="paralab.scale.heldout.fixed_seconds",
        prompt=(
            "Two measured rows of the same video on the same GPUs: `base` runs "
            "`base.workload.steps` denoising steps of `base.model.branches` forwards each "
            "(guided: 2), `distilled` runs `distilled.workload.steps` steps of "
            "`distilled.model.branches`. Each row's `measured` seconds are the same fixed "
            "seconds (work outside the denoiser) plus its number of forwards times the seconds "
            "of one forward. Return `(seconds a forward, seconds outside the forwards)`. The "
            "check allows rounding-level differences (1e-9)."
        ),
        hint="return (seconds of one denoiser forward, seconds outside the forwards) such that "
        "each row's measured seconds = outside + its steps x its branches x a forward",
        cases=_pair_cases,
        kinds=lambda world: [f"Cosmos base against distilled, {n} {hw}" for hw, n in PAIRS],
        hidden=_hidden_pair_cases,
        hidden_kinds=lambda world: [
            "a drawn pair, distilled with one branch",
            "a drawn pair, distilled with two branches",
        ],
        world_sizes=(0,),
        points=1,
        minutes=10,
        atol=1e-9,
        rtol=1e-9,
        normalize=_as_seconds,
        bugs=[
            (
                "forwards counted in steps, the two branches forgotten",
                forwards_as_steps,
                "case 0, seconds a forward",
            ),
            (
                "the base row taken as denoiser time only",
                base_row_all_denoiser,
                "case 0, seconds a forward",
            ),
        ],
    ),
    Exercise(
        name="per_token_layer_bytes",
        lab=LAB,
        target="paralab.scale.memory.per_token_layer_bytes",
        prompt=(
            "The bytes of activations one layer of model `m` keeps per token on one GPU under "
            'AC mode `ac` ("none", "selective", "full"), tensor parallel degree `tp` '
            "and sequence parallelism `sp`. `layer_tensors(m)[ac]` gives the bf16 elements per "
            "token as (outside the TP regions, inside them): inside are cut over tp; outside "
            "are cut over tp only under SP and kept whole on every tp rank without it. "
            "Return the bytes (bf16: `ACT` = 2 bytes an element)."
        ),
        hint="ACT x (outside / (tp under SP, else 1) + inside / tp)",
        cases=_layer_cases,
        kinds=lambda world: [
            f"{name}, AC {ac}, tp {tp}, {'SP' if sp else 'no SP'}"
            for name, ac, tp, sp in LAYER_CASES
        ],
        hidden=_hidden_layer_cases,
        hidden_kinds=lambda world: [
            f"a drawn Llama shape, AC {ac}, {'SP' if sp else 'no SP'}"
            for ac in ("none", "selective", "full")
            for sp in (False, True)
        ],
        world_sizes=(0,),
        points=1,
        minutes=10,
        atol=1e-9,
        rtol=1e-12,
        normalize=_as_layer_bytes,
        bugs=[
            (
                "the tensors outside the TP regions kept whole under SP",
                sp_ignored,
                "case 1, bytes a token a layer",
            ),
            (
                "every tensor cut over tp without SP",
                everything_over_tp,
                "case 2, bytes a token a layer",
            ),
        ],
    ),
]
