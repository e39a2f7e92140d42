"""Lab 02 exercises: the log-sum-exp merge, the Ulysses all-to-alls, the ring hop; and the bugs they must catch.

The bug variants are real-world failures of context parallelism. The lab's bug
clinic and tests/test_cp_dist.py import them from here, so each bug is written once.
"""

from __future__ import annotations

import functools
import random

import torch
import torch.distributed as dist

from paralab.cp.blocks import attention_block
from paralab.cp.ring import KV_TAG, ring_backward, ring_pass
from paralab.cp.ulysses import UlyssesAttention, take_heads
from paralab.exercises import Exercise
from paralab.parallel_dims import ParallelDims
from paralab.patches import Patches, patched

LAB = "02_cp_ring_vs_ulysses"


# --------------------------------------------------------------------------- merge_partials
def _partials(seed: int, q_scale: float, k2_scale: float = 1.0) -> tuple:
    """(out, lse) of two key blocks (4 and 7 keys) for the same queries; scales make the scores large."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 6, 5, dtype=torch.float64, generator=g) for _ in range(3))
    q = q * q_scale
    k2 = k[:, :, 4:] * k2_scale
    return (*attention_block(q, k[:, :, :4], v[:, :, :4]), *attention_block(q, k2, v[:, :, 4:]))


def _merge_cases(rank: int, world: int) -> list[tuple]:
    """Ordinary scores, scores near 1e3 (exp overflows float64), and blocks whose lse differ by ~700."""
    return [
        _partials(0, 1.0),
        _partials(1, 4.0),
        _partials(2, 400.0),
        _partials(3, 300.0, k2_scale=0.001),
    ]


MERGE_KINDS = [
    "ordinary scores",
    "scores around 10",
    "scores near 1e3 (exp(lse) overflows)",
    "blocks whose lse differ by ~700",
]


def _hidden_merge_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Other shapes and key splits, drawn from the grading seed, at the same three score regimes.

    Never a degenerate shape (a batch, a head, a query or a key block of 1) and scores large
    enough that exp(lse) overflows, on which a known-wrong merge could still pass."""
    draw = random.Random(seed)
    cases = []
    for q_scale, k2_scale in [
        (1.0, 1.0),
        (draw.uniform(800, 1200), 1.0),
        (draw.uniform(800, 1200), 0.001),
    ]:
        b, h, n, d, split = (
            draw.randint(2, 3),
            draw.randint(2, 4),
            draw.randint(2, 9),
            draw.randint(2, 8),
            draw.randint(2, 6),
        )
        g = torch.Generator().manual_seed(draw.randrange(10**6))
        q = torch.randn(b, h, n, d, dtype=torch.float64, generator=g) * q_scale
        k, v = (torch.randn(b, h, split + 3, d, dtype=torch.float64, generator=g) for _ in range(2))
        cases.append(
            (
                *attention_block(q, k[:, :, :split], v[:, :, :split]),
                *attention_block(q, k[:, :, split:] * k2_scale, v[:, :, split:]),
            )
        )
    return cases


HIDDEN_MERGE_KINDS = [
    "another shape, ordinary scores",
    "another shape, scores around 1e3 (exp(lse) overflows)",
    "another shape, one block's lse far below the other's",
]


def _out_and_lse(result: tuple) -> dict[str, torch.Tensor]:
    out, lse = result
    return {"out": out, "lse": lse}


def merge_without_rescaling(out, lse, block_out, block_lse):
    """Bug: adds the partial outputs as if each were normalized over all keys (lse kept as the max)."""
    return out + block_out, torch.maximum(lse, block_lse)


def merge_by_plain_average(out, lse, block_out, block_lse):
    """Bug: averages the partial outputs, ignoring how much softmax mass each block holds."""
    return (out + block_out) / 2, torch.logaddexp(lse, block_lse)


def merge_lse_by_max(out, lse, block_out, block_lse):
    """Bug: the merged lse is max(lse, block_lse) (drops the log(1 + exp(-|difference|)) term)."""
    new_lse = torch.maximum(lse, block_lse)
    return torch.exp(lse - new_lse).unsqueeze(-1) * out + torch.exp(block_lse - new_lse).unsqueeze(
        -1
    ) * block_out, new_lse


