# %% [markdown]
# # Lab 01 — FSDP (`dp_shard`) and HSDP (`dp_replicate` × `dp_shard`)
#
# **What is split.** Data parallelism gives every rank a different slice of the global
# batch. Plain DDP also gives every rank a full copy of the parameters, their gradients
# and the optimizer state. FSDP (ZeRO-3) splits those three as well: each FSDP *unit*
# (here: one block of the model) is flattened into one vector, padded to a multiple of
# the shard-group size $N$, and rank $i$ keeps only slice $i$ — its **shard**. A unit's
# full parameters exist only while the unit computes: all-gather, compute, free; in the
# backward, all-gather again, compute the gradient, **reduce-scatter** it (each rank
# gets the mean of its own slice), free. HSDP does this inside a shard group and then
# all-reduces the gradient shard across replicas.
#
# **You will learn** to
# - shard a unit, gather it back, and reduce-scatter its gradient, on real ranks;
# - show that ZeRO-3, HSDP, DDP and FSDP2 train the same parameters as one process, and
#   when the match is bitwise;
# - count each strategy's bytes per step (3Ψ vs 2Ψ) and memory per rank, from the
#   ledger and the real tensors, against closed forms;
# - hand FSDP2 the right mesh (the 2-D-mesh trap), and read torchtitan's *consuming*
#   use of the same knobs.
#
# **Prerequisites:** the collectives primer (all-gather, reduce-scatter, all-reduce and
# their ring costs) and lab 00 (`ParallelDims`, its dp mesh). **Reading time:** about
# 45 minutes.
#
# **Reading guide.** 1 one unit sharded and gathered on 2 ranks; 2 the gradient's
# reduce-scatter; 3–4 the engine and the sharded optimizer (folded); 5 the real runs and
# one step's timeline; 6 exactness; 7 FSDP2, its mesh trap and torchtitan's reading;
# 8 traffic; 9 memory; 10 a bug clinic; then the closing table and what to try.

# %%
import time

import torch
import torch.distributed as dist
from IPython.display import Markdown, display

from paralab import ParallelDims, fsdp_mesh
from paralab.check import claim, compare, fold, summary, verdict_table
from paralab.fsdp import runs as fsdp_runs
from paralab.fsdp.checks import (
    MEMORY_PARTS,
    check_fsdp2_calls,
    check_memory,
    check_params,
    check_traffic,
    fsdp2_calls,
)
from paralab.fsdp.engine_facts import fsdp2_mesh_calls
from paralab.fsdp.runs import (
    STEPS,
    Job,
    reference_first_gradient,
    reference_first_loss,
    train_reference,
    train_reference_rank_by_rank,
    unit_numels,
)
from paralab.launch import run
from paralab.models import make_mlp_stack
from paralab.viz import (
    plot_fsdp_timeline,
    plot_memory,
    plot_overlay_vs_consuming,
    plot_rank_strip,
    plot_shard_layout,
    plot_traffic,
    show,
)

LAB_START = time.monotonic()
CLAIMS = []  # the closing table: one row per claim; each claim's detail table is printed (folded) where it is checked


# %% [markdown]
# ## 1. One unit, sharded and gathered back
#
# The lines that carry the idea. A unit's parameters are flattened into one vector and
# zero-padded to a multiple of $n$ so that every rank holds an equal slice (all-gather
# needs equal pieces). `gather_unit_params` all-gathers the slices back into the full
# flat vector; `free_unit_params` releases its storage once the unit has computed.

# %%
# show: paralab.fsdp.zero.flat_shard paralab.fsdp.zero.gather_unit_params paralab.fsdp.zero.free_unit_params

# %% [markdown]
# `padded_size` rounds up to a multiple of $n$. `shard_unit` keeps the shard as an `nn.Parameter` (so autograd can accumulate its
# gradient) and moves the module to the `meta` device: it keeps its structure, not its
# numbers. `unflatten` gives views into the gathered vector, one per parameter. (Folded:
# click to open.)

# %% jupyter={"source_hidden": true}
# show: paralab.fsdp.zero.padded_size paralab.fsdp.zero.FlatUnit paralab.fsdp.zero.shard_unit paralab.fsdp.zero.unflatten

# %% [markdown]
# **A tiny run.** One unit, `Linear(2, 3)` (9 parameters), on 2 real ranks.
#
# **Predict before you run:** how many elements does each rank hold, and what is the
# last element of rank 1's shard?
#
# <details><summary>Answer</summary>
#
# 9 is padded to 10, so each rank holds 5. Rank 1's last element is padding: exactly 0.
# After the all-gather both ranks hold the same 10 numbers: the 9 parameters, then the 0.
# </details>


# %%
def one_unit_on_this_rank():
    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 3).double()
    flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
    unit = shard_unit(layer, dist.group.WORLD)
    shard = unit.shard.detach().clone()
    gathered = gather_unit_params(unit, dist.group.WORLD).clone()
    free_unit_params(unit)
    return flat, shard, gathered, unit.full.untyped_storage().nbytes()


tiny = run(one_unit_on_this_rank, 2)
torch.set_printoptions(precision=4)
print("the layer's 9 parameters, flat:", tiny[0][0])
for rank, (_, shard, gathered, freed) in enumerate(tiny):
    print(
        f"rank {rank}: shard {shard}\n        gathered {gathered}  (bytes held after free: {freed})"
    )
padded = torch.nn.functional.pad(tiny[0][0], (0, 1))
CLAIMS.append(
    claim(
        "one unit on 2 ranks: shards = halves of the padded vector, gather = it",
        all(
            torch.equal(g, padded) and torch.equal(s, padded[5 * r : 5 * r + 5]) and freed == 0
            for r, (_, s, g, freed) in enumerate(tiny)
        ),
        "both ranks: gathered == padded parameters (exact), storage 0 B after free",
    )
)
print(CLAIMS[-1].describe())

# %% [markdown]
# The model of this lab has four units: three residual MLP blocks of 82 parameters (two
# `Linear` layers with biases) and a 6-parameter head. 82 does not divide by 4 or 8, so
# every unit is padded; at 8 ranks the head has one element per rank and ranks 6 and 7
# hold nothing but padding. The picture shows who holds what (numbers: the ranks
# holding that shard).

