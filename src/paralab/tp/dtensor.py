"""The same model and data under torch's DTensor tensor parallelism, for a parity check.

`parallelize_module` with `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel` and
`loss_parallel`, as torchtitan plans a Llama, and optionally FSDP2's `fully_shard` over
a dp mesh around it (TP inside each dp replica). All of them run on gloo on the CPU in
torch 2.13 (`tests/test_tp_dtensor.py` pins it).

Two adaptations, both outside torch:
- the fused q/k/v weight is permuted first so that torch's contiguous row shard r is
  [q_r; k_r; v_r], the heads of rank r (torchtitan keeps wq, wk, wv apart instead);
  `params_in_model_order` undoes it;
- under SP the position table is added to this rank's tokens outside any DTensor plan,
  so its gradient is partial and summed over tp by hand, as the package's SP does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from paralab.tp.layout import Split, owned_range, shard, unshard
from paralab.tp.mappings import SEQ_DIM
from paralab.tp.memory import SavedBytes
from paralab.tp.model import TinyLM, build_model
from paralab.tp.runs import LR, block_inputs, build_mesh, fsdp_over_dp, global_batch, sample_rows

QKV = Split(0, parts=3)


def head_aligned_qkv(model: TinyLM, tp: int) -> None:
    """Permute each fused q/k/v weight and bias so that contiguous shard r holds rank r's heads."""
    for block in model.blocks:
        for p in block.attn.qkv.parameters():
            p.data = torch.cat([shard(p.data, QKV, r, tp) for r in range(tp)])


def params_in_model_order(params: dict[str, torch.Tensor], tp: int) -> dict[str, torch.Tensor]:
    """Undo `head_aligned_qkv` on full parameters."""
    out = dict(params)
    for name, p in params.items():
        if ".attn.qkv." in name:
            out[name] = unshard(list(p.chunk(tp)), QKV)
    return out


def block_plan(sequence_parallel: bool) -> dict:
    """torchtitan's styles for one block's modules, the sequence all-gather on each column linear."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "attn.qkv": ColwiseParallel(input_layouts=seq),
        "attn.proj": RowwiseParallel(output_layouts=seq),
        "mlp.up": ColwiseParallel(input_layouts=seq),
        "mlp.down": RowwiseParallel(output_layouts=seq),
    }
    if sequence_parallel:
        plan |= {"norm1": SequenceParallel(), "norm2": SequenceParallel()}
    return plan


def tp_plan(model: TinyLM, sequence_parallel: bool) -> dict:
    """torchtitan's plan for this model: which style each module gets."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "head": ColwiseParallel(
            input_layouts=seq, output_layouts=Shard(-1), use_local_output=False
        ),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for i in range(len(model.blocks)):
        plan |= {
            f"blocks.{i}.{name}": style for name, style in block_plan(sequence_parallel).items()
        }
    return plan


def dtensor_model(
    mesh: DeviceMesh, sequence_parallel: bool, seed: int = 0, model: TinyLM | None = None
) -> TinyLM:
    """The model under torch's TP on the mesh's tp axis, inside FSDP2 over dp_shard when > 1."""
    tp_mesh, tp = mesh["tp"], mesh["tp"].size()
    model = model or build_model(seed)
    head_aligned_qkv(model, tp)
    parallelize_module(model, tp_mesh, tp_plan(model, sequence_parallel))
    for block in model.blocks:
        block.attn.heads //= tp
    if sequence_parallel:
        model.pos_offset = owned_range(model.sizes.seq, tp_mesh.get_local_rank(), tp)[0]
    return fsdp_over_dp(model, mesh)


def dtensor_train(
    tp: int, dp_shard: int = 1, *, sequence_parallel: bool = False, steps: int = 2, seed: int = 0
) -> dict[str, torch.Tensor]:
    """`runs.train` with torch's TP (and FSDP2 over dp when dp_shard > 1): the full parameters."""
    mesh = build_mesh(tp, dp_shard)
    model = dtensor_model(mesh, sequence_parallel, seed)
    ids, targets = global_batch(dp_shard, seed)
    rows = sample_rows(mesh.get_local_rank("dp_shard"))
    ids, targets = ids[rows], targets[rows]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        optimizer.zero_grad()
        with loss_parallel():
            logits = model(ids).flatten(0, 1)
            F.cross_entropy(logits, targets.flatten()).backward()
        if sequence_parallel:
            grad = model.pos.grad
            dist.all_reduce(
                grad.to_local() if hasattr(grad, "to_local") else grad,
                group=mesh["tp"].get_group(),
            )
        optimizer.step()
    return full_parameters(model, tp)


def full_parameters(model: TinyLM, tp: int) -> dict[str, torch.Tensor]:
    """Every parameter gathered in full, q/k/v back in the model's own order."""
    full = {}
    for name, p in model.named_parameters():
        full[name] = (gather_dp_then_tp(p) if isinstance(p, DTensor) else p).detach().clone()
    return params_in_model_order(full, tp)


def gather_dp_then_tp(p: DTensor) -> torch.Tensor:
    """A parameter in full, one mesh axis at a time: FSDP's all-gather over dp, then TP's.

    FSDP2 cuts the TP shard this rank holds, so on the (dp_shard, tp) mesh a TP weight is
    `(_StridedShard(dim=0, sf=tp), Shard(dim=0))`: a dp shard's rows lie inside one tp
    shard, not at rank (d, t)'s place in the flattened mesh. One all-gather over both
    axes cannot restore that order; `full_tensor()` runs 2 sequential all-gathers and
    logs a warning. The same two, named: undo FSDP (its unshard), then undo TP."""
    if p.device_mesh.ndim > 1:
        p = p.redistribute(p.device_mesh, [Replicate(), *p.placements[1:]])
    return p.full_tensor()


def fsdp_rows(tp: int, dp_shard: int, seed: int = 0) -> list[int]:
    """On every rank of a (dp_shard, tp) mesh: which rows of the full MLP-up weight this
    rank's FSDP shard holds, read from a weight whose row i holds the number i."""
    model = build_model(seed)
    up = model.blocks[0].mlp.up.weight
    up.data.copy_(torch.arange(up.shape[0], dtype=up.dtype)[:, None].expand_as(up))
    model = dtensor_model(build_mesh(tp, dp_shard), False, seed, model)
    return model.blocks[0].mlp.up.weight.to_local()[:, 0].long().tolist()


def dtensor_memory_job(sequence_parallel: bool = False, seed: int = 0) -> int:
    """On every rank (tp = world): bytes autograd saves for one block's forward under torch's TP,
    measured as `runs.memory_job` measures the package's block."""
    tp = dist.get_world_size()
    tp_mesh = build_mesh(tp)["tp"]
    model = build_model(seed)
    head_aligned_qkv(model, tp)
    block = parallelize_module(model.blocks[0], tp_mesh, block_plan(sequence_parallel))
    block.attn.heads //= tp
    x, _ = block_inputs(seed)
    if sequence_parallel:
        start, end = owned_range(x.shape[SEQ_DIM], tp_mesh.get_local_rank(), tp)
        x = x[:, start:end]
    saved = SavedBytes(list(block.parameters()))
    with saved.recording():
        block(x.clone().requires_grad_())
    return saved.bytes
