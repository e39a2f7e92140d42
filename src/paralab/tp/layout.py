"""Which slice of a full weight each tensor-parallel rank holds, and how the slices go back together.

Used once by the layers (to cut a rank's shard out of a one-process model), by the
runs (to put gradients and parameters back together) and by the pictures.

- A column-parallel weight (out, in) is cut on dim 0, the output features: rank r
  holds rows r·out/tp ... A fused weight of `parts` equal blocks (q, k, v) is cut in
  each block, so every rank holds the q, k and v of the same heads.
- A row-parallel weight (out, in) is cut on dim 1, the input features.
- A vocab-parallel embedding (V, h) is cut on dim 0: rank r holds tokens r·V/tp ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Split:
    """How one parameter is split over tp ranks: along `dim`, in each of `parts` equal blocks."""

    dim: int
    parts: int = 1


def shard(full: torch.Tensor, split: Split | None, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s piece of `full` (a copy); `split=None` means replicated: the whole tensor."""
    if split is None:
        return full.detach().clone()
    if full.shape[split.dim] % (split.parts * tp):
        raise ValueError(
            f"shard: dim {split.dim} of size {full.shape[split.dim]} does not divide into "
            f"{split.parts} parts x tp={tp}"
        )
    ### BEGIN SOLUTION
    blocks = full.detach().chunk(split.parts, split.dim)
    return torch.cat([b.chunk(tp, split.dim)[rank] for b in blocks], split.dim).clone()
    ### END SOLUTION


def unshard(pieces: list[torch.Tensor], split: Split | None) -> torch.Tensor:
    """The full tensor from every rank's piece, in rank order (replicated: rank 0's copy)."""
    if split is None:
        return pieces[0]
    per_rank = [p.chunk(split.parts, split.dim) for p in pieces]
    return torch.cat(
        [torch.cat([blocks[k] for blocks in per_rank], split.dim) for k in range(split.parts)],
        split.dim,
    )


def owned_range(size: int, rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the rows rank `rank` holds when `size` rows are cut into tp equal pieces."""
    if size % tp:
        raise ValueError(f"owned_range: {size} rows do not divide by tp={tp}")
    per = size // tp
    return rank * per, (rank + 1) * per
