"""Ring and Ulysses attention on real gloo ranks: output and dq/dk/dv vs single-process SDPA, bytes vs formulas.

One launch per cp runs every configuration (causal or not, contiguous or zigzag,
both Ulysses layouts) and returns results plus ledger records for each.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import paralab.cp as cp
from paralab import ParallelDims
from paralab.check import CheckFailed, assert_match
from paralab.exercises.lab02 import break_replicated_backward, break_ring_backward, break_ring_merge
from paralab.launch import LaunchError, run
from paralab.ledger import Ledger

# (algorithm, causal, zigzag or layout)
CONFIGS = [
    ("ring", False, False), ("ring", True, False), ("ring", True, True), ("ring", False, True),
    ("ulysses", False, "sequence_sharded"), ("ulysses", True, "sequence_sharded"),
    ("ulysses", False, "replicated"), ("ulysses", True, "replicated"),
]


def _shape(world):
    """Not powers of two: 3 query rows per zigzag chunk, 3 heads per rank, head_dim 5."""
    return 2, 3 * world, 2 * world * 3, 5


def _tensors(world, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*_shape(world), dtype=torch.float64, generator=g) for _ in range(4)]  # q, k, v, dout


def _inputs(full, config, rank, world):
    algo, _, how = config
    if algo == "ulysses" and how == "replicated":
        return [t.clone() for t in full]
    return [cp.shard_sequence(t, rank, world, zigzag=how is True) for t in full]


def _attend(config, q, k, v):
    algo, causal, how = config
    if algo == "ring":
        return cp.ring_attention(q, k, v, causal=causal, zigzag=how)
    return cp.ulysses_attention(q, k, v, causal=causal, layout=how)


def _worker(full, configs, patch=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for config in configs:
        q, k, v, dout = _inputs(full, config, rank, world)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        with Ledger() as led:
            with led.phase("forward"):
                out = _attend(config, q, k, v)
            if patch:
                patch()
            with led.phase("backward"):
                out.backward(dout)
        results.append({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                        "sent": {p: led.total_sent(phase=p) for p in ("forward", "backward")}})
    return results


def _reference(full, causal):
    q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(full))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _per_rank_expected(ref, config, world):
    algo, _, how = config
    if algo == "ulysses" and how == "replicated":
        return [ref] * world
    return [{n: cp.shard_sequence(t, r, world, zigzag=how is True) for n, t in ref.items()} for r in range(world)]


def _check(results, full, config, world):
    """max |diff| <= 1e-12 relative to each reference tensor's largest magnitude."""
    expected = _per_rank_expected(_reference(full, config[1]), config, world)
    actual = [{n: r[n] for n in ("out", "dq", "dk", "dv")} for r in results]
    for name in ("out", "dq", "dk", "dv"):
        scale = max(e[name].abs().max().item() for e in expected)
        assert_match([a[name] for a in actual], [e[name] for e in expected], atol=1e-12 * scale, name=f"{config} {name}")


def _formula(config, world):
    b, h, n, d = _shape(world)
    s = cp.shard_bytes(b, h, n, d, world)
    algo, _, how = config
    return cp.ring_bytes(s, world) if algo == "ring" else cp.ulysses_bytes(s, world, how)


@pytest.fixture(scope="module", params=[2, 3, 4, 8])
def launched(request):
    world = request.param
    full = _tensors(world)
    return world, full, run(_worker, world, full, CONFIGS, timeout=120)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[f"{a}-{'causal' if c else 'full'}-{h}" for a, c, h in CONFIGS])
def test_matches_sdpa_forward_and_backward(launched, index):
    world, full, per_rank = launched
    _check([r[index] for r in per_rank], full, CONFIGS[index], world)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[f"{a}-{'causal' if c else 'full'}-{h}" for a, c, h in CONFIGS])
def test_bytes_per_rank_equal_formula(launched, index):
    world, _, per_rank = launched
    want = _formula(CONFIGS[index], world)
    assert [r[index]["sent"] for r in per_rank] == [want] * world


