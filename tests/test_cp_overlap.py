"""FLOPs of one ring block, counted by torch's FlopCounterMode: the compute side of lab 02's overlap chapter."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from paralab.cp.blocks import attention_block, attention_block_backward

B, H, N, D = 2, 3, 16, 5  # one (query shard, key shard) block: N = seq / cp tokens each


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_one_block_costs_4BHn2D_forward_and_10BHn2D_backward():
    q, k, v, dout = (torch.randn(B, H, N, D, dtype=torch.float64) for _ in range(4))
    out, lse = attention_block(q, k, v)
    delta = (dout * out).sum(-1)
    assert _flops(lambda: attention_block(q, k, v)) == 4 * B * H * N * N * D  # q k^T, then p v
    assert (
        _flops(lambda: attention_block_backward(dout, q, k, v, lse, delta))
        == 10 * B * H * N * N * D
    )  # 5 matmuls
