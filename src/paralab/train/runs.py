"""Training runs: the global batch, which sample a rank loads, the training loop, the reference.

`train` runs inside `paralab.launch.run` on every rank; `reference` is one process
on the whole global batch. Both draw every sample from `make_sample(seed, step,
index)`, so the parallel run and the reference see the same data by construction,
and the only question is whether each rank picks the right sample and the right
tokens of it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.utils import counters, get_compilation_metrics
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from paralab.launch import groups_freed
from paralab.ledger import Ledger, in_phase
from paralab.parallel_dims import ParallelDims
from paralab.patches import patched
from paralab.train.model import DTYPE, SHAPE, SequenceShard, build_model, loss_of
from paralab.train.parallelism import (
    CPAttention,
    apply_ac,
    apply_compile,
    blocks_of,
    parallelize,
    shard_on,
)

LEARNING_RATE = {"sgd": 0.2, "adam": 0.02}
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def make_sample(
    seed: int, step: int, index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample `index` of the global batch at `step`: (noisy tokens, noise level, noise), full length."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + index)
    clean = torch.randn(1, SHAPE["tokens"], SHAPE["channels"], dtype=DTYPE, generator=g)
    noise = torch.randn(clean.shape, dtype=DTYPE, generator=g)
    sigma = torch.rand(1, dtype=DTYPE, generator=g)
    return (1 - sigma) * clean + sigma * noise, sigma, noise


def samples_in_batch(parallel_dims: ParallelDims) -> int:
    """The global batch: one sample per group of cfgp * cp ranks that share it."""
    return parallel_dims.world_size // (parallel_dims.cfgp * parallel_dims.cp)


def sample_index(rank: int, parallel_dims: ParallelDims) -> int:
    """Which sample of the global batch this rank loads: rest = rank // (cfgp * cp).

    cp partners (consecutive ranks, cp innermost in the overlay mesh) get the same
    sample, and each then keeps its own shard of the tokens.
    """
    return rank // (parallel_dims.cfgp * parallel_dims.cp)


def sample_and_positions(
    rank: int, parallel_dims: ParallelDims, n_tokens: int, zigzag: bool
) -> tuple[int, list[int]]:
    """The sample `rank` loads and the global positions of the tokens it keeps, by arithmetic.

    The overlay mesh is (rest, cfgp, cp), cp innermost; a cp rank keeps shard `rank % cp` of
    the sequence: chunk `i` of `cp` chunks, or with `zigzag` chunks `i` and `2cp-1-i` of `2cp`.
    """
    ### BEGIN SOLUTION
    cp = parallel_dims.cp
    cp_rank = rank % cp
    chunks = 2 * cp if zigzag else cp
    size = n_tokens // chunks
    held = (cp_rank, chunks - 1 - cp_rank) if zigzag else (cp_rank,)
    positions = [chunk * size + i for chunk in held for i in range(size)]
    return rank // (parallel_dims.cfgp * cp), positions
    ### END SOLUTION


def optimizer_for(params: Any, kind: str) -> torch.optim.Optimizer:
    """SGD, or Adam fused as torchtitan builds it by default (`implementation = "fused"`,
    pytorch/torchtitan@b5bcd76:torchtitan/components/optimizer/optimizer.py).

    Fused Adam runs on CPU too, and DTensor shards it: one kernel per parameter instead of a
    dozen dispatched ops, which makes an 8-rank Adam step cost what an SGD step costs here.
    SGD stays the for-loop one: DTensor has no sharding strategy for fused SGD.
    """
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE[kind])
    if kind == "adam":
        return torch.optim.Adam(params, lr=LEARNING_RATE[kind], fused=True)
    raise ValueError(f"optimizer = {kind!r}, expected 'sgd' or 'adam'")


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, unsharded, under its plain model name (one all-gather per FSDP unit)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    out = {}
    for name, p in model.named_parameters():
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        out[name] = (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
    for unit in units:
        unit.reshard()
    return out


def training_loop(
    model: nn.Module, sample: int, *, steps: int, optimizer: str, seed: int
) -> dict[str, torch.Tensor]:
    """`steps` optimizer steps of `model` on sample `sample` of each step's global batch; full params back."""
    opt = optimizer_for(model.parameters(), optimizer)
    for step in range(steps):
        with in_phase("forward"):
            loss = loss_of(model, *make_sample(seed, step, sample))
        with in_phase("backward"):
            loss.backward()
        with in_phase("optimizer"):
            opt.step()
            opt.zero_grad()
    with in_phase("report"):
        return full_parameters(model)


