"""Ring attention: queries stay, K/V blocks travel round the cp ring, partials merge by log-sum-exp.

Forward, on every rank, for step = 0 .. cp-1:
    start sending the K/V block it holds to rank+1 (and receiving one from rank-1),
    attend its queries to the block it holds (skipping causally masked chunks),
    merge that partial result into its running (out, lse), then wait for the next block.
After cp steps every query has seen every key once; each rank sent cp-1 K/V blocks.

Backward, same ring again: K/V travel as in the forward (cp-1 hops), and so do
the dK/dV of each block, accumulated by every rank that attends to it and
delivered home after cp-1 hops; each rank keeps its own contribution to its own
block at home instead of sending it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab.cp.agree import refuse_together
from paralab.cp.blocks import attention_block, attention_block_backward, merge_partials
from paralab.cp.layout import DIAGONAL, check_qkv, ring_blocks

KV_TAG, DKV_TAG = 0, 1


def ring_pass(
    t: torch.Tensor, group: dist.ProcessGroup | None, tag: int
) -> tuple[torch.Tensor, list]:
    """Start sending `t` to the next rank and receiving the previous rank's; returns (buffer, works)."""
    ### BEGIN SOLUTION
    group = group or dist.group.WORLD
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    to_next = dist.get_global_rank(group, (rank + 1) % cp)
    from_prev = dist.get_global_rank(group, (rank - 1) % cp)
    received = torch.empty_like(t)
    works = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, t, to_next, group, tag),
            dist.P2POp(dist.irecv, received, from_prev, group, tag),
        ]
    )
    ### END SOLUTION
    return received, works


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def _chunks(x: torch.Tensor, zigzag: bool) -> tuple[torch.Tensor, ...]:
    """Views of this rank's one (contiguous) or two (zigzag) chunks along the sequence."""
    return x.chunk(2, dim=2) if zigzag else (x,)


def ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    zigzag: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of this rank's queries against the whole sequence's keys."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    q_chunks = _chunks(q, zigzag)
    partial: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(q_chunks)
    kv = torch.stack([k, v])
    for step in range(cp):
        if step < cp - 1:
            next_kv, works = ring_pass(kv, group, KV_TAG)
        k_chunks, v_chunks = _chunks(kv[0], zigzag), _chunks(kv[1], zigzag)
        for i, j, kind in ring_blocks(rank, step, cp, causal=causal, zigzag=zigzag):
            block = attention_block(
                q_chunks[i], k_chunks[j], v_chunks[j], diagonal=kind == DIAGONAL
            )
            partial[i] = block if partial[i] is None else merge_partials(*partial[i], *block)
        if step < cp - 1:
            _wait(works)
            kv = next_kv
    out = torch.cat([o for o, _ in partial], dim=2)
    lse = torch.cat([lse for _, lse in partial], dim=2)
    return out, lse


def ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    zigzag: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) for this rank's shards: K/V go round again, their gradients follow them home."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    delta = (dout * out).sum(dim=-1)
    dq = torch.zeros_like(q)
    q_chunks, dq_chunks = _chunks(q, zigzag), _chunks(dq, zigzag)
    dout_chunks, lse_chunks, delta_chunks = (
        _chunks(dout, zigzag),
        _chunks(lse, zigzag),
        _chunks(delta, zigzag),
    )
    kv = torch.stack([k, v])
    dkv_travelling, dkv_works = None, None
    for step in range(cp):
        if step < cp - 1:
            next_kv, kv_works = ring_pass(kv, group, KV_TAG)
        dkv = torch.zeros_like(kv)
        k_chunks, v_chunks = _chunks(kv[0], zigzag), _chunks(kv[1], zigzag)
        dk_chunks, dv_chunks = _chunks(dkv[0], zigzag), _chunks(dkv[1], zigzag)
        for i, j, kind in ring_blocks(rank, step, cp, causal=causal, zigzag=zigzag):
            dq_ij, dk_ij, dv_ij = attention_block_backward(
                dout_chunks[i],
                q_chunks[i],
                k_chunks[j],
                v_chunks[j],
                lse_chunks[i],
                delta_chunks[i],
                diagonal=kind == DIAGONAL,
            )
            dq_chunks[i].add_(dq_ij)
            dk_chunks[j].add_(dk_ij)
            dv_chunks[j].add_(dv_ij)
        if step == 0:
            dkv_home = dkv
        else:
            if dkv_works is not None:  # the block's gradient so far, from the ranks before us
                _wait(dkv_works)
                dkv.add_(dkv_travelling)
            dkv_travelling, dkv_works = ring_pass(dkv, group, DKV_TAG)
        if step < cp - 1:
            _wait(kv_works)
            kv = next_kv
    if dkv_works is not None:  # our own block's gradient from every other rank
        _wait(dkv_works)
        dkv_home = dkv_home + dkv_travelling
    return dq, dkv_home[0], dkv_home[1]


class RingAttention(torch.autograd.Function):
    """Ring attention with a hand-written backward (autograd cannot differentiate through a send)."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, zigzag):  # type: ignore[override]
        out, lse = ring_forward(q, k, v, group, causal, zigzag)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.zigzag = group, causal, zigzag
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(
            dout.contiguous(), q, k, v, out, lse, ctx.group, ctx.causal, ctx.zigzag
        )
        return dq, dk, dv, None, None, None


def check_ring_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, zigzag: bool) -> None:
    """This rank's shards: one shape, dtype and device; a zigzag shard is two equal chunks."""
    check_qkv(q, k, v, "ring_attention")
    if zigzag and q.shape[2] % 2:
        raise ValueError(
            f"ring_attention(zigzag=True): local sequence length {q.shape[2]} (dim 2) is odd; "
            "a zigzag shard is two equal chunks (cut it with shard_sequence(..., zigzag=True))"
        )


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool = False,
    zigzag: bool = False,
) -> torch.Tensor:
    """Exact attention of this rank's query shard over the whole sequence held by the cp `group`.

    q, k, v: this rank's sequence shards, (batch, heads, seq/cp, head_dim), cut by
    `shard_sequence(..., zigzag=zigzag)`. Returns this rank's shard of the output.
    Every rank checks its inputs and the ranks agree before the first send.
    """
    refuse_together(lambda: check_ring_inputs(q, k, v, zigzag), q, group, "ring_attention")
    return RingAttention.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), group, causal, zigzag
    )
