"""Lab 05's seeded bug: the data loader picks the sample by global rank instead of `rest`.

Planted into the real loop with `planted(paralab.train.runs, sample_index=sample_by_global_rank)`.
"""
from __future__ import annotations

from paralab.parallel_dims import ParallelDims


def sample_by_global_rank(rank: int, parallel_dims: ParallelDims) -> int:
    """Every rank its own sample: cp partners no longer share one, and samples past the batch are read."""
    return rank
