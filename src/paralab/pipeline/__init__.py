"""Lab 06: the whole VFM inference pipeline (lb encode, FSDP2 denoiser, cfgp x cp sampling, decode).

`generate` is the stable entry point; `inference` holds the stages, `runs`
the per-rank jobs and the checks' inputs, `costs` the closed-form bytes and memory.
"""

from paralab.pipeline.inference import generate

__all__ = ["generate"]
