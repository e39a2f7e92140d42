"""Lab 06's per-rank jobs: the pipeline on several layouts in one launch, with its ledger and memory.

`pipeline_job` runs `generate` for every (layout, variant) on the ranks of one
launch and returns, per run, the output, the ledger records and what the
memory probe saw. It calls `paralab.pipeline.inference` as that module holds
it when it runs, so `run(pipeline_job, ..., patches={"paralab.pipeline.inference":
{...}})` hands the ranks other pipeline code (the lab's bug clinic). `classify`
sorts ledger records into the groups the lab talks about; `replicated_denoiser_job`
is the dp_replicate > 1 experiment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from paralab.ledger import Ledger, Record
from paralab.models import CondDenoiser
from paralab.parallel_dims import ParallelDims
from paralab.pipeline import inference


# ------------------------------------------------------------------ memory: tracking storages
def _unique_storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(b for ptr, b in seen.items() if ptr)


def gathered_bytes(model: torch.nn.Module) -> int:
    """Bytes of gathered (unsharded) parameter storage the model holds now.

    FSDP2 registers on each module either the sharded DTensor or the gathered
    plain tensor; a freed gathered buffer is resized to 0 bytes. So: every
    distinct storage behind a plain-tensor parameter, by its size.
    """
    return _unique_storage_bytes(p for p in model.parameters() if not isinstance(p, DTensor))


def shard_storage_bytes(model: torch.nn.Module) -> int:
    """Bytes of this rank's parameter shards (the DTensors' local storage)."""
    return _unique_storage_bytes(p.to_local() for p in model.parameters() if isinstance(p, DTensor))


def held_all_gather_bytes(module: FSDPModule) -> int:
    """Bytes of the flat all-gather output FSDP2 keeps after a unit's forward.

    In forward, `FSDPParamGroup.wait_for_unshard` defers freeing it until the next
    unit's copy-out (so that copy-out can overlap the next all-gather): one unit's
    gathered size on top of the gathered parameters.
    """
    state = module._get_fsdp_state()._comm_ctx.all_gather_state
    if state is None:
        return 0
    return _unique_storage_bytes([state.all_gather_result.all_gather_output])


@dataclass
class MemoryProbe:
    """What the hooks saw: shards at the first forward, gathered bytes before each forward and inside them."""

    shards: int = 0
    between: list[int] = field(default_factory=list)
    peak: int = 0
    peak_with_buffer: int = 0
    """The peak counting the all-gather output FSDP2 holds for overlap (`AllGatherState`)."""


@contextlib.contextmanager
def probe_memory() -> Iterator[MemoryProbe]:
    """Global module hooks on every FSDP2 unit of a `CondDenoiser`.

    Before the root's forward (FSDP2 has not gathered yet): what the previous
    step left gathered. After each unit's forward (FSDP2 frees after this
    hook): what is gathered at that moment; the largest is the peak.
    """
    probe, root = MemoryProbe(), {}

    def before(module, args):
        if isinstance(module, CondDenoiser) and isinstance(module, FSDPModule):
            if not root:
                root["model"] = module
                probe.shards = shard_storage_bytes(module)
            probe.between.append(gathered_bytes(module))

    def after(module, args, output):
        if isinstance(module, FSDPModule) and root:
            gathered = gathered_bytes(root["model"])
            probe.peak = max(probe.peak, gathered)
            probe.peak_with_buffer = max(
                probe.peak_with_buffer, gathered + held_all_gather_bytes(module)
            )

    handles = [register_module_forward_pre_hook(before), register_module_forward_hook(after)]
    try:
        yield probe
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------------ the job
def pipeline_job(layouts: dict[str, dict], variants: dict[str, dict]) -> dict:
    """Run `generate` for every layout x variant on this rank; {(layout, variant): result}.

    `layouts`: name -> ParallelDims keyword arguments (inference mode is
    added). `variants`: name -> `generate` keyword arguments.
    """
    out = {}
    for layout, dims in layouts.items():
        pd = ParallelDims(dist.get_world_size(), enable_inference_mode=True, **dims)
        pd.build_meshes("cpu")
        for name, kwargs in variants.items():
            with Ledger() as ledger, probe_memory() as probe:
                output = inference.generate(pd, **kwargs)
            out[(layout, name)] = {
                "output": output,
                "records": ledger.records,
                "memory": probe,
                "groups": pd.group_ranks(),
                "samples": inference.samples_of_rank(pd, dist.get_rank()),
                "branch": "cond" if pd.cfgp_rank == 0 else "uncond",
            }
    return out


def training_step_records() -> list[Record]:
    """A planted case for the "no backward" claim: one forward and backward of the sharded denoiser.

    Runs on the default group (dp_shard = the world); its ledger must show FSDP2's
    gradient reduce-scatters, which an inference step must not.
    """
    pd = ParallelDims(dist.get_world_size(), enable_inference_mode=True)
    pd.build_meshes("cpu")
    model = inference.shard_denoiser(inference.make_denoiser(), pd, reshard_after_forward=True)
    x = torch.randn(
        model.latent_shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    context = torch.randn(
        1, 8, model.text_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    with Ledger() as ledger:
        model(x, 0.5, context, attention=inference.whole_sequence_attention).sum().backward()
    return ledger.records


def gradient_reductions(records: list[Record]) -> int:
    """Calls that reduce gradients: any reduce-scatter (FSDP2 records `reduce_scatter_single`) or all-reduce."""
    return sum(1 for r in records if r.op.startswith("reduce_scatter") or r.op == "all_reduce")


# ------------------------------------------------------------------ sorting the ledger
GROUPS = (
    "lb exchange",
    "dp_shard all-gather",
    "cfgp swap",
    "cp attention",
    "one-off (noise, context, return)",
)


def classify(record: Record, groups: dict[str, list[int]]) -> str:
    """Which of the lab's traffic groups a ledger record belongs to."""
    ranks = list(record.group_ranks)
    if record.phase == "encode":
        return "one-off (noise, context, return)" if record.op == "broadcast" else "lb exchange"
    if record.phase.startswith("step"):
        if ranks == groups.get("dp_shard") and record.op.startswith("all_gather"):
            return "dp_shard all-gather"
        if ranks == groups.get("cfgp"):
            return "cfgp swap"
        if ranks == groups.get("cp"):
            return "cp attention"
        return f"unexpected {record.op} on {ranks}"
    return "one-off (noise, context, return)"


