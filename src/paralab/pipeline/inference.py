"""The whole VFM inference pipeline on one set of ranks: encode, denoise, decode.

1. **Encode** (`encode_conditioning`, called by `conditioning_contexts`).
   A fixed batch of conditioning videos of unequal sizes. The raw videos of
   a sample group arrive on its loader rank; the lb axis spreads their VAE
   encode over each lb group (`vae_lb.offload_encode`, lab 04), and the
   loader hands each latent to its cp peers (a broadcast): every rank of
   the conditional branch needs it as its cross-attention context, the
   unconditional branch only its shape.
2. **Denoise** (`denoise`). The denoiser is sharded with FSDP2 over dp_shard
   (`shard_denoiser`). Every step, the cond and uncond branches run on the
   two ranks of a cfgp group and swap predictions (lab 03), and each
   branch's sequence is split over the cp group (ring or Ulysses, lab 02).
3. **Decode** (`decode_and_gather`). Every rank decodes its group's final
   latents; an all-gather over the world returns every sample's video.

Sample groups: the overlay mesh is `(rest, cfgp, cp)`, so the `world /
(cfgp·cp)` ranks blocks that share a `rest` coordinate form one sample
group; group g generates samples `g·k ... g·k + k - 1` of the batch, with
`k = BATCH / groups`. Every rank is in the one dp_shard group of the whole
world: all ranks must run the same FSDP units the same number of times, in
lockstep, whichever branch and sample they hold.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from paralab import cfgp, cp, vae_lb
from paralab.ledger import in_phase
from paralab.models import (
    CondDenoiser,
    TinyVideoDecoder,
    TinyVideoEncoder,
    random_raw_videos,
    random_video_shapes,
)
from paralab.parallel_dims import ParallelDims, fsdp_mesh

BATCH = 4
VIDEO_SEED = 6
VIDEO_SIZE = {"max_frames": 8, "max_side": 32}


# ------------------------------------------------------------------ the fixed batch and the models
def conditioning_shapes() -> list[tuple[int, ...]]:
    """The (3, T, H, W) shapes of the batch's raw videos: the manifest every rank knows."""
    return random_video_shapes(BATCH, VIDEO_SEED, **VIDEO_SIZE)


def conditioning_videos() -> list[torch.Tensor]:
    """The batch's raw uint8 videos (what a loader rank reads from storage)."""
    return random_raw_videos(BATCH, VIDEO_SEED, **VIDEO_SIZE)


def make_denoiser() -> CondDenoiser:
    """8 heads (Ulysses splits them at cp = 2, 4, 8), 2 x 4 x 4 = 32 latent tokens (whole token ranges at cp = 2, 4, 8).

    `text_dim` = the VAE's 4 latent channels: the conditioning video's latent
    tokens are the cross-attention context.
    """
    return CondDenoiser(
        channels=4, dim=32, heads=8, text_dim=4, n_blocks=2, frames=2, height=4, width=4, seed=0
    )


def make_decoder(denoiser: CondDenoiser) -> TinyVideoDecoder:
    return TinyVideoDecoder(
        denoiser.frames, denoiser.height, denoiser.width, latent_channels=denoiser.channels
    )


def sample_seed(seed: int, index: int) -> int:
    """The noise seed of sample `index`: a function of the sample, never of the rank that holds it."""
    return seed * BATCH + index


