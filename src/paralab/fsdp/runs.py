"""Lab 01's experiments: the single-process reference, per-rank training jobs, and the formulas.

One launch runs several `Job`s in a row on the same ranks (each builds its own
meshes), because a launch costs far more than a few tiny training steps.
Every job trains the same float64 `MLPStack` for `STEPS` optimizer steps on
its rank's slice of one global batch and returns what the notebook checks:
the parameters this rank holds, the ledger records, and the memory it held.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from paralab.check import Verdict, compare
from paralab.fsdp.costs import fsdp2_calls_formula, memory_formula, per_step_sent, traffic_formula
from paralab.fsdp.zero import HandFSDP, ShardOptimizer, all_reduce_gradients, flat_shard
from paralab.launch import rank_device
from paralab.ledger import Ledger, calls
from paralab.models import MLPStack, make_mlp_stack, regression_data
from paralab.parallel_dims import ParallelDims, fsdp_mesh

GLOBAL_BATCH = 16
STEPS = 3
LR = {"sgd": 0.1, "adam": 0.05}


@dataclass(frozen=True)
class Job:
    """One training run on every rank of a launch.

    engine: "hand" (our ZeRO-3 / HSDP / ZeRO-2-like), "ddp" (all-reduce of
    gradients) or "fsdp2" (torch's `fully_shard`). mesh (fsdp2 only):
    "fsdp_mesh" or "dp_mesh", the 2-D (dp_replicate, dp_shard) mesh of the trap.
    """

    engine: str
    dp_replicate: int = 1
    optimizer: str = "adam"
    reshard_after_forward: bool = True
    mesh: str = "fsdp_mesh"

    @property
    def strategy(self) -> str:
        if self.engine != "hand":
            return {"ddp": "DDP", "fsdp2": "FSDP2"}[self.engine]
        keep = "" if self.reshard_after_forward else "ZeRO-2-like"
        if self.dp_replicate > 1:
            return f"HSDP {keep}".rstrip()
        return keep or "ZeRO-3"

    def label(self, world: int) -> str:
        shard = world // self.dp_replicate
        if self.engine == "ddp":
            return f"DDP n={world}"
        if self.engine == "fsdp2":
            layout = f"HSDP {self.dp_replicate}x{shard}" if self.dp_replicate > 1 else f"n={world}"
            trap = f" on (1,{world}) dp_mesh" if self.mesh == "dp_mesh" else ""
            return f"FSDP2 {layout}{trap} {self.optimizer}"
        if self.dp_replicate > 1:
            return (
                self.strategy.replace("HSDP", f"HSDP {self.dp_replicate}x{shard}")
                + f" {self.optimizer}"
            )
        return f"{self.strategy} n={world} {self.optimizer}"


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).mean()


def local_batch(
    rank: int, world: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous slice of the global batch (equal slices, so mean of means = global mean)."""
    x, y = regression_data(GLOBAL_BATCH)
    size = GLOBAL_BATCH // world
    return x[rank * size : (rank + 1) * size].to(device), y[rank * size : (rank + 1) * size].to(
        device
    )


def _my_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return local_batch(dist.get_rank(), dist.get_world_size(), rank_device())


def torch_optimizer(params, kind: str) -> torch.optim.Optimizer:
    """The references' and FSDP2's optimizer: torch.optim's single-tensor code path."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR["sgd"], momentum=0.9, foreach=False)
    return torch.optim.Adam(params, lr=LR["adam"], foreach=False)


def reference_first_gradient() -> MLPStack:
    """The global-batch gradient at the initial weights, stored as the values of a
    model-shaped container, so that `expected_params` slices it like parameters."""
    model = make_mlp_stack()
    x, y = regression_data(GLOBAL_BATCH)
    mse(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    return model


def reference_first_loss(rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s loss at the initial weights on its own slice (same shapes as on the rank)."""
    x, y = local_batch(rank, world)
    with torch.no_grad():
        return mse(make_mlp_stack()(x), y)


def train_reference(optimizer: str = "adam", steps: int = STEPS) -> MLPStack:
    """One process, the whole global batch, torch.optim (single-tensor path)."""
    model = make_mlp_stack()
    x, y = regression_data(GLOBAL_BATCH)
    opt = torch_optimizer(model.parameters(), optimizer)
    for _ in range(steps):
        mse(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


def train_reference_rank_by_rank(
    world: int, dp_replicate: int = 1, optimizer: str = "adam", steps: int = STEPS
) -> MLPStack:
    """One process, but the gradient is combined like the ranks do: each rank's local-batch
    gradient, averaged inside each shard group, then across replicas (sums left to right)."""
    model = make_mlp_stack()
    shard = world // dp_replicate
    opt = torch_optimizer(model.parameters(), optimizer)
    for _ in range(steps):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            mse(model(local_batch(rank, world)[0]), local_batch(rank, world)[1]).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])
        groups = [per_rank[g * shard : (g + 1) * shard] for g in range(dp_replicate)]
        group_means = [[sum(gs[1:], gs[0]) / shard for gs in zip(*grp)] for grp in groups]
        for p, gs in zip(model.parameters(), zip(*group_means)):
            p.grad = sum(gs[1:], gs[0]) / dp_replicate
        opt.step()
    return model


