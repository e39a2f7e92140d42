# %% [markdown]
# # Lab 00 — `ParallelDims`: one descriptor, many groupings of the same ranks
#
# Every later lab asks the same question first: *which ranks talk to which?*
# `paralab.ParallelDims` answers it for every parallel axis at once, and builds the
# `torch.distributed` process groups (as `DeviceMesh`es) that the axes use.
#
# **You will learn** to
# - read a rank's groups on every axis off a real `DeviceMesh`, and predict them by hand
#   with row-major arithmetic;
# - tell the two kinds of axis apart: *partition* axes that fill the world, *overlay*
#   axes that group the same ranks again;
# - say which data each rank gets under the overlay (cp partners share a sample), from its
#   coordinates on the meshes;
# - recognise every rule a config can break, and the two configs that are changed
#   instead of rejected.
#
# **Prerequisites:** the collectives primer (`00_collectives_primer`): what a process
# group is, and all-gather / all-reduce. **Reading time:** about 20 minutes.
#
# There are two kinds of axis:
#
# | kind | axes | rule | question it answers |
# |---|---|---|---|
# | **partition** | `dp_shard`, `dp_replicate` | `dp_replicate × dp_shard == world_size`; every rank is in exactly one shard group and one replica group | "the model / data does not fit on one GPU" |
# | **overlay** | `cp`, `cfgp` (and, separately, `lb`) | take no rank slots of their own: `cfgp × cp` divides `world_size`, `lb` divides it | "one sequence is too long" (cp), "guided inference runs the network twice" (cfgp), "raw videos of very different cost before the VAE encode" (lb) |
#
# So on 8 ranks one rank is, *at the same time*, in a dp shard group of 4, a dp
# replica group of 2, a cp group of 2, a cfgp group of 2 and an lb group of 2.
#
# **Reading guide.** 1 the descriptor on 8 real ranks, checked against arithmetic;
# 2 its pictures; 3 which data each rank gets; 4 every way a config can be wrong;
# 5 which workload uses which axis; 6 a bug clinic. Lab 01 continues with the mesh
# FSDP2 is handed (`fsdp_mesh`) and torchtitan's other reading of the same knobs.
# Code: `src/paralab/parallel_dims.py` (descriptor, meshes, `predict_groups`),
# `src/paralab/launch.py` (ranks), `src/paralab/check.py` (verdicts), `src/paralab/viz/mesh.py` (pictures).

# %%
import logging
import sys
import warnings

import torch
import torch.distributed as dist

from paralab import ParallelDims
from paralab.check import claim, compare, verdict_table
from paralab.launch import run
from paralab.parallel_dims import predict_groups
from paralab.patches import patched
from paralab.viz import plot_dp_grid, plot_rank_groups, plot_rank_strip, show

WORLD = 8
CONFIG = dict(dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2, enable_inference_mode=True)
verdicts = []

# %% [markdown]
# ## 1. The descriptor and its meshes on 8 real ranks
#
# Construction only validates and infers sizes — no process group needed:

# %%
pd = ParallelDims(WORLD, **CONFIG)
print(pd)
print(
    "enabled:",
    {
        axis: getattr(pd, f"{axis}_enabled")
        for axis in ("dp", "dp_shard", "dp_replicate", "cp", "cfgp", "lb")
    },
)
print("meshes before build_meshes:", pd.mesh)

# %% [markdown]
# `build_meshes()` calls the real `torch.distributed.device_mesh.init_device_mesh`
# once per family of axes, all row-major, from one table that says each mesh's dims,
# their names and who uses them. The lb mesh is its own: the raw-video exchange before
# the VAE encode has nothing to do with how sequences are sharded.

# %%
# show: paralab.parallel_dims.ParallelDims.mesh_layouts

# %% [markdown]
# Then each enabled axis keeps its 1-D slice of its family's mesh (the code, exactly as
# the package runs it):

# %%
# show: paralab.parallel_dims.ParallelDims.build_meshes

