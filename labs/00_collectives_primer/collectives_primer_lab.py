# %% [markdown]
# # Lab 00 — Collectives primer: how ranks share tensors, forward and backward
#
# Every other lab splits a model or a sequence over several processes ("ranks") and
# glues the pieces back together with a handful of **collectives**: calls that every
# rank of a group makes at the same time, each contributing a tensor and getting one
# back. This lab runs each collective the suite uses on 4 real ranks, on numbers small
# enough to check by eye, then runs its backward, then counts what it costs.
#
# **Learning goals.** After this lab you can
# 1. say what each rank holds after an all-gather, a reduce-scatter, an all-reduce, an
#    all-to-all, a broadcast and a send/recv, given what it held before;
# 2. name the backward of each: all-gather ↔ reduce-scatter, all-reduce ↔ all-reduce,
#    all-to-all ↔ all-to-all, broadcast ↔ reduce, send ↔ recv — and say why (a
#    collective is a linear map; its backward is the transpose);
# 3. derive the ring cost: each rank sends (n−1)/n·S bytes for a reduce-scatter or an
#    all-gather of S bytes, 2(n−1)/n·S for an all-reduce, and check it with a ledger.
#
# **Prerequisites.** Python, `torch` tensors and autograd (`.backward()`, `.grad`). No
# distributed training: that is what this lab introduces.
#
# **Time.** About 30 minutes to read; the last cell prints how long the runs took.
#
# **Reading guide.** 1 how ranks run; 2 the six collectives, one picture each; 3 their
# backwards; 4 the ring cost; 5 the closing table and what to try. The code lives in
# `src/paralab/collectives/` (`runs.py`: the per-rank jobs and the one-process
# answers; `ring.py`: the ring algorithms by hand; `costs.py`: the byte formulas).

# %% jupyter={"source_hidden": true}
import time

import torch
import torch.distributed as dist

from paralab.check import claim, compare, verdict_table
from paralab.collectives import costs, runs
from paralab.collectives.runs import OPS, before_after_table, op_input
from paralab.launch import run
from paralab.ledger import calls, sent
from paralab.tables import text_table
from paralab.viz import plot_collective, show

WORLD = 4
lab_start = time.perf_counter()
verdicts = []


def show_collective(op, title=None):
    """What every rank held before `op` and after it: a table, then the picture."""
    print(before_after_table(before[op], [a[op] for a in after]))
    show(plot_collective(title or op, before[op], [a[op] for a in after]))


# %% [markdown]
# ## 1. Four ranks, one function
#
# `paralab.launch.run(fn, 4)` starts 4 processes, joins them into one
# `torch.distributed` group (gloo on a CPU, NCCL on GPUs), calls `fn()` in each, and
# returns the 4 results to this notebook, in rank order. Inside `fn`, a rank knows who
# it is from `dist.get_rank()` and how many there are from `dist.get_world_size()`:


# %%
def who_am_i():
    return f"rank {dist.get_rank()} of {dist.get_world_size()}"


print(run(who_am_i, WORLD))

# %% [markdown]
# Every rank starts from numbers that say where they come from: **element `c` of
# rank `r` is `10·r + c`** (the tens digit is the rank, the units digit the slot).
# They are integers stored in float64, so every result below is exact and prints the
# same on any machine.

# %%
print(
    text_table(
        ("rank", "holds"),
        [(r, op_input("all_reduce", r, WORLD).long().tolist()) for r in range(WORLD)],
    )
)