def device_type() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def ensure_meshes(parallel_dims: ParallelDims) -> ParallelDims:
    if not parallel_dims.mesh:
        parallel_dims.build_meshes(device_type())
    return parallel_dims


def check_training_args(parallel_dims: ParallelDims, steps: int) -> None:
    """Refuse, naming the value, what would otherwise train nothing or train an inference layout."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train: steps must be an int >= 1, got steps={steps!r}")
    if parallel_dims.enable_inference_mode:
        raise ValueError(
            f"train: the descriptor is an inference layout (enable_inference_mode=True, "
            f"cfgp={parallel_dims.cfgp}); CFG parallelism has no backward. Train with "
            "enable_inference_mode=False and cfgp=1"
        )


def train(
    parallel_dims: ParallelDims,
    *,
    steps: int = 3,
    attention: str = "ring",
    ac: str = "none",
    compile: bool = False,
    optimizer: str = "sgd",
    seed: int = 0,
    causal: bool = False,
) -> dict[str, torch.Tensor]:
    """Train the DiT on this rank's share of the global batch; every rank returns the same full parameters.

    Runs on the current default process group (call it inside `paralab.launch.run`).
    The model is parallelized by `parallelize` (CP -> AC -> compile -> FSDP).
    """
    check_training_args(parallel_dims, steps)
    pd = ensure_meshes(parallel_dims)
    model = parallelize(build_model(causal), pd, attention=attention, ac=ac, compile=compile)
    return training_loop(
        model, sample_index(dist.get_rank(), pd), steps=steps, optimizer=optimizer, seed=seed
    )


def reference(
    *, samples: int, steps: int = 3, optimizer: str = "sgd", seed: int = 0, causal: bool = False
) -> dict[str, torch.Tensor]:
    """One process, the whole global batch of `samples` samples, loss = mean over samples."""
    model = build_model(causal)
    opt = optimizer_for(model.parameters(), optimizer)
    for step in range(steps):
        batch = [make_sample(seed, step, i) for i in range(samples)]
        noisy, sigma, noise = (torch.cat(parts) for parts in zip(*batch))
        loss_of(model, noisy, sigma, noise).backward()
        opt.step()
        opt.zero_grad()
    return full_parameters(model)


# ------------------------------------------------------------------ per-rank jobs of the lab and tests
_BUILT: dict[tuple, ParallelDims] = {}
"""ParallelDims with meshes, per (world, dims), in this rank process: a launch builds each mesh once."""


def dims_of(dims: dict) -> ParallelDims:
    """The ParallelDims of `dims` on this world, meshes built once per process and reused."""
    key = (dist.get_world_size(), tuple(sorted(dims.items())))
    if key not in _BUILT:
        _BUILT[key] = ensure_meshes(ParallelDims(dist.get_world_size(), **dims))
    return _BUILT[key]


@contextlib.contextmanager
def meshes_freed():
    """Forget the meshes `dims_of` builds inside the block and destroy their process groups
    (`launch.groups_freed`) when it ends: a launch that trains one layout after another would
    otherwise keep each finished layout's gloo groups alive."""
    built = set(_BUILT)
    try:
        with groups_freed():
            yield
    finally:
        for key in set(_BUILT) - built:
            del _BUILT[key]


def run_variants(
    jobs: list[tuple[dict, dict]], *, steps: int = 3, ledger: bool = False
) -> list[dict]:
    """One launch, many trainings: `train(ParallelDims(**dims), **variant)` for each (dims, variant).

    Returns per job {"params", "records"} (records: this rank's ledger, when asked).
    """
    out = []
    for dims, variant in jobs:
        with Ledger() if ledger else contextlib.nullcontext() as led:
            params = train(dims_of(dims), steps=steps, **variant)
        out.append({"params": params, "records": led.records if ledger else []})
    return out


def compile_report() -> dict:
    """What torch.compile captured in this process so far: graphs, graph breaks, and where each graph is.

    "frames": one row per forward frame Dynamo compiled (its compile id, function,
    file:line, ops in its graph, and why it was compiled again, if it was); a frame
    with ops is one of the "graphs", a recompile is a second graph of the same code.
    """
    breaks = {str(reason).splitlines()[0][:90]: n for reason, n in counters["graph_break"].items()}
    frames = [
        {
            "id": m.compile_id,
            "function": m.co_name,
            "where": f"{(m.co_filename or '').rsplit('/', 1)[-1]}:{m.co_firstlineno}",
            "ops": m.graph_op_count or 0,
            "recompiled because": (m.recompile_reason or "")
            .split("#")[0]
            .split(":", 1)[-1]
            .strip(),
        }
        for m in get_compilation_metrics()
        if m.is_forward and m.co_name
    ]
    return {"graphs": counters["stats"]["unique_graphs"], "breaks": breaks, "frames": frames}


