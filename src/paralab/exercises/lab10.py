"""Lab 10's bug clinic: one decision of the composed step swapped, as a patch set.

The lab and tests/test_compose_runs.py run the same bug by passing `replica_setup()` to
`launch.run(..., patches=...)`.
"""

from __future__ import annotations

from paralab.compose.grid import Grid
from paralab.patches import Patches

LAB = "10_four_d_composition"


def one_flat_group(grid: Grid) -> tuple[str, str | None]:
    """The FSDP group taken as every data-parallel rank (with cp), the replicas forgotten."""
    return "dp_cp", None


def replica_setup() -> Patches:
    """The clinic's patch set (named so as not to give the bug away before the clinic asks)."""
    return {"paralab.compose.runs": {"fsdp_groups": one_flat_group}}
