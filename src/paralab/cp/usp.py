"""USP (Ulysses x ring): Ulysses all-to-alls inside groups of u ranks, ring attention across c groups.

The composition yunchang's `LongContextAttention` makes (feifeibear/long-context-attention,
`yunchang/hybrid/attn_layer.py`), with its default placement (`yunchang/globals.py`,
`set_seq_parallel_pg(..., use_ulysses_low=True)`): rank = ring_rank * u + ulysses_rank, so a
Ulysses group is u neighbouring ranks and a ring group is strided by u. After the all-to-all a
Ulysses group's ranks hold its u contiguous shards, that is one contiguous chunk of the ring.
Forward only: it shows the composition and its traffic with the package's own pieces.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab.cp.layout import check_qkv
from paralab.cp.ring import ring_attention
from paralab.cp.ulysses import check_heads_divisible, heads_to_seq, seq_to_heads


def usp_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses_group: dist.ProcessGroup,
    ring_group: dist.ProcessGroup,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Exact attention of this rank's contiguous sequence shard (batch, heads, seq/(u*c), head_dim)."""
    check_qkv(q, k, v, "usp_attention_forward")
    check_heads_divisible(q.shape[1], dist.get_world_size(ulysses_group))
    heads = [seq_to_heads(t.contiguous(), ulysses_group) for t in (q, k, v)]
    out_heads = ring_attention(*heads, ring_group, causal=causal)
    return heads_to_seq(out_heads, ulysses_group)