# %% [markdown]
# ## 2. The six collectives
#
# | collective | torch call | where the suite uses it |
# |---|---|---|
# | all-gather | `all_gather_into_tensor` (also `all_gather`, `all_gather_single`) | FSDP's parameters (01), Ulysses' heads (02), cfgp (03), lb's costs (04) |
# | reduce-scatter | `reduce_scatter_tensor` | FSDP's gradients (01) |
# | all-reduce | `all_reduce` | HSDP across replicas, DDP (01) |
# | all-to-all | `all_to_all_single` | Ulysses: sequence shards ↔ head shards (02) |
# | broadcast | `broadcast` | cfgp's shared initial noise (03) |
# | send / recv | `batch_isend_irecv` of `P2POp(isend)` and `P2POp(irecv)` | ring attention (02), cfgp's swap (03), lb's exchange (04) |
#
# Here they are, called exactly as the suite calls them (the package's code):

# %%
# show: paralab.collectives.runs.apply_collective

# %% [markdown]
# One launch runs all six on 4 ranks (plus two other spellings of the all-gather the
# suite also uses, `dist.all_gather` into a list and `dist.all_gather_single`). It hands
# the ranks this kernel's `apply_collective` with `patches=`, so an edit of the cell
# above is what they run. The results come back to this notebook, which computes what each rank *should* hold from
# the definitions alone (`runs.expected_forward`, one process) and compares every
# element:

# %%
FORWARD_EDIT = {"paralab.collectives.runs": {"apply_collective": apply_collective}}
after = run(runs.forward_job, WORLD, patches=FORWARD_EDIT)
before = {op: [op_input(op, r, WORLD) for r in range(WORLD)] for op in OPS}
expected = {op: runs.expected_forward(op, WORLD) for op in OPS}
forward_verdicts = compare(
    [{op: a[op] for op in OPS} for a in after],
    [{op: expected[op][r] for op in OPS} for r in range(WORLD)],
    name="forward",
)
spellings_agree = all(
    torch.equal(a["all_gather"], a[other])
    for a in after
    for other in ("all_gather (list)", "all_gather_single")
)
print(
    f"{sum(v.passed for v in forward_verdicts)} of {len(forward_verdicts)} (rank, collective) results "
    "equal the one-process answer element by element"
)
verdicts.append(
    claim(
        "forward: 6 collectives x 4 ranks equal the one-process answer",
        all(v.passed for v in forward_verdicts),
        f"{sum(v.passed for v in forward_verdicts)}/{len(forward_verdicts)} tensors bitwise",
    )
)
verdicts.append(
    claim(
        "all_gather_into_tensor = all_gather (list) = all_gather_single",
        spellings_agree,
        f"{WORLD}/{WORLD} ranks identical" if spellings_agree else "they differ",
    )
)

# %% [markdown]
# ### 2.1 All-gather — everyone gets everyone's shard
#
# Rank `r` holds one shard; afterwards every rank holds all `n` shards, in rank order.
# FSDP (lab 01) keeps each rank's slice of the parameters and all-gathers a layer's
# full weights just before using them.
#
# **Predict** before you run the next cell: what does rank 2 hold after the all-gather?
#
# <details><summary>Answer</summary>
#
# `[0 11 22 33]`, the same as every other rank: shard `r` lands in slot `r` on every
# rank. Rank 2's own `22` is in slot 2.
# </details>

# %%
show_collective("all_gather")

# %% [markdown]
# ### 2.2 Reduce-scatter — sum over ranks, each rank keeps one chunk
#
# Every rank holds a full tensor of `n` chunks; afterwards rank `r` holds chunk `r` of
# the *sum* over ranks. FSDP reduce-scatters gradients: each rank ends up with the
# summed gradient of exactly the slice of parameters it owns.
#
# **Predict:** what does rank 3 hold?
#
# <details><summary>Answer</summary>
#
# `[72]`: chunk 3 of every rank summed, `3 + 13 + 23 + 33`. Each rank gets a different
# sum, and a quarter of the tensor.
# </details>

# %%
show_collective("reduce_scatter")

