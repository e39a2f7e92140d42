"""The model the pipeline cuts by depth: 8 residual blocks on (batch, seq, hidden) float64 tokens.

Every process builds all 8 blocks from the same seed, so a stage is simply the blocks it
keeps, and the one-process reference is the same blocks run in order. A stage boundary
carries one (batch, seq, hidden) activation forward and its gradient backward: b·s·h values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

N_BLOCKS = 8
MICRO_BATCH, SEQ, HIDDEN, FFN = 2, 3, 4, 5
"""One micro-batch: 2 samples of 3 tokens of width 4; each block's MLP is 5 wide."""
LEARNING_RATE = 0.1


class Block(nn.Module):
    """x + fc2(tanh(fc1(x))): per token, so any batch or sequence length goes through."""

    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


def make_blocks(seed: int = 0) -> nn.ModuleList:
    """The same 8 float64 blocks in every process that calls it with the same seed."""
    torch.manual_seed(seed)
    return nn.ModuleList(Block() for _ in range(N_BLOCKS)).double()


def stage_blocks(stage: int, n_stages: int) -> range:
    """Which blocks a (virtual) stage runs: as even a cut as 8 allows (3 stages: 2, 3, 3)."""
    return range(stage * N_BLOCKS // n_stages, (stage + 1) * N_BLOCKS // n_stages)


class Stage(nn.Module):
    """A contiguous run of blocks; its parameters keep the whole model's names (`blocks.3.fc1.weight`)."""

    def __init__(self, blocks: nn.ModuleList, stage: int, n_stages: int) -> None:
        super().__init__()
        self.index = stage
        self.ids = list(stage_blocks(stage, n_stages))
        self.blocks = nn.ModuleDict({str(i): blocks[i] for i in self.ids})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x

    def named_model_parameters(self) -> dict[str, nn.Parameter]:
        return {f"blocks.{name}": p for name, p in self.blocks.named_parameters()}


def microbatch_loss(output: torch.Tensor, target: torch.Tensor, microbatches: int) -> torch.Tensor:
    """One micro-batch's share of the global-batch loss: its mean squared error over m.

    The m micro-batches have the same size, so the sum of these shares is the mean over
    the whole global batch, and the accumulated gradient is that of one process on it.
    """
    ### BEGIN SOLUTION
    return F.mse_loss(output, target) / microbatches
    ### END SOLUTION


def global_batch(microbatches: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of one step: m micro-batches of MICRO_BATCH samples, drawn from (seed, step)."""
    g = torch.Generator().manual_seed(1000 * seed + step + 1)
    shape = (microbatches * MICRO_BATCH, SEQ, HIDDEN)
    return (
        torch.randn(shape, dtype=torch.float64, generator=g),
        torch.randn(shape, dtype=torch.float64, generator=g),
    )
