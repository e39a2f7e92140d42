"""Small float64 models the labs train and check element by element against one process."""
from __future__ import annotations

import torch
from torch import nn


# ======================================================================
# Lab 01 (FSDP / HSDP): a stack of residual MLP blocks plus a linear head.
# Each block and the head is one FSDP unit. Sizes are chosen so that the
# units do not divide evenly by 2, 4 or 8 ranks (padding is exercised) and
# the head is so small that some ranks hold nothing but padding.
# ======================================================================
class MLPBlock(nn.Module):
    """x + fc2(tanh(fc1(x))): two Linear layers with biases, one residual."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class MLPStack(nn.Module):
    """`n_blocks` residual MLP blocks then a Linear head; `units()` lists the FSDP units in order."""

    def __init__(self, width: int = 5, hidden: int = 7, n_blocks: int = 3, out: int = 1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(width, hidden) for _ in range(n_blocks))
        self.head = nn.Linear(width, out)

    def units(self) -> list[nn.Module]:
        return [*self.blocks, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units():
            x = unit(x)
        return x


def make_mlp_stack(seed: int = 0, width: int = 5, hidden: int = 7, n_blocks: int = 3, out: int = 1) -> MLPStack:
    """The same float64 weights in every process that calls it with the same seed."""
    torch.manual_seed(seed)
    return MLPStack(width, hidden, n_blocks, out).double()


def regression_data(batch: int, width: int = 5, out: int = 1, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed float64 global batch (inputs, targets)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, width, generator=g, dtype=torch.float64)
    y = torch.randn(batch, out, generator=g, dtype=torch.float64)
    return x, y