def whole_sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention over the whole sequence with the cp kernels' own math (lab 02's `attention_block`).

    The reference uses it so that Ulysses (whole-sequence attention on
    heads/cp heads) sums exactly what one process sums.
    """
    return cp.attention_block(q, k, v)[0]


def conditioning_tokens(latent: torch.Tensor) -> torch.Tensor:
    """A (C, T, H, W) VAE latent as a (1, T*H*W, C) cross-attention context."""
    return latent.flatten(1).T.unsqueeze(0).contiguous()


# ------------------------------------------------------------------ who does what
def sample_groups(pd: ParallelDims) -> int:
    """How many sample groups the world holds: world / (cfgp * cp)."""
    return pd.world_size // (pd.cfgp * pd.cp)


def samples_of_rank(pd: ParallelDims, rank: int) -> list[int]:
    """The batch indices the sample group of `rank` generates."""
    groups = sample_groups(pd)
    if BATCH % groups:
        raise ValueError(
            f"the batch of {BATCH} samples does not split over world/(cfgp*cp) = {groups} sample groups "
            f"(world_size={pd.world_size}, cfgp={pd.cfgp}, cp={pd.cp})"
        )
    per_group = BATCH // groups
    group = rank // (pd.cfgp * pd.cp)
    return list(range(group * per_group, (group + 1) * per_group))


def latent_ranks(pd: ParallelDims, sample: int, batch: int = BATCH) -> dict[str, list[int]]:
    """The ranks that denoise `sample`'s latent, per branch, in cp order (cp rank 0 first).

    With cfgp each branch has its own cp group; without, every rank runs both branches.
    """
    ### BEGIN SOLUTION
    per_group = batch // (pd.world_size // (pd.cfgp * pd.cp))
    first = (sample // per_group) * pd.cfgp * pd.cp
    cond = list(range(first, first + pd.cp))
    uncond = [r + pd.cp for r in cond] if pd.cfgp > 1 else cond
    return {"cond": cond, "uncond": uncond}
    ### END SOLUTION


def videos_held(pd: ParallelDims, rank: int) -> list[int]:
    """The samples whose raw videos arrive on `rank`: all of its group's on the group's loader.

    The loader is the group's first rank (cfgp rank 0, cp rank 0 in the
    row-major (rest, cfgp, cp) mesh); the other ranks start with none.
    """
    return samples_of_rank(pd, rank) if rank % (pd.cfgp * pd.cp) == 0 else []


# ------------------------------------------------------------------ 1. encode
def encode_conditioning(
    pd: ParallelDims, samples: list[int], encoder: TinyVideoEncoder
) -> list[torch.Tensor | None]:
    """Each sample's conditioning latent on the ranks of its cond branch (None on the uncond branch).

    The loader rank holds the raw videos; every rank of an lb group takes part
    in `offload_encode`, with or without videos (a rank that skipped it would
    hang its peers). Then the loader broadcasts each latent over its cp group.
    """
    held = [conditioning_videos()[i] for i in videos_held(pd, dist.get_rank())]
    costs = [vae_lb.encode_cost(v) for v in held]
    if pd.lb_enabled:
        latents = vae_lb.offload_encode(held, costs, encoder, pd.lb_mesh.get_group())
    else:
        latents = [encoder(v) for v in held]
    if pd.cfgp_rank != 0:
        return [None] * len(samples)
    if not pd.cp_enabled:
        return latents
    shapes = [encoder.latent_shape(conditioning_shapes()[i]) for i in samples]
    out = latents if pd.cp_rank == 0 else [torch.empty(s, dtype=torch.float64) for s in shapes]
    for latent in out:
        dist.broadcast(latent, group=pd.cp_mesh.get_group(), group_src=0)
    return out


def conditioning_contexts(
    pd: ParallelDims | None, encoder: TinyVideoEncoder
) -> tuple[list[int], list[torch.Tensor | None], list[torch.Tensor]]:
    """This process's samples, their cond contexts (None on an uncond rank) and uncond (zero) contexts.

    One process: every sample, encoded here, each branch at batch 1. On ranks:
    this rank's sample group, encoded by `encode_conditioning` in the ledger's
    "encode" phase; the uncond context is zeros of the latent's token shape,
    known from the manifest alone.
    """
    if pd is None:
        with torch.no_grad():
            conds = [conditioning_tokens(encoder(v)) for v in conditioning_videos()]
        return list(range(BATCH)), conds, [torch.zeros_like(c) for c in conds]
    samples = samples_of_rank(pd, dist.get_rank())
    with in_phase("encode"), torch.no_grad():
        latents = encode_conditioning(pd, samples, encoder)
    conds = [None if z is None else conditioning_tokens(z) for z in latents]
    shapes = [encoder.latent_shape(conditioning_shapes()[i]) for i in samples]
    return (
        samples,
        conds,
        [torch.zeros(1, s[1] * s[2] * s[3], s[0], dtype=torch.float64) for s in shapes],
    )


# ------------------------------------------------------------------ 2. denoise
def shard_denoiser(
    model: CondDenoiser, pd: ParallelDims, reshard_after_forward: bool
) -> CondDenoiser:
    """FSDP2 over dp_shard: each block one unit, the rest (embeddings, head) the root unit.

    `reshard_after_forward` is passed explicitly to every unit, the root
    included (left unset, FSDP2 keeps the root unsharded after forward).
    """
    mesh = fsdp_mesh(pd)
    if mesh is None:
        return model
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def should_skip_uncond(guidance_scale: float, parallel_dims: ParallelDims | None) -> bool:
    """At w == 1 the guided velocity is the cond prediction, so the uncond forward is wasted work.

    A rank may skip work, never a collective its group enters: under FSDP the
    uncond forward all-gathers parameters together with the cond ranks
    (dp_shard spans both branches), so it must run even at w == 1.
    """
    sharded = parallel_dims is not None and parallel_dims.dp_shard_enabled
    return guidance_scale == 1.0 and not sharded


def guided_velocity(
    cond_pred: torch.Tensor, uncond_pred: torch.Tensor | None, guidance_scale: float
) -> torch.Tensor:
    """Lab 03's `cfg_combine`, except at w == 1, where guidance is exactly the cond prediction."""
    if guidance_scale == 1.0:
        return cond_pred
    return cfgp.cfg_combine(cond_pred, uncond_pred, guidance_scale)