# %%
model = make_mlp_stack()
NUMELS = unit_numels(model)
UNIT_NAMES = [f"block {i}" for i in range(len(model.blocks))] + ["head"]
print(model)
print("parameters per unit:", dict(zip(UNIT_NAMES, NUMELS)), "total", sum(NUMELS))
for world, replicas in [(8, 1), (8, 2)]:
    show(plot_shard_layout(NUMELS, world, replicas, UNIT_NAMES))

# %% [markdown]
# ## 2. The gradient: reduce-scatter, and the replica all-reduce
#
# In the backward every rank computes the unit's *full* gradient from its own rows of the
# batch. `reduce_scatter_grads` sums those over the shard group and hands each rank only
# its slice, divided by $n$ (exact when $n$ is a power of two); for HSDP it then
# averages that slice across the replicas holding the same shard. What each sum is divided
# by is one decision, kept in one small function (FSDP2 makes it in
# `_get_gradient_divide_factors`). All-gather and
# reduce-scatter are each other's mirror: one concatenates shards, the other sums full
# tensors and hands back one slice each.

# %%
# show: paralab.fsdp.zero.gradient_divide_factors paralab.fsdp.zero.reduce_scatter_grads

# %% [markdown]
# **A tiny run.** On 2 ranks, rank $r$'s "full gradient" is `(r + 1) · [0, 1, …, 9]`.
# The mean over ranks is `1.5 · [0, …, 9]`; rank 0 must get its first half, rank 1 its second.


# %%
def reduce_scatter_on_this_rank():
    full_grad = (dist.get_rank() + 1) * torch.arange(10, dtype=torch.float64)
    return reduce_scatter_grads(full_grad, dist.group.WORLD)


scattered = run(reduce_scatter_on_this_rank, 2)
mean = 1.5 * torch.arange(10, dtype=torch.float64)
for rank, shard in enumerate(scattered):
    print(f"rank {rank}: gradient shard {shard}")
CLAIMS.append(
    claim(
        "reduce-scatter on 2 ranks: each rank gets its slice of the mean",
        all(torch.equal(g, mean[5 * r : 5 * r + 5]) for r, g in enumerate(scattered)),
        "both ranks exact",
    )
)
print(CLAIMS[-1].describe())
torch.set_printoptions(profile="default")

# %% [markdown]
# ## 3. A unit's forward and backward, and the engine
#
# One `torch.autograd.Function` per unit call:
#
# ```text
# forward(shard):  full = gather_unit_params(unit)     # all-gather
#                  out  = unit.module(x) on views of full
#                  free_unit_params(unit)              # (kept if reshard_after_forward=False)
# backward(g):     full = gather_unit_params(unit)     # all-gather again
#                  grad = autograd.grad(out, full, g)  # the unit's full gradient
#                  free_unit_params(unit)
#                  shard.grad = reduce_scatter_grads(grad, shard_group, replicate_group)
# ```
#
# Because the units are chained, autograd runs their backwards in reverse unit order on
# every rank, so every rank issues the same collectives in the same order
# (differentiable collectives scattered through one graph do not guarantee that).
# `free` releases the *storage* of the gathered tensor; the tensor object stays, because
# autograd saved views of it, and the backward gather refills that same storage (FSDP2
# does the same); `_unsafe_preserve_version_counter` tells autograd that refilling is
# not a modification. The full code (folded):

# %% jupyter={"source_hidden": true}
# show: paralab.fsdp.zero.ShardedUnitFunction paralab.fsdp.zero.HandFSDP

# %% [markdown]
# ## 4. The sharded optimizer step
#
# SGD with momentum and Adam are elementwise, so updating a shard gives exactly the
# same numbers as updating the full tensor and slicing: no communication, and the
# optimizer state is $1/N$ too. The functions repeat `torch.optim`'s single-tensor
# operations in the same order, so the reference (which uses `torch.optim`) can be
# matched bit for bit. DDP uses the same optimizer on full parameters, and
# `all_reduce_gradients` for its gradients. (Folded.)

# %% jupyter={"source_hidden": true}
# show: paralab.fsdp.zero.sgd_momentum_step paralab.fsdp.zero.adam_step paralab.fsdp.zero.ShardOptimizer paralab.fsdp.zero.all_reduce_gradients

# %% [markdown]
# ## 5. Real runs: three launches
#
# Each launch runs several jobs in a row on the same ranks (a launch costs more than a
# few tiny steps). Every job trains for 3 optimizer steps on its rank's slice of one
# global batch of 16 and returns what its rank holds, the ledger records and the memory.
# The notebook's own definitions above are handed to the ranks as a patch set,
# `run(..., patches=LAB_ENGINE)`, so editing a cell of sections 1–4 and re-running it and
# this cell takes effect on the ranks. FSDP2 (`fully_shard`, the real engine) runs in the same launches.

# %%
PLAN = {
    2: [
        Job("hand"),
        Job("hand", optimizer="sgd"),
        Job("hand", reshard_after_forward=False),
        Job("ddp"),
        Job("fsdp2"),
    ],
    4: [
        Job("hand"),
        Job("hand", optimizer="sgd"),
        Job("hand", 2),
        Job("hand", reshard_after_forward=False),
        Job("ddp"),
        Job("fsdp2"),
        Job("fsdp2", 2),
        Job("fsdp2", mesh="dp_mesh"),
    ],
    8: [
        Job("hand"),
        Job("hand", 2),
        Job("hand", 2, optimizer="sgd"),
        Job("hand", reshard_after_forward=False),
        Job("ddp"),
        Job("fsdp2"),
        Job("fsdp2", 2),
    ],
}
LAB_ENGINE = {  # this kernel's engine, sent by value: it calls this kernel's cells above
    "paralab.fsdp.zero": {
        "HandFSDP": HandFSDP,
        "ShardOptimizer": ShardOptimizer,
        "all_reduce_gradients": all_reduce_gradients,
    }
}
RESULTS = {}  # label -> list of per-rank results
for world, jobs in PLAN.items():
    per_rank = run(fsdp_runs.run_jobs, world, jobs, timeout=120, patches=LAB_ENGINE)
    for j in range(len(jobs)):
        RESULTS[per_rank[0][j]["label"]] = [per_rank[r][j] for r in range(world)]
