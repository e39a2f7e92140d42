"""Lab 06 exercises: which ranks share a latent, the bytes of one denoising step; and the bug clinic's variant.

The pipeline's real loop (`paralab.pipeline.inference.predict`) asks
`should_skip_uncond` whether the uncond forward can be skipped at w == 1.
The clinic's variant answers from the guidance scale alone: only the uncond
branch consults it, so under FSDP the uncond ranks leave the parameter
all-gathers their cond partners are waiting in.
"""

from __future__ import annotations

import random

import torch

from paralab.exercises import Exercise
from paralab.models import CondDenoiser
from paralab.parallel_dims import ParallelDims
from paralab.pipeline.costs import ITEMSIZE, denoising_step_bytes, forwards_per_step
from paralab.pipeline.inference import latent_ranks, make_denoiser


def skip_uncond_whenever_guidance_is_one(
    guidance_scale: float, parallel_dims: ParallelDims | None
) -> bool:
    """The clinic's patch: at w == 1 the uncond prediction is unused, so skip its forward whenever w == 1."""
    return guidance_scale == 1.0


LAB = "06_inference_pipeline"


def _inference(world: int, **dims) -> ParallelDims:
    return ParallelDims(world, enable_inference_mode=True, **dims)


def _describe(pd: ParallelDims) -> str:
    axes = [f"{a} {getattr(pd, a)}" for a in ("cfgp", "cp", "lb") if getattr(pd, a) > 1]
    return f"{pd.world_size} ranks, {', '.join(axes)}"


# --------------------------------------------------------------------------- latent_ranks
LATENT_LAYOUTS = [
    (8, dict(cfgp=2, cp=2, lb=2)),
    (4, dict(cfgp=2, cp=2)),
    (8, dict(cfgp=2, cp=4)),
    (8, dict(cp=2)),
]
"""The lab's three layouts, and one without cfgp (each rank runs both branches)."""


def _latent_cases(rank: int, world: int) -> list[tuple]:
    return [(_inference(w, **dims), s, 4) for w, dims in LATENT_LAYOUTS for s in range(4)]


def _latent_kinds(world: int) -> list[str]:
    return [
        f"sample {s} of 4, {_describe(_inference(w, **dims))}"
        for w, dims in LATENT_LAYOUTS
        for s in range(4)
    ]


HIDDEN_LATENT_LAYOUTS = [
    (12, dict(cfgp=2, cp=3), 6),
    (16, dict(cfgp=2, cp=2), 8),
    (6, dict(cp=3), 4),
]
"""(world, dims, batch): cp 3, four sample groups of two samples, and cp 3 without cfgp."""


def _hidden_latent_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    return [
        (_inference(w, **dims), draw.randrange(batch), batch)
        for w, dims, batch in HIDDEN_LATENT_LAYOUTS
        for _ in range(2)
    ]


def _hidden_latent_kinds(world: int) -> list[str]:
    return [
        f"a sample of {batch}, {_describe(_inference(w, **dims))}"
        for w, dims, batch in HIDDEN_LATENT_LAYOUTS
        for _ in range(2)
    ]


