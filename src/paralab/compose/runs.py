"""The composed training step on every rank, the one-process reference, and the checks.

One step on one rank, every axis from its own package:
1. the model cut over tp (`tp.model.tensor_parallel`), then over cp (`model.context_parallel`:
   the ring on zigzag shards), then by depth (`model.LMStage`);
2. this rank's sample (its `dp` coordinate) and its cp tokens, cut into m micro-batches;
3. the pipeline: 1F1B (`pp.schedules.build_schedule`) run by `pp.executor.run_actions`,
   its messages addressed to the global ranks of this rank's pp group;
4. the loss: each rank's summed cross-entropy over the tokens all of dp_cp counts together
   (one all-reduce of the count, torchtitan's `global_valid_tokens`), so ranks may hold
   unequal tokens (padding: `padded_batch`);
5. the gradient sum over dp_cp (torchtitan's `gradient_divide_factor` 1): reduce-scatter
   over dp_shard_cp, all-reduce over dp_replicate, the SGD step on this rank's 1/N of the
   stage, then all-gather (`fsdp.zero.gather_unit_params`). Gradients and the step are
   sharded (ZeRO-2); the parameters stay whole between steps.

`compose_worker` is the same step under the ledger, returning the records as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paralab.check import Verdict, compare
from paralab.compose.costs import group_phase_bytes, moe_group_phase_bytes
from paralab.compose.grid import DOC_ORDER, Grid
from paralab.compose.model import (
    CONFIG,
    IGNORE_INDEX,
    LMStage,
    context_parallel,
    microbatch_lm_loss,
    positions_of,
)
from paralab.compose.moe import (
    MoEMLP,
    aux_loss,
    expert_parallel,
    is_expert,
    moe_config,
    saw_every_token,
    with_experts,
)
from paralab.cp.layout import shard_sequence
from paralab.fsdp.zero import FlatUnit, flat_shard, gather_unit_params
from paralab.fsdp.zero import unflatten as unflatten_unit
from paralab.launch import groups_freed
from paralab.ledger import Ledger, Record, in_phase
from paralab.pp.executor import run_actions
from paralab.pp.schedules import Schedule, addressed, build_schedule
from paralab.tp.layout import owned_range
from paralab.tp.model import build_model, param_splits, tensor_parallel
from paralab.tp.runs import LR, RELATIVE_BOUND, full_params, global_batch, sample_rows

GROUPS = ("tp", "cp", "pp", "dp_shard_cp", "dp_replicate", "dp_cp")
EXPERT_GROUPS = ("ep", "dp_shard_mod_ep")
"""The groups a step talks over (ep joins them in an MoE model)."""
PHASES = {
    "token count": ("dp_cp",),
    "forward": ("tp", "cp", "pp", "ep"),
    "backward": ("tp", "cp", "pp", "ep"),
    "grad sync": ("tp", "dp_shard_cp", "dp_replicate", "dp_shard_mod_ep"),
    "param gather": ("dp_shard_cp", "dp_shard_mod_ep"),
}
"""Which groups each phase talks over: the ledger's records are named by their ranks."""


class ProcessGroups:
    """This rank's process group per grid name. Every rank makes every distinct group of every
    name, in the same order (`new_group` is called by all ranks), and keeps its own."""

    def __init__(self, grid: Grid, names: tuple[str, ...] = GROUPS) -> None:
        rank = dist.get_rank()
        made: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in sorted({g for name in names for g in grid.groups(name)}):
            group = dist.new_group(list(ranks))
            if rank in ranks:
                made[ranks] = group
        self.ranks = {name: grid.group(rank, name) for name in names}
        self.group = {name: made[ranks] for name, ranks in self.ranks.items()}

    def index(self, name: str) -> int:
        return self.ranks[name].index(dist.get_rank())


def fsdp_groups(grid: Grid) -> tuple[str, str | None]:
    """(shard group, replicate group) of the gradient sum: HSDP shards over dp_shard_cp and
    all-reduces the shard over dp_replicate; with dp_replicate = 1 that is FSDP over dp_shard_cp.
    The decision torchtitan's `parallelize` makes when it picks the FSDP mesh."""
    return "dp_shard_cp", "dp_replicate"