print(len(RESULTS), "jobs:", ", ".join(RESULTS))

# %% [markdown]
# **One step of one rank, unit by unit.** The ledger recorded every collective of every
# job. From ZeRO-3 on 4 ranks, rank 0's first step: each unit's events in the order they
# happen, and below, the unsharded bytes the rank holds on top of its shards.
#
# **Predict before you run:** where is the memory peak, in the forward or in the backward?
#
# <details><summary>Answer</summary>
#
# In the backward: there a unit holds its gathered parameters *and* its full gradient
# until the reduce-scatter hands back only a slice. In the forward only the gathered
# parameters of one unit are held at a time (this engine does not prefetch).
# </details>

# %%
r = RESULTS["ZeRO-3 n=4 adam"][0]
show(
    plot_fsdp_timeline(
        r["records"],
        UNIT_NAMES,
        resident_bytes=sum(r["memory"][k] for k in ("params", "grads", "optimizer")),
    )
)

# %% [markdown]
# ## 6. Exactness against one process on the whole global batch
#
# **First step, forward and backward.** Each rank's loss on its own 16/n rows must
# equal, bit for bit, the loss one process computes with the initial weights on the
# same rows: the gathered parameters are exact copies (an all-gather moves numbers, it
# adds nothing) and the operations are the same. The gradient each rank holds after
# the first backward (its shard of the mean gradient for FSDP, the local part for
# FSDP2, the full gradient for DDP) must equal the matching slice of the global-batch
# gradient — within 1e-12, see below. In the folded tables, one row per job; the shape column counts the
# tensors folded into the row (ranks × units or parameters).

# %%
GRAD_REFERENCE = reference_first_gradient()
loss_rows, grad_rows = [], []
for label, res in RESULTS.items():
    world = res[0]["world"]
    losses = [r["loss"] for r in res]
    loss_rows.append(
        fold(compare(losses, [reference_first_loss(r, world) for r in range(world)]), label)
    )
    grad_rows.append(fold(check_params(res, GRAD_REFERENCE, atol=1e-12, key="grads"), label))
CLAIMS.append(
    summary(
        f"first-step loss, every rank of {len(loss_rows)} jobs = one process (exact)", loss_rows
    )
)
CLAIMS.append(
    summary(
        f"first-step gradient, every rank of {len(grad_rows)} jobs = global-batch slice (1e-12)",
        grad_rows,
    )
)
print("\n".join(c.describe() for c in CLAIMS[-2:]))

# %% jupyter={"outputs_hidden": true}
print(
    verdict_table(
        loss_rows, "first-step loss of every rank vs one process on the same rows (exact)"
    )
)
print()
print(
    verdict_table(
        grad_rows, "first-step gradient every rank holds vs the global-batch gradient (atol 1e-12)"
    )
)

# %% [markdown]
# **After 3 optimizer steps.** The reference is one process training the same model
# with `torch.optim` on all 16 rows. Every tensor every rank holds (a flat shard per unit
# for our engine, the local part of each parameter for FSDP2, full parameters for DDP)
# is compared element by element with the matching slice of the reference.
#
# These agree **within 1e-12, not bitwise**: the reference sums the 16 per-row
# gradient contributions in one matrix product, the ranks sum their own rows and then
# add the per-rank sums — the same numbers added in a different order, and float
# addition is not associative (differences of one unit in the last place, ~1e-16).

# %%
REFERENCE = {opt: train_reference(opt) for opt in ("adam", "sgd")}
rows = [
    fold(check_params(res, REFERENCE[res[0]["job"].optimizer], atol=1e-12), label)
    for label, res in RESULTS.items()
]
CLAIMS.append(
    summary(
        f"parameters after 3 steps, every rank of {len(rows)} jobs on 2/4/8 ranks = one process (1e-12)",
        rows,
    )
)
print(CLAIMS[-1].describe())

# %% jupyter={"outputs_hidden": true}
print(
    verdict_table(
        rows, "every rank's parameters after 3 steps vs the global-batch reference (atol 1e-12)"
    )
)

# %% [markdown]
# The same check for one job, ZeRO-3 on 8 ranks, one row per rank (its 4 unit shards).
# The padding must stay exactly zero: its gradient is zero, and both optimizers map a
# zero gradient on a zero parameter to zero. At 8 ranks the head's shards on ranks 6
# and 7 are nothing but padding.

# %%
res = RESULTS["ZeRO-3 n=8 adam"]
verdicts = check_params(res, REFERENCE["adam"], atol=1e-12)
rows = [
    fold(verdicts[r * n : (r + 1) * n], f"rank {r}, {n} unit shards")
    for r, n in enumerate([len(NUMELS)] * 8)
]
padding = []
for rank, out in enumerate(res):
    for numel, shard in zip(NUMELS, out["params"]):
        padding.append(shard[max(0, min(shard.numel(), numel - rank * shard.numel())) :])
padding = torch.cat(padding)
rows += compare(
    padding, torch.zeros_like(padding), name="padding elements of all ranks [exact zero]"
)
CLAIMS.append(
    summary("ZeRO-3 on 8 ranks: every rank's shards match (1e-12), padding stays 0", rows)
)
print(CLAIMS[-1].describe())

# %% jupyter={"outputs_hidden": true}
print(verdict_table(rows, "ZeRO-3, 8 ranks: every rank vs the reference, and the padding"))

# %% [markdown]
# ### When is it bitwise?
#
# Change the reference, not the claim: let one process compute each rank's local
# gradient and combine them the way the groups do — average inside each shard group,
# then across replicas. With **groups of two ranks** every reduction is one addition
# `a + b`, which is commutative, and dividing by 2 is exact, so the parallel run is
# **bitwise equal** to this reference: world 2 (ZeRO-3, DDP, FSDP2) and HSDP 2×2
# (`((g0+g1)/2 + (g2+g3)/2)/2` on both sides). With 4 or more ranks in a group, the
# ring reduction adds the contributions in an order that depends on the chunk of the
# buffer, so only 1e-12 can be promised.