def merge_through_exp(out, lse, block_out, block_lse):
    """Bug: the textbook formula in exp space; exp(lse) overflows to inf once scores pass ~709."""
    total = torch.exp(lse) + torch.exp(block_lse)
    merged = (
        torch.exp(lse).unsqueeze(-1) * out + torch.exp(block_lse).unsqueeze(-1) * block_out
    ) / total.unsqueeze(-1)
    return merged, torch.log(total)


# --------------------------------------------------------------------------- Ulysses all-to-alls
@functools.cache
def _cp_groups(world: int) -> list[tuple[dist.ProcessGroup, int]]:
    """(group, its size): the whole world as one cp group and, at world 4, two cp groups of 2.
    Built once per rank process: every case and grading seed shares them."""
    sizes = [world] + ([2] if world == 4 else [])
    groups = []
    for cp in sizes:
        pd = ParallelDims(world, cp=cp)
        pd.build_meshes("cpu")
        groups.append((pd.cp_mesh.get_group(), cp))
    return groups


def _blocks(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _group_kinds(world: int) -> list[str]:
    return [f"the whole world as one cp group of {world}"] + (
        ["the {0,1} and {2,3} cp groups of 2 inside 4 ranks"] if world == 4 else []
    )


CP_KINDS = ["cp = 2", "cp = 4", "cp = 3"]
HIDDEN_CP_KINDS = ["another shape, cp = 5", "another shape, cp = 6"]


def _hidden_sizes(seed: int) -> tuple[int, int, int, int]:
    """(batch, heads per rank, tokens per rank, head_dim) drawn from the grading seed, each at least
    2: with a size of 1, a known-wrong layout (strided, interleaved) equals the right one."""
    draw = random.Random(seed)
    return draw.randint(2, 3), draw.randint(2, 3), draw.randint(2, 6), draw.randint(2, 4)


def _hidden_pack_heads_cases(rank: int, world: int, seed: int) -> list[tuple]:
    b, heads, tokens, d = _hidden_sizes(seed)
    return [(_blocks(seed + cp, (b, heads * cp, tokens, d)), cp) for cp in (5, 6)]


def _hidden_pack_seq_cases(rank: int, world: int, seed: int) -> list[tuple]:
    b, heads, tokens, d = _hidden_sizes(seed)
    return [(_blocks(seed + 10 + cp, (b, heads, tokens * cp, d)), cp) for cp in (5, 6)]


def _hidden_received_cases(rank: int, world: int, seed: int) -> list[tuple]:
    b, heads, tokens, d = _hidden_sizes(seed)
    return [(_blocks(seed + 20 + cp, (cp, b, heads, tokens, d)),) for cp in (5, 6)]


def _pack_heads_cases(rank: int, world: int) -> list[tuple]:
    """A (b, h, n/cp, d) sequence shard and cp: 3 heads per rank, 5 tokens per rank, head_dim 3."""
    return [(_blocks(cp, (2, 3 * cp, 5, 3)), cp) for cp in (2, 4, 3)]


def _pack_seq_cases(rank: int, world: int) -> list[tuple]:
    """A (b, h/cp, n, d) head shard and cp: 3 heads, 5 tokens per rank of the full sequence, head_dim 3."""
    return [(_blocks(10 + cp, (2, 3, 5 * cp, 3)), cp) for cp in (2, 4, 3)]


def _received_cases(rank: int, world: int) -> list[tuple]:
    """What the all-to-all hands back, (cp, b, h/cp, n/cp, d): block i came from rank i."""
    return [(_blocks(20 + cp, (cp, 2, 3, 5, 3)),) for cp in (2, 4, 3)]


def pack_heads_without_transpose(x, cp):
    """Bug: the head groups are not moved to dim 0, so the all-to-all cuts the batch instead of the heads."""
    b, h, s, d = x.shape
    return x.reshape(b, cp, h // cp, s, d).contiguous()


def unpack_heads_interleaved(received):
    """Bug: the source rank goes after the token index, so the sequence comes out interleaved, not in rank order."""
    cp, b, hl, s, d = received.shape
    return received.permute(1, 2, 3, 0, 4).reshape(b, hl, cp * s, d)


def pack_seq_strided(x, cp):
    """Bug: the tokens are cut as (n/cp, cp), so rank j gets every cp-th token instead of shard j."""
    b, hl, n, d = x.shape
    return x.reshape(b, hl, n // cp, cp, d).permute(3, 0, 1, 2, 4).contiguous()


def unpack_seq_heads_mixed(received):
    """Bug: the heads come out as (my head, source rank) instead of (source rank, my head)."""
    cp, b, hl, s, d = received.shape
    return received.permute(1, 2, 0, 3, 4).reshape(b, cp * hl, s, d)


def unpack_seq_without_transpose(received):
    """Bug: the received dim (source rank) is reshaped straight into the batch dim: the transpose is missing."""
    cp, b, hl, s, d = received.shape
    return received.reshape(b, cp * hl, s, d)


# --------------------------------------------------------------------------- ring_pass
def _ring_cases(rank: int, world: int) -> list[tuple]:
    """A stacked K/V block (2, b, h, s, d) per rank, passed on WORLD (None) and on every cp group."""
    cases = []
    for i, group in enumerate([None] + [group for group, _ in _cp_groups(world)]):
        g = torch.Generator().manual_seed(100 * i + rank)
        cases.append(
            (torch.randn(2, 1, 3, 4, 5, dtype=torch.float64, generator=g), group, KV_TAG + i % 2)
        )
    return cases


def _ring_kinds(world: int) -> list[str]:
    return [f"the whole world (group=None) of {world}"] + _group_kinds(world)


def _hidden_ring_cases(rank: int, world: int, seed: int) -> list[tuple]:
    """Blocks of another shape, drawn from the seed, on WORLD and on every cp group."""
    draw = random.Random(seed)
    shape = (2, draw.randint(1, 2), draw.randint(1, 4), draw.randint(1, 6), draw.randint(1, 5))
    cases = []
    for i, group in enumerate([None] + [group for group, _ in _cp_groups(world)]):
        g = torch.Generator().manual_seed(seed + 100 * i + rank)
        cases.append((torch.randn(*shape, dtype=torch.float64, generator=g), group, KV_TAG + i % 2))
    return cases


def _hidden_ring_kinds(world: int) -> list[str]:
    return [f"another shape, {kind}" for kind in _ring_kinds(world)]


def _received(result: tuple) -> torch.Tensor:
    """Wait for the hop to finish and keep the received block."""
    received, works = result
    for work in works:
        work.wait()
    return received


def ring_pass_backwards(t, group, tag):
    """Bug: sends to the previous rank and receives from the next: the ring turns the wrong way."""
    group = group or dist.group.WORLD
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    received = torch.empty_like(t)
    works = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, t, dist.get_global_rank(group, (rank - 1) % cp), group, tag),
            dist.P2POp(
                dist.irecv, received, dist.get_global_rank(group, (rank + 1) % cp), group, tag
            ),
        ]
    )
    return received, works


