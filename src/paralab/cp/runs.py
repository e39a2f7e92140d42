"""Lab 02's experiments: the configurations, each rank's inputs, the per-rank job and the references.

A `CPConfig` names one way to run context-parallel attention. `cp_worker` runs a
list of them on every rank of a launch, forward and backward under the ledger,
and returns what the checks need; `sdpa_reference` and `one_process_blocks`
(Ulysses' own per-head arithmetic) are the single-process answers, and
`assemble` puts the ranks' results back into full tensors; `check_config` and
`check_bytes` are the verdicts the notebook prints and the tests assert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.check import Verdict, compare
from paralab.cp.blocks import attention_block, attention_block_backward
from paralab.cp.costs import ring_bytes, shard_bytes, ulysses_bytes
from paralab.cp.layout import shard_sequence, unshard_sequence
from paralab.cp.ring import ring_attention
from paralab.cp.ulysses import LAYOUTS, ulysses_attention
from paralab.ledger import Ledger, sent
from paralab.parallel_dims import ParallelDims

GRADS = ("out", "dq", "dk", "dv")
PHASES = ("forward", "backward")


@dataclass(frozen=True)
class CPConfig:
    """One way to run cp attention: the algorithm, the mask, and how the sequence is laid out.

    `zigzag` applies to the ring (zigzag shards balance causal work); `layout` to
    Ulysses ("sequence_sharded" shards in and out, or "replicated": full tensors on every rank).
    """

    algorithm: str
    causal: bool
    zigzag: bool = False
    layout: str = "sequence_sharded"

    def __post_init__(self) -> None:
        if self.algorithm not in ("ring", "ulysses"):
            raise ValueError(
                f"CPConfig: algorithm must be 'ring' or 'ulysses', got {self.algorithm!r}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"CPConfig: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.algorithm == "ring" and self.layout != "sequence_sharded":
            raise ValueError(
                "CPConfig: the ring takes sequence shards only (layout is a Ulysses option)"
            )
        if self.algorithm == "ulysses" and self.zigzag:
            raise ValueError("CPConfig: Ulysses takes contiguous shards (zigzag is a ring option)")

    @property
    def replicated(self) -> bool:
        """Every rank holds the full q, k, v and output (Ulysses' replicated layout)."""
        return self.layout == "replicated"

    @property
    def name(self) -> str:
        layout = (
            ("zigzag" if self.zigzag else "contiguous") if self.algorithm == "ring" else self.layout
        )
        return f"{self.algorithm} {'causal' if self.causal else 'full'} {layout}"


CONFIGS = [
    CPConfig("ring", causal=False),
    CPConfig("ring", causal=True),
    CPConfig("ring", causal=True, zigzag=True),
    CPConfig("ring", causal=False, zigzag=True),
    CPConfig("ulysses", causal=False),
    CPConfig("ulysses", causal=True),
    CPConfig("ulysses", causal=False, layout="replicated"),
    CPConfig("ulysses", causal=True, layout="replicated"),
]


def rank_inputs(
    full: list[torch.Tensor], config: CPConfig, rank: int, cp: int
) -> list[torch.Tensor]:
    """This rank's q, k, v, dout: its sequence shard of each, or a copy of each when replicated."""
    if config.replicated:
        return [t.clone() for t in full]
    return [shard_sequence(t, rank, cp, zigzag=config.zigzag) for t in full]


def attend(
    config: CPConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The package's ring or Ulysses attention, as `config` says."""
    if config.algorithm == "ring":
        return ring_attention(q, k, v, group, causal=config.causal, zigzag=config.zigzag)
    return ulysses_attention(q, k, v, group, causal=config.causal, layout=config.layout)


def cp_worker(
    full: list[torch.Tensor],
    configs: list[CPConfig],
    probe_heads: int | None = None,
) -> dict:
    """On every rank (cp = world): each config forward and backward under the ledger.

    Returns per config this rank's out, dq, dk, dv and ledger records; with
    `probe_heads`, also the error Ulysses raises for that many heads (None if it runs).
    A bug clinic launches it twice, once as it is and once with `run(..., patches=...)`.
    """
    world = dist.get_world_size()
    pd = ParallelDims(world, cp=world)
    pd.build_meshes("cpu")
    group, rank, cp = pd.cp_mesh.get_group(), pd.cp_rank, pd.cp
    results = []
    for config in configs:
        q, k, v, dout = rank_inputs(full, config, rank, cp)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        with Ledger() as led:
            with led.phase("forward"):
                out = attend(config, q, k, v, group)
            with led.phase("backward"):
                out.backward(dout)
        results.append(
            {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "records": led.records}
        )
    heads_error = None
    if probe_heads is not None:
        bad = torch.zeros(1, probe_heads, 2 * cp, 3, dtype=torch.float64)
        try:
            ulysses_attention(bad, bad, bad, group)
        except ValueError as exc:
            heads_error = str(exc)
    return {"results": results, "heads_error": heads_error}


def sdpa_reference(full: list[torch.Tensor], causal: bool) -> dict[str, torch.Tensor]:
    """Single-process `scaled_dot_product_attention` and its autograd gradients (the answer cp must give)."""
    q, k, v = (t.clone().requires_grad_() for t in full[:3])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(full[3])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def one_process_blocks(full: list[torch.Tensor], causal: bool) -> dict[str, torch.Tensor]:
    """The same per-head arithmetic as Ulysses, on the full tensors, in one process."""
    q, k, v, dout = full
    out, lse = attention_block(q, k, v, diagonal=causal)
    dq, dk, dv = attention_block_backward(dout, q, k, v, lse, (dout * out).sum(-1), diagonal=causal)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def assemble(per_rank: list[dict], config: CPConfig) -> dict[str, torch.Tensor]:
    """The full tensors from every rank's result (replicated: every rank's copy, stacked)."""
    if config.replicated:
        return {n: torch.stack([r[n] for r in per_rank]) for n in GRADS}
    return {n: unshard_sequence([r[n] for r in per_rank], zigzag=config.zigzag) for n in GRADS}


def bytes_formula(config: CPConfig, shape: tuple[int, int, int, int], cp: int) -> dict[str, int]:
    """Bytes each rank sends per phase for (batch, heads, seq, head_dim) float64 q, k, v."""
    s = shard_bytes(*shape, cp)
    if config.algorithm == "ring":
        return ring_bytes(s, cp)
    return ulysses_bytes(s, cp, config.layout)


def stacked(
    tensors: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    cp: int | None = None,
    relative: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out, dq, dk, dv stacked into one tensor, each divided by its reference's largest magnitude
    (`relative`), so that one bound fits all four; `cp` (replicated results: one copy per cp rank)
    repeats the reference cp times."""
    scale = {n: reference[n].abs().max() if relative else 1 for n in GRADS}
    ref = {
        n: reference[n] if cp is None else reference[n].expand(cp, *reference[n].shape)
        for n in GRADS
    }
    return torch.stack([tensors[n] / scale[n] for n in GRADS]), torch.stack(
        [ref[n] / scale[n] for n in GRADS]
    )


def check_config(per_rank: list[dict], config: CPConfig, full: list[torch.Tensor]) -> list[Verdict]:
    """One config's results on every rank vs SDPA (relative error <= 1e-12) and, for Ulysses,
    vs the same per-head arithmetic in one process (bitwise)."""
    cp = len(per_rank)
    got = assemble(per_rank, config)
    copies = cp if config.replicated else None
    verdicts = compare(
        *stacked(got, sdpa_reference(full, config.causal), copies),
        atol=1e-12,
        name=f"cp={cp} {config.name} vs SDPA",
    )
    if config.algorithm == "ulysses":
        verdicts += compare(
            *stacked(got, one_process_blocks(full, config.causal), copies, relative=False),
            name=f"cp={cp} {config.name} vs attention_block, bitwise",
        )
    return verdicts


def bytes_sent(per_rank: list[dict]) -> torch.Tensor:
    """Bytes each rank sent, from its ledger: [phase, rank]."""
    return torch.tensor([[sent(r["records"], phase=p) for r in per_rank] for p in PHASES])


def check_bytes(
    per_rank: list[dict], config: CPConfig, shape: tuple[int, int, int, int]
) -> list[Verdict]:
    """Bytes sent by every rank in each phase vs `bytes_formula` (exact)."""
    cp = len(per_rank)
    want = bytes_formula(config, shape, cp)
    expected = torch.tensor([[want[p]] * cp for p in PHASES])
    return compare(
        bytes_sent(per_rank), expected, name=f"cp={cp} {config.name} bytes sent [phase, rank]"
    )
