"""Ring and Ulysses attention on real gloo ranks: output and dq/dk/dv vs single-process SDPA, bytes vs formulas.

One launch per cp runs every configuration (causal or not, contiguous or zigzag,
both Ulysses layouts) and returns results plus ledger records for each.
"""

import pytest
import torch
import torch.distributed as dist

import paralab.cp as cp
from paralab import ParallelDims
from paralab.check import assert_match, compare
from paralab.cp.runs import (
    CONFIGS,
    CPConfig,
    assemble,
    attend,
    check_bytes,
    check_config,
    cp_worker,
    rank_inputs,
    sdpa_reference,
)
from paralab.exercises.lab02 import (
    merge_without_rescaling,
    pack_heads_without_transpose,
    pack_seq_strided,
    replicated_clinic_bug,
    ring_clinic_bug,
    unpack_heads_interleaved,
    unpack_seq_heads_mixed,
)
from paralab.launch import LaunchError, run


def _shape(world):
    """Not powers of two: 3 query rows per zigzag chunk, 3 heads per rank, head_dim 5."""
    return 2, 3 * world, 2 * world * 3, 5


def _tensors(world, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(*_shape(world), dtype=torch.float64, generator=g) for _ in range(4)
    ]  # q, k, v, dout


def _failed(verdicts):
    return [v.describe() for v in verdicts if not v.passed]


def _results(per_rank):
    return [[r["results"][i] for r in per_rank] for i in range(len(per_rank[0]["results"]))]


@pytest.fixture(scope="module", params=[2, 3, 4, 8])
def launched(request):
    world = request.param
    full = _tensors(world)
    return world, full, _results(run(cp_worker, world, full, CONFIGS, timeout=120))


@pytest.mark.parametrize(
    "index", range(len(CONFIGS)), ids=[c.name.replace(" ", "-") for c in CONFIGS]
)
def test_matches_sdpa_forward_and_backward(launched, index):
    _, full, per_config = launched
    assert not _failed(check_config(per_config[index], CONFIGS[index], full))


@pytest.mark.parametrize(
    "index", range(len(CONFIGS)), ids=[c.name.replace(" ", "-") for c in CONFIGS]
)
def test_bytes_per_rank_equal_formula(launched, index):
    world, _, per_config = launched
    assert not _failed(check_bytes(per_config[index], CONFIGS[index], _shape(world)))


MERGE_BUG = {"paralab.cp.ring": {"merge_partials": merge_without_rescaling}}


def _correct_and_buggy(world, full, config, patches):
    """The package's cp_worker on one config, launched as it is and then with `patches`."""
    return tuple(
        [r["results"][0] for r in run(cp_worker, world, full, [config], patches=bug)]
        for bug in (None, patches)
    )


@pytest.mark.parametrize(
    "patches, forward_right",
    [(MERGE_BUG, False), (ring_clinic_bug(), True)],
    ids=["merge-without-rescaling", "ring-clinic-bug"],
)
def test_broken_variants_are_caught(patches, forward_right):
    """Both bugs fail the check; the clinic's ring bug is in the backward only, so `out` still matches."""
    world, config = 2, CPConfig("ring", causal=True, zigzag=True)
    full = _tensors(world, seed=1)
    good, bad = _correct_and_buggy(world, full, config, patches)
    assert not _failed(check_config(good, config, full))
    assert _failed(check_config(bad, config, full))
    ref = sdpa_reference(full, causal=True)["out"]
    out = compare(assemble(bad, config)["out"], ref, atol=1e-12 * ref.abs().max().item())
    assert (not _failed(out)) == forward_right


@pytest.mark.parametrize(
    "step, bug",
    [
        ("pack_heads", pack_heads_without_transpose),
        ("unpack_heads", unpack_heads_interleaved),
        ("pack_seq", pack_seq_strided),
        ("unpack_seq", unpack_seq_heads_mixed),
    ],
)
def test_each_ulysses_step_bug_breaks_the_real_attention(step, bug):
    """Each exercise's bug variant, planted as one step of the real Ulysses loop, fails the same check."""
    world, config = 2, CPConfig("ulysses", causal=True)
    full = _tensors(world, seed=3)
    bad = run(cp_worker, world, full, [config], patches={"paralab.cp.ulysses": {step: bug}})
    assert _failed(check_config([r["results"][0] for r in bad], config, full))