# %% [markdown]
# ### 2.3 All-reduce — sum over ranks, everyone keeps all of it
#
# A reduce-scatter followed by an all-gather of the summed chunks. DDP all-reduces
# gradients; HSDP (lab 01) all-reduces the already reduce-scattered shards across
# replicas.
#
# **Predict:** which rank's output differs from the others?
#
# <details><summary>Answer</summary>
#
# None: every rank holds `[60 64 68 72]`, slot `c` being `c + (10+c) + (20+c) + (30+c)
# = 60 + 4c`.
# </details>

# %%
show_collective("all_reduce")

# %% [markdown]
# ### 2.4 All-to-all — slot `j` goes to rank `j`
#
# Rank `r` sends slot `j` of its tensor to rank `j`, and receives slot `r` of every
# rank's tensor, in rank order. Read the ranks × slots grid as a matrix: the all-to-all
# transposes it. Ulysses attention (lab 02) uses it to trade "my part of the sequence,
# all heads" for "all of the sequence, my heads".
#
# **Predict:** what does rank 1 hold?
#
# <details><summary>Answer</summary>
#
# `[1 11 21 31]`: slot 1 of ranks 0, 1, 2, 3 — column 1 of the "before" grid became
# row 1.
# </details>

# %%
show_collective("all_to_all")

# %% [markdown]
# ### 2.5 Broadcast — the root's tensor overwrites everyone's
#
# Rank 0 (the root, `src=0`) sends its tensor to every rank. cfgp (lab 03) broadcasts
# the initial noise so that the two ranks of a guided sampler start from the same
# latent.
#
# **Predict:** what is left of rank 2's `[20 21 22 23]`?
#
# <details><summary>Answer</summary>
#
# Nothing: the buffer is overwritten with `[0 1 2 3]`. That is also why, in section 3,
# rank 2's input gets a zero gradient.
# </details>

# %%
show_collective("broadcast")

# %% [markdown]
# ### 2.6 Send / recv — one rank to one rank
#
# Point to point: a `send` on one rank is matched by a `recv` on another. The suite
# posts them in pairs with `dist.batch_isend_irecv([P2POp(isend, ...), P2POp(irecv,
# ...)])`, so no rank waits for its partner to be ready. Here every rank sends to
# `rank + 1` and receives from `rank − 1` (a ring), as ring attention (lab 02) passes
# K/V blocks; cfgp's swap and lb's exchange are the same call with other partners.
#
# **Predict:** what does rank 0 hold?
#
# <details><summary>Answer</summary>
#
# `[30 31 32 33]`, rank 3's tensor: rank 0's predecessor on the ring is rank 3.
# </details>

# %%
show_collective("send_recv", "send_recv (ring: to rank+1)")

# %% [markdown]
# ## 3. The backward of each collective
#
# Each collective is a **linear map** from everyone's inputs to everyone's outputs:
# it only copies and adds numbers. For a linear map `y = A x`, the gradient of
# `L = Σ g·y` is `dL/dx = Aᵀ g`, the **transpose**. So a collective's backward is the
# collective whose matrix is the transpose:
#
# | forward | copies or adds | backward (its transpose) |
# |---|---|---|
# | all-gather | one shard copied to every rank | reduce-scatter: the copies' gradients are summed back onto the shard's owner |
# | reduce-scatter | chunk `r` of everyone summed onto rank `r` | all-gather: rank `r`'s gradient copied back to every rank's chunk `r` |
# | all-reduce | sum, copied to everyone | all-reduce |
# | all-to-all | slot `j` of rank `r` moved to slot `r` of rank `j` | all-to-all back (input and output split sizes swapped) |
# | broadcast | the root's tensor copied to everyone | reduce (sum) onto the root; the other inputs were unused: zero |
# | send to `r+1` | a tensor moved | the gradient sent back, to `r−1` (send's backward is a recv) |
#
# This forward/backward symmetry is what every later lab rests on: FSDP's backward
# reduce-scatters what its forward all-gathered, Ulysses' backward runs its two
# all-to-alls in reverse, ring attention's backward sends gradients back round the ring.
#
# Below, each collective runs through autograd — `torch.distributed.nn.functional`'s
# differentiable versions, and for send/recv our own `ring_shift`, whose backward is
# written by hand — with `L = Σ g·y` where the upstream gradient `g` on rank `r` is
# again `10·r + c`. Next to it, the **mirror**: the transposed collective called by
# hand on `g`. The backward cell hands the ranks this kernel's `mirror` with `patches=`,
# so an edit of the cell below is what they run.
#
# **Exercise `mirror`** (graded, `paralab.exercises.lab00_primer`): the cell below is the
# answer. In the students' copy it is empty; the grader runs it on 2, 3 and 4 ranks with
# gradients it draws, and one known-wrong version, the all-gather's backward keeping only
# its own slot of `g`, is the first thing it must catch.

