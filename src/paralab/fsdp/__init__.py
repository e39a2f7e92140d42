"""FSDP (ZeRO-3) and HSDP by hand: the `dp_shard` and `dp_replicate` axes.

- `zero`: the algorithm (flat shards, gather / free / reduce-scatter, the sharded
  unit's forward and backward, the sharded optimizer, DDP for contrast);
- `runs`: lab 01's per-rank training jobs and the single-process references;
- `checks`: every rank's tensors, bytes and calls against those references and the formulas;
- `costs`: the closed-form bytes sent and held per rank;
- `engine_facts`: what torch's FSDP2 does (calls per mesh, mixed precision, checkpoints),
  measured for the chapters.

The algorithm's names are re-exported here. A bug is planted in the module
whose globals the real loop reads, one decision at a time:
`patches={"paralab.fsdp.zero": {"gradient_divide_factors": bug}}`.
"""

from paralab.fsdp.zero import (
    FlatUnit,
    HandFSDP,
    ShardedUnitFunction,
    ShardOptimizer,
    adam_step,
    all_reduce_gradients,
    flat_shard,
    free_unit_params,
    gather_unit_params,
    gradient_divide_factors,
    padded_size,
    reduce_scatter_grads,
    sgd_momentum_step,
    shard_unit,
    unflatten,
)

__all__ = [
    "FlatUnit",
    "HandFSDP",
    "ShardOptimizer",
    "ShardedUnitFunction",
    "adam_step",
    "all_reduce_gradients",
    "flat_shard",
    "free_unit_params",
    "gather_unit_params",
    "gradient_divide_factors",
    "padded_size",
    "reduce_scatter_grads",
    "sgd_momentum_step",
    "shard_unit",
    "unflatten",
]
