"""Lab 01's experiments: the per-rank training jobs and the single-process references they must match.

One launch runs several `Job`s in a row on the same ranks (each builds its own
meshes), because a launch costs far more than a few tiny training steps.
Every job trains the same float64 `MLPStack` for `STEPS` optimizer steps on
its rank's slice of one global batch and returns what the notebook checks:
the parameters this rank holds, the ledger records, and the memory it held.
The comparisons against the references are in `paralab.fsdp.checks`; the
FSDP2 engine facts the chapters cite in `paralab.fsdp.engine_facts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from paralab.fsdp import zero
from paralab.launch import rank_device
from paralab.ledger import Ledger
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


def run_hand(job: Job, pd: ParallelDims, steps: int) -> dict:
    """The hand-written engine (`zero.HandFSDP`, `zero.ShardOptimizer`), looked up at call time."""
    shard_group, replicate_group = _groups(pd)
    model = make_mlp_stack().to(rank_device())
    engine = zero.HandFSDP.wrap(
        model.units(), shard_group, replicate_group, job.reshard_after_forward
    )
    opt = zero.ShardOptimizer(engine.shards(), job.optimizer, lr=LR[job.optimizer])
    x, y = _my_batch()
    out = _train(engine, opt, x, y, steps, grads=lambda: [s.grad.clone() for s in engine.shards()])
    memory = {
        "params": sum(s.nbytes for s in engine.shards()),
        "grads": sum(s.grad.nbytes for s in engine.shards()),
        "optimizer": opt.state_bytes(),
        "gathered peak": engine.peak_gathered_bytes,
    }
    return {**out, "params": [s.detach().clone() for s in engine.shards()], "memory": memory}


def run_ddp(job: Job, pd: ParallelDims, steps: int) -> dict:
    """DDP for contrast: full parameters, `zero.all_reduce_gradients` after each backward."""
    model = make_mlp_stack().to(rank_device())
    opt = zero.ShardOptimizer(list(model.parameters()), job.optimizer, lr=LR[job.optimizer])
    x, y = _my_batch()
    out = _train(
        model,
        opt,
        x,
        y,
        steps,
        grads=lambda: {k: p.grad.clone() for k, p in model.named_parameters()},
        after_backward=lambda: zero.all_reduce_gradients(model.units(), dist.group.WORLD),
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


def run_fsdp2(job: Job, pd: ParallelDims, steps: int) -> dict:
    """torch's FSDP2 (`fully_shard`) on `fsdp_mesh(pd)`, or on the 2-D `pd.dp_mesh` of the trap."""
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


def run_jobs(jobs: list[Job], steps: int = STEPS) -> list[dict]:
    """Run on every rank of a launch: each job on fresh meshes, results in job order.

    The engines are read from `paralab.fsdp.zero` at call time, so an edited
    engine reaches the ranks as a patch set:
    `run(run_jobs, n, jobs, patches={"paralab.fsdp.zero": {"HandFSDP": edited}})`.
    """
    world = dist.get_world_size()
    results = []
    for job in jobs:
        pd = ParallelDims(world, dp_shard=world // job.dp_replicate, dp_replicate=job.dp_replicate)
        pd.build_meshes(rank_device().type)
        result = RUNNERS[job.engine](job, pd, steps)
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
    return [zero.flat_shard(u, shard_size, rank % shard_size) for u in reference.units()]


def dim0_chunk(t: torch.Tensor, n: int, index: int) -> torch.Tensor:
    """FSDP2's per-parameter shard: `torch.chunk` along dim 0, empty for ranks past the last chunk."""
    chunks = torch.chunk(t, n, dim=0)
    return chunks[index] if index < len(chunks) else t.new_empty((0, *t.shape[1:]))


# ---------------------------------------------------------------- sizes
def unit_numels(model: MLPStack | None = None) -> list[int]:
    """Parameters per unit of the lab's model: what the byte formulas count."""
    model = model or make_mlp_stack()
    return [sum(p.numel() for p in u.parameters()) for u in model.units()]
