"""Closed-form bytes each rank sends, per phase, for ring and Ulysses attention.

S = bytes of one rank's shard of ONE of q, k, v: batch * heads * (seq/cp) * head_dim * itemsize
(in the replicated layout, a rank's heads of the full sequence: the same number).

| algorithm | forward | backward |
|---|---|---|
| ring | (cp-1) * 2S: K and V, cp-1 hops | (cp-1) * 2S + (cp-1) * 2S: K/V again, then dK/dV home |
| Ulysses, sequence_sharded | 4 * (cp-1)/cp * S: q, k, v, out all-to-alls | 4 * (cp-1)/cp * S: dout, dq, dk, dv |
| Ulysses, replicated | (cp-1) * S: all-gather of out heads | 3 * (cp-1) * S: all-gather of dq, dk, dv heads |
| USP, cp = u * c | 4 * (u-1)/u * S all-to-all + (c-1) * 2S ring | (not built) |
| Ulysses, grouped-query | (cp-1)/cp * (2 S + 2 S_kv): q, out at S; k, v at S_kv | the same: dout, dq; dk, dv |

S_kv is S at the K/V head count (`cp.ulysses.ulysses_gqa_forward`). In USP the ring's K/V
block is still S bytes: H/u heads of N/c tokens.
"""

from __future__ import annotations


def shard_bytes(batch: int, heads: int, seq: int, head_dim: int, cp: int, itemsize: int = 8) -> int:
    """S: one rank's share of one of q, k, v."""
    return batch * heads * (seq // cp) * head_dim * itemsize


def ring_bytes(s: int, cp: int) -> dict[str, int]:
    return {"forward": 2 * (cp - 1) * s, "backward": 4 * (cp - 1) * s}


def ulysses_bytes(s: int, cp: int, layout: str = "sequence_sharded") -> dict[str, int]:
    if layout == "replicated":
        return {"forward": (cp - 1) * s, "backward": 3 * (cp - 1) * s}
    return {"forward": 4 * (cp - 1) * s // cp, "backward": 4 * (cp - 1) * s // cp}


def usp_bytes(s: int, ulysses: int, ring: int) -> dict[str, int]:
    """Forward bytes per rank of USP: Ulysses all-to-alls over `ulysses` ranks, then a ring over `ring`."""
    return {"all_to_all": 4 * (ulysses - 1) * s // ulysses, "ring": 2 * (ring - 1) * s}


def ulysses_gqa_bytes(s: int, s_kv: int, cp: int) -> dict[str, int]:
    """Ulysses with grouped-query attention: q and out move S, k and v only S_kv, per pass."""
    sent = 2 * ((cp - 1) * s // cp) + 2 * ((cp - 1) * s_kv // cp)
    return {"forward": sent, "backward": sent}
