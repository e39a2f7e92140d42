"""Lab 03's per-rank jobs: build the meshes, sample under the ledger, report this rank's place.

The sampler itself is `paralab.cfgp.sampling.sample`; this module runs it on
a rank of a launch (`sample_on_rank`), several ways in one launch
(`sample_variants`), and returns what the notebook and the tests check. A bug
variant is a patch set handed to the launch, `run(sample_on_rank, ...,
patches=...)`, next to a plain launch on the same inputs.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from paralab.cfgp.sampling import sample
from paralab.ledger import Ledger
from paralab.parallel_dims import ParallelDims

EXCHANGE_VARIANTS = {"p2p": {}, "all_gather": {"exchange": "all_gather"}}


def sample_on_rank(
    model, cond, uncond, dims: dict | None = None, *, repeats: int = 1, **sample_kwargs
) -> dict:
    """Worker for `paralab.launch.run`: build the meshes from `dims`, sample under a ledger.

    Returns this rank's latent, the ledger records of the first run, the best
    seconds per step over `repeats` runs (a shared CPU is noisy: the minimum is
    the least disturbed run) and this rank's place in the mesh.
    """
    pd = None
    if dims is not None:
        pd = ParallelDims(dist.get_world_size(), enable_inference_mode=True, **dims)
        pd.build_meshes("cpu")
    with Ledger() as ledger:
        latent = sample(model, cond, uncond, parallel_dims=pd, **sample_kwargs)
    seconds = []
    for _ in range(repeats - 1):
        dist.barrier()
        start = time.perf_counter()
        sample(model, cond, uncond, parallel_dims=pd, **sample_kwargs)
        seconds.append(time.perf_counter() - start)
    return {
        "latent": latent,
        "records": ledger.records,
        "seconds_per_step": min(seconds) / sample_kwargs["steps"] if seconds else None,
        "rank": dist.get_rank(),
        "cfgp_rank": pd.cfgp_rank if pd else 0,
        "cp_rank": pd.cp_rank if pd else 0,
    }


def sample_variants(
    model,
    cond,
    uncond,
    dims: dict | None,
    variants: dict[str, dict],
    **sample_kwargs,
) -> dict[str, dict]:
    """On every rank: `sample_on_rank` once per variant, its keyword arguments over `sample_kwargs`
    (one launch for several samplers: launches cost time)."""
    return {
        name: sample_on_rank(model, cond, uncond, dims, **{**sample_kwargs, **extra})
        for name, extra in variants.items()
    }