# %%
BITWISE = ["ZeRO-3 n=2 adam", "DDP n=2", "FSDP2 n=2 adam", "HSDP 2x2 adam", "FSDP2 HSDP 2x2 adam"]
CLOSE = ["ZeRO-3 n=4 adam", "ZeRO-3 n=8 adam", "HSDP 2x4 adam", "FSDP2 HSDP 2x4 adam"]
rows = []
for label in BITWISE + CLOSE:
    res = RESULTS[label]
    job, world = res[0]["job"], res[0]["world"]
    rbr = train_reference_rank_by_rank(world, job.dp_replicate, job.optimizer)
    atol = 0.0 if label in BITWISE else 1e-12
    rows.append(
        fold(check_params(res, rbr, atol=atol), label + (" [exact]" if atol == 0 else " [1e-12]"))
    )
CLAIMS.append(
    summary(
        f"2-rank groups = rank-by-rank reference, bitwise ({len(BITWISE)} jobs)",
        rows[: len(BITWISE)],
    )
)
CLAIMS.append(
    summary(
        f"groups of 4 or 8 = rank-by-rank reference within 1e-12 ({len(CLOSE)} jobs)",
        rows[len(BITWISE) :],
    )
)
print("\n".join(c.describe() for c in CLAIMS[-2:]))

# %% jupyter={"outputs_hidden": true}
print(
    verdict_table(rows, "vs the rank-by-rank reference: exact for 2-rank groups, 1e-12 otherwise")
)

# %% [markdown]
# ## 7. The real engine, and the 2-D-mesh trap
#
# FSDP2's `fully_shard` on `fsdp_mesh(ParallelDims(...))` — the 1-D shard mesh, or the
# 2-D `(dp_replicate, dp_shard)` mesh for HSDP — reaches the same parameters (rows
# `FSDP2 …` above). FSDP2 shards each parameter along dim 0 instead of one flat vector
# per unit, so its bytes differ slightly from ours (different padding), but the
# collectives are the same: all-gather per unit in forward and backward, reduce-scatter
# per unit, and for HSDP an all-reduce per unit across replicas.
#
# **The trap.** FSDP2 picks HSDP from `mesh.ndim` alone. `ParallelDims` always builds
# the dp mesh 2-D, `(dp_replicate, dp_shard)`, so handing `pd.dp_mesh` with
# `dp_replicate == 1` to `fully_shard` puts a pure-FSDP run on the HSDP path: one
# extra all-reduce **over a one-rank group** per FSDP unit per step. The gradients stay
# right (an all-reduce over one rank changes nothing), so only latency shows it; the
# ledger sees it. `fsdp_mesh` returns the 1-D shard mesh unless there are real replicas:

# %%
# show: paralab.parallel_dims.fsdp_mesh

# %% [markdown]
# The two meshes on 4 ranks with `dp_replicate == 1`:


# %%
def mesh_shapes():
    import torch.distributed as dist

    pd = ParallelDims(dist.get_world_size(), dp_replicate=1)
    pd.build_meshes("cpu")
    return {
        "pd.dp_mesh": (pd.dp_mesh.ndim, tuple(pd.dp_mesh.shape), pd.dp_mesh.mesh_dim_names),
        "fsdp_mesh(pd)": (
            fsdp_mesh(pd).ndim,
            tuple(fsdp_mesh(pd).shape),
            fsdp_mesh(pd).mesh_dim_names,
        ),
    }


for name, (ndim, shape, names) in run(mesh_shapes, 4)[0].items():
    print(f"{name:<14} ndim {ndim}  shape {shape}  dims {names}")


# %% [markdown]
# **A tiny run of the trap.** Two `Linear(8, 8)` layers, each its own FSDP2 unit, one
# forward and backward on 4 ranks, once per mesh (`fsdp.engine_facts.fsdp2_mesh_calls`, which
# `tests/test_ledger.py` runs too).
#
# **Predict before you run:** how many all-gathers, reduce-scatters and all-reduces
# does each mesh give?
#
# <details><summary>Answer</summary>
#
# With `U = 2` units (the root owns no parameters): forward all-gathers each unit once,
# backward re-gathers each and reduce-scatters its gradients, so `2U = 4` all-gathers
# and `U = 2` reduce-scatters on both meshes — and the 2-D mesh adds `U = 2`
# all-reduces over a group of one rank.
# </details>


# %%
counts = {}
for use in (True, False):
    ops = [(op, size) for _, op, size in run(fsdp2_mesh_calls, 4, not use)[0]]
    counts[use] = {op: ops.count(op) for op in sorted(set(ops))}
    label = "fsdp_mesh(pd) (1-D)" if use else "pd.dp_mesh (1, 4)  "
    print(
        label,
        "->",
        ", ".join(f"{n} x {op}[group of {size}]" for (op, size), n in counts[use].items()),
    )
units = 2
expected_trap = {("all_gather_single", 4): 2 * units, ("reduce_scatter_single", 4): units}
trap_rows = compare(
    torch.tensor([counts[True].get(k, 0) for k in [*expected_trap, ("all_reduce", 1)]]),
    torch.tensor([*expected_trap.values(), 0]),
    name="fsdp_mesh: 2U all-gathers, U reduce-scatters, no all-reduce",
)
trap_rows += compare(
    torch.tensor(counts[False].get(("all_reduce", 1), 0)),
    torch.tensor(units),
    name="2-D (1,N) mesh: U extra one-rank all-reduces",
)
print(verdict_table(trap_rows, "the 2-D-mesh trap on 2 units"))

# %% [markdown]
# The same counts for every FSDP2 job of the real runs, every rank and every step:

# %%
rows = []
for label, res in RESULTS.items():
    if res[0]["job"].engine == "fsdp2":
        print(
            f"{label:<32} per step: gathers, reduce-scatters, 1-rank all-reduces, replica all-reduces "
            f"{fsdp2_calls(res[0]['records'], res[0]['job'].dp_replicate)}"
        )
        rows.append(check_fsdp2_calls(res, len(NUMELS)))
CLAIMS.append(
    summary(
        "FSDP2 calls per unit per step = formula; the (1, n) mesh adds a 1-rank all-reduce",
        rows + trap_rows,
    )
)
print(CLAIMS[-1].describe())

# %% jupyter={"outputs_hidden": true}
print(
    verdict_table(
        rows,
        "FSDP2 calls per step, every rank vs formula: per unit 2 gathers, 1 reduce-scatter, "
        "1 replica all-reduce for HSDP, 1 one-rank all-reduce on the (1, n) mesh",
    )
)