def sent_by_group(result: dict, phase: str | None = None) -> dict[str, int]:
    """Bytes this rank sent, by traffic group (only `phase` if given)."""
    out = {g: 0 for g in GROUPS}
    for r in result["records"]:
        if phase is None or r.phase == phase:
            key = classify(r, result["groups"])
            out[key] = out.get(key, 0) + r.bytes_sent
    return out


def calls_by_group(result: dict, phase: str) -> dict[str, dict[str, int]]:
    """{group: {op: calls}} for one phase."""
    out: dict[str, dict[str, int]] = {}
    for r in result["records"]:
        if r.phase == phase:
            ops = out.setdefault(classify(r, result["groups"]), {})
            ops[r.op] = ops.get(r.op, 0) + 1
    return out


# ------------------------------------------------------------------ dp_replicate > 1 in inference
def repeated_forwards(model: CondDenoiser, steps: int = 4) -> torch.Tensor:
    """`steps` cond forwards of the denoiser on fixed inputs (no cp, no cfgp); the last prediction."""
    x = torch.randn(
        model.latent_shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    context = torch.randn(
        1, 8, model.text_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    with torch.no_grad():
        for step in range(steps):
            y = model(x, 1.0 - step / steps, context, attention=inference.whole_sequence_attention)
    return y


def replicated_denoiser_job(meshes: dict[str, tuple[int, ...]], steps: int = 4) -> dict:
    """The denoiser sharded on each mesh shape (FSDP2 picks HSDP from a 2-D mesh), `repeated_forwards` on it.

    Bypasses `ParallelDims` on purpose: it is the experiment behind the rule
    that rejects dp_replicate > 1 in inference. Returns per mesh the last
    output, the ledger and the bytes of this rank's parameter shards.
    """
    out = {}
    for name, shape in meshes.items():
        names = ("dp_replicate", "dp_shard") if len(shape) == 2 else ("dp_shard",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        model = inference.make_denoiser()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        with Ledger() as ledger:
            y = repeated_forwards(model, steps)
        out[name] = {"output": y, "records": ledger.records, "shards": shard_storage_bytes(model)}
    return out
