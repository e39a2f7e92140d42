# %% [markdown]
# # Lab 01 — FSDP (`dp_shard`) and HSDP (`dp_replicate` × `dp_shard`)
#
# **What is split.** Data parallelism gives every rank a different slice of the global
# batch. Plain DDP also gives every rank a full copy of the parameters, their gradients
# and the optimizer state. FSDP (ZeRO-3) splits those three as well: each FSDP *unit*
# (here: one block of the model) is flattened into one vector, padded to a multiple of
# the shard-group size $N$, and rank $i$ keeps only slice $i$ — its **shard**.
#
# **What moves.** A unit's full parameters exist only while the unit computes:
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
# typically all-reduces bf16 gradients; the cell after the imports prints the bytes per
# parameter of each: the ratio is 2, not 1.5.
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

# %%
import time

import torch
from IPython.display import Markdown, display

from paralab import ParallelDims, fsdp_mesh
from paralab.check import claim, compare, verdict_table
from paralab.launch import run
from paralab.models import make_mlp_stack
from paralab.fsdp import runs as fsdp_runs
from paralab.fsdp.runs import (
    MEMORY_PARTS, STEPS, Job, check_fsdp2_calls, check_memory, check_params, check_traffic, fold, fsdp2_calls,
    reference_first_gradient, reference_first_loss, train_reference, train_reference_rank_by_rank, unit_numels,
)
from paralab.viz import plot_memory, plot_shard_layout, plot_traffic, show

LAB_START = time.monotonic()
model = make_mlp_stack()
NUMELS = unit_numels(model)
UNIT_NAMES = [f"block {i}" for i in range(len(model.blocks))] + ["head"]
print(model)
print("parameters per unit:", dict(zip(UNIT_NAMES, NUMELS)), "total", sum(NUMELS))

# %%
# Bytes per parameter per step (ring model, large n) under MixedPrecisionPolicy(bf16 params, fp32 reduce)
bf16, fp32 = torch.bfloat16.itemsize, torch.float32.itemsize
zero3 = 2 * bf16 + fp32  # forward and backward all-gather of bf16 params + reduce-scatter of fp32 grads
ddp = 2 * bf16  # all-reduce of bf16 grads = a reduce-scatter and an all-gather
print(f"FSDP2 (ZeRO-3) {zero3} B/param, DDP {ddp} B/param: ratio {zero3 / ddp:g} (one dtype: 3 passes vs 2 = 1.5)")

# %% [markdown]
# ## 1. The shard
#
# Four units: three residual MLP blocks of 82 parameters (two `Linear` layers with
# biases) and a 6-parameter head. 82 does not divide by 4 or 8, so every unit is padded;
# at 8 ranks the head has one element per rank and ranks 6 and 7 hold nothing but
# padding. The picture shows who holds what (numbers: the ranks holding that shard).

# %%
for world, replicas in [(8, 1), (8, 2)]:
    show(plot_shard_layout(NUMELS, world, replicas, UNIT_NAMES))

# %% [markdown]
# The shard is a contiguous slice of the padded flat vector. `shard_unit` keeps it as an
# `nn.Parameter` (so autograd can accumulate its gradient) and moves the module itself
# to the `meta` device: the module keeps its structure, not its numbers.

# %%
# show: paralab.fsdp.zero.padded_size paralab.fsdp.zero.flat_shard paralab.fsdp.zero.FlatUnit paralab.fsdp.zero.shard_unit paralab.fsdp.zero.unflatten

# %% [markdown]
# ## 2. The collectives
#
# Gather before use, free after use, reduce-scatter the gradient, and for HSDP average the
# gradient shard across replicas. `free` releases the *storage* of the gathered tensor;
# the tensor object stays, because autograd saved views of it for the backward pass, and
# the backward gather refills that same storage (FSDP2 does the same).
# `_unsafe_preserve_version_counter` tells autograd that refilling is not a modification.
# The mean is a sum followed by a division by $n$ (exact when $n$ is a power of two).

# %%
# show: paralab.fsdp.zero.gather_unit_params paralab.fsdp.zero.free_unit_params paralab.fsdp.zero.reduce_scatter_grads

