"""The primer's harness, in one process (the lab's nbval run already executes the distributed
jobs), and that an edited ring handed over with `patches=` is what the ring cost job runs."""

import pytest
import torch

from paralab.collectives import costs, runs
from paralab.exercises.lab00_primer import ring_starts_from_own_chunk
from paralab.launch import run

N = 4


@pytest.mark.parametrize("op", runs.OPS)
def test_expected_backward_is_the_transpose_of_expected_forward(op):
    """For a linear map A: <A x, g> == <x, A^T g>, summed over ranks."""
    after = runs.expected_forward(op, N)
    grads = runs.expected_backward(op, N)
    forward_side = sum(torch.dot(after[r], runs.upstream_grad(op, r, N)) for r in range(N))
    backward_side = sum(torch.dot(runs.op_input(op, r, N), grads[r]) for r in range(N))
    assert forward_side == backward_side


@pytest.mark.parametrize("n", [2, 4, 8, 1024])
def test_ring_costs(n):
    s = 1024 * n
    assert costs.reduce_scatter_bytes(s, n) == costs.all_gather_bytes(s, n) == (n - 1) * s // n
    assert costs.all_reduce_bytes(s, n) == 2 * (n - 1) * s // n
    assert costs.all_to_all_bytes(s, n) == (n - 1) * s // n


def test_unknown_collective_names_the_known_ones():
    with pytest.raises(ValueError, match="all_gather, reduce_scatter"):
        runs.expected_forward("allgather", N)


def test_the_ring_cost_job_runs_the_ring_it_is_handed():
    edit = {"paralab.collectives.ring": {"ring_reduce_scatter": ring_starts_from_own_chunk}}
    plain, edited = run(runs.ring_cost_job, 2, 8)[0], run(runs.ring_cost_job, 2, 8, patches=edit)[0]
    assert torch.equal(plain["reduce_scatter"]["by_hand"], plain["reduce_scatter"]["torch"])
    for name in ("reduce_scatter", "all_reduce"):  # the all-reduce starts with the reduce-scatter
        assert not torch.equal(edited[name]["by_hand"], edited[name]["torch"]), name
    assert torch.equal(edited["all_gather"]["by_hand"], edited["all_gather"]["torch"])
