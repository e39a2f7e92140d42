"""Where each token lives: sequence shards, zigzag chunks, and which ring blocks need work.

The sequence is cut into equal chunks. Contiguous layout: `cp` chunks, rank r
holds chunk r. Zigzag layout (for causal attention): `2 * cp` chunks, rank r
holds chunks r and 2*cp-1-r, so every rank owns one early and one late chunk
and does the same amount of causal work.

Everything here is pure bookkeeping (no communication), shared by the ring
algorithm, the tests and the pictures, so the picture shows what the code does.
"""

from __future__ import annotations

import torch

FULL, DIAGONAL, SKIP = "full", "diagonal", "skip"


def chunk_ids(rank: int, cp: int, *, zigzag: bool = False) -> tuple[int, ...]:
    """The global chunk indices rank `rank` holds, in the order they sit in its shard."""
    return (rank, 2 * cp - 1 - rank) if zigzag else (rank,)


def check_sequence_divisible(seq_len: int, cp: int, *, zigzag: bool, dim: int = 2) -> None:
    """Every chunk must have the same length: seq % cp (or % 2*cp for zigzag) == 0."""
    n_chunks = 2 * cp if zigzag else cp
    if seq_len % n_chunks:
        need = f"2*cp = {n_chunks} (zigzag)" if zigzag else f"cp = {cp}"
        raise ValueError(f"sequence length {seq_len} (dim {dim}) is not divisible by {need}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, who: str) -> None:
    """q, k, v must be 4-D (batch, heads, seq, head_dim) shards of one shape, dtype and device."""
    if q.dim() != 4:
        raise ValueError(
            f"{who}: q must be (batch, heads, seq, head_dim), got {q.dim()} dims {tuple(q.shape)}"
        )
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"{who}: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[3] == 0:
        raise ValueError(f"{who}: head_dim = 0 (dim 3) in {tuple(q.shape)}; it must be positive")
    if not q.dtype == k.dtype == v.dtype or not q.dtype.is_floating_point:
        raise ValueError(
            f"{who}: q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not q.device == k.device == v.device:
        raise ValueError(f"{who}: q, k, v devices differ: {q.device}, {k.device}, {v.device}")


def shard_sequence(
    x: torch.Tensor, rank: int, cp: int, *, dim: int = 2, zigzag: bool = False
) -> torch.Tensor:
    """This rank's slice of the sequence (a copy), contiguous or zigzag."""
    check_sequence_divisible(x.shape[dim], cp, zigzag=zigzag, dim=dim)
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is outside cp = {cp}")
    chunks = x.chunk(2 * cp if zigzag else cp, dim=dim)
    return torch.cat([chunks[c] for c in chunk_ids(rank, cp, zigzag=zigzag)], dim=dim)


def unshard_sequence(
    shards: list[torch.Tensor], *, dim: int = 2, zigzag: bool = False
) -> torch.Tensor:
    """The full sequence from every rank's shard (index = rank): the inverse of `shard_sequence`."""
    cp = len(shards)
    if not zigzag:
        return torch.cat(shards, dim=dim)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for rank, shard in enumerate(shards):
        check_sequence_divisible(shard.shape[dim], 1, zigzag=True, dim=dim)
        for c, piece in zip(chunk_ids(rank, cp, zigzag=True), shard.chunk(2, dim=dim)):
            chunks[c] = piece
    return torch.cat(chunks, dim=dim)


def kv_source(rank: int, step: int, cp: int) -> int:
    """Whose K/V block rank `rank` holds at ring step `step` (blocks move to rank + 1 each step)."""
    return (rank - step) % cp


def block_kind(q_chunk: int, kv_chunk: int, *, causal: bool) -> str:
    """How much of a (query chunk, key chunk) block causal attention needs.

    Chunks are in global order, so a key chunk after the query chunk is entirely
    in the future (SKIP), one before it entirely in the past (FULL), and the same
    chunk is the triangle on the diagonal (DIAGONAL).
    """
    if not causal or kv_chunk < q_chunk:
        return FULL
    return DIAGONAL if kv_chunk == q_chunk else SKIP


def ring_blocks(
    rank: int, step: int, cp: int, *, causal: bool, zigzag: bool
) -> list[tuple[int, int, str]]:
    """The (local query chunk, local K/V chunk, kind) blocks computed at one ring step; SKIP ones omitted."""
    q_chunks = chunk_ids(rank, cp, zigzag=zigzag)
    kv_chunks = chunk_ids(kv_source(rank, step, cp), cp, zigzag=zigzag)
    blocks = []
    for i, qc in enumerate(q_chunks):
        for j, kc in enumerate(kv_chunks):
            kind = block_kind(qc, kc, causal=causal)
            if kind != SKIP:
                blocks.append((i, j, kind))
    return blocks


def causal_work(rank: int, step: int, cp: int, *, causal: bool, zigzag: bool) -> float:
    """Attention work at one step, in units of a full shard-by-shard block (a triangle counts half)."""
    chunk_area = 1 / len(chunk_ids(0, cp, zigzag=zigzag)) ** 2
    return sum(
        chunk_area * (0.5 if kind == DIAGONAL else 1.0)
        for _, _, kind in ring_blocks(rank, step, cp, causal=causal, zigzag=zigzag)
    )