def predict(
    model, x, t, cond, uncond, guidance_scale: float, pd: ParallelDims | None, forward: dict
) -> torch.Tensor:
    """The guided velocity of one sample at one step, on this rank.

    One process: both branches here. cfgp = 2: this rank's branch, then lab
    03's swap with its cfgp peer, which holds the same cp shard of the other branch.
    """
    if pd is None or not pd.cfgp_enabled:
        cond_pred = model(x, t, cond, **forward)
        uncond_pred = (
            None if should_skip_uncond(guidance_scale, pd) else model(x, t, uncond, **forward)
        )
        return guided_velocity(cond_pred, uncond_pred, guidance_scale)
    is_cond = pd.cfgp_rank == 0
    if not is_cond and should_skip_uncond(guidance_scale, pd):
        mine = torch.zeros_like(x)  # skipped: zeros stand in for this branch's prediction
    else:
        mine = model(x, t, cond if is_cond else uncond, **forward)
    theirs = cfgp.exchange_prediction(mine, pd.cfgp_mesh.get_group())
    cond_pred, uncond_pred = (mine, theirs) if is_cond else (theirs, mine)
    return guided_velocity(cond_pred, uncond_pred, guidance_scale)


@torch.no_grad()
def denoise(
    model: CondDenoiser,
    conds: list[torch.Tensor | None],
    unconds: list[torch.Tensor],
    seeds: list[int],
    *,
    steps: int,
    guidance_scale: float,
    pd: ParallelDims | None,
    attention: str,
) -> list[torch.Tensor]:
    """Guided Euler sampling of several samples, step by step; returns each whole final latent.

    Steps outside, samples inside: each rank runs one forward per sample of its
    group at every step, the same count on every rank, so the FSDP all-gathers
    line up across the whole dp_shard group. Built from lab 03's pieces (noise,
    cp kwargs, swap, combine, Euler step, latent return).
    """
    forward = cfgp.cp_forward_kwargs(pd, model.latent_shape[1], attention, whole_sequence_attention)
    with in_phase("noise"):
        xs = [cfgp.initial_latent(model.latent_shape, s, pd) for s in seeds]
    ts = cfgp.timesteps(steps)
    for step, (t, t_next) in enumerate(zip(ts[:-1], ts[1:]), start=1):
        with in_phase(f"step {step}"):
            for i, x in enumerate(xs):
                velocity = predict(model, x, t, conds[i], unconds[i], guidance_scale, pd, forward)
                xs[i] = cfgp.euler_step(x, velocity, t, t_next)
    with in_phase("return"):
        return [cfgp.gather_latent(x, pd) for x in xs]