# %% [markdown]
# ## 3. A unit's forward and backward, and the engine
#
# One `torch.autograd.Function` per unit call. Forward: gather, run the unit on views
# of the flat parameters (building the unit's own small graph), free. Backward:
# gather again, `autograd.grad` through the unit's graph, free, reduce-scatter, replica
# all-reduce. Because the units are chained, autograd runs their backwards in reverse
# unit order on every rank, so every rank issues the same collectives in the same order
# (differentiable collectives scattered through one graph do not guarantee that).
# The gradient returned for the `shard` input lands in `shard.grad`.

# %%
# show: paralab.fsdp.zero.ShardedUnitFunction paralab.fsdp.zero.HandFSDP

# %% [markdown]
# ## 4. The sharded optimizer step
#
# SGD with momentum and Adam are elementwise, so updating a shard gives exactly the
# same numbers as updating the full tensor and slicing: no communication, and the
# optimizer state is $1/N$ too. The functions repeat `torch.optim`'s single-tensor
# operations in the same order, so the reference (which uses `torch.optim`) can be
# matched bit for bit. DDP uses the same optimizer on full parameters, and
# `all_reduce_gradients` for its gradients.

# %%
# show: paralab.fsdp.zero.sgd_momentum_step paralab.fsdp.zero.adam_step paralab.fsdp.zero.ShardOptimizer paralab.fsdp.zero.all_reduce_gradients

# %% [markdown]
# ## 5. Real runs: three launches
#
# Each launch runs several jobs in a row on the same ranks (a launch costs more than a
# few tiny steps). Every job trains for 3 optimizer steps on its rank's slice of one
# global batch of 16 and returns what its rank holds, the ledger records and the memory.
# The notebook's own definitions above are handed to the ranks, so editing a cell and
# re-running takes effect. FSDP2 (`fully_shard`, the real engine) runs in the same launches.

# %%
PLAN = {
    2: [Job("hand"), Job("hand", optimizer="sgd"), Job("hand", reshard_after_forward=False),
        Job("ddp"), Job("fsdp2")],
    4: [Job("hand"), Job("hand", optimizer="sgd"), Job("hand", 2), Job("hand", reshard_after_forward=False),
        Job("ddp"), Job("fsdp2"), Job("fsdp2", 2), Job("fsdp2", mesh="dp_mesh")],
    8: [Job("hand"), Job("hand", 2), Job("hand", 2, optimizer="sgd"), Job("hand", reshard_after_forward=False),
        Job("ddp"), Job("fsdp2"), Job("fsdp2", 2)],
}
IMPL = dict(HandFSDP=HandFSDP, ShardOptimizer=ShardOptimizer, all_reduce_gradients=all_reduce_gradients)
RESULTS = {}  # label -> list of per-rank results
for world, jobs in PLAN.items():
    per_rank = run(fsdp_runs.run_jobs, world, jobs, timeout=120, **IMPL)
    for j in range(len(jobs)):
        RESULTS[per_rank[0][j]["label"]] = [per_rank[r][j] for r in range(world)]
print(len(RESULTS), "jobs:", ", ".join(RESULTS))

# %% [markdown]
# ## 6. Exactness against one process on the whole global batch
#
# **First step, forward and backward.** Each rank's loss on its own 16/n rows must
# equal, bit for bit, the loss one process computes with the initial weights on the
# same rows: the gathered parameters are exact copies (an all-gather moves numbers, it
# adds nothing) and the operations are the same. The gradient each rank holds after
# the first backward (its shard of the mean gradient for FSDP, the local part for
# FSDP2, the full gradient for DDP) must equal the matching slice of the global-batch
# gradient — within 1e-12, see below. One row per job; the shape column counts the
# tensors folded into the row (ranks × units or parameters).

# %%
GRAD_REFERENCE = reference_first_gradient()
loss_rows, grad_rows = [], []
for label, res in RESULTS.items():
    world = res[0]["world"]
    losses = [r["loss"] for r in res]
    loss_rows.append(fold(compare(losses, [reference_first_loss(r, world) for r in range(world)]), label))
    grad_rows.append(fold(check_params(res, GRAD_REFERENCE, atol=1e-12, key="grads"), label))
print(verdict_table(loss_rows, "first-step loss of every rank vs one process on the same rows (exact)"))
print()
print(verdict_table(grad_rows, "first-step gradient every rank holds vs the global-batch gradient (atol 1e-12)"))

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
rows = [fold(check_params(res, REFERENCE[res[0]["job"].optimizer], atol=1e-12), label)
        for label, res in RESULTS.items()]
print(verdict_table(rows, "every rank's parameters after 3 steps vs the global-batch reference (atol 1e-12)"))

