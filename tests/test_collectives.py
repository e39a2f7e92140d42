"""The primer's harness, in one process: the lab's nbval run already executes the distributed jobs."""

import pytest
import torch

from paralab.collectives import costs, runs

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
