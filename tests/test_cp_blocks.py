"""Pure logic of context parallelism: layouts, causal block bookkeeping, the log-sum-exp merge."""

import importlib
import inspect
import pkgutil

import pytest
import torch

import paralab.cp
from paralab.cp import (
    attention_block,
    attention_block_backward,
    causal_work,
    chunk_ids,
    kv_source,
    merge_partials,
    ring_blocks,
    shard_sequence,
    unshard_sequence,
)
from paralab.cp.layout import DIAGONAL, FULL, SKIP, block_kind


def _randn(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("cp", [1, 3, 4])
def test_shard_unshard_round_trip(cp, zigzag):
    x = torch.arange(2 * 3 * 2 * cp * 5 * 2, dtype=torch.float64).reshape(2, 3, 2 * cp * 5, 2)
    shards = [shard_sequence(x, r, cp, zigzag=zigzag) for r in range(cp)]
    assert torch.equal(unshard_sequence(shards, zigzag=zigzag), x)


def test_zigzag_rank_holds_chunks_r_and_mirror():
    assert [chunk_ids(r, 4, zigzag=True) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    positions = torch.arange(16).reshape(1, 1, 16, 1)
    assert shard_sequence(positions, 1, 4, zigzag=True).flatten().tolist() == [2, 3, 12, 13]


@pytest.mark.parametrize(
    "seq, cp, zigzag, needle", [(10, 4, False, "cp = 4"), (12, 4, True, "2*cp = 8")]
)
def test_indivisible_sequence_is_a_clear_error(seq, cp, zigzag, needle):
    with pytest.raises(ValueError, match=rf"sequence length {seq} \(dim 2\).*{needle}"):
        shard_sequence(torch.zeros(1, 1, seq, 1), 0, cp, zigzag=zigzag)


def test_block_kinds_and_ring_sources():
    assert [block_kind(2, c, causal=True) for c in (1, 2, 3)] == [FULL, DIAGONAL, SKIP]
    assert block_kind(2, 3, causal=False) == FULL
    assert [kv_source(0, s, 4) for s in range(4)] == [0, 3, 2, 1]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_balances_causal_work_and_contiguous_does_not(cp):
    def total(rank, zigzag):
        return sum(causal_work(rank, s, cp, causal=True, zigzag=zigzag) for s in range(cp))

    contiguous = [total(r, False) for r in range(cp)]
    zigzag = [total(r, True) for r in range(cp)]
    assert contiguous == [r + 0.5 for r in range(cp)]  # rank r: r full blocks and one triangle
    assert zigzag == [cp / 2] * cp
    assert sum(contiguous) == sum(zigzag) == cp * cp / 2
    # every zigzag step after the first is exactly half a block on every rank
    assert {
        causal_work(r, s, cp, causal=True, zigzag=True) for r in range(cp) for s in range(1, cp)
    } == {0.5}


def test_every_query_chunk_meets_every_visible_key_chunk_exactly_once():
    cp = 4
    for zigzag in (False, True):
        for rank in range(cp):
            seen = [
                (
                    chunk_ids(rank, cp, zigzag=zigzag)[i],
                    chunk_ids(kv_source(rank, s, cp), cp, zigzag=zigzag)[j],
                )
                for s in range(cp)
                for i, j, _ in ring_blocks(rank, s, cp, causal=True, zigzag=zigzag)
            ]
            want = [(q, k) for q in chunk_ids(rank, cp, zigzag=zigzag) for k in range(q + 1)]
            assert sorted(seen) == sorted(want)


def _reference(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def test_merge_of_key_blocks_equals_attention_over_all_keys():
    q, k, v = (
        _randn(2, 3, 7, 5, seed=s) * 4 for s in range(3)
    )  # large scores: the merge must stay stable
    k9, v9 = (
        torch.cat([k, _randn(2, 3, 2, 5, seed=7)], 2),
        torch.cat([v, _randn(2, 3, 2, 5, seed=8)], 2),
    )
    blocks = [attention_block(q, k9[:, :, a:b], v9[:, :, a:b]) for a, b in ((0, 2), (2, 5), (5, 9))]
    out, lse = blocks[0]
    for block in blocks[1:]:
        out, lse = merge_partials(out, lse, *block)
    expected = _reference(q, k9, v9, False)
    assert (out - expected).abs().max() <= 1e-12 * expected.abs().max()
    assert torch.allclose(
        lse, torch.logsumexp(q @ k9.transpose(-2, -1) * 5**-0.5, -1), rtol=0, atol=1e-12
    )


def test_merge_stays_finite_when_a_whole_block_is_masked():
    """A query row that sees no key of a block (padding, packed sequences) gets the partial (0, -inf)."""
    q, k, v = (_randn(1, 2, 4, 3, seed=s) for s in range(3))
    seen_out, seen_lse = attention_block(q, k, v)
    masked_out, masked_lse = torch.zeros_like(seen_out), torch.full_like(seen_lse, float("-inf"))
    # masked on both sides: -inf - (-inf) would be NaN; the merge keeps (0, -inf)
    out, lse = merge_partials(masked_out, masked_lse, masked_out, masked_lse)
    assert torch.equal(out, masked_out) and torch.equal(lse, masked_lse)
    # a masked block merged with a seen one, in either order, leaves the seen one exactly as it was
    for pair in (
        (masked_out, masked_lse, seen_out, seen_lse),
        (seen_out, seen_lse, masked_out, masked_lse),
    ):
        out, lse = merge_partials(*pair)
        assert torch.equal(out, seen_out) and torch.equal(lse, seen_lse)
    # one row masked everywhere, the others not: the masked row stays 0, the others are untouched
    row_lse = seen_lse.clone()
    row_lse[..., 1] = float("-inf")
    row_out = seen_out.clone()
    row_out[..., 1, :] = 0
    out, lse = merge_partials(row_out, row_lse, masked_out, masked_lse)
    assert not out.isnan().any() and torch.equal(out, row_out) and torch.equal(lse, row_lse)


def test_merge_without_rescaling_is_caught():
    q, k, v = (_randn(1, 2, 4, 3, seed=s) for s in range(3))
    (o1, _), (o2, _) = (
        attention_block(q, k[:, :, :2], v[:, :, :2]),
        attention_block(q, k[:, :, 2:], v[:, :, 2:]),
    )
    unscaled = o1 + o2
    expected = _reference(q, k, v, False)
    assert (unscaled - expected).abs().max() > 1e-3


@pytest.mark.parametrize("diagonal", [False, True])
def test_block_backward_equals_autograd(diagonal):
    q, k, v = (_randn(2, 3, 6, 4, seed=s).requires_grad_() for s in range(3))
    dout = _randn(2, 3, 6, 4, seed=9)
    out = _reference(q, k, v, diagonal)
    out.backward(dout)
    _, lse = attention_block(q.detach(), k.detach(), v.detach(), diagonal=diagonal)
    delta = (dout * out.detach()).sum(-1)
    grads = attention_block_backward(
        dout, q.detach(), k.detach(), v.detach(), lse, delta, diagonal=diagonal
    )
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        assert (got - want).abs().max() <= 1e-12 * want.abs().max()


def _public_callables(module):
    """Every public function of `module`, and every public class it defines with the methods written in it."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield obj
        elif inspect.isclass(obj):
            yield obj
            yield from (
                m
                for _, m in inspect.getmembers(obj, inspect.isfunction)
                if m.__qualname__.startswith(f"{obj.__name__}.")
            )


def test_no_public_cp_function_calls_the_cp_size_world():
    """In paralab.cp a group's size is `cp`; `world` is only the launched processes (paralab's docstring)."""
    modules = [
        importlib.import_module(f"paralab.cp.{m.name}")
        for m in pkgutil.iter_modules(paralab.cp.__path__)
    ]
    offenders = [
        f"{fn.__module__}.{fn.__qualname__}"
        for module in modules
        for fn in _public_callables(module)
        if "world" in inspect.signature(fn).parameters
    ]
    assert len(modules) >= 7 and not offenders, (
        f"parameters named `world` (call a cp group's size `cp`): {offenders}"
    )
