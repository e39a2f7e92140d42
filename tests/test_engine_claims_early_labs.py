"""What the primer's and lab 00's chapters say torch and the descriptor do, run on CPU.

labs/00_collectives_primer/02_collectives_inside_autograd.md and the lab 00 chapters cite
these tests by name: which reduce ops `torch.distributed.nn`'s all-reduce differentiates
correctly with its same-op backward, that the overlay mesh's cp and cfgp slices are different
process groups although the upstream docstring says they "share the same backing process
group", and that `cfgp=2` needs `enable_inference_mode=True`. That a bad `dp_replicate` is
refused even under `python -O` is tests/test_parallel_dims.py's, beside every other bad value.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_reduce

from paralab.launch import run
from paralab.parallel_dims import ParallelDims

OPS = ("SUM", "AVG", "MAX", "MIN", "PRODUCT")
REFERENCE = {
    "SUM": lambda stacked: stacked.sum(0),
    "AVG": lambda stacked: stacked.mean(0),
    "MAX": lambda stacked: stacked.amax(0),
    "MIN": lambda stacked: stacked.amin(0),
    "PRODUCT": lambda stacked: stacked.prod(0),
}
WEIGHTS = torch.tensor([1.0, 2.0, -1.5], dtype=torch.float64)


def rank_input(rank: int) -> torch.Tensor:
    """Distinct values per rank and per column, so MAX and MIN have no ties."""
    return torch.tensor([1.0 + rank, 3.0 - rank, 0.5 + 2 * rank], dtype=torch.float64)


def rank_loss(y: torch.Tensor, rank: int) -> torch.Tensor:
    """Each rank's loss weighs the reduced tensor differently, so the ranks' gradients differ."""
    return (y * WEIGHTS * (rank + 1)).sum()


def _all_reduce_gradients() -> dict[str, list[float]]:
    """On each rank: the gradient of the summed losses through an autograd all-reduce per op."""
    gradients = {}
    for op in OPS:
        x = rank_input(dist.get_rank()).requires_grad_()
        y = all_reduce(x, op=getattr(dist.ReduceOp, op))
        rank_loss(y, dist.get_rank()).backward()
        gradients[op] = x.grad.tolist()
    return gradients


def reference_gradients(op: str, world: int) -> list[list[float]]:
    """One process: the same reduction over stacked inputs, every rank's loss summed."""
    inputs = [rank_input(rank).requires_grad_() for rank in range(world)]
    y = REFERENCE[op](torch.stack(inputs))
    sum(rank_loss(y, rank) for rank in range(world)).backward()
    return [x.grad.tolist() for x in inputs]


@pytest.fixture(scope="module")
def all_reduce_gradients():
    return run(_all_reduce_gradients, 2, timeout=120)


@pytest.mark.parametrize("op", OPS)
def test_same_op_all_reduce_backward(all_reduce_gradients, op):
    """The same-op backward is exact for SUM and AVG, and wrong for MAX, MIN and PRODUCT."""
    ranks = [gradients[op] for gradients in all_reduce_gradients]
    reference = reference_gradients(op, len(ranks))
    if op in ("SUM", "AVG"):
        assert ranks == reference
    else:
        assert all(got != want for got, want in zip(ranks, reference))


def _overlay_groups() -> dict[str, list[int]]:
    pd = ParallelDims(4, cp=2, cfgp=2, enable_inference_mode=True)
    meshes = pd.build_meshes("cpu")
    groups = {axis: meshes[axis].get_group() for axis in ("cp", "cfgp")}
    ranks = {axis: dist.get_process_group_ranks(group) for axis, group in groups.items()}
    return {**ranks, "same group": groups["cp"] is groups["cfgp"]}


def test_cp_and_cfgp_of_one_overlay_mesh_are_different_groups():
    results = run(_overlay_groups, 4, timeout=120)
    for rank, groups in enumerate(results):
        assert groups["same group"] is False
        assert groups["cp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert groups["cfgp"] == [rank % 2, rank % 2 + 2]


def test_cfgp_2_needs_inference_mode():
    with pytest.raises(ValueError, match="enable_inference_mode"):
        ParallelDims(8, dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2)
    pd = ParallelDims(8, dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2, enable_inference_mode=True)
    assert (pd.dp_replicate, pd.dp_shard, pd.cfgp, pd.cp, pd.lb) == (2, 4, 2, 2, 2)
