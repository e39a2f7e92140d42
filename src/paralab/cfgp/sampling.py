"""CFG parallelism (cfgp): the two branches of classifier-free guidance on two ranks.

Guided sampling runs the denoiser twice per step, once with the prompt
(cond) and once with the null prompt (uncond), then combines
`uncond + w * (cond - uncond)`. The two forwards are independent, so with
`cfgp == 2` the rank with `cfgp_rank == 0` runs the conditional branch and
the other rank the unconditional one. Each step they swap their prediction
(one latent-sized tensor each way), both combine in the same order and both
take the same Euler step, so both hold the same latent and never need to
resynchronize. The initial noise is drawn once, on the group's first rank,
and broadcast: the two ranks must start from the same latent.

With the cp overlay the same loop runs on a sequence shard: each rank holds
`tokens / cp` of the latent, its self-attention is ring or Ulysses attention
over its cp group, and the cfgp swap moves a shard-sized tensor between
cfgp peers that hold the same shard.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from paralab import cp
from paralab.models import Attention, full_attention
from paralab.parallel_dims import ParallelDims


def cfg_combine(
    cond_pred: torch.Tensor, uncond_pred: torch.Tensor, guidance_scale: float
) -> torch.Tensor:
    """Classifier-free guidance. Both cfgp ranks call it with the SAME argument order,
    so both compute the same float64 operations and get the same bits."""
    ### BEGIN SOLUTION
    return uncond_pred + guidance_scale * (cond_pred - uncond_pred)
    ### END SOLUTION


def timesteps(steps: int) -> list[float]:
    """Flow-matching time from 1 (pure noise) to 0 (clean), `steps + 1` points."""
    return [1.0 - i / steps for i in range(steps + 1)]


def euler_step(x: torch.Tensor, velocity: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
    """One deterministic Euler step of dx/dt = velocity."""
    return x + (t_next - t) * velocity


def draw_noise(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial latent from a fresh generator: same seed, same tensor, whatever ran before."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def broadcast_noise(noise: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Send the first rank's noise to every rank of the cfgp group (in place)."""
    dist.broadcast(noise, group=group, group_src=0)
    return noise


