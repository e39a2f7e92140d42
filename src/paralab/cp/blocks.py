"""Attention on one (query block, key block) pair, and the log-sum-exp merge of partial results.

Softmax attention over keys split into blocks B1, B2, ... is exact if every block
returns, besides its output, the log-sum-exp of its scores:

    out_B = softmax(S_B) V_B,    lse_B = log sum_j exp(S_B[:, j])

because the full softmax weights are the block's weights times exp(lse_B - lse),
with lse the log-sum-exp over all keys (see `merge_partials`).

The backward needs, per block, only the final `lse` and `delta = rowsum(dout * out)`:
    P  = exp(S_B - lse)                 (the block's slice of the full softmax)
    dV_B = P^T dout,   dP = dout V_B^T,   dS = P * (dP - delta)
    dQ += dS K_B * scale,   dK_B = dS^T Q * scale
so each block's gradient can be computed wherever its K/V happen to be.
"""

from __future__ import annotations

import torch


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    """Scaled q k^T; on a diagonal block, key positions after the query are masked out."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def attention_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    diagonal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of softmax attention of q over one block of keys; `diagonal` = causal triangle."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = _scores(q, k, scale, diagonal)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse.unsqueeze(-1)) @ v
    return out, lse


def merge_partials(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets into one.

    The merged log-sum-exp is lse' = log(exp(lse) + exp(block_lse)), computed
    stably by `logaddexp` (max + log1p(exp(-|difference|))). Each partial output
    is a softmax-weighted average normalized over its own keys; renormalizing it
    over the union multiplies it by exp(its lse - lse'), a number in [0, 1],
    so nothing overflows however large the scores are.

    A query row that sees no key in either part (padding, or a packed-sequence
    mask that hides a whole block from it) has lse = -inf on both sides, and
    -inf - (-inf) is NaN. Such a partial is (0, -inf); its rows merge to
    (0, -inf), finite, so later blocks still merge into them exactly.
    """
    ### BEGIN SOLUTION
    new_lse = torch.logaddexp(lse, block_lse)
    finite = torch.where(
        torch.isneginf(new_lse), torch.zeros_like(new_lse), new_lse
    )  # both weights then exp(-inf) = 0
    out = (
        torch.exp(lse - finite).unsqueeze(-1) * out
        + torch.exp(block_lse - finite).unsqueeze(-1) * block_out
    )
    ### END SOLUTION
    return out, new_lse


def attention_block_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    *,
    diagonal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) contributed by one key block, given the FINAL lse and delta = rowsum(dout * out)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = torch.exp(_scores(q, k, scale, diagonal) - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    dq = (ds @ k) * scale
    dk = (ds.transpose(-2, -1) @ q) * scale
    return dq, dk, dv
