"""paralab: hand-written parallelism labs, checked element by element against one process."""
from paralab.parallel_dims import ParallelDims, fsdp_mesh

__all__ = ["ParallelDims", "fsdp_mesh"]
