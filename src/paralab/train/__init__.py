"""Lab 05: the training axes composed in one step — CP, activation checkpointing, compile, FSDP.

Public entry points (stable: other code and checks call them):
- `train(parallel_dims, *, steps, attention, ac, compile, optimizer, seed, causal)`: run
  inside `paralab.launch.run`; full parameters after `steps`, the same on every rank.
- `reference(*, samples, steps, optimizer, seed, causal)`: one process, the global batch.
- `apply_cp`, `apply_ac`, `apply_compile`, `apply_fsdp`, and `parallelize` (all four in order).
"""

from paralab.lazy import entry_points

_HOMES = {
    **dict.fromkeys(
        ("apply_ac", "apply_compile", "apply_cp", "apply_fsdp", "parallelize"), "parallelism"
    ),
    **dict.fromkeys(("reference", "train"), "runs"),
}
__all__ = sorted(_HOMES)
__getattr__ = entry_points(__name__, _HOMES)