def ring_pass_kv_stays(t, group, tag):
    """Bug: the K/V hop moves nothing, every rank keeps its own block (other tags still travel)."""
    if tag == KV_TAG:
        return t.clone(), []
    return ring_pass(t, group, tag)


def ring_backward_kv_stays(*args: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bug: the package's `ring_backward` whose K/V hop moves nothing (`ring_pass_kv_stays`);
    the forward keeps the real ring, so only the gradients go wrong."""
    with patched({"paralab.cp.ring": {"ring_pass": ring_pass_kv_stays}}):
        return ring_backward(*args)


def ring_clinic_bug() -> Patches:
    """The bug clinic's ring bug, for `run(..., patches=...)`: its wrong decision is in the backward only."""
    return {"paralab.cp.ring": {"ring_backward": ring_backward_kv_stays}}


# --------------------------------------------------------------------------- replicated Ulysses, all-gather backward
def reduce_scatter_heads(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Bug when used as the backward of the output all-gather: sums cp identical copies of dout's heads."""
    cp = dist.get_world_size(group)
    mine = take_heads(x, group)
    chunks = [c.contiguous() for c in x.chunk(cp, dim=1)]
    dist.reduce_scatter(mine, chunks, group=group)
    return mine


_ULYSSES_BACKWARD = UlyssesAttention.backward


def backward_reduce_scatter(ctx: object, dout: torch.Tensor) -> tuple:
    """Bug: the package's Ulysses backward with `reduce_scatter_heads` for `take_heads`, so in the
    replicated layout the backward of the output all-gather sums dout; the forward is untouched."""
    with patched({"paralab.cp.ulysses": {"take_heads": reduce_scatter_heads}}):
        return _ULYSSES_BACKWARD(ctx, dout)


def replicated_clinic_bug() -> Patches:
    """The clinic's second bug, for `run(..., patches=...)`: its wrong decision is in the backward only."""
    return {"paralab.cp.ulysses.UlyssesAttention": {"backward": backward_reduce_scatter}}


EXERCISES = [
    Exercise(
        name="merge_partials",
        lab=LAB,
        target="paralab.cp.blocks.merge_partials",
        prompt=(
            "Two partial attention results over disjoint key blocks arrive as `(out, lse)` and "
            "`(block_out, block_lse)`: each `out` is softmax-normalized over its own keys only, each `lse` "
            "is the log-sum-exp of its own scores, shape `(b, h, queries)`. Compute `new_lse`, the "
            "log-sum-exp over both blocks, and `out`, attention over both blocks. It must stay finite for "
            "scores in the thousands (the check uses some), so never form `exp(lse)` itself."
        ),
        hint="return (out, new_lse) with the shapes of (out, lse): attention over the union of both key "
        "blocks and the log-sum-exp of all their scores, finite even when scores are in the thousands",
        cases=_merge_cases,
        kinds=lambda world: MERGE_KINDS,
        hidden=_hidden_merge_cases,
        hidden_kinds=lambda world: HIDDEN_MERGE_KINDS,
        world_sizes=(0,),
        points=2,
        minutes=15,
        atol=1e-12,
        rtol=1e-12,
        normalize=_out_and_lse,
        bugs=[
            ("outputs added without rescaling", merge_without_rescaling, "case 0, out:"),
            (
                "outputs averaged, not weighted by their softmax mass",
                merge_by_plain_average,
                "case 0, out:",
            ),
            ("lse merged with max instead of logaddexp", merge_lse_by_max, "case 0, lse:"),
            (
                "merge in exp space (overflows on large scores)",
                merge_through_exp,
                "case 2, out: 45 NaN values",
            ),
        ],
    ),
    Exercise(
        name="pack_heads",
        lab=LAB,
        target="paralab.cp.ulysses.pack_heads",
        prompt=(
            "The first step of Ulysses' `seq_to_heads` (pack, exchange, unpack). A rank holds a contiguous "
            "sequence shard `x` of shape `(b, h, n/cp, d)`; the all-to-all sends block `j` of dim 0 to rank `j`, "
            "and rank `j` must end with head group `j` (heads `[j·h/cp, (j+1)·h/cp)`). Return the send buffer, "
            "`(cp, b, h/cp, n/cp, d)`, contiguous. The check tries cp = 2, 4 and 3."
        ),
        hint="reshape the heads into (cp, h/cp), then move that cp dim first (transpose with the batch dim)",
        cases=_pack_heads_cases,
        kinds=lambda world: CP_KINDS,
        hidden=_hidden_pack_heads_cases,
        hidden_kinds=lambda world: HIDDEN_CP_KINDS,
        points=2,
        minutes=10,
        bugs=[
            (
                "transpose missing: the batch is cut instead of the heads",
                pack_heads_without_transpose,
                "case 0: 90 of 180 elements differ",
            )
        ],
    ),
    Exercise(
        name="unpack_heads",
        lab=LAB,
        target="paralab.cp.ulysses.unpack_heads",
        prompt=(
            "The last step of `seq_to_heads`. The all-to-all returned `received`, `(cp, b, h/cp, n/cp, d)`, "
            "where block `i` is sequence shard `i` (from rank `i`) of this rank's heads. Return this rank's "
            "head shard of the whole sequence, `(b, h/cp, n, d)`, tokens in rank order."
        ),
        hint="move the block dim (the source rank = sequence shard) just before the tokens, then merge the two",
        cases=_received_cases,
        kinds=lambda world: CP_KINDS,
        hidden=_hidden_received_cases,
        hidden_kinds=lambda world: HIDDEN_CP_KINDS,
        points=1,
        minutes=10,
        bugs=[
            (
                "received shards interleaved instead of in rank order",
                unpack_heads_interleaved,
                "case 0:",
            )
        ],
    ),
    Exercise(
        name="pack_seq",
        lab=LAB,
        target="paralab.cp.ulysses.pack_seq",
        prompt=(
            "The first step of `heads_to_seq`, the inverse all-to-all. A rank holds `h/cp` heads of the whole "
            "sequence, `(b, h/cp, n, d)`; rank `j` must receive sequence shard `j` (tokens "
            "`[j·n/cp, (j+1)·n/cp)`). Return the send buffer, `(cp, b, h/cp, n/cp, d)`, contiguous."
        ),
        hint="cut the tokens into (cp, n/cp), then move that cp dim first",
        cases=_pack_seq_cases,
        kinds=lambda world: CP_KINDS,
        hidden=_hidden_pack_seq_cases,
        hidden_kinds=lambda world: HIDDEN_CP_KINDS,
        points=1,
        minutes=10,
        bugs=[
            (
                "tokens cut strided: every cp-th token instead of a contiguous shard",
                pack_seq_strided,
                "case 0:",
            )
        ],
    ),
    Exercise(
        name="unpack_seq",
        lab=LAB,
        target="paralab.cp.ulysses.unpack_seq",
        prompt=(
            "The last step of `heads_to_seq`. `received` is `(cp, b, h/cp, n/cp, d)`, block `i` being head group "
            "`i` (from rank `i`) of this rank's sequence shard. Return the sequence shard of all heads, "
            "`(b, h, n/cp, d)`, heads in rank order. Ulysses uses it for the output in the forward and for dq, "
            "dk, dv in the backward."
        ),
        hint="put the block dim (the source rank = head group) just before the heads it holds, then merge the two",
        cases=_received_cases,
        kinds=lambda world: CP_KINDS,
        hidden=_hidden_received_cases,
        hidden_kinds=lambda world: HIDDEN_CP_KINDS,
        points=1,
        minutes=5,
        bugs=[
            (
                "received head groups placed after this rank's heads",
                unpack_seq_heads_mixed,
                "case 0:",
            ),
            (
                "final transpose missing: source rank mixed into the batch",
                unpack_seq_without_transpose,
                "case 0:",
            ),
        ],
    ),
    Exercise(
        name="ring_pass",
        lab=LAB,
        target="paralab.cp.ring.ring_pass",
        prompt=(
            "One hop of the ring: start sending `t` to the next rank of `group` (`None` means the whole "
            "world) and receiving the previous rank's block into a new buffer, without waiting: return "
            "`(received, works)`, the works of `dist.batch_isend_irecv`. Peers of a P2P op are *global* "
            "ranks. The check waits on your works, on 2 and 4 ranks and on cp groups of 2 inside 4 ranks."
        ),
        hint="return (received, works) at once, without waiting: received is a new tensor that will hold the "
        "previous group member's t; works are the requests to wait on; peers of P2POp are global ranks",
        cases=_ring_cases,
        kinds=_ring_kinds,
        hidden=_hidden_ring_cases,
        hidden_kinds=_hidden_ring_kinds,
        hidden_world_sizes=(3, 4),
        world_sizes=(2, 4),
        points=2,
        minutes=15,
        normalize=_received,
        bugs=[
            (
                "the ring turns the wrong way (invisible on 2 ranks)",
                ring_pass_backwards,
                "world 4, rank 0, case 0:",
            ),
            (
                "the K/V block never moves (the bug clinic's)",
                ring_pass_kv_stays,
                "world 2, rank 0, case 0:",
            ),
        ],
    ),
]
