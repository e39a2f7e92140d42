"""All the training axes on one set of ranks: world = dp_replicate × dp_shard × cp × tp × pp.

- `grid`: `Grid`, the consuming descriptor: validation naming the axis, every rank's
  coordinates and groups in the doc group's order (inner -> outer TP -> CP -> PP -> DP),
  torchtitan's, or any other; flattened groups named as torchtitan names them.
- `model`: lab 07's TinyLM cut by depth (`LMStage`), over tp and over cp (the ring, zigzag).
- `runs`: `train` (on every rank) and `reference` (one process), the ledgered
  `compose_worker` and the checks; `costs`: bytes per group and phase in closed form.
"""

from paralab.compose.grid import DOC_ORDER, TORCHTITAN_ORDER, TP_OUTERMOST, Grid, GridError
from paralab.lazy import entry_points

__all__ = [
    "DOC_ORDER",
    "TORCHTITAN_ORDER",
    "TP_OUTERMOST",
    "Grid",
    "GridError",
    "reference",
    "train",
]
__getattr__ = entry_points(__name__, {"reference": "runs", "train": "runs"})
