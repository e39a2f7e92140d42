"""Every lab's byte formula at a real size, in bytes and seconds: the numbers the lab's pictures
draw. Each function calls the lab's own `costs.py`; only the dtype and the size are real."""

from __future__ import annotations

from paralab.collectives.costs import all_gather_bytes, all_reduce_bytes
from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_bytes
from paralab.scale.hardware import Hardware
from paralab.scale.models import ModelShape
from paralab.scale.predict import (
    ACT_BYTES,
    Layout,
    Workload,
    block_forward_seconds,
    compute_time,
    fsdp_unit_bytes,
    link_for,
)

COSMOS_LIKE_TOKENS = 75_600
"""Lab 06's Cosmos-like size: 21 latent frames of 45 x 80 patches."""


def ring_collective_seconds(hw: Hardware, full_bytes: float, n: int, stride: int = 1) -> dict:
    """The primer's ring formulas as seconds: all-gather (n-1)/n S, all-reduce 2(n-1)/n S."""
    link = link_for(hw, stride, n)
    return {
        "all_gather": link.time(all_gather_bytes(int(full_bytes), n), n - 1),
        "all_reduce": link.time(all_reduce_bytes(int(full_bytes), n), 2 * (n - 1)),
    }


def alpha_beta_knee(hw: Hardware, n: int, stride: int = 1) -> float:
    """The gathered size S at which an n-rank all-gather's alpha (one call, n-1 ring steps)
    equals its bytes / busbw: below it latency rules, above it bandwidth. Alpha is the link's
    own (`Link.time` at zero bytes), so a group across nodes pays the network's latency on the
    steps that cross."""
    link = link_for(hw, stride, n)
    return link.time(0, n - 1) * link.busbw * n / (n - 1)


def inference_step_bytes(m: ModelShape, dp_shard: int, cp: int, tokens: int) -> dict[str, float]:
    """Lab 06's per-step table at a real size (bf16, two branches on every rank, no cfgp): the
    dp_shard all-gathers of every block per forward, against cp's attention traffic."""
    forwards = m.branches
    unit = fsdp_unit_bytes(m.block_params(), Layout(dp_shard=dp_shard), inference=True)
    s = shard_bytes(1, m.heads, tokens, m.head_dim, cp, ACT_BYTES)
    return {
        "dp_shard all-gather": forwards * m.layers * unit["all_gather"],
        "cp ring": forwards * m.layers * ring_bytes(s, cp)["forward"],
        "cp Ulysses": forwards * m.layers * ulysses_bytes(s, cp)["forward"],
    }


def fsdp_block_seconds(
    m: ModelShape, hw: Hardware, dp_shard: int, w: Workload, eff: dict[str, float]
) -> dict[str, float]:
    """One block's all-gather against the forward compute it hides behind, at `dp_shard` GPUs
    (the node boundary is crossed beyond 8): the same `block_forward_seconds` (GEMMs and
    attention) that `predict_train` hides it behind, for `w`'s sequences on each GPU."""
    lo = Layout(dp_shard=dp_shard)
    unit = fsdp_unit_bytes(m.block_params(), lo)
    link = link_for(hw, 1, dp_shard)
    return {
        "all-gather": link.time(unit["all_gather"], dp_shard - 1),
        "block forward": block_forward_seconds(m, hw, lo, w, eff),
        "link": link.name,
    }


def ring_hop_seconds(
    m: ModelShape, hw: Hardware, seq: int, cp: int, attention_eff: float
) -> dict[str, float]:
    """One forward ring hop (lab 02's K and V blocks, bf16) against the causal attention block
    it hides behind: 1/cp of a rank's 1/cp share of the layer."""
    s = shard_bytes(1, m.kv_heads, seq, m.head_dim, cp, ACT_BYTES)
    hop = ring_bytes(s, cp)["forward"] / (cp - 1)
    flops = 2 * seq * seq * m.attention_width / cp / cp
    return {
        "hop": link_for(hw, 1, cp).time(hop, 1),
        "attention a hop": compute_time(flops, hw, "bf16", attention_eff),
    }


def cp_gather_seconds(
    m: ModelShape, hw: Hardware, seq: int, cp: int, attention_eff: float
) -> dict[str, float]:
    """torchtitan's default CP exchange at a real size (`Layout.cp_rotate` "allgather"): one
    all-gather of every rank's K and V shards (lab 02's ring bytes, bf16, in one collective)
    against the first sub-SDPA it hides behind, the causal diagonal block (1/cp of a rank's 1/cp
    share of the layer)."""
    s = shard_bytes(1, m.kv_heads, seq, m.head_dim, cp, ACT_BYTES)
    flops = 2 * seq * seq * m.attention_width / cp / cp
    return {
        "K/V all-gather": link_for(hw, 1, cp).time(ring_bytes(s, cp)["forward"], cp - 1),
        "first block": compute_time(flops, hw, "bf16", attention_eff),
    }
