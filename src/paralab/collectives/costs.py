"""Bytes one rank sends in the ring (bandwidth-optimal) algorithms, S = bytes of the FULL tensor.

A ring of n ranks cuts the tensor into n chunks of S/n. Each of n-1 steps, every
rank sends one chunk to its right neighbour:

| collective | steps | bytes sent per rank |
|---|---|---|
| reduce-scatter | n-1 (add what arrives, pass it on) | (n-1)/n S |
| all-gather | n-1 (pass on what arrives) | (n-1)/n S |
| all-reduce = reduce-scatter + all-gather | 2(n-1) | 2(n-1)/n S |
| all-to-all (direct) | one chunk to each other rank | (n-1)/n S |

For large n every rank sends about S (2S for all-reduce), whatever n is: that is
why the ring is called bandwidth-optimal.
"""

from __future__ import annotations


def reduce_scatter_bytes(full_bytes: int, n: int) -> int:
    """n-1 chunks of S/n leave every rank."""
    return (n - 1) * full_bytes // n


def all_gather_bytes(full_bytes: int, n: int) -> int:
    """n-1 chunks of S/n leave every rank (S = the gathered output)."""
    return (n - 1) * full_bytes // n


def all_reduce_bytes(full_bytes: int, n: int) -> int:
    """A reduce-scatter, then an all-gather of the reduced chunks."""
    return reduce_scatter_bytes(full_bytes, n) + all_gather_bytes(full_bytes, n)


def all_to_all_bytes(full_bytes: int, n: int) -> int:
    """Every chunk but the one a rank keeps for itself."""
    return (n - 1) * full_bytes // n