def exchange_prediction(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Point-to-point swap with the other cfgp rank: send mine, receive theirs."""
    ### BEGIN SOLUTION
    peer = dist.get_global_rank(group, 1 - dist.get_rank(group))
    theirs = torch.empty_like(mine)
    ops = [dist.P2POp(dist.isend, mine, peer, group), dist.P2POp(dist.irecv, theirs, peer, group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return theirs
    ### END SOLUTION


def exchange_prediction_all_gather(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The collective alternative: all_gather both predictions, keep the other one."""
    both = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(both, mine, group=group)
    return both[1 - dist.get_rank(group)]


EXCHANGES = ("p2p", "all_gather")


def predict_branches(model, x, t, cond, uncond, **forward) -> tuple[torch.Tensor, torch.Tensor]:
    """Single process, each branch at batch 1: the reference the cfgp ranks match bit for bit."""
    return model(x, t, cond, **forward), model(x, t, uncond, **forward)


def predict_branches_batched(
    model, x, t, cond, uncond, **forward
) -> tuple[torch.Tensor, torch.Tensor]:
    """The usual single-GPU trick: both branches in ONE forward at batch 2. Faster, but every
    matmul now sees twice the rows, and a kernel may sum in another order for that shape."""
    both = model(torch.cat([x, x]), t, torch.cat([cond, uncond]), **forward)
    return both[:1], both[1:]


def predict_cfgp(model, x, t, cond, uncond, *, group, exchange: str = "p2p", **forward):
    """cfgp rank 0 runs cond, rank 1 uncond; one swap gives both ranks both predictions."""
    is_cond_rank = dist.get_rank(group) == 0
    mine = model(x, t, cond if is_cond_rank else uncond, **forward)
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got exchange={exchange!r}")
    swap = (
        exchange_prediction if exchange == "p2p" else exchange_prediction_all_gather
    )  # looked up at call time
    theirs = swap(mine, group)
    return (mine, theirs) if is_cond_rank else (theirs, mine)


def initial_latent(shape: tuple[int, ...], seed: int, pd: ParallelDims | None) -> torch.Tensor:
    """This rank's part of the initial noise: drawn on cfgp rank 0, cut to this rank's cp shard,
    broadcast over the cfgp group, so both branches start from the same latent."""
    ### BEGIN SOLUTION
    if pd is None or not pd.cfgp_enabled:
        return shard_latent(draw_noise(shape, seed), pd)
    if pd.cfgp_rank == 0:
        shard = shard_latent(draw_noise(shape, seed), pd).contiguous()
    else:
        tokens = shape[1] // pd.cp_size
        shard = torch.empty(
            (shape[0], tokens, *shape[2:]), dtype=torch.float64
        )  # filled by the broadcast
    return broadcast_noise(shard, pd.cfgp_mesh.get_group())
    ### END SOLUTION


def shard_latent(full: torch.Tensor, pd: ParallelDims | None) -> torch.Tensor:
    """This rank's cp shard of a (batch, tokens, channels) latent: contiguous token ranges
    (no causal mask in a denoiser, so no zigzag load balancing is needed)."""
    if pd is None or not pd.cp_enabled:
        return full
    return cp.shard_sequence(full, pd.cp_rank, pd.cp_size, dim=1)


def gather_latent(shard: torch.Tensor, pd: ParallelDims | None) -> torch.Tensor:
    """The latent return path: all_gather the cp shards so every rank returns the whole latent."""
    if pd is None or not pd.cp_enabled:
        return shard
    shards = [torch.empty_like(shard) for _ in range(pd.cp_size)]
    dist.all_gather(shards, shard.contiguous(), group=pd.cp_mesh.get_group())
    return cp.unshard_sequence(shards, dim=1)


def cp_forward_kwargs(
    pd: ParallelDims | None,
    tokens: int,
    cp_attention: str = "ring",
    attention: Attention = full_attention,
) -> dict:
    """What the denoiser needs on a cp rank: the cp attention and the global positions of its shard.
    Without cp, the local `attention` over the whole sequence."""
    if pd is None or not pd.cp_enabled:
        return {"attention": attention}
    group = pd.cp_mesh.get_group()
    kinds: dict[str, Attention] = {
        "ring": functools.partial(cp.ring_attention, group=group),
        "ulysses": functools.partial(cp.ulysses_attention, group=group),
    }
    if cp_attention not in kinds:
        raise ValueError(
            f"cp_attention must be 'ring' or 'ulysses', got cp_attention={cp_attention!r}"
        )
    positions = cp.shard_sequence(torch.arange(tokens), pd.cp_rank, pd.cp_size, dim=0)
    return {"attention": kinds[cp_attention], "positions": positions}


def branch_predictor(
    pd: ParallelDims | None, exchange: str = "p2p", batch_branches: bool = False
) -> Callable:
    """Who predicts what. cfgp == 2: this rank runs its own branch and swaps (`predict_cfgp`).
    Otherwise both branches run here, each at batch 1, or in one batch-2 forward (`batch_branches`)."""
    if pd is not None and pd.cfgp_enabled:
        if batch_branches:
            raise ValueError(
                "batch_branches needs both branches on one rank; with cfgp=2 each rank runs one"
            )
        return functools.partial(predict_cfgp, group=pd.cfgp_mesh.get_group(), exchange=exchange)
    return predict_branches_batched if batch_branches else predict_branches


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    cond: torch.Tensor,
    uncond: torch.Tensor,
    *,
    steps: int,
    guidance_scale: float,
    seed: int,
    parallel_dims: ParallelDims | None = None,
    exchange: str = "p2p",
    cp_attention: str = "ring",
    attention: Attention = full_attention,
    batch_branches: bool = False,
    trajectory: list | None = None,
) -> torch.Tensor:
    """Guided Euler sampling from `seed`; returns the final latent (whole, on every rank).

    `parallel_dims` decides who predicts what (`branch_predictor`) and which part of the
    latent this rank holds (cp > 1: a sequence shard, attended with `cp_attention`, "ring" or
    "ulysses"; without cp, `attention`). `trajectory`, if given, receives this rank's latent
    before the first step and after every step.
    """
    pd = parallel_dims
    forward = cp_forward_kwargs(pd, model.latent_shape[1], cp_attention, attention)
    predict = branch_predictor(pd, exchange, batch_branches)
    x = initial_latent(model.latent_shape, seed, pd)
    if trajectory is not None:
        trajectory.append(x.clone())
    ts = timesteps(steps)
    for t, t_next in zip(ts[:-1], ts[1:]):
        cond_pred, uncond_pred = predict(model, x, t, cond, uncond, **forward)
        x = euler_step(x, cfg_combine(cond_pred, uncond_pred, guidance_scale), t, t_next)
        if trajectory is not None:
            trajectory.append(x.clone())
    return gather_latent(x, pd)