# %% [markdown]
# ### Overlay vs consuming: the same 8 ranks, read two ways
#
# torchtitan's `ParallelDims` **consumes** ranks: `dp_replicate × dp_shard × cp × tp ×
# pp == world_size`, and FSDP shards parameters over the flattened `dp_shard × cp`
# ranks (cp ranks hold different tokens of the same sequences, so for the weights
# they are just more data-parallel ranks). paralab's descriptor **overlays** cp: dp
# alone fills the world and cp groups the same ranks again (lab 00).
#
# Below, both readings of the same knobs, `dp_shard=4, cp=2` on 8 ranks, as real
# meshes. Consuming: `dp_replicate = 8 / (4·2) = 1`, mesh `(1, 4, 2)` named
# `(dp_replicate, dp_shard, cp)`, and FSDP's group is the `("dp_shard", "cp")`
# sub-mesh. Overlay: `dp_replicate = 8 / 4 = 2`, and cp regroups the same ranks.
#
# **Predict before you run:** how many ranks does FSDP shard each weight over in each
# reading?
#
# <details><summary>Answer</summary>
#
# Consuming: all 8 (`dp_shard × cp`). Overlay: 4 (`dp_shard`), with 2 replicas.
# </details>


# %%
def consuming_vs_overlay():
    from torch.distributed.device_mesh import init_device_mesh

    titan = init_device_mesh("cpu", (1, 4, 2), mesh_dim_names=("dp_replicate", "dp_shard", "cp"))
    overlay = ParallelDims(dist.get_world_size(), dp_shard=4, cp=2)
    overlay.build_meshes("cpu")
    return {
        "titan dp_shard": titan["dp_shard"].mesh.tolist(),
        "titan cp": titan["cp"].mesh.tolist(),
        "titan FSDP group": titan["dp_shard", "cp"].mesh.flatten().tolist(),
        "overlay dp_shard = FSDP": overlay.dp_shard_mesh.mesh.tolist(),
        "overlay dp_replicate": overlay.dp_replicate_mesh.mesh.tolist(),
        "overlay cp": overlay.cp_mesh.mesh.tolist(),
    }


contrast = run(consuming_vs_overlay, 8)
overlay = [
    {
        "dp_shard": c["overlay dp_shard = FSDP"],
        "dp_replicate": c["overlay dp_replicate"],
        "cp": c["overlay cp"],
    }
    for c in contrast
]
consuming = [
    {"dp_shard_cp": c["titan FSDP group"], "dp_shard": c["titan dp_shard"], "cp": c["titan cp"]}
    for c in contrast
]
show(plot_overlay_vs_consuming(overlay, consuming))
fsdp_sizes = torch.tensor(
    [[len(r["titan FSDP group"]), len(r["overlay dp_shard = FSDP"])] for r in contrast]
)
titan_rows = compare(
    fsdp_sizes, torch.tensor([[8, 4]] * 8), name="FSDP group size: consuming 8, overlay 4"
)
print(verdict_table(titan_rows, "consuming vs overlay"))
CLAIMS.append(
    summary("dp_shard 4, cp 2 on 8 ranks: FSDP over 8 ranks consuming, 4 overlaid", titan_rows)
)

# %% [markdown]
# The cp pairs are the same, everything else differs. Consuming: cp ate a factor 2 of
# the budget, so `dp_shard` groups are strided (`0,2,4,6`: the ranks that hold the
# same tokens of different samples) and each weight is sharded over all 8 ranks
# (`dp_shard × cp`). Overlay: `dp_shard` keeps its 4 neighbours, there are 2 replicas,
# and cp regroups the same ranks; turning cp on or off (say, only for the long-video
# stage) does not change how the model is sharded.

