"""Lab 07's experiments: each rank's job, the one-process references and the checks.

- `train` / `reference`: the public pair. `train` runs on every rank of a launch
  (world = dp_shard × tp), trains the tensor-parallel model (inside FSDP2 over dp when
  dp_shard > 1) and returns the full parameters; `reference` trains the one-process
  model on the same global batch.
- `block_job` / `lm_job`: one forward and backward of one block, or of the whole model,
  under the ledger; `block_reference` / `lm_reference` are the one-process answers and
  `check_block` / `check_lm` / `check_bytes` the verdicts the lab prints and the tests assert.

A bug clinic launches a job twice, once as it is and once with `run(..., patches=...)`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from paralab.check import Verdict, compare
from paralab.ledger import Ledger, summarize
from paralab.tp.clip import clip_tp_grads_, tp_grad_norm
from paralab.tp.costs import block_step_bytes, step_bytes
from paralab.tp.layout import Split, owned_range, unshard
from paralab.tp.mappings import SEQ_DIM
from paralab.tp.memory import SavedBytes, block_saved_bytes
from paralab.tp.model import (
    CONFIG,
    LMConfig,
    build_model,
    param_splits,
    sync_replicated_grads,
    tensor_parallel,
    tensor_parallel_block,
)

LR = 0.2
PHASES = ("forward", "backward", "grad sync")
RELATIVE_BOUND = 1e-12
"""Tensor parallelism re-orders sums (a row linear adds tp partial products): results agree
with one process to rounding, checked element by element relative to the reference's scale."""


def global_batch(
    samples: int, seed: int, config: LMConfig = CONFIG
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, targets) of `samples` samples of `config.batch` sequences each, from `seed` alone."""
    g = torch.Generator().manual_seed(1000 + seed)
    tokens = torch.randint(0, config.vocab, (samples * config.batch, config.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def sample_rows(samples_rank: int, config: LMConfig = CONFIG) -> slice:
    """The rows of the global batch that dp rank `samples_rank` trains on."""
    return slice(samples_rank * config.batch, (samples_rank + 1) * config.batch)


def build_mesh(tp: int, dp_shard: int = 1) -> DeviceMesh:
    """(dp_shard, tp), tp innermost: tp partners are neighbouring ranks, as on one node's NVLink."""
    if dist.get_world_size() != dp_shard * tp:
        raise ValueError(f"world size {dist.get_world_size()} != dp_shard={dp_shard} x tp={tp}")
    return init_device_mesh("cpu", (dp_shard, tp), mesh_dim_names=("dp_shard", "tp"))


