"""Lab 03 exercises: the cfgp swap, the guidance combine, and the shared initial noise.

Each bug variant below is a mistake seen in real CFG-parallel samplers; the
tests prove the grader fails it and that its report points at the place.
"""

from __future__ import annotations

import functools
import random

import torch
import torch.distributed as dist

from paralab.cfgp.sampling import draw_noise, shard_latent
from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches

LAB = "03_cfgp"
LATENT_SHAPE = (1, 12, 4)  # (batch, tokens, channels): small, tokens divisible by cp = 2

# World 2: one cfgp pair. World 4: two cfgp pairs, once as neighbours (cfgp alone: {0,1} {2,3})
# and once strided (cfgp x cp = 2 x 2: {0,2} {1,3}), where the peer is NOT the adjacent rank.
LAYOUTS = {2: [dict(cfgp=2)], 4: [dict(cfgp=2), dict(cfgp=2, cp=2)]}
LAYOUT_KINDS = {
    2: ["one cfgp pair {0,1}"],
    4: [
        "two cfgp pairs of neighbours, {0,1} and {2,3}",
        "two cfgp pairs strided by cp = 2, {0,2} and {1,3}",
    ],
}
HIDDEN_LAYOUTS = {6: [dict(cfgp=2, cp=3)]}
HIDDEN_LAYOUT_KINDS = {
    6: ["another latent shape, three cfgp pairs strided by cp = 3 inside 6 ranks"]
}


def _hidden_shape(seed: int) -> tuple[int, int, int]:
    draw = random.Random(seed)
    return draw.randint(1, 2), 6 * draw.randint(1, 3), draw.randint(1, 5)


def _meshes(world: int, dims: dict) -> ParallelDims:
    """The layout's meshes, built once per rank process: every case and grading seed at one
    layout shares them (each build is a collective that creates new process groups)."""
    return _built(world, tuple(sorted(dims.items())))


@functools.cache
def _built(world: int, dims: tuple[tuple[str, int], ...]) -> ParallelDims:
    parallel_dims = ParallelDims(world, enable_inference_mode=True, **dict(dims))
    parallel_dims.build_meshes("cpu")
    return parallel_dims


# ----------------------------------------------------------------------------- the exchange
def _exchange_cases(rank: int, world: int) -> list[tuple]:
    """Each rank's own prediction is different (seeded by rank), so a wrong peer shows."""
    cases = []
    for i, dims in enumerate(LAYOUTS[world]):
        group = _meshes(world, dims).cfgp_mesh.get_group()
        mine = torch.randn(
            LATENT_SHAPE,
            generator=torch.Generator().manual_seed(100 * i + rank),
            dtype=torch.float64,
        )
        cases.append((mine, group))
    return cases


def _hidden_exchange_cases(rank: int, world: int, seed: int) -> list[tuple]:
    group = _meshes(world, HIDDEN_LAYOUTS[world][0]).cfgp_mesh.get_group()
    mine = torch.randn(
        _hidden_shape(seed),
        generator=torch.Generator().manual_seed(seed + rank),
        dtype=torch.float64,
    )
    return [(mine, group)]


def _as_received(theirs: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"received prediction": theirs}


