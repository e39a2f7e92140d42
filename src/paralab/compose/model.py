"""lab 07's `TinyLM`, cut three ways at once: by depth into pipeline stages, by heads and
features over tp, by the sequence over cp.

Nothing here is a new layer. `tp.model.tensor_parallel` cuts the model over the tp group;
`LMStage` keeps the part one pipeline stage runs (the embedding on the first, a run of
blocks, the final norm and head on the last), with the whole model's parameter names;
`context_parallel` swaps each attention's `attend` for `cp.ring.ring_attention` over the
cp group, on the zigzag layout (`cp.layout.shard_sequence`), and gives the position
table this rank's positions. The loss of a micro-batch is the vocab-parallel
cross-entropy summed over this rank's counted tokens, over the count of every data-parallel
rank's (`pp.executor.run_actions` takes it): torchtitan's normalisation.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paralab.cp.layout import shard_sequence
from paralab.cp.ring import ring_attention
from paralab.tp.cross_entropy import vocab_parallel_cross_entropy
from paralab.tp.model import LMConfig, TinyLM

CONFIG = LMConfig(vocab=16, hidden=16, heads=4, ffn=32, blocks=2, seq=8, batch=4)
"""Tiny: 4 heads (tp 2: 2 each), 8 tokens (cp 2 zigzag: 4 chunks of 2), 4 sequences per
sample (pp 2, m = 4: one sequence per micro-batch), 2 blocks (pp 2: one per stage)."""


def stage_blocks(stage: int, n_stages: int, blocks: int) -> range:
    """The blocks pipeline stage `stage` runs: an even cut of the model's blocks; or, where the
    stages divide blocks + 2 but not the blocks, the embedding and the head each counted as one
    layer (Megatron's `account_for_embedding_in_pipeline_split` and `..._loss_...`): the first
    and last stages run one block fewer (none, on 4 stages of 2 blocks)."""
    if blocks % n_stages and (blocks + 2) % n_stages:
        raise ValueError(f"{n_stages} stages divide neither the {blocks} blocks nor blocks + 2")
    ### BEGIN SOLUTION
    if blocks % n_stages == 0:
        per = blocks // n_stages
        return range(stage * per, (stage + 1) * per)
    per = (blocks + 2) // n_stages
    return range(max(stage * per - 1, 0), min((stage + 1) * per - 1, blocks))
    ### END SOLUTION


class LMStage(nn.Module):
    """One pipeline stage of a (tensor-parallel) TinyLM; parameter names as in the whole model."""

    def __init__(self, lm: TinyLM, stage: int, n_stages: int, positions: torch.Tensor) -> None:
        super().__init__()
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.positions = positions
        if self.first:
            self.embed, self.pos = lm.embed, lm.pos
        ids = stage_blocks(stage, n_stages, len(lm.blocks))
        self.blocks = nn.ModuleDict({str(i): lm.blocks[i] for i in ids})
        if self.last:
            self.norm, self.head = lm.norm, lm.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos[self.positions]
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def context_parallel(lm: TinyLM, group: dist.ProcessGroup) -> None:
    """Every attention attends by the ring over `group`, on zigzag sequence shards."""
    if dist.get_world_size(group) == 1:
        return
    for block in lm.blocks:
        block.attn.attend = functools.partial(ring_attention, group=group, causal=True, zigzag=True)


def positions_of(cp_rank: int, cp: int, seq: int) -> torch.Tensor:
    """The positions this cp rank's tokens hold: its two zigzag chunks (all of them at cp = 1)."""
    return shard_sequence(torch.arange(seq).unsqueeze(0), cp_rank, cp, dim=1, zigzag=cp > 1)[0]


IGNORE_INDEX = -100
"""A target no loss counts (padding): torch's and torchtitan's `ignore_index`."""


def lm_loss_sum(
    logits: torch.Tensor, targets: torch.Tensor, group: dist.ProcessGroup
) -> torch.Tensor:
    """The sum of cross-entropy over this rank's counted positions, from its vocab shard of the
    logits (an ignored target's position is multiplied by 0, so it adds nothing either way)."""
    logits, targets = logits.flatten(0, 1), targets.flatten()
    if dist.get_world_size(group) == 1:
        return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    counted = (targets != IGNORE_INDEX).to(logits.dtype)
    return (vocab_parallel_cross_entropy(logits, targets, group) * counted).sum()


def microbatch_lm_loss(group: dist.ProcessGroup, global_tokens: int):
    """The executor's loss(output, target, m): one micro-batch's summed cross-entropy over the
    tokens every data-parallel rank counts together (torchtitan's `global_valid_tokens`). An MoE
    layer's aux loss joins the backward on its own stage (`moe.AuxLossAutoScaler`)."""

    def loss(logits: torch.Tensor, targets: torch.Tensor, microbatches: int) -> torch.Tensor:
        return lm_loss_sum(logits, targets, group) / global_tokens

    return loss