# %%
# show: paralab.collectives.runs.mirror

# %%
# show: paralab.collectives.ring.ring_shift paralab.collectives.ring._RingShift

# %% [markdown]
# Why one collective per `.backward()`: when one graph holds several independent
# differentiable collectives, autograd may run their backwards in a different order on
# different ranks, and collectives matched in the wrong order mix up tensors silently.
# The later labs fuse them or hand-write the backward with a fixed order.
#
# **Predict** before you run: with upstream gradients `g` = `10·r + c`, what gradient
# does rank 0's all-gather input (one number) get?
#
# <details><summary>Answer</summary>
#
# `60`: rank 0's shard sits in slot 0 of every rank's output, so its gradient is the
# sum of slot 0 of every rank's `g`: `0 + 10 + 20 + 30`. That is chunk 0 of the
# reduce-scatter of the `g`s.
# </details>

# %%
MIRROR_EDIT = {"paralab.collectives.runs": {"mirror": mirror}}
backward = run(runs.backward_job, WORLD, patches=MIRROR_EDIT)
for op in OPS:
    want = runs.expected_backward(op, WORLD)
    autograd_ok = compare([b[op]["autograd"] for b in backward], want, name=op)
    mirror_ok = compare([b[op]["mirror"] for b in backward], want, name=op)
    holds = all(v.passed for v in autograd_ok + mirror_ok)
    issued = runs.calls_by_phase(backward[0][op]["records"])
    both = sum(a.passed and m.passed for a, m in zip(autograd_ok, mirror_ok))
    print(
        f"{op:<15} forward: {issued['forward']:<22} backward: {issued['backward']:<22}"
        f" autograd = mirror = expected on {both}/{WORLD} ranks"
    )
    verdicts.append(
        claim(
            f"backward of {op} = its mirror",
            holds,
            f"{sum(v.passed for v in autograd_ok + mirror_ok)}/{2 * WORLD} grads exact",
        )
    )

# %% [markdown]
# The middle column is the ledger's record of what autograd actually called on rank 0.
# Two things to notice. The reduce-scatter's backward is an `all_gather`, and the
# all-to-all's an `all_to_all_single`, exactly the mirrors. The all-gather's backward
# shows `scatter x4`: on gloo, which has no reduce-scatter of its own,
# `torch.distributed.nn.functional` emulates the reduce-scatter with an all-to-all
# (made of one `scatter` per rank) followed by a local sum (torch 2.13,
# `torch/distributed/nn/functional.py`, `_AllGather.backward`; on NCCL it calls
# `reduce_scatter`). Same numbers, other wiring.
#
# The all-gather's backward as a picture: the upstream gradients on the left, the input
# gradients on the right — a reduce-scatter, as in 2.2.

# %%
show(
    plot_collective(
        "all_gather's backward, a reduce-scatter",
        [runs.upstream_grad("all_gather", r, WORLD) for r in range(WORLD)],
        [b["all_gather"]["autograd"] for b in backward],
        before_label="gradient of the output",
        after_label="gradient\nof the input",
    )
)

