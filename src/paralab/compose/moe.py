"""The MoE variant of the composed model: each block's MLP replaced by lab 09's `MoELayer`.

The experts are tensor-parallel over tp (etp = tp, as torchtitan's ETP=TP): each expert's
fc1 column-parallel and fc2 row-parallel (`tp.layers`), and split over the ep group carved
from dp_shard × cp (`ep.model.shard_experts`). The experts' tp partners must hold the same
tokens and the same (replicated) router, so they route alike and dispatch to the same experts'
shards. Under sequence parallelism each tp rank holds s/tp tokens between the tp regions, so
the layer gathers its partners' tokens in front (`tp.mappings.gather_to_duplicated`: the
backward keeps this rank's shard of a gradient every rank holds whole) and keeps its own
shard behind (`tp.mappings.scatter_to_sp`: the backward all-gathers). Megatron routes each
rank's own tokens instead and gathers them over the expert tp group inside its token
dispatcher, after the ep all-to-all; gathering in front of the router runs lab 09's layer
unchanged, at the price of routing every token on every tp rank.

Gradients: the layer's parameters (router, experts) saw every token of the micro-batch on
every tp rank, so under SP their gradients are not partial sums over tp (`saw_every_token`).
A rank's expert gradient already sums the tokens of its whole ep group (combine's
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
from paralab.tp.mappings import gather_to_duplicated, scatter_to_sp
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
    """An MoE layer where a block's MLP was: (batch, seq, hidden) in and out; keeps its aux loss.
    Under SP (`sequence_group`, the tp group) it takes and returns this rank's seq/tp tokens."""

    def __init__(self, layer: MoELayer) -> None:
        super().__init__()
        self.moe, self.config = layer, layer.config
        self.aux: torch.Tensor | None = None
        self.routings: list[Routing] = []
        """Every forward's routing, in order: the counts the bytes formula reads."""
        self.aux_grad: float | None = None
        """On the ranks: d(loss)/d(aux) per micro-batch, carried by `AuxLossAutoScaler`."""
        self.sequence_group: dist.ProcessGroup | None = None
        """Under SP, the tp group whose sequence shards the layer gathers and splits again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_group is not None:  # every tp rank: the micro-batch's every token
            x = gather_to_duplicated(x, self.sequence_group)
        y, routing = self.moe(x.reshape(-1, x.shape[-1]))
        self.aux = routing.aux
        self.routings.append(routing)
        if self.aux_grad is not None:
            y = AuxLossAutoScaler.apply(y, routing.aux, self.aux_grad)
        y = y.reshape(x.shape)
        return y if self.sequence_group is None else scatter_to_sp(y, self.sequence_group)


def with_experts(lm: TinyLM, seed: int) -> TinyLM:
    """Every block's MLP swapped for an MoE layer drawn from (seed, block): the same in every process."""
    config = moe_config(lm.sizes)
    for i, block in enumerate(lm.blocks):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(10_000 + 100 * seed + i)
            block.mlp = MoEMLP(MoELayer(config).double())
    return lm


def expert_parallel(
    lm: TinyLM,
    tp_group: dist.ProcessGroup,
    ep_group: dist.ProcessGroup,
    sequence_parallel: bool = False,
) -> None:
    """Each expert cut over tp (fc1 column, fc2 row), then only this rank's experts kept over ep;
    under SP each MoE layer gathers the tp group's tokens in front and splits them behind."""
    for block in lm.blocks:
        for expert in block.mlp.moe.experts.values():
            expert.fc1 = ColumnParallelLinear(expert.fc1, tp_group)
            expert.fc2 = RowParallelLinear(expert.fc2, tp_group)
        shard_experts(block.mlp, ep_group)
        block.mlp.sequence_group = tp_group if sequence_parallel else None


def aux_loss(modules: list[nn.Module]) -> torch.Tensor | int:
    """aux_coef · the sum of the aux losses the MoE layers kept from their last forward."""
    layers = [m for m in modules if isinstance(getattr(m, "aux", None), torch.Tensor)]
    return sum(m.config.aux_coef * m.aux for m in layers)


def is_expert(name: str) -> bool:
    return ".mlp.moe.experts." in name


def saw_every_token(name: str) -> bool:
    """A parameter of an MoE layer (router, experts): under SP the layer gathers the tp group's
    tokens, so its gradient is already whole on every tp rank, not a partial sum over tp."""
    return ".mlp.moe." in name