# ---------------------------------------------------------------- per-rank jobs
def _train(forward, optimizer, x, y, steps: int, grads, after_backward=None) -> dict:
    """`steps` optimizer steps under a ledger; keeps the first step's loss and gradients (`grads()`)."""
    out = {}
    with Ledger() as led:
        for step in range(steps):
            optimizer.zero_grad()
            with led.phase("forward"):
                loss = mse(forward(x), y)
            with led.phase("backward"):
                loss.backward()
                if after_backward is not None:
                    after_backward()
            if step == 0:
                out.update(loss=loss.detach().clone(), grads=grads())
            with led.phase("optimizer"):
                optimizer.step()
    out["records"] = led.records
    return out


def _groups(pd: ParallelDims) -> tuple:
    shard = pd.dp_shard_mesh.get_group() if pd.dp_shard_mesh is not None else None
    replicate = pd.dp_replicate_mesh.get_group() if pd.dp_replicate_mesh is not None else None
    return shard, replicate


def run_hand(job: Job, pd: ParallelDims, steps: int, impl: dict) -> dict:
    shard_group, replicate_group = _groups(pd)
    model = make_mlp_stack().to(rank_device())
    engine = impl["HandFSDP"].wrap(
        model.units(), shard_group, replicate_group, job.reshard_after_forward
    )
    opt = impl["ShardOptimizer"](engine.shards(), job.optimizer, lr=LR[job.optimizer])
    x, y = _my_batch()
    out = _train(engine, opt, x, y, steps, grads=lambda: [s.grad.clone() for s in engine.shards()])
    memory = {
        "params": sum(s.nbytes for s in engine.shards()),
        "grads": sum(s.grad.nbytes for s in engine.shards()),
        "optimizer": opt.state_bytes(),
        "gathered peak": engine.peak_gathered_bytes,
    }
    return {**out, "params": [s.detach().clone() for s in engine.shards()], "memory": memory}


def run_ddp(job: Job, pd: ParallelDims, steps: int, impl: dict) -> dict:
    model = make_mlp_stack().to(rank_device())
    opt = impl["ShardOptimizer"](list(model.parameters()), job.optimizer, lr=LR[job.optimizer])
    x, y = _my_batch()
    reduce = impl["all_reduce_gradients"]
    out = _train(
        model,
        opt,
        x,
        y,
        steps,
        grads=lambda: {k: p.grad.clone() for k, p in model.named_parameters()},
        after_backward=lambda: reduce(model.units(), dist.group.WORLD),
    )
    memory = {
        "params": sum(p.nbytes for p in model.parameters()),
        "grads": sum(p.grad.nbytes for p in model.parameters()),
        "optimizer": opt.state_bytes(),
        "gathered peak": 0,
    }
    return {
        **out,
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
        "memory": memory,
    }


def run_fsdp2(job: Job, pd: ParallelDims, steps: int, impl: dict) -> dict:
    from torch.distributed.fsdp import fully_shard

    mesh = pd.dp_mesh if job.mesh == "dp_mesh" else fsdp_mesh(pd)
    model = make_mlp_stack().to(rank_device())
    for unit in model.units():
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch_optimizer(model.parameters(), job.optimizer)
    x, y = _my_batch()
    out = _train(
        model,
        opt,
        x,
        y,
        steps,
        grads=lambda: {k: p.grad.to_local().clone() for k, p in model.named_parameters()},
    )
    return {
        **out,
        "params": {k: p.to_local().detach().clone() for k, p in model.named_parameters()},
    }


RUNNERS = {"hand": run_hand, "ddp": run_ddp, "fsdp2": run_fsdp2}