# %% [markdown]
# ## 4. What a collective costs: the ring
#
# Take a reduce-scatter of a tensor of `S` bytes on `n` ranks. Cut the tensor into `n`
# chunks of `S/n`. Arrange the ranks in a ring; at every step each rank sends one
# partial chunk to its right neighbour, which adds its own share of that chunk and
# passes it on. After `n − 1` steps each chunk has visited every rank once and sits,
# fully summed, on its owner. Each rank sent `n − 1` chunks:
#
# $$\text{reduce-scatter: } (n-1)\,\frac{S}{n} \qquad
#   \text{all-gather (pass on what arrives): } (n-1)\,\frac{S}{n} \qquad
#   \text{all-reduce = both: } 2\,(n-1)\,\frac{S}{n}$$
#
# For large `n` that is about `S` (or `2S`) per rank **whatever `n` is**: adding ranks
# does not add traffic per rank, which is why rings are called bandwidth-optimal.
# Here are the rings written with sends and receives; `_exchange` is one hop, a send to
# the next rank posted together with a receive from the previous one. The reduce-scatter
# is the exercise `ring_reduce_scatter` (graded on 2, 3 and 4 ranks and on pairs of ranks
# inside 4): which chunk must a rank send first so that it ends holding chunk `rank`?
# The cost cell below hands this kernel's three rings to the ranks with `patches=`.

# %%
# show: paralab.collectives.ring.ring_reduce_scatter paralab.collectives.ring.ring_all_gather paralab.collectives.ring.ring_all_reduce

# %% [markdown]
# **What the ledger counts.** `paralab.ledger.Ledger` wraps every `torch.distributed`
# call a rank makes and books its bytes *by formula, from the tensor sizes*: an
# `isend` of a tensor books its size; a `reduce_scatter_tensor` books `(n−1)/n·S`, the
# ring model, whatever the backend really does (the ledger's docstring notes that gloo
# emulates some collectives). So two different things can be compared: the bytes our
# hand-written ring really posts as `isend`s, and the ledger's model of torch's
# collective — both against the formula.
#
# **Predict:** at `n = 8`, what fraction of `S` does each rank send in an all-reduce?
#
# <details><summary>Answer</summary>
#
# `2·7/8 = 1.75`: almost twice the tensor, and no more at 800 ranks (1.9975).
# </details>

# %%
RINGS = (ring_reduce_scatter, ring_all_gather, ring_all_reduce)  # this kernel's, as shown above
RING_EDIT = {"paralab.collectives.ring": {ring.__name__: ring for ring in RINGS}}
NUMEL = 24  # float64 elements in S: divisible by 2, 4 and 8
S = NUMEL * 8
rows, ring_ok = [], {name: True for name in runs.RING_STEPS}
formulas = {
    "reduce_scatter": costs.reduce_scatter_bytes,
    "all_gather": costs.all_gather_bytes,
    "all_reduce": costs.all_reduce_bytes,
}
for n in (2, 4, 8):
    per_rank = run(runs.ring_cost_job, n, NUMEL, patches=RING_EDIT)
    for name, formula in formulas.items():
        by_hand = [sent(r[name]["records"], phase="ring by hand", op="isend") for r in per_rank]
        booked = [sent(r[name]["records"], phase="torch") for r in per_rank]
        same = all(torch.equal(r[name]["by_hand"], r[name]["torch"]) for r in per_rank)
        steps = calls(per_rank[0][name]["records"], phase="ring by hand", op="isend")
        ring_ok[name] &= same and set(by_hand) == set(booked) == {formula(S, n)}
        rows.append((n, name, steps, formula(S, n), by_hand[0], booked[0], "yes" if same else "NO"))
print(f"S = {S} B")
print(
    text_table(
        (
            "n",
            "collective",
            "ring steps",
            "formula B",
            "ring by hand B",
            "ledger: torch's B",
            "ring result = torch's",
        ),
        rows,
        align_right=(2, 3, 4, 5),
    )
)

