"""Tensor and sequence parallelism by hand: Megatron's f/g pair, its layers, a small LM cut over tp ranks.

- `mappings`: the four region crossings as autograd Functions with hand-written
  backwards: f (identity / all-reduce), g (all-reduce / identity), and under sequence
  parallelism all-gather / reduce-scatter and reduce-scatter / all-gather.
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`, each
  cut from a one-process layer; `cross_entropy`: the vocab-parallel loss (three small
  all-reduces, the logits never gathered).
- `model`: `TinyLM` (float64, 2 blocks, 12 heads) and `tensor_parallel`, which swaps its
  layers for their parallel forms without touching its forward code.
- `runs`: `train` (on every rank, world = dp_shard × tp) and `reference` (one process),
  the per-rank jobs and the checks; `costs`: the closed-form bytes per phase.
"""

from paralab.lazy import entry_points

__all__ = ["reference", "train"]
__getattr__ = entry_points(__name__, dict.fromkeys(__all__, "runs"))
