"""A small float64 language model, and the same model cut over a tensor-parallel group.

`TinyLM` is written once. `tensor_parallel(model, group, sequence_parallel)` copies it
and swaps its layers for their parallel forms; the forward code does not change:
- attention: q, k, v one fused column-parallel linear (each rank its heads' q, k and v),
  the output projection row-parallel, `heads / tp` heads per rank;
- MLP: up column-parallel, down row-parallel;
- the embedding vocab-parallel, the head column-parallel (vocab-sharded logits), the loss
  vocab-parallel (the logits are never gathered);
- norms, residuals and the position embedding replicated; under sequence parallelism
  they hold this rank's `seq / tp` tokens, and their gradients are partial sums over
  tokens, summed over the group after the backward (`sync_replicated_grads`).

The sizes divide by 2, 3 and 4 (12 heads, hidden 48, vocab 48, 12 tokens), so tp = 2, 3
and 4 all run. No dropout: every result is deterministic and compared element by element.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from paralab.tp.cross_entropy import vocab_parallel_cross_entropy
from paralab.tp.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    split_of,
)
from paralab.tp.layout import Split, owned_range


@dataclass(frozen=True)
class LMConfig:
    """Sizes of `TinyLM`; `batch` sequences per sample (one sample per dp rank)."""

    vocab: int = 48
    hidden: int = 48
    heads: int = 12
    ffn: int = 96
    blocks: int = 2
    seq: int = 12
    batch: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


CONFIG = LMConfig()


class Attention(nn.Module):
    """Causal self-attention over `heads` heads; q, k, v come out of one fused linear."""

    def __init__(self, qkv: nn.Module, proj: nn.Module, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = qkv, proj, heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        batch, seq, width = q.shape
        q, k, v = (
            t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v)
        )
        out = self.attend(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, width))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of (batch, heads, seq, head_dim) q, k, v: the step context parallelism swaps."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class MLP(nn.Module):
    def __init__(self, up: nn.Module, down: nn.Module) -> None:
        super().__init__()
        self.up, self.down = up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        h, dtype = config.hidden, torch.float64
        self.norm1 = nn.LayerNorm(h, dtype=dtype)
        self.attn = Attention(
            nn.Linear(h, 3 * h, dtype=dtype), nn.Linear(h, h, dtype=dtype), config.heads
        )
        self.norm2 = nn.LayerNorm(h, dtype=dtype)
        self.mlp = MLP(nn.Linear(h, config.ffn, dtype=dtype), nn.Linear(config.ffn, h, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token and position embeddings, `blocks` blocks, a final norm, a head to vocabulary logits."""

    def __init__(self, config: LMConfig = CONFIG) -> None:
        super().__init__()
        h, dtype = config.hidden, torch.float64
        self.sizes = config
        """Named `sizes`, not `config`: cloudpickle, sending a notebook's copy of a function that
        uses `dist` and an attribute named `config`, tries to send `torch.distributed.config` too."""
        self.embed = nn.Embedding(config.vocab, h, dtype=dtype)
        self.pos = nn.Parameter(0.1 * torch.randn(config.seq, h, dtype=dtype))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.blocks))
        self.norm = nn.LayerNorm(h, dtype=dtype)
        self.head = nn.Linear(h, config.vocab, bias=False, dtype=dtype)
        self.pos_offset = 0
        """The first position this rank's tokens hold: rank·seq/tp under sequence parallelism."""
        self.vocab_group: ProcessGroup | None = None
        """The tp group when the logits are vocab-sharded (the loss then reduces over it)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.pos[self.pos_offset : self.pos_offset + x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every position (vocab-parallel when the logits are split)."""
        logits = self(ids).flatten(0, 1)
        if self.vocab_group is None:
            return F.cross_entropy(logits, targets.flatten())
        return vocab_parallel_cross_entropy(logits, targets.flatten(), self.vocab_group).mean()


def build_model(seed: int = 0, config: LMConfig = CONFIG) -> TinyLM:
    """The one-process model, its weights drawn from `seed` (the same on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(config)
        for name, p in model.named_parameters():  # norms off identity, so their gradients matter
            if "norm" in name:
                p.data.add_(0.1 * torch.randn_like(p))
    return model


def tensor_parallel(model: TinyLM, group: ProcessGroup, sequence_parallel: bool = False) -> TinyLM:
    """A copy of `model` whose layers are cut over `group`: this rank's shards, same forward code."""
    tp = dist.get_world_size(group)
    config = model.sizes
    for name, size in (("heads", config.heads), ("ffn", config.ffn), ("vocab", config.vocab)):
        if size % tp:
            raise ValueError(f"tensor_parallel: {name}={size} does not divide by tp={tp}")
    if sequence_parallel and config.seq % tp:
        raise ValueError(f"tensor_parallel: seq={config.seq} does not divide by tp={tp} (SP)")
    sp = sequence_parallel
    out = copy.deepcopy(model)
    out.embed = VocabParallelEmbedding(model.embed, group, sp)
    out.blocks = nn.ModuleList(tensor_parallel_block(b, group, sp) for b in model.blocks)
    out.head = ColumnParallelLinear(model.head, group, sp)
    out.vocab_group = group
    if sp:
        out.pos_offset = owned_range(config.seq, dist.get_rank(group), tp)[0]
    return out


def tensor_parallel_block(
    block: Block, group: ProcessGroup, sequence_parallel: bool = False
) -> Block:
    """A copy of `block` with attention's heads and the MLP's hidden features cut over `group`."""
    tp = dist.get_world_size(group)
    if block.attn.heads % tp or block.mlp.up.out_features % tp:
        raise ValueError(f"tensor_parallel_block: heads or ffn do not divide by tp={tp}")
    sp = sequence_parallel
    out = copy.deepcopy(block)
    out.attn.qkv = ColumnParallelLinear(block.attn.qkv, group, sp, parts=3)
    out.attn.proj = RowParallelLinear(block.attn.proj, group, sp)
    out.attn.heads = block.attn.heads // tp
    out.mlp.up = ColumnParallelLinear(block.mlp.up, group, sp)
    out.mlp.down = RowParallelLinear(block.mlp.down, group, sp)
    return out


def param_splits(model: nn.Module) -> dict[str, Split | None]:
    """Each parameter's split over the tp ranks, by name (None: replicated on every rank)."""
    splits = {}
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            splits[f"{module_name}.{name}" if module_name else name] = split_of(module, name)
    return splits


def sync_replicated_grads(model: nn.Module, group: ProcessGroup) -> None:
    """Sum the gradients of replicated parameters over the group (needed under SP only).

    Under sequence parallelism a norm or a bias sees only this rank's tokens, so its
    gradient is a partial sum over tokens; without SP every rank computed the full sum.
    All of them go in one flat buffer and one all-reduce, as Megatron's
    `_allreduce_non_tensor_model_parallel_grads` does: one collective's latency, not one
    per parameter.
    """
    grads = []
    for name, split in param_splits(model).items():
        p = model.get_parameter(name)
        if split is None and p.grad is not None:
            grads.append(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for grad, summed in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(summed.view_as(grad))
