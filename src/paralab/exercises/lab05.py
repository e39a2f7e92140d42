"""Lab 05's seeded bug: the data loader picks the sample by global rank instead of `rest`.

Planted into the real loop with `patches={"paralab.train.runs": {"sample_index": sample_by_global_rank}}`;
`loader_clinic_bug()` does that under a name that does not give the bug away before the
lab's clinic asks about it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager

from paralab.parallel_dims import ParallelDims
from paralab.patches import patched


def sample_by_global_rank(rank: int, parallel_dims: ParallelDims) -> int:
    """Every rank its own sample: cp partners no longer share one, and samples past the batch are read."""
    return rank


def loader_clinic_bug() -> ContextManager:
    """The bug clinic's loader bug, planted for a block (lab 05 trains once inside it)."""

    return patched({"paralab.train.runs": {"sample_index": sample_by_global_rank}})
