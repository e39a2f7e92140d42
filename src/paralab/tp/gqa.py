"""Grouped-query attention under TP, with Megatron's fused q/k/v layout, even with fewer kv heads than tp.

Megatron lays the fused `linear_qkv` weight out per query group: `q1 q2 k1 v1 | q3 q4 k2 v2
| ...` (NVIDIA/Megatron-LM@d98e8a64:megatron/core/transformer/attention.py,
`get_query_key_value_tensors`). A column-parallel cut into tp contiguous pieces then
gives each rank whole groups when the kv heads divide by tp: no permutation, where this
lab's own `q | k | v` layout needs `dtensor.head_aligned_qkv`. With fewer kv heads than
tp, a piece holds part of a group, so Megatron all-gathers the q/k/v output on its last
dim, slices out the group `rank // (tp / groups)`, and keeps its share of that group's
query heads; its kv head is duplicated on tp / groups ranks. Either way rank r ends with
query heads `[r·a/tp, (r+1)·a/tp)`, so the output projection is the usual row cut.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.check import Verdict, compare
from paralab.tp.layout import Split, shard
from paralab.tp.mappings import copy_to_tp, reduce_from_tp

BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM = 2, 12, 48, 8, 6


def interleaved_qkv(
    wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, groups: int
) -> torch.Tensor:
    """Megatron's fused layout: for each query group, its query rows, then its key and value rows."""
    return torch.cat(
        [
            part
            for g in range(groups)
            for part in (wq.chunk(groups)[g], wk.chunk(groups)[g], wv.chunk(groups)[g])
        ]
    )


def gqa_weights(groups: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full weights: the fused q/k/v in Megatron's layout (HEADS query, `groups` kv heads), the output."""
    g = torch.Generator().manual_seed(4000 + seed)
    draw = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g) / HIDDEN**0.5  # noqa: E731
    wq, wk, wv = (
        draw(HEADS * HEAD_DIM, HIDDEN),
        draw(groups * HEAD_DIM, HIDDEN),
        draw(groups * HEAD_DIM, HIDDEN),
    )
    return {"qkv": interleaved_qkv(wq, wk, wv, groups), "out": draw(HIDDEN, HEADS * HEAD_DIM)}


def gqa_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x and the gradient arriving at the output, (batch, seq, hidden) each."""
    g = torch.Generator().manual_seed(5000 + seed)
    return tuple(
        torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.float64, generator=g) for _ in range(2)
    )


def grouped_attention(
    mixed: torch.Tensor, groups: int, heads: int, own: slice = slice(None)
) -> torch.Tensor:
    """`mixed` (b, s, groups·(heads/groups + 2)·d) in the per-group layout: causal attention of
    the query heads `own` of its `heads` over their group's kv head; (b, s, own heads·d)."""
    b, s, _ = mixed.shape
    per_group = heads // groups
    q, k, v = mixed.view(b, s, groups, (per_group + 2) * HEAD_DIM).split(
        [per_group * HEAD_DIM, HEAD_DIM, HEAD_DIM], dim=-1
    )
    q = q.reshape(b, s, heads, HEAD_DIM).transpose(1, 2)
    k, v = (t.transpose(1, 2).repeat_interleave(per_group, dim=1) for t in (k, v))
    out = F.scaled_dot_product_attention(q[:, own], k[:, own], v[:, own], is_causal=True)
    return out.transpose(1, 2).flatten(2)


class GatherLastDim(torch.autograd.Function):
    """All-gather on the last dim; backward: every rank's gradient of the whole, summed, and this
    rank's slice (Megatron reduce-scatters; an all-reduce then a slice gives the same values)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(dist.get_world_size(ctx.group), dim=-1)[dist.get_rank(ctx.group)], None


def gqa_job(groups: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """On every rank (tp = world): GQA with Megatron's layout, forward and backward.
    Returns the output, dx and this rank's pieces of the two weights' gradients."""
    rank, tp = dist.get_rank(), dist.get_world_size()
    full = gqa_weights(groups, seed)
    w_qkv = shard(full["qkv"], Split(0), rank, tp).requires_grad_()
    w_out = shard(full["out"], Split(1), rank, tp).requires_grad_()
    x, grad_out = gqa_inputs(seed)
    x.requires_grad_()
    mixed = F.linear(copy_to_tp(x, None), w_qkv)
    if groups < tp:
        ranks_per_group = tp // groups
        mixed = GatherLastDim.apply(mixed, None)
        size = mixed.shape[-1] // groups
        group = rank // ranks_per_group
        mixed = mixed[..., group * size : (group + 1) * size]
        first = (rank % ranks_per_group) * (HEADS // tp)
        attended = grouped_attention(mixed, 1, HEADS // groups, slice(first, first + HEADS // tp))
    else:
        attended = grouped_attention(mixed, groups // tp, HEADS // tp)
    out = reduce_from_tp(F.linear(attended, w_out), None)
    out.backward(grad_out)
    return {"out": out.detach(), "dx": x.grad, "qkv": w_qkv.grad, "out_weight": w_out.grad}


def gqa_reference(groups: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """One process: the same weights, input and output gradient."""
    full = {k: v.clone().requires_grad_() for k, v in gqa_weights(groups, seed).items()}
    x, grad_out = gqa_inputs(seed)
    x.requires_grad_()
    out = F.linear(grouped_attention(F.linear(x, full["qkv"]), groups, HEADS), full["out"])
    out.backward(grad_out)
    return {
        "out": out.detach(),
        "dx": x.grad,
        "qkv": full["qkv"].grad,
        "out_weight": full["out"].grad,
    }


def check_gqa(per_rank: list[dict], groups: int) -> list[Verdict]:
    """Output, dx and both weights' gradients (pieces joined) vs one process, relative 1e-12."""
    want = gqa_reference(groups)
    got = {
        "out": per_rank[0]["out"],
        "dx": per_rank[0]["dx"],
        "qkv": torch.cat([r["qkv"] for r in per_rank]),
        "out_weight": torch.cat([r["out_weight"] for r in per_rank], dim=1),
    }
    tag = f"GQA {groups} kv heads, tp={len(per_rank)}"
    return [
        v
        for name in got
        for v in compare(
            got[name], want[name], atol=1e-12 * want[name].abs().max().item(), name=f"{tag}: {name}"
        )
    ]
