"""`paralab.patches`: a patch keyed by the defining module reaches every module that imported the name."""

import torch

import paralab.cp as cp
import paralab.cp.blocks as blocks
import paralab.cp.ring as ring
from paralab.launch import run
from paralab.patches import patched


def _merge_that_marks(*args):
    """A stand-in merge: the ring's output becomes all sevens wherever it merged two blocks."""
    out, lse = _ORIGINAL(*args)
    return torch.full_like(out, 7.0), lse


_ORIGINAL = blocks.merge_partials


def test_a_patch_reaches_the_modules_that_imported_the_name():
    with patched({"paralab.cp.blocks": {"merge_partials": _merge_that_marks}}):
        assert ring.merge_partials is _merge_that_marks  # `from paralab.cp.blocks import ...`
        assert blocks.merge_partials is _merge_that_marks
        assert cp.merge_partials is _merge_that_marks  # the package's re-export
    assert ring.merge_partials is _ORIGINAL and cp.merge_partials is _ORIGINAL


def test_a_constant_is_replaced_only_where_it_is_named():
    """Only callables are followed into other modules: an int or a tuple may be shared by chance."""
    from paralab.cp import ring as ring_module

    tag = ring_module.KV_TAG
    with patched({"paralab.cp.ring": {"KV_TAG": tag + 1}}):
        assert ring_module.KV_TAG == tag + 1
    assert ring_module.KV_TAG == tag


def _ring_output(cp_size: int) -> torch.Tensor:
    """On every rank: ring attention on a fixed input, this rank's output shard."""
    import torch.distributed as dist

    from paralab.cp.ring import ring_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4 * cp_size, 3, dtype=torch.float64) for _ in range(3))
    rank = dist.get_rank()
    shard = slice(4 * rank, 4 * rank + 4)
    return ring_attention(q[:, :, shard], k[:, :, shard], v[:, :, shard])


def test_the_defining_module_key_reaches_the_ring_on_every_rank():
    """Under forkserver; spawned ranks, which import the ring afresh, are checked in the one
    spawned launch of `test_warm_forkserver_launch_beats_spawn_and_patches_reach_spawned_ranks`."""
    edited = run(
        _ring_output, 2, 2, patches={"paralab.cp.blocks": {"merge_partials": _merge_that_marks}}
    )
    assert all(torch.all(out == 7.0) for out in edited)


def test_the_module_of_a_wrapping_bug_keeps_calling_the_original():
    """A variant that wraps the real function (as the lab 02 clinic's) must not call itself."""
    from paralab.exercises import lab02

    bug = lab02.ring_clinic_bug()
    with patched(bug):
        assert ring.ring_backward is lab02.ring_backward_kv_stays
        assert lab02.ring_backward is not lab02.ring_backward_kv_stays  # its own copy stays
