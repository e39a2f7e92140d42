"""CFG parallelism (cfgp): the two branches of classifier-free guidance on two ranks.

- `sampling`: the algorithm (the guided Euler sampler, the noise broadcast, the
  prediction swap, the cp overlay's sharding of the latent);
- `runs`: lab 03's per-rank jobs (`sample_on_rank`, `sample_variants`);
- `costs`: the closed-form bytes each rank sends while sampling.

The sampler's names are re-exported here. A bug is planted in the module whose
globals the loop reads: `patches={"paralab.cfgp.sampling": {"cfg_combine": bug}}`.
"""

from paralab.cfgp.runs import sample_on_rank, sample_variants
from paralab.cfgp.sampling import (
    EXCHANGES,
    broadcast_noise,
    cfg_combine,
    cp_forward_kwargs,
    draw_noise,
    euler_step,
    exchange_prediction,
    exchange_prediction_all_gather,
    gather_latent,
    initial_latent,
    predict_branches,
    predict_branches_batched,
    predict_cfgp,
    sample,
    shard_latent,
    timesteps,
)

__all__ = [
    "EXCHANGES",
    "broadcast_noise",
    "cfg_combine",
    "cp_forward_kwargs",
    "draw_noise",
    "euler_step",
    "exchange_prediction",
    "exchange_prediction_all_gather",
    "gather_latent",
    "initial_latent",
    "predict_branches",
    "predict_branches_batched",
    "predict_cfgp",
    "sample",
    "sample_on_rank",
    "sample_variants",
    "shard_latent",
    "timesteps",
]