# %% [markdown]
# ## 8. Traffic per step: ledger vs formula
#
# For every job of our engine and of DDP, on every rank, the bytes sent per step by
# each collective must equal the formula below (computed with each unit's padded
# size, since padding travels too). Ψ = 252 parameters = 2016 bytes.
#
# **What moves, per strategy:**
#
# | step | forward | backward (the mirror) |
# |---|---|---|
# | ZeRO-3 | all-gather the shards → run → free | all-gather again → unit's gradients → **reduce-scatter** (mean) → free |
# | HSDP $r \times s$ | the same inside the shard group of $s$ ranks | … then **all-reduce** the gradient shard across the $r$ replicas |
# | ZeRO-2-like (`reshard_after_forward=False`) | all-gather → run → **keep** | (no gather) → reduce-scatter → free |
# | DDP | nothing | all-reduce of the full gradients |
#
# All-gather and reduce-scatter are each other's mirror: one concatenates shards,
# the other sums full tensors and hands back one slice each.
#
# **Traffic per rank per step** in the ring model the ledger uses ($S$ = bytes of a unit's
# padded parameters, $n$ = group size): all-gather sends $(n-1)\,S/n$, reduce-scatter
# $(n-1)\,S/n$, all-reduce $2(n-1)\,S/n$. Summed over units ($\Psi$ = model bytes):
#
# - ZeRO-3: $2$ all-gathers $+ 1$ reduce-scatter $= 3\,\frac{n-1}{n}\Psi \approx 3\Psi$
# - ZeRO-2-like: $1 + 1 = 2\,\frac{n-1}{n}\Psi$ — the same as DDP's all-reduce, $\approx 2\Psi$
# - HSDP $r \times s$: $3\,\frac{s-1}{s}\Psi$ in the shard group plus $2\,\frac{r-1}{r}\,\frac{\Psi}{s}$ across replicas
#
# These count passes over $\Psi$ in **one dtype**, as this lab's float64 run has. In bytes
# they depend on the dtypes of each collective. Under FSDP2's
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` the two
# all-gathers move bf16 parameters and the reduce-scatter fp32 gradients, while DDP
# typically all-reduces bf16 gradients; the next cell prints the bytes per
# parameter of each: the ratio is 2, not 1.5.

# %%
# Bytes per parameter per step (ring model, large n) under MixedPrecisionPolicy(bf16 params, fp32 reduce)
bf16, fp32 = torch.bfloat16.itemsize, torch.float32.itemsize
zero3 = (
    2 * bf16 + fp32
)  # forward and backward all-gather of bf16 params + reduce-scatter of fp32 grads
ddp = 2 * bf16  # all-reduce of bf16 grads = a reduce-scatter and an all-gather
print(
    f"FSDP2 (ZeRO-3) {zero3} B/param, DDP {ddp} B/param: ratio {zero3 / ddp:g} (one dtype: 3 passes vs 2 = 1.5)"
)

# %% [markdown]
# First the ledger itself for HSDP 2×4, all 3 steps, by phase, collective and group
# size (ranks 0–3 shown; 4–7 are the same): the gathers and the reduce-scatter stay
# inside the shard group of 4, only the gradient shard's all-reduce (group of 2) crosses
# to the other replica, and it carries a quarter of the model.

# %%
from paralab.ledger import format_table

print(
    format_table(
        [r["records"] for r in RESULTS["HSDP 2x4 adam"][:4]], by=("phase", "op", "group_size")
    )
)

# %%
# show: paralab.fsdp.costs.traffic_formula paralab.fsdp.costs.per_step_sent

# %%
rows, TRAFFIC = [], {}
for label, res in RESULTS.items():
    job, world = res[0]["job"], res[0]["world"]
    if job.engine == "fsdp2":
        continue
    rows.append(check_traffic(res, NUMELS))
    if job.optimizer == "adam":
        formula = traffic_formula(
            job.engine, NUMELS, world, job.dp_replicate, job.reshard_after_forward
        )
        per_op = per_step_sent(res[0]["records"], STEPS)
        # HSDP's only cross-replica collective is the gradient shard's all-reduce; everything else stays in a group
        across = per_op.get("all_reduce", 0) if job.dp_replicate > 1 else 0
        TRAFFIC.setdefault(job.strategy, {})[world] = (
            sum(per_op.values()) - across,
            across,
            sum(formula.values()),
        )
        print(
            f"{label:<22} measured {sum(per_op.values()):5d} B/step ({across:4d} across replicas)  "
            f"formula {sum(formula.values()):5d} B/step  {formula}"
        )
CLAIMS.append(
    summary(f"bytes sent per rank per step = ring formula, every rank of {len(rows)} jobs", rows)
)
print(CLAIMS[-1].describe())

# %% jupyter={"outputs_hidden": true}
print(verdict_table(rows, "bytes sent per rank per step, every rank vs formula"))

# %%
show(plot_traffic(TRAFFIC))

# %% [markdown]
# One panel per strategy, so each one's trend with the world size shows; HSDP's bars
# split into the bytes that stay inside the shard group (blue) and those that cross
# between replicas (orange). In this float64 run ZeRO-3 sends 1.5× what DDP sends (3 vs 2 passes over Ψ in one
# dtype; a little more at 4 and 8 ranks because the padding travels too); ZeRO-2-like equals DDP up to that padding.
# HSDP 2×4 moves most of its bytes inside the shard group of 4 and only
# $2\cdot\frac{1}{2}\cdot\Psi/4$ across replicas — the slow inter-node link in a real
# cluster sees only a shard's worth of gradient.

# %% [markdown]
# ## 9. Memory per rank: real tensors vs formula
#
# **Memory per rank** (parameters + gradients + optimizer state). The ZeRO paper's mixed
# precision keeps bf16 parameters and gradients plus an fp32 master copy and two fp32 Adam
# moments: $(2\Psi + 2\Psi + 12\Psi)/N$ with $\Psi$ counted in parameters. FSDP2 splits it
# differently: its sharded parameters *are* the fp32 master copy (cast to bf16 only when
# gathered), and gradients are reduced into fp32 shards, so it holds
# $(4\Psi + 4\Psi + 8\Psi)/N$ plus transient bf16 unsharded parameters and gradients.
# This lab trains in **float64 with no separate master copy**, so the constants change:
# $(8 + 8 + 16)\Psi/N = 32\Psi/N$ bytes for Adam, $(8+8+8)\Psi/N$ for SGD with momentum,
# plus the full parameters of the unit being computed.
#
# Measured on the tensors each rank holds after the last step: its shards, their
# gradients, the optimizer state, and the peak bytes of gathered full parameters
# (read from the storages). Formulas: parameters and gradients $8\,\Psi_{pad}/s$,
# Adam $16\,\Psi_{pad}/s$ (SGD $8\,\Psi_{pad}/s$); gathered peak = the largest
# unit for ZeRO-3 and HSDP, all units for ZeRO-2-like; DDP holds $8\Psi$, $8\Psi$, $16\Psi$.
#
# "The largest unit" holds for this hand engine only: it gathers one unit at a time,
# with no prefetch, and measures parameters alone. FSDP2 prefetches, issuing the next
# unit's all-gather while the current one computes (forward and backward), so its peak
# holds about two units' parameters, and in the backward each unit's unsharded
# gradient is a transient peak too, until its reduce-scatter. This lab does not
# measure FSDP2's peak.

# %%
# show: paralab.fsdp.costs.memory_formula

# %%
rows, MEMORY, MEMORY_FORMULA = [], {}, {}
for label, res in RESULTS.items():
    job, world = res[0]["job"], res[0]["world"]
    if job.engine == "fsdp2":
        continue
    rows.append(check_memory(res, NUMELS))
    if job.optimizer == "adam":
        formula = memory_formula(
            job.engine, NUMELS, world, job.optimizer, job.dp_replicate, job.reshard_after_forward
        )
        MEMORY[label] = res[0]["memory"]
        MEMORY_FORMULA[label] = sum(formula.values())
        print(
            f"{label:<22} "
            + "  ".join(f"{p} {res[0]['memory'][p]:4d}" for p in MEMORY_PARTS)
            + f"  total {sum(res[0]['memory'].values()):5d}  formula {sum(formula.values()):5d}"
        )
CLAIMS.append(
    summary(f"bytes held per rank (4 parts) = formula, every rank of {len(rows)} jobs", rows)
)
print(CLAIMS[-1].describe())

# %% jupyter={"outputs_hidden": true}
print(verdict_table(rows, "bytes held per rank, every rank vs formula"))

# %%
show(plot_memory(MEMORY, MEMORY_FORMULA))

# %% [markdown]
# The trade is visible: ZeRO-2-like saves one all-gather per unit but holds every
# unit's full parameters from forward to backward (its gathered peak is the whole padded
# model); ZeRO-3 holds one unit at a time. HSDP 2×4's shards are twice those of ZeRO-3
# on 8 ranks (1/4 of the model, not 1/8) in exchange for little cross-replica traffic.

# %% [markdown]
# The numbers of sections 8 and 9 in one place:

# %%
closing = ["| strategy | world | bytes sent per rank per step (= formula) |", "|---|---|---|"]
closing += [
    f"| {name} | {world} | {sum(measured):,} |"
    for name, rows in TRAFFIC.items()
    for world, (*measured, _) in rows.items()
]
closing += [
    "",
    "| job (Adam) | bytes held per rank: params + grads + state + gathered peak (= formula) |",
    "|---|---|",
]
closing += [f"| {label} | {sum(memory.values()):,} |" for label, memory in MEMORY.items()]
display(
    Markdown(
        "Measured on this run (ledger and real tensors; sections 8 and 9 check every rank against "
        "the formulas):\n\n" + "\n".join(closing)
    )
)

# %% [markdown]
# ## 10. Bug clinic: an HSDP run that trains, but not the model it should
#
# A bug seen in real HSDP code. Below, HSDP 2×2 (replicas {0, 2} and {1, 3}, shard
# groups {0, 1} and {2, 3}) trains for 3 steps in two launches on 4 real ranks: once with
# the package's code, once with one decision of its gradient reduction swapped. The bug
# is a patch set (`paralab.exercises.lab01.one_reduction_decision_swapped()`; do not read
# it yet) handed to the second launch with `run(..., patches=BUG)`. Nothing crashes, the
# collectives and their bytes are the same, the first loss is the same. The picture is
# `|buggy - correct|` of every parameter every rank holds after 3 SGD steps: one row per
# rank, its four unit shards side by side (41 + 41 + 41 + 3 elements, drawn apart).

# %%
from paralab.exercises.lab01 import one_reduction_decision_swapped

BUG = one_reduction_decision_swapped()
CLINIC_WORLD, CLINIC_JOBS = 4, [Job("hand", 2, optimizer="sgd"), Job("hand", 2)]
launches = [  # the same jobs launched twice: the package's code, then with the bug planted
    run(fsdp_runs.run_jobs, CLINIC_WORLD, CLINIC_JOBS, timeout=120, patches=patches)
    for patches in (None, BUG)
]
correct, buggy = (
    [[rank[j] for rank in per_rank] for j in range(len(CLINIC_JOBS))] for per_rank in launches
)
shard_sizes = [p.numel() for p in correct[0][0]["params"]]
show(
    plot_rank_strip(
        torch.stack([torch.cat(r["params"]) for r in correct[0]]),
        torch.stack([torch.cat(r["params"]) for r in buggy[0]]),
        [(f"{name} shard", size) for name, size in zip(UNIT_NAMES, shard_sizes)],
        f"{CLINIC_JOBS[0].label(CLINIC_WORLD)}: every parameter element each rank holds after 3 steps",
        unit="|buggy - correct| (parameter value)",
    )
)

# %%
first_grad = [(torch.cat(b["grads"]), torch.cat(c["grads"])) for b, c in zip(buggy[0], correct[0])]
ratios = torch.cat([b[c != 0] / c[c != 0] for b, c in first_grad])
print(
    "first-step loss equal on every rank:",
    all(torch.equal(b["loss"], c["loss"]) for b, c in zip(buggy[0], correct[0])),
)
print(
    "buggy / correct first-step gradient, every nonzero element of every rank: min",
    f"{ratios.min().item():.6g}",
    "max",
    f"{ratios.max().item():.6g}",
)
for job, c_runs, b_runs in zip(CLINIC_JOBS, correct, buggy):
    diff = max(
        (torch.cat(b["params"]) - torch.cat(c["params"])).abs().max().item()
        for b, c in zip(b_runs, c_runs)
    )
    moved = max(
        (torch.cat(c["params"]) - p0).abs().max().item()
        for c, p0 in zip(
            c_runs,
            (
                torch.cat(fsdp_runs.expected_params(make_mlp_stack(), job, CLINIC_WORLD, r))
                for r in range(CLINIC_WORLD)
            ),
        )
    )
    print(
        f"{job.optimizer}: largest parameter difference after 3 steps {diff:.1e}, largest move of a parameter {moved:.1e}"
    )

# %%
rows = []
for job, runs in zip(CLINIC_JOBS, zip(correct, buggy)):
    label = f"clinic: {job.label(CLINIC_WORLD)}"
    right, wrong = (fold(check_params(r, REFERENCE[job.optimizer], atol=1e-12), "") for r in runs)
    rows.append(
        claim(f"{label}, package code passes", right.passed, f"max |diff| {right.max_abs:.1e}")
    )
    rows.append(
        claim(
            f"{label}, seeded bug caught (atol 1e-12)",
            not wrong.passed,
            f"the check catches the bug: {wrong.n_diff} elements differ, max {wrong.max_abs:.1e}",
        )
    )
print(verdict_table(rows, "bug clinic: the check sees the bug, with SGD and with Adam"))
CLAIMS.append(summary("bug clinic: package passes, seeded HSDP bug caught (SGD and Adam)", rows))

# %% [markdown]
# **What is wrong?** Rows 0 and 2 (and 1 and 3) hold the same shard: are they still equal
# to each other? By how much is every gradient element off, and why would a loss curve
# with Adam barely show it? Then open the answer.

# %% [markdown]
# <details><summary>Answer</summary>
#
# The gradient is averaged twice. The patch set replaces the package's
# `gradient_divide_factors` with `replicas_divided_by_world`, so `reduce_scatter_grads`
# averages inside the shard group (sum, then ÷ `dp_shard` = 2) as it should, but then
# divides the replica all-reduce's sum by the **world size** (4) instead of by
# `dp_replicate` (2). Each rank's contribution is divided by `dp_shard · world` = 8 instead of by `world` = 4: every gradient element is
# exactly `1/dp_shard` = 0.5 of the right value (the ratio above; exact because the
# factors are powers of two). The replicas still agree with each other (the all-reduce ran),
# the forward and the first loss are untouched, and the bytes on the wire are the same, so
# neither a hang, nor a replica-divergence check, nor the ledger catches it.
#
# - With **SGD** it is a silently halved learning rate: every parameter moves half as far
#   (the heatmap follows the size of each update).
# - With **Adam** it almost vanishes: Adam divides the first moment by the square root of
#   the second, so a constant factor on the gradient cancels except against `eps`: the
#   largest parameter difference printed above is orders of magnitude below the largest
#   move, far below what a loss curve shows. Real runs "train fine" with this bug until someone
#   changes the optimizer, `eps`, the gradient clipping threshold (clipping sees a norm
#   `dp_shard` times too small) or the mesh shape (the factor follows `dp_shard`).
#
# The fix: divide each reduction by its own group's size (÷ `dp_shard` in the
# reduce-scatter, ÷ `dp_replicate` in the replica all-reduce; their product is the world),
# or sum in both and divide once by the world size. Comparing every element with a
# single-process reference catches it even under Adam (second row above).
# </details>

# %% [markdown]
# ## Closing table
#
# Every claim of this lab; each one's row-by-row detail is printed (folded) where it is
# checked. The run time of this notebook:

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")

# %%
print(verdict_table(CLAIMS, "Lab 01 claims"))

# %% [markdown]
# ## What to try
#
# 1. **Sum instead of mean.** The clinic's ranks run the package's engine, so an edit
#    reaches them only as a patch set. Make section 2's `gradient_divide_factors` cell
#    `return 1, 1` and re-run it; then in section 10's first cell hand it over in place of
#    the clinic's bug, `BUG = {"paralab.fsdp.zero": {"gradient_divide_factors":
#    gradient_divide_factors}}`, and re-run the two clinic cells. Predict the printed
#    gradient ratio first. Why is the parameter
#    difference of order 1 for SGD but about 1e-6 for Adam? Would the DDP and FSDP2 rows
#    of section 6 change?
#    <details><summary>Hint</summary>The ratio is 4 = `dp_replicate · dp_shard`: neither
#    reduction divides, so every gradient is the world size times too large. SGD moves 4
#    times too far; Adam divides the first moment by the square root of the second, so a
#    constant factor cancels except against `eps`. Both checks still catch it. DDP and
#    FSDP2 do not call `reduce_scatter_grads`: their rows would not change.</details>
# 2. Which ranks hold identical bytes after HSDP 2×4? Check
#    `torch.equal(RESULTS["HSDP 2x4 adam"][1]["params"][0], RESULTS["HSDP 2x4 adam"][5]["params"][0])`.
#    Why does an HSDP checkpoint need only `dp_shard` distinct shard files, each read by
#    `dp_replicate` ranks?
#    <details><summary>Hint</summary>Ranks `r` and `r + 4` are one replica group: the
#    replica all-reduce makes their shards equal, so one file per shard slot suffices.</details>
# 3. Add `Job("hand", 8)` to the 8-rank plan (HSDP 8×1: shard groups of one rank).
#    Predict its bytes per step before running: which strategy does it become?
#    <details><summary>Hint</summary>Shard groups of one rank gather and reduce-scatter
#    nothing; the replica all-reduce of the whole gradient remains: it is DDP.</details>
# 4. Add `Job("fsdp2", mesh="dp_mesh")` to the 8-rank plan. Does the number of one-rank
#    all-reduces per step depend on the world size or on the number of units?
#    <details><summary>Hint</summary>One per unit per step (section 7's tiny run has
#    2 units and 2 all-reduces), whatever the world size.</details>
# 5. In section 6 set `atol=0` in the check after 3 steps and re-run that cell. Which
#    rows fail now? Compare with the rank-by-rank table: why do world 2 and HSDP 2×2 pass
#    there but not here?
#    <details><summary>Hint</summary>The global-batch reference adds 16 rows in one
#    matrix product; the ranks add their own rows first. Only the rank-by-rank
#    reference adds in the same order as 2-rank groups.</details>
# 6. Add `Job("hand", 2, reshard_after_forward=False)` to the 8-rank plan (HSDP with
#    parameters kept between forward and backward). Predict its bytes per step and its
#    gathered peak from the formulas before running.
#    <details><summary>Hint</summary>One all-gather per unit instead of two inside the
#    shard group of 4, the same replica all-reduce; the gathered peak is the whole padded model.</details>
# 7. In the bug clinic set `CLINIC_WORLD = 8` (HSDP 2×4) and re-run that cell; predict
#    the gradient ratio first. Then make both clinic jobs `Job("hand", 4, ...)` (HSDP 4×2):
#    does the factor follow `dp_shard`, `dp_replicate` or the world size?
#    <details><summary>Hint</summary>The ratio is `1/dp_shard`: 0.25 for 2×4, 0.5 for 4×2.</details>
# 8. In section 7, make the consuming mesh `(2, 2, 2)` and the overlay `dp_shard=4,
#    dp_replicate=2, cp=2`. Now the FSDP groups coincide: why? What would still differ
#    if you turned cp off?
#    <details><summary>Hint</summary>Consuming, FSDP shards over the flattened last two
#    dims `(dp_shard, cp)`: 4 contiguous ranks, the same as the overlay's `dp_shard = 4`
#    row. Turning cp off changes the consuming mesh (its `dp_shard` or `dp_replicate` must
#    grow to fill the world), not how the overlay shards the model.</details>
# 9. **Three units in the trap.** The trap model is built on the ranks by the package
#    (`fsdp.engine_facts._two_unit_model`), so give it three layers by handing the ranks a
#    builder defined here with `patches=`, and predict the counts before running:
#
#    ```python
#    def three_layers():
#        torch.manual_seed(0)
#        return torch.nn.Sequential(*(torch.nn.Linear(8, 8, bias=False) for _ in range(3)))
#
#    THREE = {"paralab.fsdp.engine_facts": {"_two_unit_model": three_layers}}
#    for on_dp_mesh in (False, True):
#        ops = [(op, size) for _, op, size in run(fsdp2_mesh_calls, 4, on_dp_mesh, patches=THREE)[0]]
#        print("pd.dp_mesh" if on_dp_mesh else "fsdp_mesh(pd)", {op: ops.count(op) for op in set(ops)})
#    ```
#    <details><summary>Hint</summary>`U = 3`: 6 all-gathers, 3 reduce-scatters, and on the
#    2-D mesh 3 one-rank all-reduces.</details>
