"""Bytes each rank sends for one MoE layer, from the routed counts (not uniform).

M[i, j] = rows rank i sends to rank j's experts (the split matrix); a row is `dim`
float64 values, R = dim * 8 bytes. For rank r of an ep group of size ep with E experts:

| call | phase | bytes rank r sends |
|---|---|---|
| count exchange (int64) | forward | 8 * (E - E/ep) |
| dispatch all-to-all | forward | R * sum_{j != r} M[r, j] |
| combine all-to-all | forward | R * sum_{i != r} M[i, r] |
| backward of combine (dispatch's splits) | backward | R * sum_{j != r} M[r, j] |
| backward of dispatch (combine's splits) | backward | R * sum_{i != r} M[i, r] |
| dense gradients, all-reduce over the world of n | grad sync | 2 (n-1)/n * dense bytes |
| expert gradients, all-reduce over the m ranks holding the same experts | grad sync | 2 (m-1)/m * local expert bytes |

Rows a rank keeps for its own experts (M[r, r]) never cross the wire. These are the
bytes the algorithm needs at the API (the ledger's model), not what gloo moves.
"""

from __future__ import annotations

import torch


def split_matrix(send_counts: list[torch.Tensor], ep: int) -> torch.Tensor:
    """(ep, ep): [i, j] rows rank i sends to rank j, from every rank's (E,) counts per expert."""
    return torch.stack([c.reshape(ep, -1).sum(dim=1) for c in send_counts])


def layer_bytes(splits: torch.Tensor, rank: int, dim: int, experts: int) -> dict[str, int]:
    """Bytes rank `rank` sends per call of one MoE layer, forward and backward (float64 rows)."""
    ep = splits.shape[0]
    row = dim * 8
    out = row * int(splits[rank].sum() - splits[rank, rank])
    back = row * int(splits[:, rank].sum() - splits[rank, rank])
    return {
        "counts": 8 * (experts - experts // ep),
        "dispatch": out,
        "combine": back,
        "combine backward": out,
        "dispatch backward": back,
    }


def all_reduce_bytes(nbytes: int, n: int) -> int:
    """Ring all-reduce: 2 (n-1)/n of the buffer (0 on one rank)."""
    return 2 * (n - 1) * nbytes // n
