"""What torch's FSDP2 engine does, measured on real ranks: the facts lab 01's chapters cite.

`fsdp2_mesh_calls` (the 2-D-mesh trap's extra all-reduce), `fsdp2_step_facts`
(what `MixedPrecisionPolicy` and `reshard_after_forward` change),
`fsdp2_inference_root_facts` (what stays gathered after an inference forward, cited by lab
11) and `checkpoint_round_trip` (what `torch.distributed.checkpoint` reads per rank),
each pinned by a test so a chapter's claim fails when torch changes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from paralab.launch import rank_device
from paralab.ledger import Ledger
from paralab.parallel_dims import ParallelDims, fsdp_mesh


def _two_unit_model() -> torch.nn.Sequential:
    """Two bias-free float32 Linear(8, 8) units: 64 elements each, no padding up to 8 ranks."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))


def _fully_shard_units(
    model: torch.nn.Sequential, mesh, units: int | None = None, **kwargs
) -> torch.nn.Sequential:
    """Each of the first `units` modules (all by default) a unit, then the root."""
    for unit in list(model)[:units]:
        fully_shard(unit, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def fsdp2_mesh_calls(on_dp_mesh: bool) -> list[tuple[str, str, int]]:
    """On every rank: one forward and backward of the two-unit model under FSDP2, on `fsdp_mesh(pd)` or on
    the 2-D `pd.dp_mesh` with one replica (the trap). Returns (phase, op, group size) of every collective."""
    pd = ParallelDims(dist.get_world_size())
    pd.build_meshes(rank_device().type)
    model = _fully_shard_units(
        _two_unit_model().to(rank_device()), pd.dp_mesh if on_dp_mesh else fsdp_mesh(pd)
    )
    with Ledger() as ledger:
        with ledger.phase("forward"):
            loss = model(torch.randn(4, 8, device=rank_device())).sum()
        with ledger.phase("backward"):
            loss.backward()
    return [(r.phase, r.op, r.group_size) for r in ledger.records]


def fsdp2_step_facts(
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
) -> dict:
    """One FSDP2 forward+backward under `MixedPrecisionPolicy(param_dtype, reduce_dtype)` on a 1-D mesh.

    Then one Adam step. Returns every collective this rank made (op, bytes sent), the dtype
    the first unit computes in, the dtypes of the sharded parameters and gradients, and the
    bytes this rank keeps between steps, so a test can pin what the policy does.
    """
    pd = ParallelDims(dist.get_world_size())
    pd.build_meshes(rank_device().type)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    model = _fully_shard_units(
        _two_unit_model().to(rank_device()),
        fsdp_mesh(pd),
        mp_policy=policy,
        reshard_after_forward=reshard_after_forward,
    )
    compute_dtypes = set()
    model[0].register_forward_pre_hook(
        lambda unit, args: compute_dtypes.add(str(unit.weight.dtype))
    )
    with Ledger() as ledger:
        model(torch.randn(4, 8, device=rank_device())).sum().backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    states = [t for state in optimizer.state.values() for t in state.values() if t.dim() > 0]
    local = [p.to_local() for p in model.parameters()]
    return {
        "calls": [(r.op, r.bytes_sent) for r in ledger.records],
        "compute_dtypes": compute_dtypes,
        "param_dtypes": {str(p.dtype) for p in model.parameters()},
        "grad_dtypes": {str(p.grad.dtype) for p in model.parameters()},
        "held_bytes": {
            "params": sum(t.numel() * t.element_size() for t in local),
            "grads": sum(
                p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters()
            ),
            "adam": sum(t.to_local().numel() * t.element_size() for t in states),
        },
    }


def fsdp2_inference_root_facts() -> dict[str, bool]:
    """Which parameters FSDP2 leaves gathered after a forward under `no_grad`, the default
    `reshard_after_forward`: two units, then a head of the root's own (a text encoder's
    embedding and output stay in the root, as Cosmos-Transfer2.5's Reason1 encoder shards it).
    Returns, per parameter name, whether it is still sharded (a DTensor) after the forward."""
    pd = ParallelDims(dist.get_world_size())
    pd.build_meshes(rank_device().type)
    model = _fully_shard_units(
        torch.nn.Sequential(*_two_unit_model(), torch.nn.Linear(8, 8, bias=False)),
        fsdp_mesh(pd),
        units=2,
    )
    with torch.no_grad():
        model(torch.randn(4, 8, device=rank_device()))
    return {name: isinstance(p, DTensor) for name, p in model.named_parameters()}


def _replicate_dims(t) -> list[int]:
    """Mesh dims (of size > 1) along which this DTensor's local shard is the same on every rank."""
    mesh = t.device_mesh
    return [d for d, p in enumerate(t.placements) if p.is_replicate() and mesh.size(d) > 1]


def _is_first_replica(t) -> bool:
    return all(t.device_mesh.get_local_rank(d) == 0 for d in _replicate_dims(t))


def _one_reader_per_replica_planner():
    """A load planner that keeps a read only on the first rank of each replica group."""
    from dataclasses import replace

    from torch.distributed.checkpoint import DefaultLoadPlanner

    class OneReaderPerReplica(DefaultLoadPlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            return replace(
                plan,
                items=[
                    i for i in plan.items if _is_first_replica(self.state_dict[i.dest_index.fqn])
                ],
            )

    return OneReaderPerReplica()


def checkpoint_round_trip(directory: str, dp_replicate: int) -> dict:
    """Save an FSDP2/HSDP model with `torch.distributed.checkpoint`, then load it twice into fresh models.

    "every rank": plain `dcp.load`, each rank reads its own shards. "one reader": only the
    first rank of each replica group reads, then broadcasts its shards down the replica
    group. Returns the tensor slices the checkpoint stores, and per load the slices this
    rank read (file, offset, length), the broadcasts it made after the load (group size),
    and whether every loaded shard equals the saved one.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    world = dist.get_world_size()
    pd = ParallelDims(world, dp_shard=world // dp_replicate, dp_replicate=dp_replicate)
    pd.build_meshes("cpu")
    saved = _fully_shard_units(_two_unit_model(), fsdp_mesh(pd))
    dcp.save(saved.state_dict(), checkpoint_id=directory)
    stored = FileSystemReader(directory).read_metadata().storage_data.values()
    result = {"stored": sorted((s.relative_path, s.offset, s.length) for s in stored)}
    for mode in ("every rank", "one reader"):
        reads: list[tuple[str, int, int]] = []

        class CountingReader(FileSystemReader):
            def read_data(self, plan, planner):
                for item in plan.items:
                    info = self.storage_data[item.storage_index]
                    reads.append((info.relative_path, info.offset, info.length))  # noqa: B023 - read in this iteration
                return super().read_data(plan, planner)

        fresh = _fully_shard_units(
            torch.nn.Sequential(
                torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False)
            ),
            fsdp_mesh(pd),
        )
        state = fresh.state_dict()
        planner = _one_reader_per_replica_planner() if mode == "one reader" else None
        dcp.load(state, storage_reader=CountingReader(directory), planner=planner)
        with Ledger() as ledger:
            if mode == "one reader":
                for t in state.values():
                    for d in _replicate_dims(t):
                        dist.broadcast(t.to_local(), group=t.device_mesh.get_group(d), group_src=0)
        result[mode] = {
            "reads": sorted(reads),
            "broadcasts": [r.group_size for r in ledger.records if r.op == "broadcast"],
            "loaded_equal": all(
                torch.equal(a.to_local(), b.to_local())
                for a, b in zip(saved.parameters(), fresh.parameters())
            ),
        }
    return result