def test_replicated_backward_by_reduce_scatter_gives_cp_times_the_gradient():
    """The bug clinic's second case: the backward of the output all-gather must slice dout, not sum it."""
    world, config = 2, CPConfig("ulysses", causal=False, layout="replicated")
    good, bad = _correct_and_buggy(world, _tensors(world, seed=2), config, replicated_clinic_bug())
    for rank in range(world):
        assert torch.equal(bad[rank]["out"], good[rank]["out"])  # the bug is in the backward only
        for name in ("dq", "dk", "dv"):
            assert torch.equal(bad[rank][name], world * good[rank][name])


def _heads_error(world):
    q = torch.zeros(1, world + 1, 2, 3, dtype=torch.float64)
    cp.ulysses_attention(q, q, q)


def test_indivisible_heads_is_a_clear_error_on_every_rank():
    with pytest.raises(
        LaunchError, match=r"heads = 5 \(dim 1\) is not divisible by cp = 4"
    ) as info:
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
    out = []
    for config in SUBGROUP_CONFIGS:
        q, k, v, dout = rank_inputs(full, config, rank, cp_size)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = attend(config, q, k, v, group)
        o.backward(dout)
        out.append({"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad})
    return out


SUBGROUP_CONFIGS = [CPConfig("ring", causal=True, zigzag=True), CPConfig("ulysses", causal=True)]


@pytest.mark.parametrize("world, cp_size", [(4, 2), (1, 1)])
def test_cp_subgroups_use_their_own_peers(world, cp_size):
    """Two independent rings (world 4, cp 2) on different data, and the trivial cp = 1."""
    fulls = [_tensors(2, seed=10 + i) for i in range(world // cp_size)]
    per_rank = run(_two_rings_worker, world, fulls, cp_size)
    for i, full in enumerate(fulls):
        ranks = per_rank[i * cp_size : (i + 1) * cp_size]
        ref = sdpa_reference(full, True)
        for c, config in enumerate(SUBGROUP_CONFIGS):
            got = assemble([r[c] for r in ranks], config)
            for name, want in ref.items():
                assert_match(
                    got[name],
                    want,
                    atol=1e-12 * want.abs().max().item(),
                    name=f"group {i} {config.name} {name}",
                )


def _refusals(attention):
    """Rank 1 passes q float32 with k/v float64, rank 0 good inputs; then both call again."""
    rank = dist.get_rank()
    good = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    q = good.float() if rank == 1 else good
    try:
        attention(q, good, good)
        message = None
    except ValueError as error:
        message = str(error)
    return message, attention(good, good, good).shape  # the next call runs, nothing hangs


@pytest.mark.parametrize("attention", [cp.ring_attention, cp.ulysses_attention])
def test_mismatched_dtypes_are_refused_on_every_rank_before_any_exchange(attention):
    (msg0, shape0), (msg1, shape1) = run(_refusals, 2, attention, timeout=20)
    assert "float32, torch.float64, torch.float64" in msg1
    assert "rank(s) [1] of the group refused their inputs" in msg0
    assert shape0 == shape1 == (1, 2, 4, 3)


def _unequal_shards(attention):
    seq = 2 + 2 * dist.get_rank()
    q = torch.zeros(1, 2, seq, 3, dtype=torch.float64)
    attention(q, q, q)


@pytest.mark.parametrize("attention", [cp.ring_attention, cp.ulysses_attention])
def test_unequal_shard_lengths_are_named_on_every_rank(attention):
    with pytest.raises(LaunchError, match=r"sequence lengths \(dim 2\) rank 0: 2, rank 1: 4"):
        run(_unequal_shards, 2, attention, timeout=20)


def _outside_the_group():
    group = dist.new_group([0, 1])
    if dist.get_rank() != 2:
        return None
    q = torch.zeros(1, 2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"global rank 2 is not in the group \(ranks \[0, 1\]\)"):
        cp.ring_attention(q, q, q, group)
    with pytest.raises(ValueError, match="global rank 2 is not in the group"):
        cp.ulysses_attention(q, q, q, group)
    return "refused"


def test_a_rank_outside_the_group_is_told_so():
    assert run(_outside_the_group, 3, timeout=20) == [None, None, "refused"]


def test_head_dim_zero_is_refused_with_its_value():
    q = torch.zeros(1, 2, 4, 0, dtype=torch.float64)
    for attention in (cp.ring_attention, cp.ulysses_attention):
        with pytest.raises(ValueError, match=r"head_dim = 0 \(dim 3\) in \(1, 2, 4, 0\)"):
            attention(q, q, q)