# %% [markdown]
# The same check for one job, ZeRO-3 on 8 ranks, one row per rank (its 4 unit shards).
# The padding must stay exactly zero: its gradient is zero, and both optimizers map a
# zero gradient on a zero parameter to zero. At 8 ranks the head's shards on ranks 6
# and 7 are nothing but padding.

# %%
res = RESULTS["ZeRO-3 n=8 adam"]
verdicts = check_params(res, REFERENCE["adam"], atol=1e-12)
rows = [fold(verdicts[r * n:(r + 1) * n], f"rank {r}, {n} unit shards") for r, n in enumerate([len(NUMELS)] * 8)]
padding = []
for rank, out in enumerate(res):
    for numel, shard in zip(NUMELS, out["params"]):
        padding.append(shard[max(0, min(shard.numel(), numel - rank * shard.numel())):])
padding = torch.cat(padding)
rows += compare(padding, torch.zeros_like(padding), name="padding elements of all ranks [exact zero]")
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
    rows.append(fold(check_params(res, rbr, atol=atol), label + (" [exact]" if atol == 0 else " [1e-12]")))
print(verdict_table(rows, "vs the rank-by-rank reference: exact for 2-rank groups, 1e-12 otherwise"))

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
# ledger sees it. The FSDP2 job (`fsdp_runs.run_fsdp2`) wraps each unit, then the root:
#
# ```python
# mesh = pd.dp_mesh if job.mesh == "dp_mesh" else fsdp_mesh(pd)   # the trap vs the fix
# for unit in model.units():
#     fully_shard(unit, mesh=mesh)
# fully_shard(model, mesh=mesh)
# ```
#
# The two meshes on 4 ranks with `dp_replicate == 1`:

# %%
def mesh_shapes():
    import torch.distributed as dist

    pd = ParallelDims(dist.get_world_size(), dp_replicate=1)
    pd.build_meshes("cpu")
    return {"pd.dp_mesh": (pd.dp_mesh.ndim, tuple(pd.dp_mesh.shape), pd.dp_mesh.mesh_dim_names),
            "fsdp_mesh(pd)": (fsdp_mesh(pd).ndim, tuple(fsdp_mesh(pd).shape), fsdp_mesh(pd).mesh_dim_names)}


for name, (ndim, shape, names) in run(mesh_shapes, 4)[0].items():
    print(f"{name:<14} ndim {ndim}  shape {shape}  dims {names}")


# %%
rows = []
for label, res in RESULTS.items():
    if res[0]["job"].engine == "fsdp2":
        print(f"{label:<32} per step: gathers, reduce-scatters, 1-rank all-reduces, replica all-reduces "
              f"{fsdp2_calls(res[0]['records'], res[0]['job'].dp_replicate)}")
        rows.append(check_fsdp2_calls(res, len(NUMELS)))
print(verdict_table(rows, "FSDP2 calls per step, every rank vs formula: per unit 2 gathers, 1 reduce-scatter, "
                          "1 replica all-reduce for HSDP, 1 one-rank all-reduce on the (1, n) mesh"))

# %% [markdown]
# ## 8. Traffic per step: ledger vs formula
#
# For every job of our engine and of DDP, on every rank, the bytes sent per step by
# each collective must equal the formula of the introduction (computed with each
# unit's padded size, since padding travels too). Ψ = 252 parameters = 2016 bytes.

# %% [markdown]
# First the ledger itself for HSDP 2×4, all 3 steps, by phase, collective and group
# size (ranks 0–3 shown; 4–7 are the same): the gathers and the reduce-scatter stay
# inside the shard group of 4, only the gradient shard's all-reduce (group of 2) crosses
# to the other replica, and it carries a quarter of the model.

# %%
from paralab.ledger import format_table

print(format_table([r["records"] for r in RESULTS["HSDP 2x4 adam"][:4]], by=("phase", "op", "group_size")))

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
        formula = traffic_formula(job.engine, NUMELS, world, job.dp_replicate, job.reshard_after_forward)
        measured = sum(per_step_sent(res[0]["records"], STEPS).values())
        TRAFFIC.setdefault(job.strategy, {})[world] = (measured, sum(formula.values()))
        print(f"{label:<22} measured {measured:5d} B/step  formula {sum(formula.values()):5d} B/step  {formula}")
print(verdict_table(rows, "bytes sent per rank per step, every rank vs formula"))

# %%
show(plot_traffic(TRAFFIC))

