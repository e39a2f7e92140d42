"""Ulysses attention: trade the sequence split for a head split with an all-to-all, and back.

layout="sequence_sharded" (inputs and output are sequence shards):
    forward : q, k, v  seq->heads all-to-all (3 calls), full-sequence attention on
              heads/cp heads, output heads->seq all-to-all (1 call).
    backward: dout seq->heads, attention backward, dq, dk, dv heads->seq: the
              backward of an all-to-all is the reverse all-to-all.
layout="replicated" (every cp rank holds the full sequence, in and out):
    forward : take this rank's heads locally (no communication), attend, all-gather
              the heads of the output.
    backward: dout is the same on every rank (the code after attention is
              replicated), so the backward of the all-gather is a SLICE of it.
              A reduce-scatter would sum cp identical copies: cp times the gradient.
              The backward of taking heads is an all-gather of dq, dk, dv heads, so
              every rank again holds the full gradient, like its full input.

Ulysses expects contiguous shards (after the all-to-all the sequence is in rank
order) and needs no load balancing: every rank attends over the full sequence.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab.cp.agree import refuse_together
from paralab.cp.blocks import attention_block, attention_block_backward
from paralab.cp.layout import check_qkv

LAYOUTS = ("sequence_sharded", "replicated")


def check_heads_divisible(heads: int, cp: int) -> None:
    """Ulysses gives every cp rank heads/cp whole heads."""
    if heads % cp:
        raise ValueError(
            f"ulysses_attention: heads = {heads} (dim 1) is not divisible by cp = {cp}"
        )


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-to-all (b, h, n/cp, d) sequence shard -> (b, h/cp, n, d) head shard: pack, exchange, unpack."""
    return unpack_heads(exchange_blocks(pack_heads(x, dist.get_world_size(group)), group))


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-to-all (b, h/cp, n, d) head shard -> (b, h, n/cp, d) sequence shard: the inverse of `seq_to_heads`."""
    return unpack_seq(exchange_blocks(pack_seq(x, dist.get_world_size(group)), group))


def exchange_blocks(send: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The all-to-all: block j of dim 0 goes to rank j; block i of the result came from rank i."""
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received


