"""The collectives every other lab uses, on a handful of integers (the primer, lab 00_collectives_primer).

- `ring`: the ring algorithms written with point-to-point sends (where the
  (n-1)/n cost comes from) and `ring_shift`, a send/recv with its backward.
- `runs`: per-rank jobs, the inputs they start from, and the results a single
  process expects, forward and backward.
- `costs`: the closed-form bytes each rank sends.
"""

from paralab.collectives.costs import (
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
)
from paralab.collectives.ring import (
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_shift,
)

__all__ = [
    "all_gather_bytes",
    "all_reduce_bytes",
    "all_to_all_bytes",
    "reduce_scatter_bytes",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce_scatter",
    "ring_shift",
]