def keeps_own_prediction(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug: no swap at all, each rank 'receives' its own prediction (cond combined with cond)."""
    return mine.clone()


def neighbour_as_peer(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug: the peer taken as the adjacent global rank (rank ^ 1) instead of the cfgp group's
    other member. Right at world 2 and with cfgp alone; wrong once cp sits between the pair."""
    peer = dist.get_rank() ^ 1
    theirs = torch.empty_like(mine)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return theirs


def send_then_receive(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Bug: blocking send before the receive on BOTH ranks: each waits for the other to
    receive, so neither does (a deadlock, on gloo even for small tensors). The grader says
    TIMEOUT, not FAIL, so it is tested on its own."""
    peer = dist.get_global_rank(group, 1 - dist.get_rank(group))
    theirs = torch.empty_like(mine)
    dist.send(mine, peer, group=group)
    dist.recv(theirs, peer, group=group)
    return theirs


# ----------------------------------------------------------------------------- the combine
GUIDANCE_SCALES = (4.0, 1.0, 0.0, 7.5)


def _combine_cases(rank: int, world: int) -> list[tuple]:
    generator = torch.Generator().manual_seed(3)
    cases = []
    for w in GUIDANCE_SCALES:
        cond = torch.randn(LATENT_SHAPE, generator=generator, dtype=torch.float64)
        uncond = torch.randn(LATENT_SHAPE, generator=generator, dtype=torch.float64)
        cases.append((cond, uncond, w))
    return cases


def _hidden_combine_cases(rank: int, world: int, seed: int) -> list[tuple]:
    draw = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for w in (draw.uniform(1.5, 12.0), draw.uniform(-1.0, -0.1)):
        shape = _hidden_shape(draw.randrange(10**6))
        cond, uncond = (
            torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(2)
        )
        cases.append((cond, uncond, w))
    return cases


def _as_guided(velocity: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"guided velocity": velocity}


def wrong_sign(
    cond_pred: torch.Tensor, uncond_pred: torch.Tensor, guidance_scale: float
) -> torch.Tensor:
    """Bug: guides away from the prompt: u - w (c - u)."""
    return uncond_pred - guidance_scale * (cond_pred - uncond_pred)


def scale_on_uncond(
    cond_pred: torch.Tensor, uncond_pred: torch.Tensor, guidance_scale: float
) -> torch.Tensor:
    """Bug: w multiplies the unconditional prediction instead of the difference."""
    return guidance_scale * uncond_pred + (cond_pred - uncond_pred)


def branches_swapped(
    cond_pred: torch.Tensor, uncond_pred: torch.Tensor, guidance_scale: float
) -> torch.Tensor:
    """Bug: cond and uncond swapped (what a rank 1 that forgets to swap the roles computes)."""
    return cond_pred + guidance_scale * (uncond_pred - cond_pred)


# ----------------------------------------------------------------------------- the initial noise
def _noise_cases(rank: int, world: int) -> list[tuple]:
    return [(LATENT_SHAPE, 7, _meshes(world, dims)) for dims in LAYOUTS[world]]


def _hidden_noise_cases(rank: int, world: int, seed: int) -> list[tuple]:
    return [(_hidden_shape(seed), seed, _meshes(world, HIDDEN_LAYOUTS[world][0]))]


def _as_latent(latent: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"latent": latent}


def noise_per_rank_seed(shape: tuple[int, ...], seed: int, pd: ParallelDims | None) -> torch.Tensor:
    """Bug: each rank draws its own noise from `seed + rank` (right for data parallelism,
    wrong here): the two branches start from different latents."""
    return shard_latent(draw_noise(shape, seed + dist.get_rank()), pd)


def per_rank_noise() -> Patches:
    """The lab's bug clinic, for `run(..., patches=...)`: `noise_per_rank_seed` instead of `initial_latent`."""
    return {"paralab.cfgp.sampling": {"initial_latent": noise_per_rank_seed}}


def wrong_sign_combine() -> Patches:
    """The sampler with `wrong_sign` as its guidance combine, for `run(..., patches=...)`."""
    return {"paralab.cfgp.sampling": {"cfg_combine": wrong_sign}}


SAMPLER_BUGS = {
    "per_rank_seed": per_rank_noise(),
    "wrong_sign": wrong_sign_combine(),
}  # patch sets: the lab's sections 6 and 10


EXERCISES = [
    Exercise(
        name="exchange_prediction",
        lab=LAB,
        target="paralab.cfgp.sampling.exchange_prediction",
        prompt=(
            "Each of the two ranks of a cfgp `group` holds its own branch's prediction `mine`. "
            "Swap them point to point: send `mine` to the other member of the group and return "
            "the tensor received from it. `group` may be one of several cfgp groups, and its "
            "members need not be adjacent ranks: `dist.get_rank(group)` is the rank inside the "
            "group (0 or 1), `dist.get_global_rank(group, r)` turns a group rank into the global "
            "rank that `P2POp` expects. Both ranks run the same code, so post the send and the "
            "receive together (`dist.batch_isend_irecv`) rather than a blocking send first. "
            "The check runs on 2 ranks and on 4 (two cfgp pairs, as neighbours and strided by cp)."
        ),
        hint="return the other group member's `mine` (same shape and dtype); both ranks call this at once, so "
        "neither may block on a send before its receive is posted; P2P peers are global ranks",
        cases=_exchange_cases,
        kinds=lambda world: LAYOUT_KINDS[world],
        hidden=_hidden_exchange_cases,
        hidden_kinds=lambda world: HIDDEN_LAYOUT_KINDS[world],
        hidden_world_sizes=(6,),
        world_sizes=(2, 4),
        points=3,
        minutes=20,
        normalize=_as_received,
        bugs=[
            (
                "returns its own prediction (no swap)",
                keeps_own_prediction,
                "world 2, rank 0, case 0, received prediction",
            ),
            (
                "peer = adjacent global rank (rank ^ 1), not the group's other member",
                neighbour_as_peer,
                "world 4, rank 0, case 1, received prediction",
            ),
        ],
    ),
    Exercise(
        name="cfg_combine",
        lab=LAB,
        target="paralab.cfgp.sampling.cfg_combine",
        prompt=(
            "Classifier-free guidance: from the conditional and unconditional predictions and the "
            "guidance scale `w`, return `uncond + w·(cond − uncond)`. `w = 1` gives the conditional "
            "prediction, `w = 0` the unconditional one, `w > 1` pushes past the prompt. The check "
            "allows rounding-level differences (1e-12), so `(1 − w)·uncond + w·cond` passes; the lab "
            "explains why both cfgp ranks must still call the very same expression."
        ),
        hint="return the guided velocity, the shape of cond_pred: equal to uncond_pred at w = 0, to cond_pred "
        "at w = 1, and linear in w",
        cases=_combine_cases,
        kinds=lambda world: [f"guidance scale w = {w:g}" for w in GUIDANCE_SCALES],
        hidden=_hidden_combine_cases,
        hidden_kinds=lambda world: [
            "another shape, a large guidance scale",
            "another shape, a negative guidance scale",
        ],
        world_sizes=(0,),
        points=1,
        minutes=5,
        atol=1e-12,
        rtol=1e-12,
        normalize=_as_guided,
        bugs=[
            ("wrong sign: u - w (c - u)", wrong_sign, "case 0, guided velocity"),
            ("w applied to uncond: w u + (c - u)", scale_on_uncond, "case 0, guided velocity"),
            ("cond and uncond swapped", branches_swapped, "case 0, guided velocity"),
        ],
    ),
    Exercise(
        name="initial_latent",
        lab=LAB,
        target="paralab.cfgp.sampling.initial_latent",
        prompt=(
            "The initial noise must be the same on both ranks of a cfgp pair. Write the `broadcast` "
            "path: without cfgp (`pd` None or `pd.cfgp_enabled` false) draw the noise here with "
            "`draw_noise(shape, seed)` and return this rank's cp shard (`shard_latent`). With cfgp, "
            "only cfgp rank 0 draws (and shards, made contiguous); cfgp rank 1 allocates an empty "
            "float64 buffer of the shard's shape, `(B, S / cp_size, C)`; then `broadcast_noise` over "
            "`pd.cfgp_mesh.get_group()` fills it. The check runs on 2 ranks and on 4 (cfgp alone and "
            "cfgp x cp)."
        ),
        hint="return this rank's cp shard of the noise, (B, S / cp_size, C) float64, identical on both ranks of "
        "every cfgp pair and equal to the matching shard of draw_noise(shape, seed)",
        cases=_noise_cases,
        kinds=lambda world: LAYOUT_KINDS[world],
        hidden=_hidden_noise_cases,
        hidden_kinds=lambda world: HIDDEN_LAYOUT_KINDS[world],
        hidden_world_sizes=(6,),
        world_sizes=(2, 4),
        points=2,
        minutes=15,
        normalize=_as_latent,
        bugs=[
            (
                "each rank draws its own noise (seed + rank)",
                noise_per_rank_seed,
                "world 2, rank 1, case 0, latent",
            )
        ],
    ),
]