def default_microbatches(pp: int) -> int:
    """1F1B's m = 2·pp on a pipeline; one micro-batch (the whole sample) without one."""
    return 2 * pp if pp > 1 else 1


def padded_batch(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`tp.runs.global_batch` with padding: sample d's sequences end in d + 1 ignored targets,
    so dp ranks (and, on the zigzag layout, cp ranks) hold unequal counted tokens."""
    ids, targets = global_batch(samples, seed, CONFIG)
    targets = targets.clone()
    for d in range(samples):
        targets[sample_rows(d, CONFIG), CONFIG.seq - min(d + 1, CONFIG.seq - 1) :] = IGNORE_INDEX
    return ids, targets


def global_token_count(local: int, group: dist.ProcessGroup) -> int:
    """The counted tokens of every rank in `group` (dp_cp): one all-reduce of one int64."""
    count = torch.tensor([local], dtype=torch.int64)
    dist.all_reduce(count, group=group)
    return int(count.item())


def sum_scatter_grads(
    full_grad: torch.Tensor, shard: dist.ProcessGroup, replicate: dist.ProcessGroup | None
) -> torch.Tensor:
    """This rank's shard of the gradient summed over every data-parallel rank: the loss is
    already divided by the global token count, so nothing is divided here (torchtitan's
    `set_gradient_divide_factor(1.0)`)."""
    n = dist.get_world_size(shard)
    out = torch.empty(full_grad.numel() // n, dtype=full_grad.dtype)
    dist.reduce_scatter_tensor(out, full_grad, group=shard)
    if replicate is not None and dist.get_world_size(replicate) > 1:
        dist.all_reduce(out, group=replicate)
    return out


@dataclasses.dataclass
class ShardedUnit:
    """Parameters reduced and stepped together: the dense ones over (shard, replicate), an MoE
    model's experts over (dp_shard_mod_ep, dp_replicate)."""

    params: list[torch.nn.Parameter]
    flat: FlatUnit
    shard: dist.ProcessGroup
    replicate: dist.ProcessGroup | None


@dataclasses.dataclass
class RankState:
    """What one rank holds through the steps: its stage, its data, its shards of the stage."""

    grid: Grid
    groups: ProcessGroups
    stage: torch.nn.Module
    """This rank's stages as one module, parameters named as in the whole model."""
    plan: Schedule
    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    units: list[ShardedUnit]
    local_tokens: int
    reshard_after_forward: bool = False
    sequence_parallel: bool = False
    stages: dict[int, LMStage] = dataclasses.field(default_factory=dict)
    """stage index -> the stage the executor runs (several under interleaving)."""


def sharded_unit(
    named: list[tuple[str, torch.nn.Parameter]],
    shard: dist.ProcessGroup,
    replicate: dist.ProcessGroup | None,
) -> ShardedUnit:
    """This rank's 1/N of the flattened parameters `named` (`fsdp.zero.flat_shard`)."""
    names, params = zip(*named)
    holder = torch.nn.ParameterList(params)
    n, rank = dist.get_world_size(shard), dist.get_rank(shard)
    flat = FlatUnit(
        module=holder,
        names=list(names),
        shapes=[p.shape for p in params],
        numel=sum(p.numel() for p in params),
        shard=torch.nn.Parameter(flat_shard(holder, n, rank)),
    )
    return ShardedUnit(list(params), flat, shard, replicate)


def load_params(state: RankState) -> None:
    """Every unit's parameters whole again: the all-gather of the shards into them, in place.
    A freed parameter's storage is given back first; the version counter is kept because the
    graph saved the parameter itself (FSDP2 refills its unsharded parameters the same way)."""
    for unit in state.units:
        full = gather_unit_params(unit.flat, unit.shard)
        with torch.no_grad():
            for p, view in zip(unit.params, unflatten_unit(unit.flat, full).values()):
                p.untyped_storage().resize_(p.numel() * p.element_size())
                with torch.autograd._unsafe_preserve_version_counter(p):
                    p.copy_(view)


def free_params(state: RankState) -> None:
    """Every unit's whole parameters dropped (storage size 0): only the 1/N shards remain."""
    for unit in state.units:
        for p in unit.params:
            p.untyped_storage().resize_(0)


def reshard_hooks(state: RankState) -> None:
    """FSDP's `reshard_after_forward=True` on this stage: each micro-batch's forward gathers the
    parameters and frees them after; its backward (a hook on the stage's output) gathers them
    again. 2m all-gathers per step where keeping them gathered costs one."""

    def gather(*_) -> None:
        with in_phase("param gather"):
            load_params(state)

    def after_forward(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        free_params(state)
        if output.requires_grad:
            output.register_hook(lambda grad: (gather(), grad)[1])

    state.stage.register_forward_pre_hook(gather)
    state.stage.register_forward_hook(after_forward)


def setup(
    grid: Grid,
    microbatches: int | None,
    seed: int,
    moe: bool = False,
    reshard_after_forward: bool = False,
    virtual: int = 1,
) -> RankState:
    """Build this rank's stages, micro-batches, schedule (1F1B; interleaved 1F1B with `virtual`
    stages per rank) and shards."""
    if reshard_after_forward and virtual > 1:
        raise NotImplementedError("reshard_after_forward composes with virtual = 1 only")
    if moe and grid.etp != grid.tp:
        raise NotImplementedError("the MoE model composes with etp = tp only")
    groups = ProcessGroups(grid, GROUPS + (EXPERT_GROUPS if moe else ()))
    tp_group, cp_group = groups.group["tp"], groups.group["cp"]
    cp_rank, pp_rank = groups.index("cp"), groups.index("pp")
    sp = uses_sequence_parallel(grid)
    lm = tensor_parallel(build_model(seed, CONFIG), tp_group, sequence_parallel=sp)
    if moe:
        expert_parallel(with_experts(lm, seed), tp_group, groups.group["ep"], sequence_parallel=sp)
    context_parallel(lm, cp_group)
    positions = positions_of(cp_rank, grid.cp, CONFIG.seq)
    if sp:  # this tp rank's run of the cp rank's tokens
        positions = positions[slice(*owned_range(len(positions), groups.index("tp"), grid.tp))]
    n_stages = grid.pp * virtual
    stages = {s: LMStage(lm, s, n_stages, positions) for s in range(pp_rank, n_stages, grid.pp)}
    stage = stages[pp_rank] if virtual == 1 else merged(list(stages.values()))
    m = microbatches or default_microbatches(grid.pp)
    if CONFIG.batch % m:
        raise ValueError(f"microbatches = {m} must divide the {CONFIG.batch} sequences per sample")
    ids, targets = padded_batch(grid.size("dp"), seed)
    dp_index = grid.group(dist.get_rank(), "dp").index(dist.get_rank())
    rows = sample_rows(dp_index, CONFIG)
    ids, targets = (
        shard_sequence(t[rows], cp_rank, grid.cp, dim=1, zigzag=grid.cp > 1) for t in (ids, targets)
    )
    name = "interleaved" if virtual > 1 else "1f1b"
    plan = addressed(build_schedule(name, grid.pp, m, virtual), groups.ranks["pp"])
    shard_name, replicate_name = fsdp_groups(grid)
    replicate = groups.group[replicate_name] if replicate_name else None
    named = list(stage.named_parameters())
    units = [
        sharded_unit([x for x in named if not is_expert(x[0])], groups.group[shard_name], replicate)
    ]
    experts = [x for x in named if is_expert(x[0])]
    if experts:
        units.append(sharded_unit(experts, groups.group["dp_shard_mod_ep"], replicate))
    tokens = int((targets != IGNORE_INDEX).sum())
    state = RankState(
        grid, groups, stage, plan, list(ids.chunk(m)), list(targets.chunk(m)), units, tokens
    )
    state.sequence_parallel, state.stages = sp, stages
    for layer in (x for x in state.stage.modules() if isinstance(x, MoEMLP)):
        layer.aux_grad = aux_loss_grad(layer.config.aux_coef, m, grid.size("dp_cp"))
    if reshard_after_forward:
        state.reshard_after_forward = True
        reshard_hooks(state)
    return state


def aux_loss_grad(aux_coef: float, microbatches: int, ranks: int) -> float:
    """d(loss)/d(aux) of one layer's aux loss in one micro-batch on one rank: the loss holds the
    mean over the samples (ranks) and micro-batches of aux_coef·aux, and the gradients are summed
    over dp_cp. Megatron's scale is loss_scale·cp / num_microbatches (its gradients averaged)."""
    return aux_coef / (microbatches * ranks)


def merged(stages: list[LMStage]) -> torch.nn.Module:
    """One module holding several stages' layers under the whole model's names."""
    out = torch.nn.Module()
    out.blocks = torch.nn.ModuleDict()
    for stage in stages:
        for name, child in stage.named_children():
            if name == "blocks":
                out.blocks.update(child)
            else:
                setattr(out, name, child)
        if stage.first:
            out.pos = stage.pos
    return out


def uses_sequence_parallel(grid: Grid) -> bool:
    """TP runs with SP (Megatron's `sequence_parallel`) whenever tp > 1, the MoE model too: its
    MoE layers gather the tp group's tokens, as their experts need (`moe.MoEMLP`)."""
    return grid.tp > 1


def sync_sequence_parallel_grads(stage: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Under SP a replicated parameter (a norm, a row bias, the position table) saw only this tp
    rank's tokens: its gradients summed over tp in ONE flattened all-reduce, as Megatron's
    `finalize_model_grads` does. An MoE layer's parameters saw every token and are left out."""
    grads = [
        stage.get_parameter(name).grad
        for name, split in param_splits(stage).items()
        if split is None
        and not saw_every_token(name)
        and stage.get_parameter(name).grad is not None
    ]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(summed.view_as(g))


def one_step(state: RankState, ledger: Ledger | None = None) -> None:
    """The token count, forward and backward through the pipeline, the gradient sum over dp_cp,
    the sharded step."""
    g = state.groups
    with ledger.phase("token count") if ledger else contextlib.nullcontext():
        tokens = global_token_count(state.local_tokens, g.group["dp_cp"])
    run_actions(
        state.plan,
        g.index("pp"),
        state.stages,
        state.inputs,
        state.targets,
        loss=microbatch_lm_loss(g.group["tp"], tokens),
        boundary_shape=boundary_shape(state),
    )
    if state.sequence_parallel:
        with ledger.phase("grad sync") if ledger else contextlib.nullcontext():
            sync_sequence_parallel_grads(state.stage, g.group["tp"])
    for unit in state.units:
        flat = torch.cat([p.grad.reshape(-1) for p in unit.params])
        padded = unit.flat.shard.numel() * dist.get_world_size(unit.shard)
        flat = torch.nn.functional.pad(flat, (0, padded - flat.numel()))
        with ledger.phase("grad sync") if ledger else contextlib.nullcontext():
            shard_grad = sum_scatter_grads(flat, unit.shard, unit.replicate)
        with torch.no_grad():
            unit.flat.shard.add_(shard_grad, alpha=-LR)
        for p in unit.params:
            p.grad = None
    if not state.reshard_after_forward:  # whole between steps; else each forward gathers
        with ledger.phase("param gather") if ledger else contextlib.nullcontext():
            load_params(state)


def boundary_shape(state: RankState) -> tuple[int, ...]:
    """What one pipeline boundary sends: (rows, tokens, hidden), the tokens cut by tp under SP."""
    rows, tokens = state.inputs[0].shape
    return rows, tokens // (state.grid.tp if state.sequence_parallel else 1), CONFIG.hidden


def gathered(state: RankState) -> dict[str, torch.Tensor]:
    """Every parameter in full on every rank: tp pieces over tp, experts over ep, stages over pp."""
    mine = full_params(state.stage, state.groups.group["tp"])
    for name in ("ep", "pp"):
        if name not in state.groups.group:
            continue
        group = state.groups.group[name]
        parts: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, mine, group=group)
        mine = {k: v for part in parts for k, v in part.items()}
    return dict(sorted(mine.items()))


def grid_of(world: int, **sizes: Any) -> Grid:
    order = sizes.pop("order", DOC_ORDER)
    return Grid(world, order=order, **sizes)


def train(
    world: int,
    *,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    cp: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    microbatches: int | None = None,
    steps: int = 2,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inside `launch.run` on `world` ranks: `steps` SGD steps of the composed model, the doc
    group's layout; the full parameters, the same on every rank."""
    if dist.get_world_size() != world:
        raise ValueError(f"train(world={world}) runs on {dist.get_world_size()} ranks")
    sizes = dict(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep)
    grid = grid_of(world, **sizes, etp=tp)
    state = setup(grid, microbatches, seed, moe=ep > 1)
    for _ in range(steps):
        one_step(state)
    return gathered(state)


def compose_worker(
    grid: Grid,
    microbatches: int | None = None,
    steps: int = 2,
    seed: int = 0,
    moe: bool = False,
    reshard_after_forward: bool = False,
    virtual: int = 1,
):
    """On every rank: `train`'s steps on `grid` (any order), step 0 under the ledger; with
    `reshard_after_forward`, FSDP's per-micro-batch gathers (`reshard_hooks`); with `virtual`,
    interleaved 1F1B over pp·virtual stages.

    Returns (full parameters, step 0's ledger records)."""
    state = setup(grid, microbatches, seed, moe, reshard_after_forward, virtual)
    records: list[Record] = []
    for step in range(steps):
        if step == 0:
            with Ledger() as led:
                one_step(state, led)
            records = led.records
        else:
            one_step(state)
    if reshard_after_forward:
        load_params(state)
    return gathered(state), records


def moe_worker(grid: Grid, steps: int = 2, seed: int = 0):
    """On every rank: the MoE model's steps on `grid` (1F1B when pp > 1), step 0 under the ledger.

    Returns (full parameters, step 0's ledger records, step 0's (E,) send counts per block of
    this rank's stage, per micro-batch)."""
    state = setup(grid, None, seed, moe=True)
    records: list[Record] = []
    counts: list[torch.Tensor] = []
    for step in range(steps):
        if step == 0:
            with Ledger() as led:
                one_step(state, led)
            records = led.records
            layers = [x for x in state.stage.modules() if isinstance(x, MoEMLP)]
            counts = [[r.send_counts for r in x.routings] for x in layers]
        else:
            one_step(state)
    return gathered(state), records, counts


def rows_worker(rows: list[tuple[str, Grid, dict]]) -> list:
    """On every rank: several rows on the same ranks in one launch, each `(worker, grid, kwargs)`
    with worker "compose" (`compose_worker`) or "moe" (`moe_worker`); their results in order.
    Each row builds its own groups and model, so the rows do not share state; its groups are
    destroyed when it ends."""
    workers = {"compose": compose_worker, "moe": moe_worker}
    out = []
    for name, grid, kwargs in rows:
        with groups_freed():
            out.append(workers[name](grid, **kwargs))
    return out


def reference(
    *, samples: int, steps: int = 2, seed: int = 0, moe: bool = False, microbatches: int = 1
) -> dict[str, torch.Tensor]:
    """One process: the same model on the global batch of `samples` samples (`padded_batch`),
    `steps` SGD steps; the loss is the cross-entropy's mean over every counted token.

    With `moe`, each micro-batch of each sample is routed on its own (as one dp rank routes it)
    and the mean over samples and micro-batches of aux_coef · aux is added."""
    model = build_model(seed, CONFIG)
    if moe:
        model = with_experts(model, seed)
    ids, targets = padded_batch(samples, seed)
    counted = int((targets != IGNORE_INDEX).sum())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.zeros((), dtype=torch.float64)
        for d in range(samples):
            rows = sample_rows(d, CONFIG)
            for x, y in zip(ids[rows].chunk(microbatches), targets[rows].chunk(microbatches)):
                logits = model(x).flatten(0, 1)
                loss = loss + F.cross_entropy(logits, y.flatten(), reduction="sum") / counted
                loss = loss + aux_loss(list(model.modules())) / (samples * microbatches)
        loss.backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --------------------------------------------------------------------------- checks
def check_params(
    per_rank: list[dict], grid: Grid, steps: int = 2, moe: bool = False
) -> list[Verdict]:
    """Parameters after `steps` vs one process (each tensor to 1e-12 of its scale), and
    bitwise the same on every rank."""
    m = default_microbatches(grid.pp) if moe else 1  # the dense loss does not depend on m
    want = reference(samples=grid.size("dp"), steps=steps, moe=moe, microbatches=m)
    tag = describe(grid)
    verdicts = []
    for name, ref in want.items():
        bound = RELATIVE_BOUND * max(ref.abs().max().item(), 1e-300)
        verdicts += compare(per_rank[0][name], ref, atol=bound, name=f"{tag} {name}")
    verdicts += compare(
        per_rank[1:], [per_rank[0]] * (len(per_rank) - 1), name=f"{tag} every rank the same"
    )
    return verdicts


def describe(grid: Grid) -> str:
    parts = [f"{a} {getattr(grid, a)}" for a in ("dp_replicate", "dp_shard", "cp", "tp", "pp")]
    return f"{grid.world} ranks: " + " x ".join(p for p in parts if not p.endswith(" 1"))


def group_of(record: Record, grid: Grid, rank: int) -> str:
    """The grid name of the group a record's call went over: among the groups its phase talks
    over, the one with its ranks (a send or receive between stages is on the world: pp)."""
    for name in PHASES.get(record.phase, GROUPS):
        if grid.group(rank, name) == record.group_ranks:
            return name
        if name == "pp" and record.op in ("isend", "irecv") and record.group_size == grid.world:
            return name
    return f"? {record.group_ranks}"


def measured_bytes(records: list[Record], grid: Grid, rank: int) -> dict[tuple[str, str], int]:
    """(group, phase) -> bytes sent, from one rank's ledger."""
    out: dict[tuple[str, str], int] = {}
    for r in records:
        key = (group_of(r, grid, rank), r.phase)
        out[key] = out.get(key, 0) + r.bytes_sent
    return out


def check_bytes(
    records: list[list[Record]],
    grid: Grid,
    microbatches: int | None = None,
    send_counts: list[list[torch.Tensor]] | None = None,
    reshard_after_forward: bool = False,
    virtual: int = 1,
) -> list[Verdict]:
    """Every rank's bytes per (group, phase) from the ledger vs `costs.group_phase_bytes` (or,
    given every rank's routed `send_counts` per block, `costs.moe_group_phase_bytes`), exact.
    Returns one verdict over the [rank, (group, phase)] table; a key only one side has counts."""
    m = microbatches or default_microbatches(grid.pp)
    measured = [measured_bytes(recs, grid, rank) for rank, recs in enumerate(records)]
    if send_counts is None:
        formula = [
            group_phase_bytes(
                grid, rank, CONFIG, m, reshard_after_forward=reshard_after_forward, virtual=virtual
            )
            for rank in range(grid.world)
        ]
    else:
        formula = [
            moe_group_phase_bytes(
                grid,
                rank,
                CONFIG,
                moe_config(CONFIG),
                [send_counts[r] for r in grid.group(rank, "ep")],
            )
            for rank in range(grid.world)
        ]
    keys = sorted({k for table in measured + formula for k in table})
    got = torch.tensor([[table.get(k, 0) for k in keys] for table in measured])
    want = torch.tensor([[table.get(k, 0) for k in keys] for table in formula])
    return compare(got, want, name=f"{describe(grid)} bytes [rank, (group, phase)]")


def cross_node_bytes(
    records: list[Record], grid: Grid, rank: int, gpus_per_node: int
) -> dict[str, int]:
    """group -> bytes this rank sends that leave its node (node = rank // gpus_per_node): a send
    to a peer on another node, or a collective over a group that spans nodes (ring model)."""
    out: dict[str, int] = {}
    node = rank // gpus_per_node
    for r in records:
        if r.peer is not None:
            leaves = r.peer // gpus_per_node != node
        else:
            leaves = len({g // gpus_per_node for g in r.group_ranks}) > 1
        if leaves and r.bytes_sent:
            name = group_of(r, grid, rank)
            out[name] = out.get(name, 0) + r.bytes_sent
    return out