# %% [markdown]
# In this float64 run ZeRO-3 sends 1.5× what DDP sends (3 vs 2 passes over Ψ in one
# dtype; a little more at 4 and 8 ranks because the padding travels too); ZeRO-2-like equals DDP up to that padding.
# HSDP 2×4 moves most of its bytes inside the shard group of 4 and only
# $2\cdot\frac{1}{2}\cdot\Psi/4$ across replicas — the slow inter-node link in a real
# cluster sees only a shard's worth of gradient.

# %% [markdown]
# ## 9. Memory per rank: real tensors vs formula
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
        formula = memory_formula(job.engine, NUMELS, world, job.optimizer, job.dp_replicate, job.reshard_after_forward)
        MEMORY[label] = res[0]["memory"]
        MEMORY_FORMULA[label] = sum(formula.values())
        print(f"{label:<22} " + "  ".join(f"{p} {res[0]['memory'][p]:4d}" for p in MEMORY_PARTS)
              + f"  total {sum(res[0]['memory'].values()):5d}  formula {sum(formula.values()):5d}")
print(verdict_table(rows, "bytes held per rank, every rank vs formula"))

# %%
show(plot_memory(MEMORY, MEMORY_FORMULA))

# %% [markdown]
# The trade is visible: ZeRO-2-like saves one all-gather per unit but holds every
# unit's full parameters from forward to backward (its gathered peak is the whole padded
# model); ZeRO-3 holds one unit at a time. HSDP 2×4's shards are twice those of ZeRO-3
# on 8 ranks (1/4 of the model, not 1/8) in exchange for little cross-replica traffic.

# %% [markdown]
# ## 10. Bug clinic: an HSDP run that trains, but not the model it should
#
# A bug seen in real HSDP code. Below, HSDP 2×2 (replicas {0, 2} and {1, 3}, shard
# groups {0, 1} and {2, 3}) trains for 3 steps twice on the same 4 real ranks: once with
# the package's `reduce_scatter_grads`, once with a seeded variant installed in its place
# (`paralab.exercises.lab01.hsdp_divides_twice`; do not read it yet). Nothing crashes, the
# collectives and their bytes are the same, the first loss is the same. The picture is
# `|buggy - correct|` of every parameter every rank holds after 3 SGD steps: one row per
# rank, its four unit shards side by side (41 + 41 + 41 + 3 elements).

# %%
from paralab.exercises import planted
from paralab.exercises.lab01 import hsdp_divides_twice
from paralab.fsdp import zero
from paralab.viz import plot_diff_heatmap


def clinic_worker(jobs, bug):
    """The same jobs twice on the same ranks: the package's gradient reduction, then `bug` in its place."""
    correct = fsdp_runs.run_jobs(jobs)
    with planted(zero, reduce_scatter_grads=bug):  # the engine's backward looks it up at call time
        buggy = fsdp_runs.run_jobs(jobs)
    return correct, buggy


CLINIC_WORLD, CLINIC_JOBS = 4, [Job("hand", 2, optimizer="sgd"), Job("hand", 2)]
clinic = run(clinic_worker, CLINIC_WORLD, CLINIC_JOBS, hsdp_divides_twice, timeout=120)
correct, buggy = ([[rank[i][j] for rank in clinic] for j in range(len(CLINIC_JOBS))] for i in (0, 1))
show(plot_diff_heatmap(torch.stack([torch.cat(r["params"]) for r in correct[0]]),
                       torch.stack([torch.cat(r["params"]) for r in buggy[0]]),
                       f"{CLINIC_JOBS[0].label(CLINIC_WORLD)}: parameters after 3 steps, buggy vs correct",
                       row_label="rank", col_label="element of the rank's unit shards"))
first_grad = [(torch.cat(b["grads"]), torch.cat(c["grads"])) for b, c in zip(buggy[0], correct[0])]
ratios = torch.cat([b[c != 0] / c[c != 0] for b, c in first_grad])
print("first-step loss equal on every rank:", all(torch.equal(b["loss"], c["loss"]) for b, c in zip(buggy[0], correct[0])))
print("buggy / correct first-step gradient, every nonzero element of every rank: min", f"{ratios.min().item():.6g}",
      "max", f"{ratios.max().item():.6g}")