# ------------------------------------------------------------------ 3. decode
def decode_and_gather(
    latents: list[torch.Tensor], decoder: TinyVideoDecoder, pd: ParallelDims | None
) -> torch.Tensor:
    """Decode this group's samples and all-gather every group's: (BATCH, 3, T, H, W) on every rank."""
    videos = torch.stack([decoder(z) for z in latents])
    if pd is None:
        return videos
    with in_phase("return"):
        gathered = [torch.empty_like(videos) for _ in range(pd.world_size)]
        dist.all_gather(gathered, videos.contiguous())
    group_size = pd.cfgp * pd.cp
    return torch.cat([gathered[g * group_size] for g in range(sample_groups(pd))])


# ------------------------------------------------------------------ the entry point
def check_layout(pd: ParallelDims) -> None:
    """Inference mode, no dp replicas, this process group's size, a batch that splits over the sample groups.

    dp_replicate > 1 is refused here, by the workload, not by `ParallelDims`:
    the descriptor's reference layout (lab 00) has replicas in inference
    mode, legal there as a grouping. In a pipeline, with no gradients to
    all-reduce, replicas only buy smaller all-gather groups with
    dp_replicate times the parameter memory (lab 06, section 7): a knob
    FSDP2 already offers on the dp_shard mesh (`reshard_after_forward`).
    """
    if not pd.enable_inference_mode:
        raise ValueError(
            "generate: the ParallelDims needs enable_inference_mode=True (inference pipeline)"
        )
    if pd.dp_replicate > 1:
        raise ValueError(
            f"generate: dp_replicate={pd.dp_replicate}, but inference forces dp_replicate=1: with no gradients "
            f"to all-reduce, replicas only hold dp_replicate={pd.dp_replicate} times the parameter shards to "
            f"all-gather over fewer ranks; shard over dp_shard={pd.world_size} and choose reshard_after_forward instead"
        )
    if pd.world_size != dist.get_world_size():
        raise ValueError(
            f"generate: ParallelDims world_size={pd.world_size} but the process group has "
            f"{dist.get_world_size()} ranks"
        )
    samples_of_rank(pd, dist.get_rank())


def generate(
    parallel_dims: ParallelDims | None = None,
    *,
    steps: int = 4,
    guidance_scale: float = 5.0,
    seed: int = 0,
    attention: str = "ulysses",
    reshard_after_forward: bool = True,
) -> torch.Tensor:
    """Every sample of the fixed batch, generated and decoded: (BATCH, 3, T, H, W) float64.

    `parallel_dims=None`: one process, the reference; else the default process group runs that
    layout, and every rank returns the same tensor (a function of seed, steps and guidance only).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"generate: steps must be an int >= 1, got steps={steps!r}")
    encoder, model = TinyVideoEncoder(), make_denoiser()
    pd = parallel_dims
    if pd is not None:
        check_layout(pd)
        if not pd.mesh:
            pd.build_meshes()
    # 1. encode: lb, then a cp broadcast
    samples, conds, unconds = conditioning_contexts(pd, encoder)
    if pd is not None:
        shard_denoiser(model, pd, reshard_after_forward)  # 2. FSDP2 over dp_shard = the world
    final = denoise(
        model,
        conds,
        unconds,
        [sample_seed(seed, i) for i in samples],
        steps=steps,
        guidance_scale=guidance_scale,
        pd=pd,
        attention=attention,
    )  # 2. cfgp branches, cp sequence
    return decode_and_gather(final, make_decoder(model), pd)  # 3. decode, all-gather over the world
