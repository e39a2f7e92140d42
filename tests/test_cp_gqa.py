"""Ulysses with grouped-query attention on 4 gloo ranks: exact vs SDPA, K/V bytes, and the K/V-head limit."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.cp import shard_bytes, shard_sequence
from paralab.cp.costs import ulysses_gqa_bytes
from paralab.cp.ulysses import ulysses_gqa_forward
from paralab.launch import LaunchError, run
from paralab.ledger import Ledger

WORLD, B, H, N, D = 4, 2, 8, 24, 5


def _worker(kv_heads):
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, dtype=torch.float64, generator=g)
    k, v = (torch.randn(B, kv_heads, N, D, dtype=torch.float64, generator=g) for _ in range(2))
    shards = [shard_sequence(t, rank, WORLD) for t in (q, k, v)]
    with Ledger() as ledger:
        out = ulysses_gqa_forward(*shards, causal=True)
    expected = shard_sequence(
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), rank, WORLD
    )
    return (out - expected).abs().max().item(), [
        r.bytes_sent for r in ledger.records if r.op == "all_to_all_single"
    ]


def test_gqa_ulysses_is_exact_and_k_v_cost_kv_heads_over_heads():
    s_q = shard_bytes(B, H, N, D, WORLD)
    s_kv = shard_bytes(B, 4, N, D, WORLD)
    for max_diff, sent in run(_worker, WORLD, 4, timeout=120):
        assert max_diff < 1e-12
        assert sent == [3 * s_q // 4, 3 * s_kv // 4, 3 * s_kv // 4, 3 * s_q // 4]  # q, k, v, out
        assert s_kv * H == s_q * 4
        assert sum(sent) == ulysses_gqa_bytes(s_q, s_kv, WORLD)["forward"]  # the scale model's form


def test_fewer_k_v_heads_than_cp_is_a_clear_error():
    with pytest.raises(LaunchError, match=r"K/V heads = 2 \(dim 1\) is not divisible by cp = 4"):
        run(_worker, WORLD, 2, timeout=120)
