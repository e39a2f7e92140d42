"""Context parallelism by hand: one long sequence split over the ranks of a cp group.

Two ways to compute exact attention when each rank holds a slice of the sequence:
- `ring_attention`: queries stay put, K/V blocks travel round the ring (point to
  point), partial outputs are merged through their log-sum-exp (`blocks.merge_partials`).
- `ulysses_attention`: an all-to-all turns sequence shards into head shards, each rank
  runs ordinary attention over the full sequence on heads/cp heads, and an
  all-to-all turns the result back.

Tensors are laid out like `scaled_dot_product_attention`: (batch, heads, seq, head_dim).
Both are `torch.autograd.Function`s with a hand-written backward in a fixed
collective order (autograd cannot see a send, and independent differentiable
collectives may be issued in different orders on different ranks).
"""

from paralab.cp.blocks import attention_block, attention_block_backward, merge_partials
from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_bytes
from paralab.cp.layout import (
    block_kind,
    causal_work,
    chunk_ids,
    kv_source,
    ring_blocks,
    shard_sequence,
    unshard_sequence,
)
from paralab.cp.ring import ring_attention
from paralab.cp.ulysses import ulysses_attention

__all__ = [
    "attention_block",
    "attention_block_backward",
    "block_kind",
    "causal_work",
    "chunk_ids",
    "kv_source",
    "merge_partials",
    "ring_attention",
    "ring_blocks",
    "ring_bytes",
    "shard_bytes",
    "shard_sequence",
    "ulysses_attention",
    "ulysses_bytes",
    "unshard_sequence",
]