def local_losses(
    dims: dict, *, attention: str = "ring", causal: bool = False, seed: int = 0
) -> dict:
    """This rank's cp-local loss at step 0, its sample and the global positions of its tokens."""
    pd = dims_of(dims)
    model = parallelize(build_model(causal), pd, attention=attention)
    sample = sample_index(dist.get_rank(), pd)
    with torch.no_grad():
        loss = loss_of(model, *make_sample(seed, 0, sample))
    return {
        "sample": sample,
        "positions": model.shard.positions(SHAPE["tokens"]).tolist(),
        "loss": loss.item(),
    }


def generate_demo(
    dims: dict, *, prompt_tokens: int = 4, new_tokens: int = 4, seed: int = 0
) -> dict:
    """FSDP-sharded `generate`: first unregistered (what happens), then registered with FSDP."""
    pd = dims_of(dims)
    model = parallelize(build_model(causal=True), pd)
    noisy, sigma, _ = make_sample(seed, 0, sample_index(dist.get_rank(), pd))
    prompt = noisy[:, :prompt_tokens]
    try:
        with torch.no_grad():
            model.generate(prompt, sigma, new_tokens)
        before = "ran"
    except Exception as exc:  # the notebook shows what an unregistered method does
        before = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    register_fsdp_forward_method(model, "generate")
    with torch.no_grad():
        after = model.generate(prompt, sigma, new_tokens)
    return {"before": before, "after": after, "prompt": prompt, "sigma": sigma}


def run_in_order(dims: dict, order: tuple[str, ...], variant: dict, *, steps: int = 3) -> dict:
    """`train` with the wrappers installed in another order; the error, if any, comes back as text."""
    pd = dims_of(dims)
    try:
        with patched({"paralab.train.parallelism": {"ORDER": order}}):
            return {"params": train(pd, steps=steps, **variant), "error": None}
    except Exception as exc:  # reported to the notebook, which shows what each wrong order does
        return {"params": None, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}


def titan_meshes(world: int, dp_replicate: int, cp: int) -> dict:
    """torchtitan's consuming reading of the same ranks: (dp_replicate, dp_shard = world/(dp_replicate*cp), cp),
    with FSDP on the flattened dp_shard_cp mesh."""
    dp_shard = world // (dp_replicate * cp)
    mesh = init_device_mesh(
        device_type(),
        (dp_replicate, dp_shard, cp),
        mesh_dim_names=("dp_replicate", "dp_shard", "cp"),
    )
    mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    fsdp = mesh[("dp_replicate", "dp_shard_cp")] if dp_replicate > 1 else mesh["dp_shard_cp"]
    coord = mesh.get_coordinate()
    return {
        "fsdp": fsdp,
        "cp": mesh["cp"],
        "dp_index": coord[0] * dp_shard + coord[1],
        "dp_shard": dp_shard,
    }


def run_titan(dp_replicate: int, cp: int, variant: dict, *, steps: int = 3) -> dict:
    """The same training with torchtitan's meshes: cp group and FSDP mesh from its 3-D mesh, batch by dp index."""
    world = dist.get_world_size()
    t = titan_meshes(world, dp_replicate, cp)
    causal = variant.get("causal", False)
    attention = variant.get("attention", "ring")
    model = build_model(causal)
    for block in blocks_of(model):
        block.attention = CPAttention(attention, t["cp"].get_group(), causal)
    model.shard = SequenceShard(t["cp"].get_local_rank(), cp, zigzag=attention == "ring" and causal)
    apply_ac(model, variant.get("ac", "none"))
    apply_compile(model, variant.get("compile", False))
    shard_on(model, t["fsdp"])
    params = training_loop(
        model,
        t["dp_index"],
        steps=steps,
        optimizer=variant.get("optimizer", "sgd"),
        seed=variant.get("seed", 0),
    )
    return {
        "params": params,
        "dp_shard": t["dp_shard"],
        "fsdp_mesh": tuple(t["fsdp"].mesh.shape),
        "fsdp_group": sorted(set(t["fsdp"].mesh.flatten().tolist())),
    }