# %% [markdown]
# Which axes get a group, and `_build_mesh`, the one call to `init_device_mesh` per
# family (folded):

# %% jupyter={"source_hidden": true}
# show: paralab.parallel_dims.ParallelDims.axes_enabled paralab.parallel_dims.ParallelDims._build_mesh

# %% [markdown]
# Every rank builds the meshes and reports its groups, read off the `DeviceMesh`
# (`mesh.mesh` is the tensor of global ranks in this rank's sub-mesh). The function
# below runs on each of the 8 ranks; its return values come back to this notebook.
#
# **Predict before you run:** the overlay mesh is `(rest, cfgp, cp) = (2, 2, 2)`,
# row-major. Who are rank 5's `cp` partners, and who are its `cfgp` partners?
#
# <details><summary>Answer</summary>
#
# `cp` is the last, fastest-varying dimension: rank 5's cp group is `4,5` (neighbours).
# One step along `cfgp` skips a whole cp group of 2, so its cfgp group is `5,7`.
# </details>


# %%
def groups_on_this_rank(config):
    pd = ParallelDims(dist.get_world_size(), **config)
    pd.build_meshes("cpu")
    local = {
        axis: (getattr(pd, f"{axis}_rank"), getattr(pd, f"{axis}_size"))
        for axis in ("cp", "cfgp", "lb")
    }
    local["dp"] = tuple(pd.dp_mesh.get_coordinate())  # (replica, shard): this rank's place
    return pd.group_ranks(), local


results = run(groups_on_this_rank, WORLD, CONFIG)
groups = [g for g, _ in results]
print(
    f"{'rank':>4}  {'dp_shard':<12} {'dp_replicate':<12} {'cfgp':<8} {'cp':<8} {'lb':<8} (cp_rank, cfgp_rank, lb_rank)"
)
for rank, (g, local) in enumerate(results):
    cells = [",".join(map(str, g[a])) for a in ("dp_shard", "dp_replicate", "cfgp", "cp", "lb")]
    print(
        f"{rank:>4}  {cells[0]:<12} {cells[1]:<12} {cells[2]:<8} {cells[3]:<8} {cells[4]:<8} "
        f"({local['cp'][0]}, {local['cfgp'][0]}, {local['lb'][0]})"
    )

# %% [markdown]
# **Check.** The same groups follow from row-major arithmetic alone (`predict_groups`,
# no process group involved). For a mesh of shape `(..., n, ...)` the group of rank
# `r` along an axis is the `n` ranks that share every other coordinate: start at `r`
# with that axis' coordinate set to 0, step by the product of the later dims.

# %%
# show: paralab.parallel_dims.predict_groups


# %%
def as_tensors(per_rank_groups):
    return [
        {axis: torch.tensor(members) for axis, members in sorted(g.items())}
        for g in per_rank_groups
    ]


predicted = [predict_groups(pd, rank) for rank in range(WORLD)]
group_verdicts = compare(as_tensors(groups), as_tensors(predicted), name="groups")
matching = sum(v.passed for v in group_verdicts)
verdicts.append(
    claim(
        "every rank's groups on every axis, read off the real DeviceMesh, equal predict_groups",
        matching == len(group_verdicts),
        f"{matching} of {len(group_verdicts)} (rank, axis) groups equal",
    )
)
print(verdicts[-1].describe())

# %% [markdown]
# The detail, one row per (rank, axis) group (folded: click the output to open it):

# %% jupyter={"outputs_hidden": true}
print(verdict_table(group_verdicts, "each (rank, axis) group: DeviceMesh vs predict_groups"))

# %% [markdown]
# ## 2. Pictures
#
# The dp mesh is a table: a **row** is one full copy of the model, sharded over
# `dp_shard` ranks; a **column** is one shard slot, replicated over `dp_replicate`
# ranks. FSDP all-gathers parameters along a row; HSDP additionally all-reduces
# gradients down a column.

# %%
show(plot_dp_grid(pd.dp_replicate, pd.dp_shard))

