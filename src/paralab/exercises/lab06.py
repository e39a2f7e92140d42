"""Lab 06: the bug clinic's variant, written once and imported by the lab.

The pipeline's real loop (`paralab.pipeline.inference.predict`) asks
`should_skip_uncond` whether the uncond forward can be skipped at w == 1.
The variant below answers from the guidance scale alone: only the uncond
branch consults it, so under FSDP the uncond ranks leave the parameter
all-gathers their cond partners are waiting in.
"""

from __future__ import annotations

from paralab.parallel_dims import ParallelDims


def skip_uncond_whenever_guidance_is_one(
    guidance_scale: float, parallel_dims: ParallelDims | None
) -> bool:
    """The clinic's patch: at w == 1 the uncond prediction is unused, so skip its forward whenever w == 1."""
    return guidance_scale == 1.0