# %% [markdown]
# Every rank, not only rank 0, sent exactly the formula's bytes (the check compares all
# of them), and the hand-written rings give torch's results element for element.

# %%
for name, label in (
    ("reduce_scatter", "(n-1)/n S"),
    ("all_gather", "(n-1)/n S"),
    ("all_reduce", "2(n-1)/n S"),
):
    verdicts.append(
        claim(
            f"ring {name.replace('_', '-')} by hand: torch's result, {label} per rank",
            ring_ok[name],
            "n = 2, 4, 8: every rank" if ring_ok[name] else "differs",
        )
    )

# %% [markdown]
# ## 5. Closing table
#
# Each row is a claim checked above, with what was observed.

# %%
print(verdict_table(verdicts, title="Collectives primer: what this lab showed"))

# %%
# NBVAL_IGNORE_OUTPUT
print(f"ran in {time.perf_counter() - lab_start:.1f} s")

# %% [markdown]
# ## What to try
#
# 1. **Eight ranks.** Run `run(runs.forward_job, 8, patches=FORWARD_EDIT)` and predict rank
#    5's all-to-all output first.
#    <details><summary>Hint</summary>Rank 5 receives slot 5 of every rank:
#    `[5 15 25 ... 75]`.</details>
# 2. **Break a mirror.** In the `mirror` cell, make the all-gather's backward an
#    `all_reduce` of `g` keeping rank `r`'s slot (`grad_in = grad_out.clone()`,
#    `dist.all_reduce(grad_in)`, `grad_in = grad_in[rank:rank + 1]`), re-run that cell and
#    the backward cell. The edit reaches the ranks: the backward cell hands this kernel's
#    `mirror` over with `patches=MIRROR_EDIT`, and a function defined in the notebook
#    travels by value. Does the check notice? Why could it not?
#    <details><summary>Hint</summary>It does not: the all_gather row still passes.
#    All-reduce then "keep slot `r`" is a reduce-scatter that sends twice the bytes
#    (section 4: `2(n-1)/n·S` against `(n-1)/n·S`). Same numbers, more traffic: a check of
#    values cannot tell them apart, only a count of bytes can.</details>
# 3. **Uneven all-to-all.** Suppose rank `r` sends `j + 1` elements to rank `j`
#    (`dist.all_to_all_single(out, x, output_split_sizes, input_split_sizes)` with
#    `input_split_sizes = [1, 2, ..., n]`). What are rank `r`'s output split sizes, and
#    what must the backward pass as split sizes?
#    <details><summary>Hint</summary>Rank `r` receives `r + 1` elements from every rank:
#    output splits `[r + 1] * n`. The forward's output splits become the backward's
#    input splits and vice versa (`_AlltoAllSingle.backward` in
#    `torch/distributed/nn/functional.py` swaps them).</details>
# 4. **Bigger rings.** Using `costs.all_reduce_bytes`, how many bytes per rank for a
#    1 GiB all-reduce on 2, 8 and 1024 ranks?
#    <details><summary>Hint</summary>1, 1.75 and about 2 GiB: the per-rank traffic
#    saturates at `2S`; what grows with `n` is the number of steps (latency).</details>
# 5. **A ring of blocking sends.** In the `mirror` cell, drop the even/odd split so that
#    every rank calls `dist.send` first (as in item 2, the backward cell hands this kernel's
#    `mirror` to the ranks with `patches=`), re-run that cell, then the backward cell with
#    `run(runs.backward_job, WORLD, patches=MIRROR_EDIT, timeout=10)`. What happens, and
#    why does the suite post its point-to-point ops with `batch_isend_irecv`?
#    <details><summary>Hint</summary>Every rank waits in its `send` for a matching
#    `recv` that nobody has posted yet: the launch stops with `LaunchTimeout` naming all
#    4 ranks (on gloo this happens even for a 4-element tensor). Posting the send and the
#    receive together lets every pair proceed in any order.</details>