for job, c_runs, b_runs in zip(CLINIC_JOBS, correct, buggy):
    diff = max((torch.cat(b["params"]) - torch.cat(c["params"])).abs().max().item() for b, c in zip(b_runs, c_runs))
    moved = max((torch.cat(c["params"]) - p0).abs().max().item()
                for c, p0 in zip(c_runs, (torch.cat(fsdp_runs.expected_params(make_mlp_stack(), job, CLINIC_WORLD, r))
                                          for r in range(CLINIC_WORLD))))
    print(f"{job.optimizer}: largest parameter difference after 3 steps {diff:.1e}, largest move of a parameter {moved:.1e}")
rows = []
for job, runs in zip(CLINIC_JOBS, zip(correct, buggy)):
    label = f"clinic: {job.label(CLINIC_WORLD)}"
    right, wrong = (fold(check_params(r, REFERENCE[job.optimizer], atol=1e-12), "") for r in runs)
    rows.append(claim(f"{label}, package code passes", right.passed, f"{right.n_diff} of {right.numel} elements differ"))
    rows.append(claim(f"{label}, seeded bug caught (atol 1e-12)", not wrong.passed,
                      f"{wrong.n_diff} of {wrong.numel} elements differ"))
print(verdict_table(rows, "bug clinic: the check sees the bug, with SGD and with Adam"))

# %% [markdown]
# **What is wrong?** Rows 0 and 2 (and 1 and 3) hold the same shard: are they still equal
# to each other? By how much is every gradient element off, and why would a loss curve
# with Adam barely show it? Then open the answer.

# %% [markdown]
# <details><summary>Answer</summary>
#
# The gradient is averaged twice. `hsdp_divides_twice` averages inside the shard group
# (sum, then ÷ `dp_shard` = 2) as it should, but then divides the replica all-reduce's sum
# by the **world size** (4) instead of by `dp_replicate` (2). Each rank's contribution is
# divided by `dp_shard · world` = 8 instead of by `world` = 4: every gradient element is
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

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")

# %% [markdown]
# ## Closing note

# %%
closing = ["| strategy | world | bytes sent per rank per step (= formula) |", "|---|---|---|"]
closing += [f"| {name} | {world} | {measured:,} |" for name, rows in TRAFFIC.items() for world, (measured, _) in rows.items()]
closing += ["", "| job (Adam) | bytes held per rank: params + grads + state + gathered peak (= formula) |", "|---|---|"]
closing += [f"| {label} | {sum(memory.values()):,} |" for label, memory in MEMORY.items()]
display(Markdown("Measured on this run (ledger and real tensors; sections 8 and 9 check every rank against "
                 "the formulas):\n\n" + "\n".join(closing) + "\n\nThe run time is printed above."))

# %% [markdown]
# ## What to try
#
# 1. In section 2 drop the `.div_(n)` of `reduce_scatter_grads` (sum instead of mean)
#    and re-run from section 2. Which rows fail? Why is the error about 1e-6 for Adam
#    but of order 1 for SGD (hint: what does Adam divide the gradient by)? Why do the
#    DDP and FSDP2 rows still pass?
# 2. Which ranks hold identical bytes after HSDP 2×4? Check
#    `torch.equal(RESULTS["HSDP 2x4 adam"][1]["params"][0], RESULTS["HSDP 2x4 adam"][5]["params"][0])`.
#    Why does an HSDP checkpoint need only `dp_shard` distinct shard files, each read by
#    `dp_replicate` ranks?
# 3. Add `Job("hand", 8)` to the 8-rank plan (HSDP 8×1: shard groups of one rank).
#    Predict its bytes per step before running: which strategy does it become?
# 4. Add `Job("fsdp2", mesh="dp_mesh")` to the 8-rank plan. Does the number of one-rank
#    all-reduces per step depend on the world size or on the number of units?
# 5. In section 6 set `atol=0` in the check after 3 steps and re-run that cell. Which
#    rows fail now? Compare with the rank-by-rank table: why do world 2 and HSDP 2×2 pass
#    there but not here?
# 6. Add `Job("hand", 2, reshard_after_forward=False)` to the 8-rank plan (HSDP with
#    parameters kept between forward and backward). Predict its bytes per step and its
#    gathered peak from the formulas before running.
# 7. In the bug clinic set `CLINIC_WORLD = 8` (HSDP 2×4) and re-run that cell; predict
#    the gradient ratio first. Then make both clinic jobs `Job("hand", 4, ...)` (HSDP 4×2):
#    does the factor follow `dp_shard`, `dp_replicate` or the world size?