def pack_heads(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(b, h, n/cp, d) sequence shard -> (cp, b, h/cp, n/cp, d): block j is head group j, for rank j."""
    ### BEGIN SOLUTION
    b, h, s, d = x.shape
    return x.reshape(b, cp, h // cp, s, d).transpose(0, 1).contiguous()
    ### END SOLUTION


def unpack_heads(received: torch.Tensor) -> torch.Tensor:
    """(cp, b, h/cp, n/cp, d), block i = sequence shard i of my heads -> (b, h/cp, n, d), shards in rank order."""
    ### BEGIN SOLUTION
    cp, b, hl, s, d = received.shape
    return received.permute(1, 2, 0, 3, 4).reshape(b, hl, cp * s, d)
    ### END SOLUTION


def pack_seq(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(b, h/cp, n, d) head shard -> (cp, b, h/cp, n/cp, d): block j is sequence shard j, for rank j."""
    ### BEGIN SOLUTION
    b, hl, n, d = x.shape
    return x.reshape(b, hl, cp, n // cp, d).permute(2, 0, 1, 3, 4).contiguous()
    ### END SOLUTION


def unpack_seq(received: torch.Tensor) -> torch.Tensor:
    """(cp, b, h/cp, n/cp, d), block i = head group i of my sequence shard -> (b, h, n/cp, d), heads in rank order."""
    ### BEGIN SOLUTION
    cp, b, hl, s, d = received.shape
    return received.transpose(0, 1).reshape(b, cp * hl, s, d)
    ### END SOLUTION


def take_heads(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's heads of a replicated (b, h, n, d) tensor (no communication)."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(cp, dim=1)[rank].contiguous()


def gather_heads(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather (b, h/cp, n, d) head shards into the replicated (b, h, n, d)."""
    cp = dist.get_world_size(group)
    gathered = torch.empty((cp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(gathered, x.contiguous(), group=group)  # [i*b:(i+1)*b] = rank i's heads
    return (
        gathered.reshape(cp, *x.shape)
        .transpose(0, 1)
        .reshape(x.shape[0], cp * x.shape[1], *x.shape[2:])
    )


class UlyssesAttention(torch.autograd.Function):
    """Ulysses attention with a hand-written backward: one fixed collective order on every rank."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout):  # type: ignore[override]
        to_heads = seq_to_heads if layout == "sequence_sharded" else take_heads
        qh, kh, vh = to_heads(q, group), to_heads(k, group), to_heads(v, group)
        out_heads, lse = attention_block(qh, kh, vh, diagonal=causal)
        ctx.save_for_backward(qh, kh, vh, out_heads, lse)
        ctx.group, ctx.causal, ctx.layout = group, causal, layout
        return (
            heads_to_seq(out_heads, group)
            if layout == "sequence_sharded"
            else gather_heads(out_heads, group)
        )

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        qh, kh, vh, out_heads, lse = ctx.saved_tensors
        group = ctx.group
        sharded = ctx.layout == "sequence_sharded"
        dout_heads = seq_to_heads(dout.contiguous(), group) if sharded else take_heads(dout, group)
        delta = (dout_heads * out_heads).sum(dim=-1)
        dqh, dkh, dvh = attention_block_backward(
            dout_heads, qh, kh, vh, lse, delta, diagonal=ctx.causal
        )
        from_heads = heads_to_seq if sharded else gather_heads
        return (
            from_heads(dqh, group),
            from_heads(dkh, group),
            from_heads(dvh, group),
            None,
            None,
            None,
        )


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool = False,
    layout: str = "sequence_sharded",
) -> torch.Tensor:
    """Exact attention over the cp `group` by switching from a sequence split to a head split.

    layout="sequence_sharded": q, k, v and the result are contiguous sequence shards
    (batch, heads, seq/cp, head_dim). layout="replicated": full (batch, heads, seq, head_dim)
    on every rank, in and out. Every rank checks its inputs and the ranks agree before
    the first all-to-all.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"ulysses_attention: layout = {layout!r}, expected one of {LAYOUTS}")

    def check_inputs() -> None:
        check_qkv(q, k, v, "ulysses_attention")
        check_heads_divisible(q.shape[1], dist.get_world_size(group))

    refuse_together(check_inputs, q, group, "ulysses_attention")
    return UlyssesAttention.apply(q, k, v, group, causal, layout)


def ulysses_gqa_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Ulysses forward with grouped-query attention: q has H heads, k and v have H_kv (H_kv divides H).

    The all-to-all gives rank j the q heads j*H/cp ... and the K/V heads j*H_kv/cp ...;
    those are exactly the K/V heads its q heads read when cp divides H_kv. So the K/V
    head count, not the q head count, bounds cp. Forward only.
    """
    cp = dist.get_world_size(group)
    heads, kv_heads = q.shape[1], k.shape[1]
    if k.shape != v.shape or heads % kv_heads:
        raise ValueError(
            f"ulysses_gqa_forward: k, v heads = {kv_heads} must divide q heads = {heads}"
        )
    check_heads_divisible(heads, cp)
    if kv_heads % cp:
        raise ValueError(
            f"ulysses_gqa_forward: K/V heads = {kv_heads} (dim 1) is not divisible by cp = {cp}; "
            "replicate K/V heads up to cp, or put the rest of cp on a ring"
        )
    qh, kh, vh = (seq_to_heads(t.contiguous(), group) for t in (q, k, v))
    group_size = heads // kv_heads
    out_heads, _ = attention_block(
        qh,
        kh.repeat_interleave(group_size, 1),
        vh.repeat_interleave(group_size, 1),
        diagonal=causal,
    )
    return heads_to_seq(out_heads, group)