# %% [markdown]
# The overlay axes group the *same* 8 ranks again. Each panel colours every rank (`r0`…`r7`) by
# its group on that axis (`g0`, `g1`, …; the panel's title lists each group's ranks). Note that `cp` pairs
# neighbours (0,1), while `cfgp` pairs ranks two apart (0,2): `cp` is the last,
# fastest-varying mesh dimension, so on GPUs cp partners sit on one node. That suits
# cp, whose attention traffic sits inside every layer's forward and backward. It
# does not make cp the axis with the most traffic: in training, FSDP's per-step
# parameter all-gathers and gradient reduce-scatters over `dp_shard` are usually
# larger, and a `dp_shard` group spans nodes as soon as it outgrows one. Which axis
# gets the fastest links is a choice to make per workload, from its traffic.

# %%
show(
    plot_rank_groups(
        groups,
        ["dp_shard", "dp_replicate", "cfgp", "cp", "lb"],
        title="One world of 8 ranks (r0-r7), five groupings: ParallelDims(8, dp 2x4, cfgp 2, cp 2, lb 2)",
    )
)

# %% [markdown]
# ## 3. Which data each rank gets in the overlay
#
# In the overlay the cp and cfgp partners of a rank work on **the same sample**: cp
# partners each take a slice of its tokens (lab 02), cfgp partners each run one branch
# of its guided prediction (lab 03). So the data a rank loads follows the `rest`
# coordinate of the overlay mesh `(rest, cfgp, cp)`: `rank // (cfgp·cp)` is its
# sample group, `cfgp` rank picks the branch, `cp` rank the token slice. The dp axes do
# not decide the data here; they decide how the *weights* are sharded and replicated.
#
# **Predict before you run:** with `(rest, cfgp, cp) = (2, 2, 2)`, which ranks work on
# the samples of group 1, and which of them holds the second token half of the
# unconditional branch?
#
# <details><summary>Answer</summary>
#
# Ranks 4–7 (`rank // 4 == 1`). The unconditional branch is cfgp rank 1 (ranks 6, 7),
# and the second token half is cp rank 1: rank 7.
# </details>

# %%
per_group = pd.cfgp * pd.cp  # ranks per sample group
print(
    f"{'rank':>4}  {'sample group':<13} {'branch (cfgp rank)':<19} {'token slice (cp rank)':<22} cp group  cfgp group"
)
for rank, (g, local) in enumerate(results):
    cfgp_rank, cp_rank = local["cfgp"][0], local["cp"][0]
    branch, tokens = f"{['cond', 'uncond'][cfgp_rank]} ({cfgp_rank})", f"{cp_rank + 1} of {pd.cp}"
    cp_group, cfgp_group = ",".join(map(str, g["cp"])), ",".join(map(str, g["cfgp"]))
    print(
        f"{rank:>4}  {rank // per_group:<13} {branch:<19} {tokens:<22} {cp_group:<9} {cfgp_group}"
    )
