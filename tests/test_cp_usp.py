"""USP (Ulysses inside, ring across) on 4 gloo ranks: output vs single-process SDPA, bytes vs formula."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from paralab.cp import shard_bytes, shard_sequence
from paralab.cp.costs import usp_bytes
from paralab.cp.usp import usp_attention_forward
from paralab.launch import run
from paralab.ledger import Ledger

ULYSSES, RING = 2, 2
B, H, N, D = 2, 4, 24, 5


def _worker():
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (RING, ULYSSES), mesh_dim_names=("ring", "ulysses"))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64, generator=g) for _ in range(3))
    results = {}
    for causal in (False, True):
        shards = [shard_sequence(t, rank, world) for t in (q, k, v)]
        with Ledger() as ledger:
            out = usp_attention_forward(
                *shards, mesh.get_group("ulysses"), mesh.get_group("ring"), causal=causal
            )
        expected = shard_sequence(
            F.scaled_dot_product_attention(q, k, v, is_causal=causal), rank, world
        )
        sent = {}
        for r in (r for r in ledger.records if r.bytes_sent):
            key = (
                "all_to_all"
                if r.op == "all_to_all_single"
                else "ring"
                if r.op in ("isend", "send")
                else r.op
            )
            sent[key] = sent.get(key, 0) + r.bytes_sent
        results[causal] = ((out - expected).abs().max().item(), sent)
    return results


def test_usp_equals_sdpa_and_sends_the_formula_bytes():
    s = shard_bytes(B, H, N, D, ULYSSES * RING)
    for rank, results in enumerate(run(_worker, ULYSSES * RING, timeout=120)):
        for causal, (max_diff, sent) in results.items():
            assert max_diff < 1e-12, (rank, causal, max_diff)
            assert sent == usp_bytes(s, ULYSSES, RING), (rank, causal, sent)
