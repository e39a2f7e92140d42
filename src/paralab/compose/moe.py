"""The MoE variant of the composed model: each block's MLP replaced by lab 09's `MoELayer`.

The experts are tensor-parallel over tp (etp = tp, as torchtitan's ETP=TP): each expert's
fc1 column-parallel and fc2 row-parallel (`tp.layers`), and split over the ep group carved
from dp_shard × cp (`ep.model.shard_experts`). tp partners hold the same tokens and the
same (replicated) router, so they route alike and dispatch to the same experts' shards.

Gradients: a rank's expert gradient already sums the tokens of its whole ep group (combine's
backward brought them); the ranks holding the same experts are its dp_shard_mod_ep group
(× dp_replicate). The loss is already divided by the global token count, so the expert
gradient is that sum summed once more over dp_shard_mod_ep × dp_replicate, nothing divided:
a mean would have to divide by |dp_cp| = |dp_shard_mod_ep| · |dp_replicate| · ep, not by the
reduce-scatter's group alone.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paralab.ep.model import MoEConfig, MoELayer, Routing, shard_experts
from paralab.tp.layers import ColumnParallelLinear, RowParallelLinear
from paralab.tp.model import LMConfig, TinyLM


def moe_config(config: LMConfig) -> MoEConfig:
    """4 experts, top-2, no capacity limit, on the LM's hidden width; each expert 2·hidden wide."""
    return MoEConfig(experts=4, top_k=2, dim=config.hidden, hidden=2 * config.hidden)


class AuxLossAutoScaler(torch.autograd.Function):
    """Megatron's `MoEAuxLossAutoScaler`: the output passes unchanged, and its backward hands the
    aux loss the gradient `scale`. So the aux loss of a layer on any pipeline stage joins the
    backward there, with no term in the last stage's loss."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        return grad_output, torch.ones_like(aux) * ctx.scale, None


class MoEMLP(nn.Module):
    """An MoE layer where a block's MLP was: (batch, seq, hidden) in and out; keeps its aux loss."""

    def __init__(self, layer: MoELayer) -> None:
        super().__init__()
        self.moe, self.config = layer, layer.config
        self.aux: torch.Tensor | None = None
        self.routings: list[Routing] = []
        """Every forward's routing, in order: the counts the bytes formula reads."""
        self.aux_grad: float | None = None
        """On the ranks: d(loss)/d(aux) per micro-batch, carried by `AuxLossAutoScaler`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, routing = self.moe(x.reshape(-1, x.shape[-1]))
        self.aux = routing.aux
        self.routings.append(routing)
        if self.aux_grad is not None:
            y = AuxLossAutoScaler.apply(y, routing.aux, self.aux_grad)
        return y.reshape(x.shape)


def with_experts(lm: TinyLM, seed: int) -> TinyLM:
    """Every block's MLP swapped for an MoE layer drawn from (seed, block): the same in every process."""
    config = moe_config(lm.sizes)
    for i, block in enumerate(lm.blocks):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(10_000 + 100 * seed + i)
            block.mlp = MoEMLP(MoELayer(config).double())
    return lm


def expert_parallel(lm: TinyLM, tp_group: dist.ProcessGroup, ep_group: dist.ProcessGroup) -> None:
    """Each expert cut over tp (fc1 column, fc2 row), then only this rank's experts kept over ep."""
    for block in lm.blocks:
        for expert in block.mlp.moe.experts.values():
            expert.fc1 = ColumnParallelLinear(expert.fc1, tp_group)
            expert.fc2 = RowParallelLinear(expert.fc2, tp_group)
        shard_experts(block.mlp, ep_group)


def aux_loss(modules: list[nn.Module]) -> torch.Tensor | int:
    """aux_coef · the sum of the aux losses the MoE layers kept from their last forward."""
    layers = [m for m in modules if isinstance(getattr(m, "aux", None), torch.Tensor)]
    return sum(m.config.aux_coef * m.aux for m in layers)


def is_expert(name: str) -> bool:
    return ".mlp.moe.experts." in name