@pytest.mark.parametrize("when, broken", [("forward", break_ring_merge), ("backward", break_ring_backward)])
def test_broken_variants_are_caught(when, broken):
    world = 2
    full = _tensors(world, seed=1)
    config = ("ring", True, True)
    patch_forward = broken if when == "forward" else None

    def worker(full):
        if patch_forward:
            patch_forward()
        return _worker(full, [config], patch=None if patch_forward else broken)

    results = [r[0] for r in run(worker, world, full)]
    with pytest.raises(CheckFailed):
        _check(results, full, config, world)


def _replicated_grads(full, broken):
    q, k, v = (t.clone().requires_grad_() for t in full[:3])
    out = cp.ulysses_attention(q, k, v, layout="replicated")
    if broken:
        broken()
    out.backward(full[3])
    return torch.stack([q.grad, k.grad, v.grad])


def test_replicated_backward_by_reduce_scatter_gives_cp_times_the_gradient():
    """The bug clinic's second case: the backward of the output all-gather must slice dout, not sum it."""
    world = 2
    full = _tensors(world, seed=2)
    good = run(_replicated_grads, world, full, None)
    bad = run(_replicated_grads, world, full, break_replicated_backward)
    for rank in range(world):
        assert torch.equal(bad[rank], world * good[rank])


def _heads_error(world):
    q = torch.zeros(1, world + 1, 2, 3, dtype=torch.float64)
    cp.ulysses_attention(q, q, q)


def test_indivisible_heads_is_a_clear_error_on_every_rank():
    with pytest.raises(LaunchError, match=r"heads = 5 \(dim 1\) is not divisible by cp = 4") as info:
        run(_heads_error, 4, 4)
    # Every rank raises on its own; under heavy load a late-starting rank may still be
    # initializing when the launcher stops the rest, so it is reported as stopped.
    assert 0 in info.value.failed_ranks
    assert sorted(info.value.failed_ranks + info.value.hung_ranks) == [0, 1, 2, 3]


def test_odd_zigzag_shard_and_bad_layout_are_clear_errors():
    q = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"local sequence length 3 \(dim 2\) is odd"):
        cp.ring_attention(q, q, q, zigzag=True)
    with pytest.raises(ValueError, match="layout = 'heads'"):
        cp.ulysses_attention(q, q, q, layout="heads")
    with pytest.raises(ValueError, match="q, k, v shapes differ"):
        cp.ring_attention(q, q[:, :1], q)


def _two_rings_worker(fulls, cp_size):
    """cp groups from ParallelDims: each group of `cp_size` ranks attends over its own sequence."""
    pd = ParallelDims(dist.get_world_size(), cp=cp_size)
    pd.build_meshes("cpu")
    group = pd.cp_mesh.get_group() if pd.cp_enabled else None  # cp = 1 runs on a world of 1: WORLD
    rank = pd.cp_rank
    full = fulls[dist.get_rank() // cp_size]
    out = {}
    for algo in ("ring", "ulysses"):
        q, k, v, dout = (cp.shard_sequence(t, rank, cp_size, zigzag=algo == "ring") for t in full)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        if algo == "ring":
            o = cp.ring_attention(q, k, v, group, causal=True, zigzag=True)
        else:
            o = cp.ulysses_attention(q, k, v, group, causal=True)
        o.backward(dout)
        out[algo] = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return out


@pytest.mark.parametrize("world, cp_size", [(4, 2), (1, 1)])
def test_cp_subgroups_use_their_own_peers(world, cp_size):
    """Two independent rings (world 4, cp 2) on different data, and the trivial cp = 1."""
    fulls = [_tensors(2, seed=10 + i) for i in range(world // cp_size)]
    per_rank = run(_two_rings_worker, world, fulls, cp_size)
    for i, full in enumerate(fulls):
        ranks = per_rank[i * cp_size:(i + 1) * cp_size]
        ref = _reference(full, True)
        for algo in ("ring", "ulysses"):
            for name, want in ref.items():
                got = cp.unshard_sequence([r[algo][name] for r in ranks], zigzag=algo == "ring")
                assert_match(got, want, atol=1e-12 * want.abs().max().item(), name=f"group {i} {algo} {name}")
