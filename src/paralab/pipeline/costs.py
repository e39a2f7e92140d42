"""Lab 06's closed forms: bytes one rank sends per denoising step, by group, and parameter bytes it holds.

Traffic model: the ledger's (per rank, `n` = group size). Notation: `k` the
samples of a sample group, `b` the forwards a rank runs per sample and step
(1 with cfgp = 2, 2 without), `L` attention layers, `B·(S/cp)·C·8` one
rank's latent shard, `Sq` one rank's share of one of q, k, v.

| group | per step, per rank |
|---|---|
| dp_shard: FSDP2 parameter all-gathers | `k·b·(n−1)·Σ_units shard` with `reshard_after_forward=True`; without, `(n−1)·Σ_units shard` at step 1 (the first forward), then 0 |
| cfgp: prediction swap | `k·B·(S/cp)·C·8` |
| cp: attention | `k·b·L·2(cp−1)·Sq` (ring) or `k·b·L·4(cp−1)/cp·Sq` (Ulysses) |

FSDP2 pads every parameter along dim 0 to a multiple of `n` before it cuts
it (`ceil(d0/n)` rows per rank), so a unit's shard is
`Σ_params ceil(d0/n)·(numel/d0)·8` bytes and its gathered form `n` times that.
There is no reduce-scatter: inference has no backward.
"""  # noqa: E501 - table rows, one line each

from __future__ import annotations

import math

from torch import nn

from paralab import cp, vae_lb
from paralab.models import CondDenoiser
from paralab.parallel_dims import ParallelDims
from paralab.pipeline import inference
from paralab.vae_lb import runs as vae_lb_runs
from paralab.vae_lb.costs import exchange_bytes

ITEMSIZE = 8  # float64


# ------------------------------------------------------------------ parameters
def units(model: CondDenoiser) -> dict[str, list[nn.Parameter]]:
    """The FSDP units of `shard_denoiser`: one per block, the root holds everything else."""
    in_blocks = {id(p) for p in model.blocks.parameters()}
    out = {"root": [p for p in model.parameters() if id(p) not in in_blocks]}
    out.update({f"block {i}": list(b.parameters()) for i, b in enumerate(model.blocks)})
    return out


def shard_bytes(shape: tuple[int, ...], n: int) -> int:
    """One rank's shard of one parameter: dim 0 padded to a multiple of n, then cut."""
    rows = math.ceil(shape[0] / n)
    return rows * math.prod(shape[1:]) * ITEMSIZE


def unit_shard_bytes(model: CondDenoiser, n: int) -> dict[str, int]:
    """Bytes of each unit's shard on one rank (the all-gather's input)."""
    return {
        name: sum(shard_bytes(tuple(p.shape), n) for p in params)
        for name, params in units(model).items()
    }


def memory(model: CondDenoiser, n: int, reshard_after_forward: bool) -> dict[str, int]:
    """Parameter bytes one rank holds: its shards always; gathered (padded) units between steps and at the peak.

    reshard_after_forward=True: nothing gathered between forwards; at the peak,
    inside a block, the root (its forward wraps the blocks) and that block.
    False: after the first forward every unit stays gathered.
    With the buffer: FSDP2 keeps a unit's flat all-gather output until the next unit's
    copy-out, so inside a block one more gathered block is held (about root + 2 x block).
    """
    shards = unit_shard_bytes(model, n)
    everything = n * sum(shards.values())
    biggest_block = max(b for name, b in shards.items() if name != "root")
    if reshard_after_forward:
        between, peak = 0, n * (shards["root"] + biggest_block)
    else:
        between, peak = everything, everything
    return {
        "shards": sum(shards.values()),
        "gathered between steps": between,
        "gathered peak": peak,
        "peak with all-gather buffer": peak + n * biggest_block,
    }


# ------------------------------------------------------------------ traffic per step
def forwards_per_step(pd: ParallelDims) -> int:
    """Denoiser forwards one rank runs per step: k samples, one branch each with cfgp, both without."""
    k = inference.BATCH // inference.sample_groups(pd)
    return k * (1 if pd.cfgp_enabled else 2)


def denoising_step_bytes(
    model: CondDenoiser, pd: ParallelDims, attention: str, reshard_after_forward: bool, step: int
) -> dict[str, int]:
    """Bytes one rank sends at denoising step `step` (1-based), by group.

    `forwards_per_step(pd)` gives `k·b`; `unit_shard_bytes` each unit's shard; lab 02's
    `cp.shard_bytes`, `cp.ring_bytes` and `cp.ulysses_bytes` one attention layer's traffic.
    """
    ### BEGIN SOLUTION
    n, forwards = pd.dp_shard, forwards_per_step(pd)
    if n == 1:
        gathers = 0
    elif reshard_after_forward:
        gathers = forwards
    else:
        gathers = 1 if step == 1 else 0  # gathered by the first forward, kept ever after
    batch, tokens, channels = model.latent_shape
    dim, heads = model.inp.out_features, model.blocks[0].heads
    k = inference.BATCH // inference.sample_groups(pd)
    out = {"dp_shard all-gather": gathers * (n - 1) * sum(unit_shard_bytes(model, n).values())}
    out["cfgp swap"] = k * batch * (tokens // pd.cp) * channels * ITEMSIZE if pd.cfgp_enabled else 0
    if pd.cp_enabled:
        sq = cp.shard_bytes(batch, heads, tokens, dim // heads, pd.cp)
        per_layer = cp.ring_bytes(sq, pd.cp) if attention == "ring" else cp.ulysses_bytes(sq, pd.cp)
        out["cp attention"] = forwards * model.n_attention_layers * per_layer["forward"]
    else:
        out["cp attention"] = 0
    return out
    ### END SOLUTION


# ------------------------------------------------------------------ the lb exchange, once
def lb_bytes(pd: ParallelDims) -> dict[int, int]:
    """Bytes each rank sends in the lb exchange, by global rank: lab 04's closed forms on this batch's plan.

    Sharing costs `8(n−1)(1 + W)` (W = most videos on a rank of the group), a
    move `M + 3THW` from the owner and `M + THW` back from the helper.
    """
    if not pd.lb_enabled:
        return {r: 0 for r in range(pd.world_size)}
    videos = inference.conditioning_videos()
    batch = [[videos[i] for i in inference.videos_held(pd, r)] for r in range(pd.world_size)]
    costs = [[vae_lb.encode_cost(v) for v in held] for held in batch]
    plan = vae_lb_runs.global_plan(costs, pd.lb)
    sent, _, gathered = exchange_bytes(batch, plan, vae_lb_runs.groups_of(pd.world_size, pd.lb))
    return {r: sent[r] + gathered[r] for r in range(pd.world_size)}
