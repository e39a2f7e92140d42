"""A small float64 transformer with one MoE layer in place of its MLP, and its data.

    x = embed(tokens) + position
    x = x + attention(x)                      (causal, `heads` heads)
    h = x + moe(x)                            (router, top-k experts, capacity, shared expert)
    loss = cross_entropy(head(h), targets) + aux_coef * switch_aux_loss

`MoELayer` runs its experts in this process when it has no group (the one-process
reference: a plain loop over experts, no permutation), and by dispatch and combine over
its ep group otherwise, holding only that rank's experts. Sizes divide by 2, 3 and 4.

The production options, each off by default and each run the same way in the reference:
`grouped_mm` (the local experts as one batched matmul, `grouped`), `shared_experts` (a dense
MLP every token runs, beside the routed ones), `bias_rate` (aux-loss-free balancing,
`balance`), `score_before_experts` (the gate weight scales the expert's input, not its output).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paralab.ep.balance import biased_top_k
from paralab.ep.dispatch import combine, dispatch, run_local_experts
from paralab.ep.grouped import run_grouped_experts
from paralab.ep.router import capacity, capacity_keep, switch_aux_loss, top_k_route


@dataclass(frozen=True)
class MoEConfig:
    """The model, the routing and the optimizer: the same in every process."""

    experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = None
    renormalize: bool = False
    aux_coef: float = 0.01
    vocab: int = 12
    seq: int = 24
    dim: int = 12
    hidden: int = 24
    heads: int = 2
    gate_scale: float = 2.0
    """Router weights are drawn this many times larger than a default Linear's: an unbalanced start."""
    lr: float = 0.2
    grouped_mm: bool = False
    """Run the local experts as one batched matmul (`grouped.run_grouped_experts`)."""
    alignment: int = 8
    """Rows each expert's block is padded to a multiple of, for the grouped matmul."""
    shared_experts: int = 0
    """torchtitan's `num_shared_experts`: one dense MLP of hidden size `hidden` times this."""
    bias_rate: float | None = None
    """Aux-loss-free balancing: the per-expert bias moves this much a step; None: no bias."""
    score_before_experts: bool = False
    """Scale each row by its gate weight before its expert (torchtitan's default), not after."""

    def with_(self, **changes: object) -> MoEConfig:
        return replace(self, **changes)


@dataclass
class Routing:
    """One MoE layer's decisions on one rank's tokens, for the loss, the checks and the pictures."""

    probs: torch.Tensor
    weights: torch.Tensor
    experts: torch.Tensor
    keep: torch.Tensor
    aux: torch.Tensor
    send_counts: torch.Tensor | None = None
    recv_counts: torch.Tensor | None = None
    sent_tokens: torch.Tensor | None = None
    """The token of each row dispatch sent, in send order (ranks only)."""


class Expert(nn.Module):
    """fc2(tanh(fc1(x))): one expert's MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class MoELayer(nn.Module):
    """Router plus experts; `experts` holds this rank's experts only once `shard_experts` ran."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.dim, config.experts, bias=False)
        with torch.no_grad():
            self.gate.weight.mul_(config.gate_scale)
        self.experts = nn.ModuleDict(
            {str(e): Expert(config.dim, config.hidden) for e in range(config.experts)}
        )
        self.shared = (
            Expert(config.dim, config.hidden * config.shared_experts)
            if config.shared_experts
            else None
        )
        self.register_buffer("expert_bias", torch.zeros(config.experts))
        self.group: dist.ProcessGroup | None = None

    def route(self, x: torch.Tensor) -> Routing:
        c = self.config
        probs = torch.softmax(self.gate(x), dim=-1)
        if c.bias_rate is None:
            weights, experts = top_k_route(probs, c.top_k, c.renormalize)
        else:
            weights, experts = biased_top_k(probs, self.expert_bias, c.top_k, c.renormalize)
        slots = capacity(x.shape[0], c.experts, c.top_k, c.capacity_factor)
        keep = capacity_keep(experts, c.experts, slots)
        return Routing(probs, weights, experts, keep, switch_aux_loss(probs, experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        routing = self.route(x)
        if self.group is None:
            return self.one_process(x, routing), routing
        c = self.config
        rows, plan = dispatch(
            x,
            routing.weights,
            routing.experts,
            routing.keep,
            c.experts,
            self.group,
            c.score_before_experts,
        )
        local = [self.experts[str(e)] for e in sorted(self.experts, key=int)]
        counts = plan.tokens_per_local_expert
        if c.grouped_mm:
            out = run_grouped_experts(local, rows, counts, c.alignment)
        else:
            out = run_local_experts(local, rows, counts)
        routing.send_counts, routing.recv_counts = plan.send_counts, plan.recv_counts
        routing.sent_tokens = plan.token_of_row
        return self.add_shared(x, combine(out, plan, x.shape[0], self.group)), routing

    def add_shared(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """The routed output plus the shared expert's, which every token runs, unweighted."""
        return routed if self.shared is None else routed + self.shared(x)

    def one_process(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Every expert here, on the tokens that chose it and fit: the reference arithmetic."""
        out = torch.zeros_like(x)
        for e in range(self.config.experts):
            token, choice = torch.nonzero((routing.experts == e) & routing.keep, as_tuple=True)
            weight = routing.weights[token, choice].unsqueeze(1)
            if self.config.score_before_experts:
                out = out.index_add(0, token, self.experts[str(e)](x[token] * weight))
            else:
                out = out.index_add(0, token, self.experts[str(e)](x[token]) * weight)
        return self.add_shared(x, out)


class MoETransformer(nn.Module):
    """Embedding, one causal attention block, one MoE layer, a linear head."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.dim)
        self.position = nn.Parameter(0.1 * torch.randn(config.seq, config.dim))
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.moe = MoELayer(config)
        self.head = nn.Linear(config.dim, config.vocab)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        c = self.config
        x = self.embed(tokens) + self.position
        q, k, v = self.qkv(x).reshape(c.seq, 3, c.heads, c.dim // c.heads).permute(1, 2, 0, 3)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(0, 1).reshape(c.seq, c.dim))
        y, routing = self.moe(x)
        return self.head(x + y), routing

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(loss, what the checks need): cross-entropy over the tokens plus aux_coef * aux."""
        logits, routing = self(tokens)
        loss = F.cross_entropy(logits, targets) + self.config.aux_coef * routing.aux
        return loss, {"logits": logits, "routing": routing}


def make_model(config: MoEConfig, seed: int) -> MoETransformer:
    """The same float64 weights, every expert included, in every process with the same seed."""
    torch.manual_seed(seed)
    return MoETransformer(config).double()


def shard_experts(model: MoETransformer, group: dist.ProcessGroup) -> MoETransformer:
    """Keep only this rank's experts, [r * E/ep, (r+1) * E/ep), and route over `group`."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    local = model.config.experts // ep
    for e in range(model.config.experts):
        if not rank * local <= e < (rank + 1) * local:
            del model.moe.experts[str(e)]
    model.moe.group = group
    return model


def sample(index: int, config: MoEConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `index`: (tokens, targets), each (seq,), the next-token task on a fixed random text."""
    g = torch.Generator().manual_seed(10_000 * seed + index + 1)
    text = torch.randint(config.vocab, (config.seq + 1,), generator=g)
    return text[:-1], text[1:]


def is_expert_param(name: str) -> bool:
    return name.startswith("moe.experts.")
