"""Lab 05's seeded bug: the data loader picks the sample by global rank instead of `rest`.

`loader_clinic_bug()` is the patch set that plants it in the real loop,
`{"paralab.train.runs": {"sample_index": sample_by_global_rank}}`, under a name
that does not give the bug away before the lab's clinic asks about it; the lab
passes it to `run(..., patches=...)`.
"""

from __future__ import annotations

from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches


def sample_by_global_rank(rank: int, parallel_dims: ParallelDims) -> int:
    """Every rank its own sample: cp partners no longer share one, and samples past the batch are read."""
    return rank


def loader_clinic_bug() -> Patches:
    """The bug clinic's loader bug as a patch set, for `run(..., patches=...)` or `patched`."""
    return {"paralab.train.runs": {"sample_index": sample_by_global_rank}}