same_sample = {
    axis: all(len({m // per_group for m in g[axis]}) == 1 for g in groups)
    for axis in ("cp", "cfgp")
}
verdicts.append(
    claim(
        "cp partners share a sample (same rank // (cfgp*cp))",
        same_sample["cp"],
        "every cp group inside one sample group",
    )
)
verdicts.append(
    claim(
        "cfgp partners share a sample, and run different branches",
        same_sample["cfgp"]
        and all(len({results[m][1]["cfgp"][0] for m in g["cfgp"]}) == pd.cfgp for g in groups),
        "every cfgp group inside one sample group, cfgp ranks 0 and 1",
    )
)
print("\n".join(v.describe() for v in verdicts[-2:]))

# %% [markdown]
# **The arithmetic.** Each column of that table is a *coordinate* of the rank on one mesh:
# `rest`, `cfgp`, `cp` on the overlay mesh, `dp_replicate`, `dp_shard` on the dp mesh,
# `lb_rest`, `lb` on the lb mesh. Row-major, the last dim varies fastest, so a coordinate is
# `rank // (product of the later dims) % (its own dim)`; the ranks that share every
# coordinate of a mesh but one are that one axis' group (section 1).
#
# **Predict before you run:** rank 6's coordinates on the dp mesh `(2, 4)` and on the
# overlay mesh `(2, 2, 2)`?
#
# <details><summary>Answer</summary>
#
# dp: `6 // 4 = 1` (the second model copy), `6 % 4 = 2` (shard 2). Overlay: `rest = 6 // 4
# = 1`, `cfgp = 6 // 2 % 2 = 1` (the uncond branch), `cp = 6 % 2 = 0` (the first token half).
# </details>
#
# `mesh_coordinates` is the lab's second graded exercise (`paralab.exercises.lab00`):

# %%
# show: paralab.parallel_dims.mesh_coordinates


# %%
coordinates = [mesh_coordinates(pd, rank) for rank in range(WORLD)]
print(coordinates[6])
agree = [
    (c["rest"], c["cfgp"], c["cp"], c["lb"], (c["dp_replicate"], c["dp_shard"]))
    == (rank // per_group, local["cfgp"][0], local["cp"][0], local["lb"][0], local["dp"])
    for rank, (c, (_, local)) in enumerate(zip(coordinates, results))
]
verdicts.append(
    claim(
        "mesh_coordinates = sample group, branch, token slice, lb slot, dp (copy, shard) of the meshes",
        all(agree),
        f"{sum(agree)} of {WORLD} ranks agree on all five",
    )
)
print(verdicts[-1].describe())

# %% [markdown]
# ## 4. Every validation rule, firing
#
# Construction validates in a fixed order, and every rejection is a `ValueError`
# naming the axis and its value. Two configs are not rejected but changed: a
# non-positive `dp_shard` is inferred as `world_size` (logged at info level) and a
# `dp_shard` larger than the world is clamped **with a warning** — a mis-sized launch
# silently running another topology is exactly the bug you want to see. The info line is
# printed here to stdout (by a handler this notebook adds), so it reads as output, not
# as an error.

# %%
bad_configs = [
    ("world_size >= 1", dict(world_size=0)),
    ("cp in [1, 32]", dict(world_size=8, cp=64)),
    ("cfgp is 1 or 2", dict(world_size=8, cfgp=3, enable_inference_mode=True)),
    ("cfgp > 1 only for inference", dict(world_size=8, cfgp=2)),
    ("lb divides world_size", dict(world_size=8, lb=3)),
    ("dp_replicate is -1 or >= 1", dict(world_size=8, dp_shard=4, dp_replicate=0)),
    ("cfgp * cp divides world_size", dict(world_size=6, cp=4)),
    ("dp_replicate * dp_shard == world_size", dict(world_size=8, dp_shard=3)),
]
rule_rows = []
for rule, kwargs in bad_configs:
    try:
        ParallelDims(**kwargs)
        rule_rows.append((rule, "NOT rejected"))
    except ValueError as exc:
        rule_rows.append((rule, f"ValueError: {exc}"))
for rule, outcome in rule_rows:
    print(f"{rule:<40} {outcome}")
fired = sum(outcome.startswith("ValueError") for _, outcome in rule_rows)
verdicts.append(
    claim(
        "every bad config is rejected with a ValueError",
        fired == len(bad_configs),
        f"{fired} of {len(bad_configs)} rejected",
    )
)

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    clamped = ParallelDims(8, dp_shard=16)
print(f"dp_shard=16 on 8 ranks -> dp_shard={clamped.dp_shard}, dp_replicate={clamped.dp_replicate}")
print("warning:", caught[0].message if caught else None)
logged = []
to_stdout = logging.StreamHandler(sys.stdout)  # stderr would show as a red box in JupyterLab
to_stdout.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
to_stdout.addFilter(lambda record: logged.append(record) or True)
descriptor_log = logging.getLogger("paralab.parallel_dims")
descriptor_log.setLevel(logging.INFO)
descriptor_log.handlers[:] = [to_stdout]  # replace, so re-running the cell prints the line once
descriptor_log.propagate = False
inferred = ParallelDims(8, cp=2)
print(
    f"dp_shard=-1 on 8 ranks with cp=2 -> dp_shard={inferred.dp_shard} (cp does not eat the dp budget)"
)
verdicts.append(
    claim(
        "dp_shard=16 on 8 ranks is clamped to 8 with one warning; dp_shard=-1 is inferred as 8",
        (clamped.dp_shard, inferred.dp_shard, len(caught)) == (8, 8, 1),
        f"clamped {clamped.dp_shard}, {len(caught)} warning, inferred {inferred.dp_shard}",
    )
)
verdicts.append(
    claim(
        "the auto-infer is logged at info level",
        [r.levelno for r in logged] == [logging.INFO],
        f"{len(logged)} record(s): {', '.join(logging.getLevelName(r.levelno) for r in logged)}",
    )
)

# %% [markdown]
# ## 5. Which workload uses which axis
#
# | workload | dp_shard | dp_replicate | cp | cfgp |
# |---|---|---|---|---|
# | VLM training | yes | optional | 1 | 1 |
# | VFM (video) training | yes | optional | optional | 1 |
# | VFM inference | yes | forced 1 | overlay | overlay (≤ 2) |
#
# "Forced 1" is the workload's rule, not the descriptor's: `ParallelDims` only
# requires inference mode for `cfgp > 1`. This lab's showcase `CONFIG` turns inference
# mode on so that cfgp can be 2 and keeps `dp_replicate = 2` to show every axis on one
# world of 8 ranks; it is a picture of the groupings, not a VFM inference config (that
# would be `dp_replicate=1, dp_shard=4` with the same overlays).
#
# Tensor and pipeline parallelism are not part of this descriptor.
#
# Lab 01 goes on from here: which dp mesh to hand FSDP2 (`fsdp_mesh`, and the
# 2-D-mesh trap it avoids), and torchtitan's *consuming* reading of the same knobs,
# where cp eats rank slots instead of overlaying them.
#
# ## 6. Bug clinic: a prediction that looks right on half the ranks
#
# Below, `predict_groups` runs with one decision swapped next to the real `DeviceMesh`
# groups of section 1. The bug is a patch set, `one_decision_swapped()` from
# `paralab.exercises.lab00` (the grader plants the same one to prove its check can fail;
# do not read it yet), planted in this kernel for one block with `with patched(BUG):`, the
# same way `run(..., patches=BUG)` would plant it on the ranks. The picture shows, per
# rank (rows) and per member slot of each axis' group (columns, axes side by side), how
# far the predicted rank number is from the true one.

# %%
from paralab.exercises.lab00 import one_decision_swapped

BUG = one_decision_swapped()
AXES = ["dp_shard", "dp_replicate", "cfgp", "cp", "lb"]
truth = torch.stack([torch.cat([torch.tensor(g[a]) for a in AXES]) for g in groups])
with patched(BUG):
    buggy_groups = [predict_groups(pd, r) for r in range(WORLD)]
buggy = torch.stack([torch.cat([torch.tensor(g[a]) for a in AXES]) for g in buggy_groups])
clinic = compare(buggy, truth, name="buggy predict_groups")
show(
    plot_rank_strip(
        truth,
        buggy,
        [(axis, len(groups[0][axis])) for axis in AXES],
        "buggy predict_groups vs the real DeviceMesh: each rank's group members, axis by axis",
        unit="|predicted - true| (rank numbers)",
    )
)
verdicts.append(
    claim(
        "the element-wise check catches the buggy prediction",
        not clinic[0].passed,
        f"the check catches the bug: {clinic[0].n_diff} of {truth.numel()} group members differ",
    )
)
print(verdicts[-1].describe())

# %% [markdown]
# **What is wrong?** Only some columns light up, and on every rank. Which axes, and what
# single decision would move exactly those?
#
# <details><summary>Answer</summary>
#
# The patch set replaces `ParallelDims.mesh_layouts` with `overlay_cp_before_cfgp`: the
# overlay mesh in the other order, `(rest, cp, cfgp)` instead of `(rest, cfgp, cp)`.
# Now `cfgp` is the last, fastest-varying dimension and pairs neighbours (`0,1`,
# `2,3`, …), while one step along `cp` skips a whole cfgp pair, so cp partners are
# `cfgp` ranks apart (`0,2`, `1,3`). Every rank has the wrong cfgp and the wrong cp
# partner, while the dp and lb axes are right — which is why checking one axis or one
# rank is not enough. On GPUs the same slip would put cp's per-layer attention traffic
# across nodes and the once-per-step cfgp exchange inside one.
#
# </details>
#
# ## Closing table
#
# Every claim of this lab (the 40 per-(rank, axis) rows are in section 1's folded output).

# %%
print(verdict_table(verdicts, "Lab 00 claims"))

# %% [markdown]
# ## What to try
#
# 1. Change `CONFIG` to `cp=4, cfgp=2` on 8 ranks. Which axis pairs neighbours now,
#    and why does `rest` become 1? (Re-run sections 1–3.)
#    <details><summary>Hint</summary>`cp` is still the last mesh dimension, so cp groups
#    are 4 neighbours; `rest = 8 / (cfgp·cp) = 1`: one sample group, all 8 ranks on one sample.</details>
# 2. Set `dp_shard=2` and `dp_replicate=-1` in `CONFIG`. How many replica groups are there, and
#    which ranks hold the same shard of the weights?
#    <details><summary>Hint</summary>`dp_replicate` is inferred as 4: a (4, 2) dp mesh, so
#    2 replica groups of 4 (`0,2,4,6` and `1,3,5,7`); the ranks of one replica group hold the same shard.</details>
# 3. In section 4, which rule fires for `ParallelDims(6, cfgp=2, cp=2,
#    enable_inference_mode=True)`, and why is `lb=4` on 6 ranks rejected before that?
#    <details><summary>Hint</summary>`cfgp·cp = 4` does not divide 6. The rules run in a fixed
#    order (section 4's list is that order), and `lb divides world_size` comes first.</details>
# 4. Set `cp=1` in `CONFIG` and re-run sections 1–3 (`CONFIG` travels to the
#    ranks as `groups_on_this_rank`'s argument). Which ranks share a sample now?
#    <details><summary>Hint</summary>Only the cfgp pairs: `rest = 4`, so sample groups are
#    `0,1`, `2,3`, … (cfgp becomes the last mesh dimension).</details>
# 5. **Edit the layout table itself.** In the `mesh_layouts` cell, make the overlay mesh
#    `((world // (self.cfgp * self.cp), self.cp, self.cfgp), ("rest", "cp", "cfgp"))` (the
#    clinic's bug, by hand) and re-run that cell. The class keeps the package's method:
#    the edit runs only where it is handed over, on the ranks with `patches=` and in this
#    kernel with `patched`:
#    ```python
#    EDIT = {"paralab.parallel_dims.ParallelDims": {"mesh_layouts": mesh_layouts}}
#    edited = [g for g, _ in run(groups_on_this_rank, WORLD, CONFIG, patches=EDIT)]
#    with patched(EDIT):
#        edited_predicted = [predict_groups(pd, r) for r in range(WORLD)]
#    print(edited[5], edited_predicted[5], edited == edited_predicted)
#    ```
#    Do the real meshes and `predict_groups` still agree? Which of rank 5's groups moved?
#    <details><summary>Hint</summary>They agree (`True`): both read the same table, so on
#    both sides rank 5's cfgp group is now `4,5` and its cp group `5,7`. The check compares
#    the arithmetic with the meshes, not with the layout you meant; the clinic caught its
#    bug only because its truth came from meshes built without the patch.</details>