def _as_tensors(branches: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {branch: torch.tensor(list(ranks)) for branch, ranks in sorted(branches.items())}


def overlay_read_as_rest_cp_cfgp(pd, sample, batch=4):
    """Bug: the overlay mesh read as (rest, cp, cfgp), so a branch's cp ranks are every other rank."""
    out = latent_ranks(pd, sample, batch)
    if pd.cfgp == 1:
        return out
    first = out["cond"][0]
    return {
        "cond": [first + pd.cfgp * i for i in range(pd.cp)],
        "uncond": [first + pd.cfgp * i + 1 for i in range(pd.cp)],
    }


def sample_groups_strided(pd, sample, batch=4):
    """Bug: sample s goes to group s % groups (round robin) instead of the block of k samples it is in."""
    groups = pd.world_size // (pd.cfgp * pd.cp)
    return latent_ranks(pd, (sample % groups) * (batch // groups), batch)


def uncond_nowhere_without_cfgp(pd, sample, batch=4):
    """Bug: without cfgp no rank is given the uncond branch (every rank runs both)."""
    out = latent_ranks(pd, sample, batch)
    return out if pd.cfgp > 1 else {"cond": out["cond"], "uncond": []}


# --------------------------------------------------------------------------- denoising_step_bytes
STEP_LAYOUTS = [
    (4, dict(cfgp=2, cp=2), "ulysses"),
    (8, dict(cfgp=2, cp=2, lb=2), "ulysses"),
    (8, dict(cfgp=2, cp=4), "ring"),
    (4, dict(cp=2), "ring"),
]
"""The lab's three runs, and a layout without cfgp (both branches on every rank)."""


def _step_cases(rank: int, world: int) -> list[tuple]:
    return [
        (make_denoiser(), _inference(w, **dims), attention, keep, step)
        for w, dims, attention in STEP_LAYOUTS
        for keep in (True, False)
        for step in (1, 2)
    ]


def _step_kinds(world: int) -> list[str]:
    return [
        f"the lab's model, {_describe(_inference(w, **dims))}, {attention}, "
        f"reshard_after_forward={keep}, step {step}"
        for w, dims, attention in STEP_LAYOUTS
        for keep in (True, False)
        for step in (1, 2)
    ]


def _hidden_step_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Another denoiser (3 blocks, 48 tokens, a width that pads over 8 ranks), both branch layouts."""
    draw = random.Random(seed)
    model = CondDenoiser(
        channels=4,
        dim=8 * draw.choice((5, 6, 7)),
        heads=8,
        text_dim=4,
        n_blocks=3,
        frames=3,
        height=4,
        width=4,
        seed=draw.randrange(100),
    )
    layouts = [(8, dict(cfgp=2, cp=4), "ulysses"), (8, dict(cp=2), "ring")]
    return [
        (model, _inference(w, **dims), attention, keep, 2)
        for w, dims, attention in layouts
        for keep in (True, False)
    ]


HIDDEN_STEP_KINDS = [
    f"another model, {where}, reshard_after_forward={keep}, step 2"
    for where in ("8 ranks, cfgp 2, cp 4, ulysses", "8 ranks, cp 2, ring")
    for keep in (True, False)
]


def _by_group(out: dict[str, int]) -> dict[str, torch.Tensor]:
    return {group: torch.tensor(n) for group, n in sorted(out.items())}


def gathers_every_step_when_kept(model, pd, attention, reshard_after_forward, step):
    """Bug: with reshard_after_forward=False the all-gathers are still counted at every step."""
    return denoising_step_bytes(model, pd, attention, reshard_after_forward, 1)


def swap_sends_the_whole_latent(model, pd, attention, reshard_after_forward, step):
    """Bug: the cfgp swap counted as the whole latent, not this rank's cp shard of it."""
    out = denoising_step_bytes(model, pd, attention, reshard_after_forward, step)
    if pd.cfgp > 1:
        batch, tokens, channels = model.latent_shape
        k = 4 // (pd.world_size // (pd.cfgp * pd.cp))
        out["cfgp swap"] = k * batch * tokens * channels * ITEMSIZE
    return out


def one_branch_per_sample(model, pd, attention, reshard_after_forward, step):
    """Bug: one forward per sample and step, the second branch forgotten where there is no cfgp."""
    out = denoising_step_bytes(model, pd, attention, reshard_after_forward, step)
    per_forward = forwards_per_step(pd) // (1 if pd.cfgp > 1 else 2)
    scale = per_forward / forwards_per_step(pd)
    for group in ("cp attention", "dp_shard all-gather"):
        if reshard_after_forward or group == "cp attention":
            out[group] = int(out[group] * scale)
    return out


EXERCISES = [
    Exercise(
        name="latent_ranks",
        lab=LAB,
        target="paralab.pipeline.inference.latent_ranks",
        prompt=(
            'Which ranks denoise sample `sample`\'s latent? Return `{"cond": [...], "uncond": '
            "[...]}`, each branch's ranks in cp order (cp rank 0 first). The overlay mesh is "
            "`(rest, cfgp, cp)`, row-major; the `world / (cfgp·cp)` sample groups each take `batch / "
            "groups` consecutive samples; cfgp rank 0 runs the cond branch, cfgp rank 1 the "
            "uncond one, and without cfgp every rank runs both."
        ),
        hint='return {"cond": ranks, "uncond": ranks}, each the global ranks of that branch in cp order',
        cases=_latent_cases,
        kinds=_latent_kinds,
        hidden=_hidden_latent_cases,
        hidden_kinds=_hidden_latent_kinds,
        points=2,
        minutes=10,
        normalize=_as_tensors,
        bugs=[
            (
                "overlay read as (rest, cp, cfgp)",
                overlay_read_as_rest_cp_cfgp,
                "case 0, cond:",
            ),
            ("samples dealt round robin to the groups", sample_groups_strided, "case 1, cond:"),
            ("no uncond ranks without cfgp", uncond_nowhere_without_cfgp, "case 12, uncond:"),
        ],
    ),
    Exercise(
        name="denoising_step_bytes",
        lab=LAB,
        target="paralab.pipeline.costs.denoising_step_bytes",
        prompt=(
            "Predict the bytes one rank sends at denoising step `step` (1-based), by group: "
            '`{"dp_shard all-gather": ..., "cfgp swap": ..., "cp attention": ...}`. Every '
            "forward of an FSDP2-sharded denoiser all-gathers each unit (`reshard_after_forward=False` "
            "keeps them gathered after the first); a rank runs `k·b` forwards a step; the cfgp swap "
            "sends this rank's cp shard of each sample's prediction; cp attention sends lab 02's "
            "bytes per self-attention layer and forward. Without cp or cfgp their entry is 0."
        ),
        hint="return {group: bytes} for the three groups, one rank, at that step",
        cases=_step_cases,
        kinds=_step_kinds,
        hidden=_hidden_step_cases,
        hidden_kinds=lambda world: HIDDEN_STEP_KINDS,
        points=2,
        minutes=20,
        normalize=_by_group,
        bugs=[
            (
                "kept parameters still gathered every step",
                gathers_every_step_when_kept,
                "case 3, dp_shard all-gather:",
            ),
            ("the swap sends the whole latent", swap_sends_the_whole_latent, "case 0, cfgp swap:"),
            (
                "one forward per sample without cfgp",
                one_branch_per_sample,
                "case 12, cp attention:",
            ),
        ],
    ),
]