def full_params(model: torch.nn.Module, tp_group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """Every parameter in full, on every rank: FSDP shards gathered over dp, then tp pieces over tp."""
    tp = dist.get_world_size(tp_group)
    out = {}
    for name, split in param_splits(model).items():
        p = model.get_parameter(name).detach()
        local = p.full_tensor() if hasattr(p, "full_tensor") else p
        pieces = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(pieces, local.contiguous(), group=tp_group)
        out[name] = unshard(pieces, split).clone()
    return out


def fsdp_over_dp(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """FSDP2 over the mesh's dp_shard axis, each block a unit, when it has more than one rank."""
    if mesh["dp_shard"].size() > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    return model


def train(
    tp: int,
    dp_shard: int = 1,
    *,
    sequence_parallel: bool = False,
    steps: int = 2,
    seed: int = 0,
    max_norm: float | None = None,
) -> dict[str, torch.Tensor]:
    """On every rank (world = dp_shard × tp): `steps` SGD steps of the tensor-parallel model.

    Each dp rank trains on its sample of the global batch; with dp_shard > 1 the
    tensor-parallel model is wrapped in FSDP2 over the dp mesh (TP inside each dp
    replica, as torchtitan composes them). `max_norm`: clip the whole model's gradient
    norm across tp first (`clip.clip_tp_grads_`; tp alone, dp_shard = 1). Returns the full
    parameters, the same on every rank.
    """
    if max_norm is not None and dp_shard > 1:
        raise ValueError(
            f"max_norm={max_norm}: clipping here spans tp only, got dp_shard={dp_shard}"
        )
    mesh = build_mesh(tp, dp_shard)
    tp_group = mesh.get_group("tp")
    model = fsdp_over_dp(tensor_parallel(build_model(seed), tp_group, sequence_parallel), mesh)
    ids, targets = global_batch(dp_shard, seed)
    rows = sample_rows(mesh.get_local_rank("dp_shard"))
    ids, targets = ids[rows], targets[rows]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss(ids, targets).backward()
        if sequence_parallel:
            sync_replicated_grads(model, tp_group)
        if max_norm is not None:
            clip_tp_grads_(model, max_norm, tp_group)
        optimizer.step()
    return full_params(model, tp_group)


def reference(
    *,
    samples: int,
    steps: int = 2,
    seed: int = 0,
    config: LMConfig = CONFIG,
    max_norm: float | None = None,
) -> dict[str, torch.Tensor]:
    """One process: the same model and global batch (`samples` = dp_shard), `steps` SGD steps,
    clipped by torch's `clip_grad_norm_` when `max_norm` is given."""
    model = build_model(seed, config)
    ids, targets = global_batch(samples, seed, config)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss(ids, targets).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --------------------------------------------------------------------------- one step, checked
def lm_job(sequence_parallel: bool = False, seed: int = 0) -> dict:
    """On every rank (tp = world): one forward and backward of the model under the ledger.

    Returns this rank's logit shard, loss, parameter-gradient pieces and ledger records.
    """
    tp_group = build_mesh(dist.get_world_size()).get_group("tp")
    model = tensor_parallel(build_model(seed), tp_group, sequence_parallel)
    ids, targets = global_batch(1, seed)
    logits = {}
    model.head.register_forward_hook(lambda m, i, o: logits.update(logits=o.detach()))
    with Ledger() as led:
        with led.phase("forward"):
            loss = model.loss(ids, targets)
        with led.phase("backward"):
            loss.backward()
        with led.phase("grad sync"):
            if sequence_parallel:
                sync_replicated_grads(model, tp_group)
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {
        "loss": loss.detach(),
        "logits": logits["logits"],
        "grads": grads,
        "splits": param_splits(model),
        "records": led.records,
    }


def lm_reference(seed: int = 0) -> dict:
    """One process: the loss, logits and parameter gradients of the same step."""
    model = build_model(seed)
    ids, targets = global_batch(1, seed)
    logits = {}
    model.head.register_forward_hook(lambda m, i, o: logits.update(logits=o.detach()))
    loss = model.loss(ids, targets)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {"loss": loss.detach(), "logits": logits["logits"], "grads": grads}


def grad_norm_job(sequence_parallel: bool = False, seed: int = 0) -> dict[str, float]:
    """On every rank (tp = world): one backward, then the whole model's gradient norm, with each
    replicated gradient counted once (`clip.tp_grad_norm`) and, for contrast, on every rank."""
    tp_group = build_mesh(dist.get_world_size()).get_group("tp")
    model = tensor_parallel(build_model(seed), tp_group, sequence_parallel)
    ids, targets = global_batch(1, seed)
    model.loss(ids, targets).backward()
    if sequence_parallel:
        sync_replicated_grads(model, tp_group)
    splits = param_splits(model)
    grads = [model.get_parameter(name).grad for name in splits]
    once = [split is None for split in splits.values()]
    return {
        "counted once": tp_grad_norm(grads, once, tp_group).item(),
        "counted on every rank": tp_grad_norm(grads, [False] * len(grads), tp_group).item(),
    }


def one_process_grad_norm(seed: int = 0) -> float:
    """The same norm in one process, as `torch.nn.utils.clip_grad_norm_` computes it."""
    model = build_model(seed)
    ids, targets = global_batch(1, seed)
    model.loss(ids, targets).backward()
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()


def block_inputs(seed: int = 0, config: LMConfig = CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """x and the gradient arriving at the block's output, (batch, seq, hidden) each."""
    g = torch.Generator().manual_seed(2000 + seed)
    shape = (config.batch, config.seq, config.hidden)
    return (torch.randn(shape, dtype=torch.float64, generator=g) for _ in range(2))


def block_job(sequence_parallel: bool = False, seed: int = 0) -> dict:
    """On every rank (tp = world): the first block's forward and backward on `block_inputs`.

    Under SP each rank feeds its `seq / tp` tokens and gets its tokens' output and input
    gradient back; otherwise every rank feeds and gets the full sequence.
    """
    tp_group = build_mesh(dist.get_world_size()).get_group("tp")
    block = tensor_parallel_block(build_model(seed).blocks[0], tp_group, sequence_parallel)
    x, dout = block_inputs(seed)
    if sequence_parallel:
        start, end = owned_range(
            x.shape[SEQ_DIM], dist.get_rank(tp_group), dist.get_world_size(tp_group)
        )
        x, dout = x[:, start:end], dout[:, start:end]
    x = x.clone().requires_grad_()
    with Ledger() as led:
        with led.phase("forward"):
            out = block(x)
        with led.phase("backward"):
            out.backward(dout)
        with led.phase("grad sync"):
            if sequence_parallel:
                sync_replicated_grads(block, tp_group)
    grads = {name: p.grad for name, p in block.named_parameters()}
    return {
        "out": out.detach(),
        "dx": x.grad,
        "grads": grads,
        "splits": param_splits(block),
        "records": led.records,
    }


def memory_job(sequence_parallel: bool = False, seed: int = 0) -> int:
    """On every rank (tp = world): bytes autograd saves for the backward of one block's forward."""
    tp_group = build_mesh(dist.get_world_size()).get_group("tp")
    block = tensor_parallel_block(build_model(seed).blocks[0], tp_group, sequence_parallel)
    x, _ = block_inputs(seed)
    if sequence_parallel:
        start, end = owned_range(
            x.shape[SEQ_DIM], dist.get_rank(tp_group), dist.get_world_size(tp_group)
        )
        x = x[:, start:end]
    saved = SavedBytes(list(block.parameters()))
    with saved.recording():
        block(x.clone().requires_grad_())
    return saved.bytes


def one_process_saved_bytes(seed: int = 0) -> int:
    """The same measure on the one-process block: tp = 1."""
    block = build_model(seed).blocks[0]
    x, _ = block_inputs(seed)
    saved = SavedBytes(list(block.parameters()))
    with saved.recording():
        block(x.clone().requires_grad_())
    return saved.bytes


def check_memory(measured: dict[tuple[int, bool], list[int]]) -> list[Verdict]:
    """Saved bytes per rank, {(tp, sp): [every rank]}, vs `memory.block_saved_bytes` (exact)."""
    verdicts = []
    for (tp, sp), per_rank in measured.items():
        want = sum(block_saved_bytes(CONFIG, tp, sp).values())
        verdicts += compare(
            torch.tensor(per_rank),
            torch.tensor([want] * len(per_rank)),
            name=f"tp={tp}{' +SP' if sp else ''} saved bytes per rank",
        )
    return verdicts


def block_reference(seed: int = 0) -> dict:
    block = build_model(seed).blocks[0]
    x, dout = block_inputs(seed)
    x = x.clone().requires_grad_()
    out = block(x)
    out.backward(dout)
    return {
        "out": out.detach(),
        "dx": x.grad,
        "grads": {n: p.grad for n, p in block.named_parameters()},
    }


def assemble(per_rank: list[dict], sequence_parallel: bool) -> dict:
    """Full tensors from every rank's pieces: gradients by their split, sequence shards concatenated."""
    splits = per_rank[0]["splits"]
    out = {
        "grads": {
            name: unshard([r["grads"][name] for r in per_rank], split)
            for name, split in splits.items()
        }
    }
    for key in ("out", "dx"):
        if key in per_rank[0]:
            pieces = [r[key] for r in per_rank]
            out[key] = torch.cat(pieces, SEQ_DIM) if sequence_parallel else pieces[0]
    if "logits" in per_rank[0]:
        out["logits"] = unshard([r["logits"] for r in per_rank], Split(-1))
        out["loss"] = per_rank[0]["loss"]
    return out


def _relative(got: dict, want: dict, name: str) -> list[Verdict]:
    """Element-by-element comparison, each tensor's bound 1e-12 times its reference's largest |value|."""
    verdicts = []
    for key in want:
        if isinstance(want[key], dict):
            verdicts += _relative(got[key], want[key], f"{name} {key}")
        elif want[key] is not None:
            bound = RELATIVE_BOUND * max(want[key].abs().max().item(), 1e-300)
            verdicts += compare(got[key], want[key], atol=bound, name=f"{name} {key}")
    return verdicts


def same_on_every_rank(per_rank: list[dict], key: str, name: str) -> list[Verdict]:
    """Bitwise: every rank holds the same copy of a replicated result (the loss; without SP, out and dx)."""
    return compare(
        [r[key] for r in per_rank[1:]], [per_rank[0][key]] * (len(per_rank) - 1), name=name
    )


def check_block(per_rank: list[dict], sequence_parallel: bool, seed: int = 0) -> list[Verdict]:
    """Block output, input gradient and every parameter gradient vs one process."""
    tp = len(per_rank)
    tag = f"tp={tp}{' +SP' if sequence_parallel else ''} block"
    got = assemble(per_rank, sequence_parallel)
    want = block_reference(seed)
    verdicts = _relative({k: got[k] for k in want}, want, tag)
    if not sequence_parallel:
        verdicts += same_on_every_rank(per_rank, "dx", f"{tag} dx, every rank the same")
    return verdicts


def check_lm(per_rank: list[dict], sequence_parallel: bool, seed: int = 0) -> list[Verdict]:
    """Loss, logits and every parameter gradient of the whole model vs one process."""
    tp = len(per_rank)
    tag = f"tp={tp}{' +SP' if sequence_parallel else ''} model"
    got = assemble(per_rank, sequence_parallel)
    want = lm_reference(seed)
    verdicts = _relative({k: got[k] for k in want}, want, tag)
    return verdicts + same_on_every_rank(per_rank, "loss", f"{tag} loss, every rank the same")


def check_train(
    per_rank: list[dict],
    tp: int,
    dp_shard: int,
    sequence_parallel: bool,
    steps: int = 2,
    max_norm: float | None = None,
) -> list[Verdict]:
    """Parameters after `steps` vs one process on the global batch, and bitwise the same on every rank."""
    tag = f"dp={dp_shard} x tp={tp}{' +SP' if sequence_parallel else ''}, {steps} steps"
    if max_norm is not None:
        tag += f", clipped at {max_norm}"
    want = reference(samples=dp_shard, steps=steps, max_norm=max_norm)
    verdicts = _relative(per_rank[0], want, f"{tag} params")
    verdicts += compare(
        per_rank[1:], [per_rank[0]] * (len(per_rank) - 1), name=f"{tag} every rank the same"
    )
    return verdicts


def measured_bytes(records: list) -> dict[tuple[str, str], tuple[int, int]]:
    """(phase, op) -> (calls, bytes sent) from one rank's ledger."""
    return {k: (t.calls, t.bytes_sent) for k, t in summarize(records, ("phase", "op")).items()}


def check_bytes(
    per_rank: list[dict], sequence_parallel: bool, block: bool = False
) -> list[Verdict]:
    """Calls and bytes per (phase, op), every rank, vs `costs.step_bytes` (the whole model's step,
    from `lm_job`) or `costs.block_step_bytes` (one block, from `block_job`); exact."""
    tp = len(per_rank)
    if block:
        want = block_step_bytes(CONFIG, tp, sequence_parallel)
    else:
        want = step_bytes(CONFIG, tp, sequence_parallel)
    keys = sorted(want)
    measured = [measured_bytes(r["records"]) for r in per_rank]
    keys += sorted({k for m in measured for k in m} - set(want))  # a collective the formula lacks
    expected = torch.tensor([[list(want.get(k, (0, 0))) for k in keys]] * tp)
    got = torch.tensor([[list(m.get(k, (0, 0))) for k in keys] for m in measured])
    what = "block" if block else "model"
    return compare(
        got,
        expected,
        name=f"tp={tp}{' +SP' if sequence_parallel else ''} {what} [rank, (phase, op), (calls, bytes)]",
    )