def run_jobs(jobs: list[Job], steps: int = STEPS, **impl) -> list[dict]:
    """Run on every rank of a launch: each job on fresh meshes, results in job order.

    `impl` may replace HandFSDP, ShardOptimizer or all_reduce_gradients (a
    notebook passes the versions its cells define, so an edited cell takes effect).
    """
    impl = {
        "HandFSDP": HandFSDP,
        "ShardOptimizer": ShardOptimizer,
        "all_reduce_gradients": all_reduce_gradients,
        **impl,
    }
    world = dist.get_world_size()
    results = []
    for job in jobs:
        pd = ParallelDims(world, dp_shard=world // job.dp_replicate, dp_replicate=job.dp_replicate)
        pd.build_meshes(rank_device().type)
        result = RUNNERS[job.engine](job, pd, steps, impl)
        result.update(label=job.label(world), job=job, world=world)
        results.append(result)
    return results


# ---------------------------------------------------------------- what each rank should hold
def expected_params(reference: MLPStack, job: Job, world: int, rank: int):
    """The slice of the reference model that `rank` must hold after `job`."""
    shard_size = world // job.dp_replicate
    if job.engine == "ddp":
        return {k: p.detach() for k, p in reference.named_parameters()}
    if job.engine == "fsdp2":
        return {
            k: dim0_chunk(p.detach(), shard_size, rank % shard_size)
            for k, p in reference.named_parameters()
        }
    return [flat_shard(u, shard_size, rank % shard_size) for u in reference.units()]


def dim0_chunk(t: torch.Tensor, n: int, index: int) -> torch.Tensor:
    """FSDP2's per-parameter shard: `torch.chunk` along dim 0, empty for ranks past the last chunk."""
    chunks = torch.chunk(t, n, dim=0)
    return chunks[index] if index < len(chunks) else t.new_empty((0, *t.shape[1:]))


# ---------------------------------------------------------------- sizes
def unit_numels(model: MLPStack | None = None) -> list[int]:
    model = model or make_mlp_stack()
    return [sum(p.numel() for p in u.parameters()) for u in model.units()]


# ---------------------------------------------------------------- checks the notebook prints
def check_params(
    per_rank: list[dict], reference: MLPStack, atol: float = 0.0, key: str = "params"
) -> list[Verdict]:
    """Every tensor every rank holds after one job (`key`: "params", or "grads" of the
    first step against `reference_first_gradient()`), element by element."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    expected = [expected_params(reference, job, world, r) for r in range(world)]
    return compare([r[key] for r in per_rank], expected, atol=atol, name=per_rank[0]["label"])


def check_counts(label: str, measured: list[list[int]], formula: list[int]) -> Verdict:
    """Integers measured on every rank (rows) against the formula's (one row): one verdict."""
    expected = torch.tensor([formula] * len(measured))
    return compare(torch.tensor(measured), expected, name=label)[0]


MEMORY_PARTS = ("params", "grads", "optimizer", "gathered peak")


def check_traffic(per_rank: list[dict], numels: list[int]) -> Verdict:
    """Bytes every rank sent per step, per collective, vs `traffic_formula` (hand-written engines)."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    formula = traffic_formula(
        job.engine, numels, world, job.dp_replicate, job.reshard_after_forward
    )
    ops = sorted(formula)
    measured = [[per_step_sent(r["records"], STEPS).get(op, 0) for op in ops] for r in per_rank]
    return check_counts(
        f"{per_rank[0]['label']}: {', '.join(ops)}", measured, [formula[op] for op in ops]
    )


def check_memory(per_rank: list[dict], numels: list[int]) -> Verdict:
    """Bytes every rank held (params, grads, optimizer state, gathered peak) vs `memory_formula`."""
    job, world = per_rank[0]["job"], per_rank[0]["world"]
    formula = memory_formula(
        job.engine, numels, world, job.optimizer, job.dp_replicate, job.reshard_after_forward
    )
    return check_counts(
        f"{per_rank[0]['label']}: {', '.join(MEMORY_PARTS)}",
        [[r["memory"][p] for p in MEMORY_PARTS] for r in per_rank],
        [formula[p] for p in MEMORY_PARTS],
    )


def fsdp2_calls(records: list, dp_replicate: int) -> list[int]:
    """FSDP2's calls per step from the ledger, in the order of `fsdp2_calls_formula`."""
    replica = calls(records, op="all_reduce", group_size=dp_replicate) if dp_replicate > 1 else 0
    counts = [
        calls(records, op="all_gather_single"),
        calls(records, op="reduce_scatter_single"),
        calls(records, op="all_reduce", group_size=1),
        replica,
    ]
    return [c // STEPS for c in counts]


def check_fsdp2_calls(per_rank: list[dict], n_units: int) -> Verdict:
    """FSDP2's calls per step on every rank vs `fsdp2_calls_formula` (the 2-D-mesh trap's extra all-reduce)."""
    job = per_rank[0]["job"]
    formula = fsdp2_calls_formula(n_units, job.dp_replicate, job.mesh == "dp_mesh")
    return check_counts(
        per_rank[0]["label"],
        [fsdp2_calls(r["records"], job.dp_replicate) for r in per_rank],
        formula,
    )


# ---------------------------------------------------------------- engine facts the chapters cite
def _two_unit_model() -> torch.nn.Sequential:
    """Two bias-free float32 Linear(8, 8) units: 64 elements each, no padding up to 8 ranks."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))


def _fully_shard_units(model: torch.nn.Sequential, mesh, **kwargs) -> torch.nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    for unit in model:
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
    from torch.distributed.fsdp import MixedPrecisionPolicy

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
