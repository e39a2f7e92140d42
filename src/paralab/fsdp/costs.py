"""Lab 01's closed-form costs: bytes one rank sends per step and bytes it holds.

The traffic model is the ledger's (ring / direct, per rank, `n` = group size,
`S` = bytes of the tensor named): all-gather (n-1) x the input shard,
reduce-scatter (n-1)/n S, all-reduce 2(n-1)/n S. Units are padded to a multiple
of the shard-group size before they are cut, and the padding travels too.
"""

from __future__ import annotations

from paralab.fsdp.zero import padded_size
from paralab.ledger import sent

ITEMSIZE = 8  # float64


def traffic_formula(
    engine: str,
    numels: list[int],
    world: int,
    dp_replicate: int = 1,
    reshard_after_forward: bool = True,
) -> dict[str, int]:
    """Bytes one rank sends per step, by collective, in the ledger's ring model.

    s = shard-group size, r = replicas, P = a unit's size padded to s, S = P*8 bytes:
    all-gather (s-1)/s S per gather (2 per unit for ZeRO-3, 1 for ZeRO-2-like),
    reduce-scatter (s-1)/s S, replica all-reduce 2(r-1)/r S/s; DDP 2(n-1)/n Psi*8.
    """
    if engine == "ddp":
        return {"all_reduce": sum(2 * (world - 1) * ITEMSIZE * p // world for p in numels)}
    s, r = world // dp_replicate, dp_replicate
    padded = [padded_size(p, s) * ITEMSIZE for p in numels]
    gathers = 2 if reshard_after_forward else 1
    out = {
        "all_gather_into_tensor": sum(gathers * (s - 1) * b // s for b in padded),
        "reduce_scatter_tensor": sum((s - 1) * b // s for b in padded),
    }
    if r > 1:
        out["all_reduce"] = sum(2 * (r - 1) * (b // s) // r for b in padded)
    return out


def memory_formula(
    engine: str,
    numels: list[int],
    world: int,
    optimizer: str,
    dp_replicate: int = 1,
    reshard_after_forward: bool = True,
) -> dict[str, int]:
    """Bytes one rank holds (float64: 8 per parameter, gradient and moment; Adam keeps 2 moments)."""
    moments = 1 if optimizer == "sgd" else 2
    if engine == "ddp":
        psi = sum(numels) * ITEMSIZE
        return {"params": psi, "grads": psi, "optimizer": moments * psi, "gathered peak": 0}
    s = world // dp_replicate
    padded = [padded_size(p, s) * ITEMSIZE for p in numels]
    shard = sum(padded) // s
    peak = max(padded) if reshard_after_forward else sum(padded)
    return {"params": shard, "grads": shard, "optimizer": moments * shard, "gathered peak": peak}


def per_step_sent(records: list, steps: int) -> dict[str, int]:
    """Ledger bytes sent per step by op (every step makes the same calls)."""
    return {op: sent(records, op=op) // steps for op in sorted({r.op for r in records})}


def fsdp2_calls_formula(n_units: int, dp_replicate: int, one_rank_mesh: bool) -> list[int]:
    """FSDP2's calls per step: all-gathers, reduce-scatters, all-reduces over one rank, replica all-reduces.

    Per unit: 2 gathers (forward, backward), 1 reduce-scatter; HSDP adds a replica
    all-reduce; the (1, n) dp mesh of the 2-D-mesh trap adds an all-reduce over one rank.
    """
    return [
        2 * n_units,
        n_units,
        n_units if one_rank_mesh else 0,
        n_units if dp_replicate > 1 else 0,
    ]
