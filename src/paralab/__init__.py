"""paralab: hand-written parallelism labs, checked element by element against one process.

Naming a group's size, everywhere in the package:
- a function that belongs to one axis names the size after that axis: `cp`, `dp_shard`,
  `dp_replicate`, `cfgp`, `lb` (as `ParallelDims` and torchtitan do);
- an axis-agnostic helper (the collectives, flat sharding, shard byte counts) calls it `n`;
- `world` is only the number of launched processes (the launcher's world).
"""

from paralab.parallel_dims import ParallelDims, fsdp_mesh

__all__ = ["ParallelDims", "fsdp_mesh"]
