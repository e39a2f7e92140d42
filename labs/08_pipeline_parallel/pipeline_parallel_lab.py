# %% [markdown]
# # Lab 08 — Pipeline parallelism: GPipe, 1F1B, interleaved and zero-bubble schedules by hand
#
# **You will learn** how a model is cut by depth into stages, one per rank (or `v` per rank,
# interleaved); why a schedule is nothing but data, every rank's ordered list of forwards and
# backwards with their sends and receives; how one executor runs any such list on real ranks
# without deadlocking; where the *bubble* comes from and how GPipe, 1F1B, interleaving and
# zero-bubble shrink it, measured on a clock that records waiting instead of assuming it; what
# each schedule costs in activations held and in bytes on the wire; how the same stages run
# under `torch.distributed.pipelining`; and why, with data parallelism beside the pipeline, the
# gradient all-reduce waits for the last micro-batch. **Prerequisites:** the collectives primer (send/recv),
# and gradient accumulation. **Time:** about 45 minutes to read; the run time of this notebook
# is printed by its last cell.
#
# **What is split.** The layers. With `pp` ranks, rank `r` holds blocks of depth `r`: it
# receives an activation from rank `r - 1`, runs its blocks, sends the result to rank `r + 1`;
# the backward goes the other way. Per stage boundary and per micro-batch that is one
# `b·s·h` activation forward and its gradient backward, point to point. The schedule has no
# collective; a real pipeline adds a few once per step, outside it: the gradients of a tied
# embedding (input embedding and LM head sharing one matrix) all-reduced between the first
# and last stages, and the gradient norm for clipping summed across all stages. Section 4 runs
# both: the norm on this model, the tied matrix on a variant of it. Few, small and point to
# point is why pipeline parallelism is the axis that crosses nodes.
#
# **The price.** Rank `r` cannot start before the first micro-batch reaches it, and must wait at
# the end for the last gradient to come back: the *bubble*. Cutting the global batch into `m`
# micro-batches fills the pipe; the schedules differ in the order in which each rank runs them:
#
# | schedule | the idea |
# |---|---|
# | GPipe | every forward, then every backward |
# | 1F1B | start the backwards as soon as they can start, and alternate |
# | interleaved 1F1B | 1F1B over `v` smaller stages per rank (`r, r+p, ...`) |
# | ZB-H1 | 1F1B with each backward split into B (input gradient, which the previous rank waits for) and W (weight gradient, which nobody waits for) |
#
# The model is a float64 stack of 8 residual blocks on `(batch, seq, hidden)` tokens, so every
# number this lab claims is checked bitwise against one process.

# %%
import time

from IPython.display import Markdown, display

from paralab import viz
from paralab.check import claim, compare, summary, verdict_table
from paralab.exercises.lab08 import p2p_clinic_change
from paralab.launch import LaunchTimeout, run
from paralab.patches import patched
from paralab.pp import runs as pp_runs
from paralab.pp.clock import simulate
from paralab.pp.costs import boundary_bytes, dp_sync_collectives, stage_parameters
from paralab.pp.dp import check_pp_dp, dp_sync_record, pp_dp_sweep
from paralab.pp.model import HIDDEN, MICRO_BATCH, N_BLOCKS, SEQ
from paralab.pp.runs import SWEEP, executed_timeline, sweep_configs
from paralab.pp.schedules import build_schedule
from paralab.pp.upstream import TORCH_SCHEDULES, torch_jobs, torch_sweep
from paralab.scale.hardware import STEP_LATENCY, hardware
from paralab.scale.models import lm_layer_matmul, model
from paralab.tables import text_table
from paralab.viz import show

LAB_START = time.monotonic()
PP_SIZES = (2, 4)
print(f"{N_BLOCKS} blocks; a micro-batch is (b, s, h) = ({MICRO_BATCH}, {SEQ}, {HIDDEN}) float64")

# %% [markdown]
# ## 1. The model, cut by depth
#
# Every process builds the same 8 blocks from the same seed and keeps only its stage's, so the
# parameters keep the whole model's names (`blocks.5.fc2.weight`) and the ranks' parts merge
# into one dictionary. `stage_blocks` cuts as evenly as 8 allows; interleaving cuts `pp·v`
# stages and gives rank `r` the stages `r, r + pp, ...`.

# %%
# show: paralab.pp.model.Block paralab.pp.model.stage_blocks paralab.pp.model.Stage

# %%
for pp, virtual in ((2, 1), (3, 1), (4, 1), (2, 2), (4, 2)):
    stages = pp * virtual
    cut = {
        r: [list(stage_blocks(s, stages)) for s in range(stages) if s % pp == r] for r in range(pp)
    }
    print(f"pp={pp} v={virtual}:", "  ".join(f"rank {r} {b}" for r, b in cut.items()))

# %% [markdown]
# **Gradient accumulation.** A rank runs its stage on one micro-batch at a time, and the
# gradients of the `m` micro-batches add up in `.grad`. For that sum to be the gradient of the
# global batch's mean loss, each micro-batch contributes its mean over `m`:

# %%
# show: paralab.pp.model.microbatch_loss

# %% [markdown]
# ## 2. A schedule is data
#
# A schedule function returns, per rank, the order in which it computes: `("F", stage, i)` a
# forward of micro-batch `i`, `("B", stage, i)` its backward, and for zero-bubble `("W", stage,
# i)` its weight gradient. GPipe and 1F1B:

# %%
# show: paralab.pp.schedules.gpipe_order paralab.pp.schedules.one_f_one_b_order

# %% [markdown]
# **Predict before you run.** At `pp = 4`, `m = 8`, how many forwards does rank 0 run before its
# first backward, and rank 3? How many micro-batches' activations does each then hold at most?

# %%
with patched({"paralab.pp.schedules": {"one_f_one_b_order": one_f_one_b_order}}):
    demo = build_schedule("1f1b", 4, 8)
for rank in range(4):
    print(f"rank {rank}:", " ".join(demo.order(rank)))

# %% [markdown]
# Rank `r` warms up with `min(p - r, m)` forwards: exactly enough that its first backward's
# gradient is on its way when the warm-up ends. Then one backward, one forward, in turn
# (steady state), then the remaining backwards (cool-down). The micro-batches in flight on
# rank `r` never exceed `p - r`, against `m` for GPipe.
#
# The interleaved and ZB-H1 orders are written the same way (`interleaved_order` follows
# Megatron's and torch's depth-first rounds; `zbh1_order` runs W after B once more than `r`
# of them are pending):

# %% jupyter={"source_hidden": true}
# show: paralab.pp.schedules.interleaved_order paralab.pp.schedules.zbh1_order

# %% [markdown]
# The sends and receives are not written by hand: `attach_messages` derives them from the
# order and from which rank owns which stage, the same way for every schedule. A forward of
# stage `s > 0` receives `act(s-1)` first; a backward (B) of stage `s < last` receives the
# gradient of its output, `grad(s+1)`, first; W exchanges nothing.

# %%
# show: paralab.pp.schedules.attach_messages

# %%
plan = build_schedule("1f1b", 2, 4)
print(
    text_table(
        ["step", "rank 0", "rank 1"],
        [
            [str(k), *(plan.actions[r][k].describe() for r in range(2))]
            for k in range(len(plan.actions[0]))
        ],
    )
)

# %% [markdown]
# ## 3. One executor for every list
#
# The executor walks a rank's list. Before each action it hands `exchange` the sends its
# previous action left and the receives this one needs, **as one batch**, and waits for the
# receives only. This matters because a gloo (or NCCL) send completes only when the peer has
# posted the matching receive: two neighbours that each insist on sending first wait for each
# other forever (section 9 shows it).

# %%
# show: paralab.pp.executor.exchange

# %% [markdown]
# The step itself: F runs the stage (the last stage adds `microbatch_loss`), B runs its
# backward (full, or only the input gradient when the schedule splits it), W the weight
# gradient from the graph B kept. Bytes saved for backward are counted with
# `saved_tensors_hooks` from each forward until the action that frees its graph.

# %% jupyter={"source_hidden": true}
# show: paralab.pp.executor.run_actions

# %% [markdown]
# ## 4. Every schedule on real ranks: bitwise one process
#
# One launch per `pp` runs every schedule at `m = 1, pp, 2·pp` (interleaved with `v = 2`), two
# SGD steps each, under the ledger (`pp_runs.pp_sweep`). The ranks import `paralab.pp` from its
# file; this launch hands them this kernel's shown `one_f_one_b_order`, `microbatch_loss` and
# `exchange` with `patches=KERNEL_EDIT`, so an edit of those cells reaches them. The reference
# is one process, `reference_run`: the same blocks, the same global batch, the same micro-batch
# losses backward one after another.

# %% jupyter={"source_hidden": true}
# show: paralab.pp.runs.pp_worker paralab.pp.runs.reference_run

# %%
KERNEL_EDIT = {
    "paralab.pp.schedules": {"one_f_one_b_order": one_f_one_b_order},
    "paralab.pp.model": {"microbatch_loss": microbatch_loss},
    "paralab.pp.executor": {"exchange": exchange},
}
runs = {}
for pp in PP_SIZES:
    configs = sweep_configs(pp)
    per_rank = run(pp_runs.pp_sweep, pp, configs, patches=KERNEL_EDIT, timeout=120)
    for index, (name, m, v, _, _) in enumerate(configs):
        runs[(pp, name, m)] = (build_schedule(name, pp, m, v), [r[index] for r in per_rank])
print(len(runs), "runs:", ", ".join(sorted({f"{name}" for _, name, _ in runs})))

# %% [markdown]
# **Predict before you run.** Gradient accumulation sums `m` micro-batch gradients; one
# process on the global batch sums the same terms. Bitwise equal, or only close?

# %%
training_rows = []
for pp in PP_SIZES:
    for name, v in SWEEP:
        found = []
        for m in (1, pp, 2 * pp):
            plan, results = runs[(pp, name, m)]
            found += pp_runs.check_training(results, name, m, v)
        training_rows.append(
            summary(f"{name} pp={pp}, m = 1, {pp}, {2 * pp}: grads + params = one process", found)
        )
full_batch = []
for (_, _, m), (_, results) in runs.items():
    full_batch += compare(
        pp_runs.merged(results, "grads", 0), pp_runs.full_batch_grads(m), atol=1e-15
    )
training_rows.append(
    summary("step-0 grads vs ONE backward on the global batch (atol 1e-15)", full_batch)
)
print(verdict_table(training_rows, "pipeline training = one process"))

# %% [markdown]
# Bitwise, for every schedule: each stage computes exactly the ops one process computes on the
# same micro-batch, and every schedule here runs a stage's backwards in micro-batch order, so
# the `.grad` sums are added in the same order. Against *one* backward on the whole global batch
# (the last row) the sums are grouped differently, so they agree only to rounding: the `1/m`
# scaling is what makes them the same number.

# %% [markdown]
# **The collectives a pipeline does have.** The schedule exchanges only point-to-point
# messages, but the step around it needs the whole model once: clipping by the global
# gradient norm. A stage holds only its parameters, so each rank sums its own squares and
# the sums are all-reduced over the pipeline, as Megatron's `get_grad_norm_fp32` does
# (`pp_runs.grad_norm_worker`). One scalar per step, against every activation per micro-batch.

# %%
norms = run(pp_runs.grad_norm_worker, 4, "1f1b", 8, timeout=60)
want_norm = pp_runs.reference_grad_norm(8)
print("per-rank sums of squares:", " ".join(f"{r['local']:.6g}" for r in norms))
print(f"global norm on every rank {norms[0]['norm']:.6g}, one process {want_norm:.6g}")
norm_verdicts = [
    claim(
        "every rank has the same norm",
        len({r["norm"] for r in norms}) == 1,
        f"{norms[0]['norm']:.6g}",
    ),
    claim(
        "= one process's, to 1e-15",
        abs(norms[0]["norm"] - want_norm) < 1e-15,
        f"{abs(norms[0]['norm'] - want_norm):.1e}",
    ),
    claim(
        "bytes: one float64 all-reduce",
        [r["bytes"] for r in norms] == [12] * 4,
        f"{norms[0]['bytes']} B a rank",
    ),
]
print(verdict_table(norm_verdicts, "gradient norm across stages"))

# %% [markdown]
# The check allows rounding: the squares are summed per stage, then across stages, a grouping
# one process need not share (here the two agree to the last bit). A ring all-reduce of 8 bytes over 4 ranks sends
# `2(p-1)/p · 8 = 12` B a rank. A model whose input embedding and LM head share one matrix
# adds one more: that matrix lives on the first and the last stage, each accumulates only its
# own use's gradient, and the two are all-reduced between just those two ranks before the
# optimizer step. `pp_runs.tied_worker` runs it on a variant of this model whose first stage
# multiplies by an `h × h` matrix and whose last multiplies by its transpose:

# %%
tied_runs = run(pp_runs.tied_worker, 4, "1f1b", 8, timeout=60)
tied_want = pp_runs.reference_tied(8)
tied_got = {k: g for r in tied_runs for k, g in r["grads"].items() if k != "tied"}
tied_verdicts = [
    summary(
        "blocks: = one process",
        compare(
            dict(sorted(tied_got.items())), {k: g for k, g in tied_want.items() if k != "tied"}
        ),
    ),
    claim(
        "first stage's partial alone is not the gradient",
        (tied_runs[0]["partial"] - tied_want["tied"]).abs().max().item() > 0.1,
        f"off by up to {(tied_runs[0]['partial'] - tied_want['tied']).abs().max().item():.3g}",
    ),
    summary(
        "tied, after the all-reduce of ranks 0 and 3: = one process to 1e-15",
        compare(
            [tied_runs[0]["grads"]["tied"], tied_runs[3]["grads"]["tied"]],
            [tied_want["tied"]] * 2,
            atol=1e-15,
        ),
    ),
    claim(
        "bytes: h·h·8 on ranks 0 and 3 only",
        [r["bytes"] for r in tied_runs] == [128, 0, 0, 128],
        str([r["bytes"] for r in tied_runs]),
    ),
]
print(verdict_table(tied_verdicts, "tied ends"))

# %% [markdown]
# Without the all-reduce each end would step with only its own use's share of the gradient
# (the table's second row). With it the tied matrix agrees with one process to rounding, not
# bitwise: each end sums its own use over the micro-batches first, where one process adds the
# two uses micro-batch by micro-batch.

# %% [markdown]
# ## 5. The bubble, measured
#
# The bubble's closed forms, idle rank-time over all rank-time (`m >= p`). That is one of two
# normalisations in use: the Megatron paper divides the idle time by the *useful* time,
# `(p-1)/m` for 1F1B, 0.375 at `p = 4`, `m = 8` where this lab counts 0.273
# (`bubble_over_useful_time`); the Zero Bubble README's table counts as this lab does.
#
# | schedule | bubble |
# |---|---|
# | GPipe, 1F1B | `(p-1)/(m+p-1)` |
# | interleaved | `(p-1)/(v·m+p-1)` (`m` a multiple of `p`) |
# | ZB-H1 | `(p-1)/(3m+p-1)` with B = W = F |

# %%
# show: paralab.pp.costs.bubble_formula

# %% [markdown]
# The logical clock runs the lists with F = 1, B = 2 (B = W = 1 when split; a stage of `v` per
# rank takes `1/v` of that), messages free, and starts each action when its rank is free **and**
# everything it needs has arrived. The pictures below are the clock run on the order each rank
# *recorded* while it ran (`executed_timeline`), `pp = 4`, `m = 8`.

# %%
# show: paralab.pp.clock.run_clock

# %% [markdown]
# **Predict before you run.** 1F1B starts its backwards early: does that shrink GPipe's bubble?
# Where in ZB-H1's picture do the held-back W's go?

# %%
recorded = {
    name: executed_timeline(runs[(4, name, 8)][1], runs[(4, name, 8)][0]) for name, _ in SWEEP
}
show(viz.plot_pipeline_timeline([(f"{name}, pp = 4, m = 8", t) for name, t in recorded.items()]))

# %% [markdown]
# 1F1B has GPipe's bubble: the same idle slots, moved from the middle to the warm-up and
# cool-down. What 1F1B saves is memory (section 6). Interleaving makes each rank's stage
# `v` times smaller, so the warm-up's `p - 1` idle slots are `v` times shorter; ZB-H1 makes
# the backward that travels back only half as long (B without W) and fills the cool-down with
# the W's it held back.
#
# The measured bubbles of every real run against the closed forms (which assume `m >= p`, and
# for interleaving `m` a multiple of `p`); and beneath them, that every rank ran exactly its
# list and the clock on those lists gives `simulate`'s events, one by one:

# %%
bubble_rows, bubble_verdicts, order_verdicts = [], [], []
for (pp, name, m), (plan, results) in runs.items():
    timeline = executed_timeline(results, plan)
    ran_lists = all(
        list(r["step0"].executed) == list(plan.actions[k]) for k, r in enumerate(results)
    )
    same_clock = timeline.events == simulate(name, pp, m, plan.virtual).events
    order_verdicts.append(claim(f"{name} pp={pp} m={m}", ran_lists and same_clock, "ran its lists"))
    measured = timeline.bubble_fraction
    formula = bubble_formula(name, pp, m, plan.virtual)
    applies = m >= pp
    bubble_rows.append(
        [
            name,
            str(pp),
            str(m),
            f"{measured:.6f}",
            f"{formula:.6f}",
            "yes" if applies else "no (m < p)",
        ]
    )
    if applies:
        bubble_verdicts.append(
            claim(f"{name} pp={pp} m={m}", abs(measured - formula) < 1e-12, f"{measured:.6f}")
        )
print(text_table(["schedule", "pp", "m", "measured", "closed form", "form applies"], bubble_rows))
bubble_claims = [
    summary("every rank ran its list; the clock on them = simulate's events", order_verdicts),
    summary("measured bubble = closed form where it applies", bubble_verdicts),
]
print(verdict_table(bubble_claims, "the bubble"))

# %% [markdown]
# Below `m = p` the warm-up never fills, and interleaving and ZB-H1 do worse than their
# forms: with one micro-batch, a pipeline is one long chain whatever the order.
#
# The bubble against `m` at `pp = 4`: the lines are the closed forms, the dots the clock on
# the lists (`simulate`), the rings the real runs above.

# %%
with patched(KERNEL_EDIT):
    swept = {
        name: [(m, simulate(name, 4, m, v).bubble_fraction) for m in range(4, 17, 4)]
        for name, v in SWEEP
        if name != "gpipe"
    }
fig = viz.plot_bubble_vs_m(
    swept, lambda name, m: bubble_formula(name, 4, m, 2 if name == "interleaved" else 1), 4, 16
)
for name in swept:
    for m in (4, 8):
        plan, results = runs[(4, name, m)]
        fig.axes[0].plot(
            m, executed_timeline(results, plan).bubble_fraction, "o", mfc="none", mec="black", ms=9
        )
show(fig)

# %% [markdown]
# And one real run on this machine's wall clock (1F1B, `pp = 4`, `m = 8`): the same shape, but
# every span is whatever this CPU took, gaps include the time messages took, and it changes
# from run to run; only the logical clock is a claim.

# %%
# NBVAL_IGNORE_OUTPUT
show(
    viz.plot_pipeline_timeline(
        [("1F1B, pp = 4, m = 8, this machine", pp_runs.wall_timeline(runs[(4, "1f1b", 8)][1]))],
        labels=False,
    )
)

# %% [markdown]
# ## 6. Memory: the activations a stage holds
#
# Counted from the bytes autograd saves for backward (parameters excluded), from each
# forward until the action that frees its graph (B, or W when split). **Predict before you
# run:** at `pp = 4`, `m = 8`, how many micro-batches does ZB-H1 hold on rank 3, which holds its
# W's back longest? And interleaving, counted in stages of half a rank's blocks, on rank 0?
# In bytes, does interleaving's rank 0 hold more than 1F1B's, or less?
# The closed forms the run is checked against, the count and the bytes from the model's shapes:

# %%
# show: paralab.pp.costs.in_flight_formula paralab.pp.costs.stage_saved_bytes

# %% [markdown]
# With one stage per rank the peak in bytes is the count times one stage's bytes. Interleaved
# chunks are not all alike (the last one also saves the loss), so `peak_held_bytes` walks the
# rank's list: a forward adds its chunk's bytes, the action that frees it takes them away, and
# the largest sum is the peak. It reads only the list and the shapes; the run measures.

# %%
# show: paralab.pp.costs.peak_held_bytes

# %%
memory_rows, memory_verdicts = [], []
for name, _ in SWEEP:
    plan, results = runs[(4, name, 8)]
    cells = []
    for rank, r in enumerate(results):
        held, peak = r["step0"].peak_in_flight, r["step0"].peak_saved_bytes
        each = f" × {stage_saved_bytes(rank, 4)} B" if plan.virtual == 1 else " chunks"
        cells.append(f"{held}{each}: {peak} B")
    memory_rows.append([name, *cells])
heads = ["pp = 4, m = 8, measured", "rank 0", "rank 1", "rank 2", "rank 3"]
print(text_table(heads, memory_rows))
for plan, results in runs.values():
    memory_verdicts += pp_runs.check_memory(results, plan)
print(
    verdict_table(
        [summary("peak held and peak bytes = formula, every run and rank", memory_verdicts)],
        "memory",
    )
)

# %% [markdown]
# GPipe holds all `m` on every rank; 1F1B caps rank `r` at `p - r`, whatever `m`: that is why
# 1F1B replaced GPipe. ZB-H1 holds `min(p, m)` on every rank (a micro-batch stays until its W),
# the first rank's 1F1B peak. Interleaving holds more stages, each `1/v` of a rank's blocks
# (the last stage saves a little more: the loss). In bytes, each block saves fc1's input
# (`b·s·h`) and its `b·s·f` hidden twice (tanh's output and fc2's input are one tensor,
# saved by two ops), 672 B here; the last stage adds the loss's output and target
# (`2·b·s·h`), which is why rank 3 saves more per micro-batch. A real stage is the same sum
# over its ops, multiplied by the micro-batches its schedule holds.
#
# Interleaving's smaller bubble is paid here. Its warm-up, Megatron's
# `(p-1-r)·2 + (v-1)·g` chunk-forwards (`get_pp_rank_microbatches`), leaves rank 0 holding 11
# chunks of one block, 7392 B, where 1F1B's rank 0 holds 4 stages of two, 5376 B: 11/8 as much.
# Rank 3 peaks with 4 chunks of stage 3 and one of stage 7 (whose F and B run back to back)
# with the loss's 384 B on top. Lab 11 carries these counts to real model sizes
# (`paralab.scale.memory.stage_memory` takes its micro-batches in flight from `in_flight_formula`).

# %% [markdown]
# ## 7. Bytes on the wire = formula
#
# Per stage boundary, each micro-batch sends `b·s·h·8 = 192` bytes forward and the same
# backward. A rank sends forward from every stage whose next stage is on another rank, and
# backward from every stage but the first. The ledger counts each `batch_isend_irecv` op at
# the API:

# %%
# show: paralab.pp.costs.step_bytes_sent

# %%
byte_rows = []
for name in ("1f1b", "interleaved"):
    plan, results = runs[(4, name, 8)]
    ledger = pp_runs.bytes_per_rank(results)
    want = step_bytes_sent(plan.owner, 8, boundary_bytes())
    for d, direction in enumerate(("forward", "backward")):
        byte_rows.append(
            [
                name,
                direction,
                *(str(int(x)) for x in ledger[d]),
                " ".join(str(w[direction]) for w in want),
            ]
        )
print(
    text_table(
        ["pp = 4, m = 8", "direction", "rank 0", "rank 1", "rank 2", "rank 3", "formula"], byte_rows
    )
)
byte_verdicts = []
for plan, results in runs.values():
    byte_verdicts += pp_runs.check_bytes(results, plan)
print(
    verdict_table(
        [summary("ledger bytes = formula, every run, rank and direction", byte_verdicts)], "bytes"
    )
)

# %% [markdown]
# Interleaving doubles every rank's forward bytes but the last's (7 boundaries instead of 3) for
# its smaller bubble. Compare a tensor-parallel layer, which all-reduces a full `b·s·h`
# activation twice per layer over its whole group in the forward alone: pipeline parallelism
# sends one `b·s·h` per *stage*, point to point, and can wait. That is why it crosses nodes and
# tensor parallelism does not.

# %% [markdown]
# ## 8. The same stages under torch.distributed.pipelining
#
# `PipelineStage` wraps each of our `Stage`s, and six of the seven schedule classes torch 2.13
# exports run one step each on 2 gloo ranks, `m = 4`, with `loss_fn = microbatch_loss(·, ·, 4)` and
# `scale_grads=False`, since this loss already divides by `m` (with an unscaled loss and
# `scale_grads=True`, torch would divide the summed gradients by `m` at the end instead: the
# same value to rounding, not bitwise). Looped classes get stages `r, r + 2`; the V-shaped ones
# (ZBV, DualPipeV) stages `r` and `3 - r`. torch's schedules are data too: each class holds its
# per-rank action list (`_Action(stage, type, microbatch)`, written `1F0`), which we read back.
# The seventh, `ScheduleLoopedBFS` (breadth first: every micro-batch through a rank's first
# stage, then its second), runs too, but it runs each stage's backwards last micro-batch
# first, so its gradients are one process's summed in another order, equal only to rounding
# (`test_looped_bfs_runs_backwards_last_first_so_its_sums_are_equal_only_to_rounding`); this
# table is for bitwise ones.

# %% jupyter={"source_hidden": true}
# show: paralab.pp.upstream.torch_worker

# %%
torch_runs = run(torch_sweep, 2, torch_jobs(4), timeout=120)
want = pp_runs.reference_run(4, 1)[1][0]
torch_verdicts = []
labels = [*TORCH_SCHEDULES, "ScheduleInterleavedZeroBubble, one stage per rank"]
for index, label in enumerate(labels):
    got = {}
    for r in torch_runs:
        got.update(r[index]["grads"])
    torch_verdicts.append(
        summary(f"{label}: grads = one process", compare(dict(sorted(got.items())), want))
    )
print(verdict_table(torch_verdicts, "torch.distributed.pipelining on gloo, CPU"))

# %% [markdown]
# The six run on CPU over gloo, and every gradient is bitwise ours. Their orders, side by side
# with the hand-written lists where torch writes the same schedule:

# %%
ours = {
    "ScheduleGPipe": build_schedule("gpipe", 2, 4),
    "Schedule1F1B": build_schedule("1f1b", 2, 4),
    "ScheduleInterleaved1F1B": build_schedule("interleaved", 2, 4, 2),
    "ScheduleInterleavedZeroBubble, one stage per rank": build_schedule("zbh1", 2, 4),
}
order_rows, order_verdicts = [], []
for index, label in enumerate(labels):
    for rank in range(2):
        theirs = [f"{k}{s}.{i}" for k, s, i in torch_runs[rank][index]["order"]]
        mine = ours[label].order(rank) if label in ours else None
        same = "—" if mine is None else ("same" if theirs == mine else "differs")
        order_rows.append([label if rank == 0 else "", str(rank), " ".join(theirs), same])
        if mine is not None and label != "Schedule1F1B":
            order_verdicts.append(
                claim(f"{label} rank {rank}: torch's order = ours", theirs == mine, same)
            )
one_f_one_b = [
    [f"{k}{s}.{i}" for k, s, i in torch_runs[r][labels.index("Schedule1F1B")]["order"]]
    for r in range(2)
]
late = [
    f"F1.{int(a.split('.')[1]) + 1}" if a.startswith("F") else a
    for a in ours["Schedule1F1B"].order(1)
]
order_verdicts.append(
    claim(
        "Schedule1F1B: rank 0 = ours; rank 1 = ours with every F one micro-batch late",
        one_f_one_b[0] == ours["Schedule1F1B"].order(0) and one_f_one_b[1] == late,
        " ".join(one_f_one_b[1]),
    )
)
print(
    text_table(
        ["torch class", "rank", "torch's action list (compute only; I written B)", "vs ours"],
        order_rows,
    )
)
print(verdict_table(order_verdicts, "orders"))

# %% [markdown]
# - GPipe, interleaved 1F1B and ZB-H1 (ScheduleInterleavedZeroBubble given one stage per rank)
#   are the same lists, action for action.
# - Schedule1F1B's list differs on the last rank only: it numbers that rank's forwards 1 to `m`
#   (`F1.1 ... F1.4`, a micro-batch 4 that does not exist). The order it *runs* is ours (its
#   `_step_microbatches` warms up with `min(m, p - r)` forwards, then alternates backward and
#   forward), but the list it describes itself with, built by
#   `_get_pipeline_order` for visualisation, starts the last rank's steady state one
#   micro-batch late (torch 2.13).
# - ScheduleZBVZeroBubble and ScheduleDualPipeV place two stages in a V (`r` and `2p-1-r`), so the
#   last stage sits on rank 0 next to the first. ZBV splits every backward into B and W.
#   DualPipeV fuses a forward of one micro-batch with a backward of another (`OVERLAP_F_B`, to
#   hide the MoE all-to-all; listed here as its F and B), whose backward is a full one: its rows
#   have fewer `W` than `B` (3 and 2 against 8). There is no hand-written counterpart here.
# - The fusing is only a pairing. torch's runtime runs an `OVERLAP_F_B`'s forward and then its
#   backward, on any device, unless a function is registered for it with
#   `register_custom_function`; DeepSeek's own DualPipeV needs a model-specific
#   `overlapped_forward_backward`. A GPU alone would not show the overlap either.

# %% [markdown]
# ## 9. Bug clinic: a deadlock at the turn
#
# A change planted in the executor, handed to the ranks as a patch set,
# `run(..., patches=p2p_clinic_change())` (`paralab.exercises.lab08`; do not read it yet). It
# replaces one function and touches no schedule. Below, GPipe and 1F1B run with it, `pp = 2`,
# `m = 4`, with a short timeout.

# %%
clinic_verdicts = []
gpipe_changed = run(pp_runs.pp_worker, 2, "gpipe", 4, 1, 1, timeout=30, patches=p2p_clinic_change())
clinic_verdicts.append(
    summary(
        "clinic: GPipe still runs, bitwise",
        pp_runs.check_training(gpipe_changed, "gpipe", 4, steps=1),
    )
)
try:
    run(pp_runs.pp_worker, 2, "1f1b", 4, 1, 1, timeout=3, patches=p2p_clinic_change())
    hung = None
except LaunchTimeout as exc:
    hung = exc.hung_ranks
    print(str(exc).splitlines()[0].replace("3 s", "the timeout"))
clinic_verdicts.append(
    claim("clinic: 1F1B stops, both ranks waiting", hung == [0, 1], f"hung ranks {hung}")
)
print(verdict_table(clinic_verdicts, "bug clinic"))

# %% [markdown]
# **What is wrong?** Both ranks are alive and waiting. Read the two lists side by side (the
# table printed in section 2): what does each rank hand `exchange` between step 1 and step 2?
# Why does GPipe never get there? Then open the answer.

# %% [markdown]
# <details><summary>Answer</summary>
#
# The change is `exchange_in_program_order`: each message as its own blocking call, the
# previous action's sends first, then this action's receives. In 1F1B at `pp = 2` the turn
# from warm-up to steady state comes after step 1: rank 0 has just run `F0.1` and must send
# `act0.1`, then receive `grad1.0` for `B0.0`; rank 1 has just run `B1.0` and must send
# `grad1.0`, then receive `act0.1` for `F1.1`. Each sends first, and a gloo send completes only when the peer posts the
# matching receive, so both wait in `send` forever: a cycle of two. GPipe never has two
# neighbours sending to each other at once (all activations flow up, then all gradients flow
# down), so the same change runs, bitwise.
#
# The fix is what the package's `exchange` does: post the pending sends and the next
# receives in one `batch_isend_irecv`, wait for the receives. torch's Schedule1F1B keeps the
# last warm-up send back to fuse it with the first backward's receive ("fwd_send_bwd_recv"),
# and Megatron calls `send_forward_recv_backward` there: the same pairing. The launcher names
# both ranks because neither returned; the logical clock cannot see this bug, since it models
# sends that never block: the lists themselves are fine.
# </details>

# %% [markdown]
# ## 10. A link that takes time
#
# The clock of section 5 delivers every message at once. Give it a link: a message arrives `d`
# after the action that sent it ended (`d` in units of one rank's forward), the sender does
# not wait, and an action starts once its rank is free and its inputs have arrived
# (`simulate(schedule, pp, m, v, latency=d)`). What `d` is for a real hop: the message's
# latency plus its bytes over the link's bandwidth, over one stage's forward.

# %%
# show: paralab.pp.costs.link_latency

# %%
# One example size: a micro-batch of 1 × 4096 tokens, h = 8192, bf16, and a stage of two
# blocks whose forward (24·s·h² flops each) runs at an assumed 40% of an H100's bf16 peak.
h100 = hardware("h100-sxm")
message, forward_s = 4096 * 8192 * 2, 2 * 24 * 4096 * 8192**2 / (0.4 * h100.peak_bf16)
LINKS = {
    "NVLink": link_latency(STEP_LATENCY["nvlink"], message, h100.intra_busbw, forward_s),
    "network": link_latency(STEP_LATENCY["net"], message, h100.inter_busbw, forward_s),
    "slow (small stages)": 0.25,
}
print(", ".join(f"{name}: d = {d:.4f}" for name, d in LINKS.items()))

# %% [markdown]
# **Predict before you run.** At `p = 4`, which schedule loses more to a link of `d = 0.25`
# as `m` grows, GPipe or 1F1B? And ZB-H1, whose held-back W's could fill a wait?
#
# The closed forms the clock is checked against (chapter 3 explains each):

# %%
# show: paralab.pp.costs.one_f_one_b_exposed_latency paralab.pp.costs.exposed_link_formula

# %%
link_rows, link_verdicts = [], []
for name, v in SWEEP:
    for m in (8, 16, 32):
        plain = simulate(name, 4, m, v)
        row = [name, str(m), f"{plain.bubble_fraction:.3f}"]
        for d in LINKS.values():
            linked = simulate(name, 4, m, v, latency=d)
            exposed = linked.makespan - plain.makespan
            row.append(f"+{exposed:.4g} ({linked.bubble_fraction:.3f})")
            formula = exposed_link_formula(name, 4, m, d, v)
            link_verdicts.append(
                claim(f"{name} m={m} d={d:.4f}", abs(exposed - formula) < 1e-9, f"{exposed:.6g}")
            )
        link_rows.append(row)
heads = [f"{name}: +link (bubble)" for name in LINKS]
print(text_table(["pp = 4", "m", "bubble, free link", *heads], link_rows))
print(verdict_table([summary("exposed link time = closed form", link_verdicts)], "the link"))

# %% [markdown]
# The time each link adds to a step, in forwards. GPipe pays every hop once, to fill and to
# drain; interleaved and ZB-H1 pay a constant too, because they have other work (the next
# chunk's forward, a held-back W) to run while a message travels, as long as `d` stays below
# it. 1F1B pays on **every** micro-batch: rank 0 holds at most `p` micro-batches, so it waits
# for each one's round trip of `2(p-1)` hops, about `2(p-1)d/p` per micro-batch. The grey
# lines are the messages:

# %%
show(
    viz.plot_pipeline_timeline(
        [
            ("1F1B, pp = 4, m = 8, free link", simulate("1f1b", 4, 8)),
            ("1F1B, link d = 0.25", simulate("1f1b", 4, 8, latency=0.25)),
            ("ZB-H1, link d = 0.25", simulate("zbh1", 4, 8, latency=0.25)),
        ]
    )
)

# %% [markdown]
# At the example size a network hop is `d` = 0.044 of a forward: at `m = 32` 1F1B's bubble
# goes from 0.086 to 0.105, the others' by less than 0.01. That is why PP is the axis that goes
# across nodes, and also its condition: stages large enough that a hop is a small fraction of a forward, or a schedule
# with slack. [Chapter 3](03_why_pp_crosses_nodes.md) draws the consequences for placement.

# %% [markdown]
# ## 11. Real stages are not equal
#
# The clock so far gives every action of a kind the same time. Two things break that in a real
# model. **F, B and W differ.** The zero-bubble forms assume F = B = W: torch's
# `ScheduleZBVZeroBubble` docstring says its schedule is zero-bubble "only if time forward ==
# time backward input == time backward weights". A layer whose weight gradient is cheap
# (attention's core has no weights) has W < B. `action_times` gives `run_clock` any F, B, W
# (an unsplit backward takes B + W), and per stage a scale:

# %%
# show: paralab.pp.clock.action_times

# %%
# show: paralab.pp.costs.idle_time_formula

# %% [markdown]
# **Predict before you run.** With W half of B, does ZB-H1 keep its advantage over 1F1B? And
# with W twice B, does it become zero-bubble?

# %%
fbw_rows, fbw_verdicts = [], []
for f, b, w in ((1, 1, 1), (1, 1.5, 0.5), (1, 2, 0.5), (1, 0.5, 1.5), (1, 1, 2)):
    row = [f"F={f} B={b} W={w}"]
    for name in ("1f1b", "zbh1"):
        plan = build_schedule(name, 4, 8)
        times = action_times(plan.split_backward, f, b, w)
        timeline = run_clock(plan.actions, plan.owner, plan.split_backward, durations=times)
        idle = timeline.makespan - 8 * (f + b + w)
        row += [
            f"{idle:g} ({idle_time_formula(name, 4, f, b, w):g})",
            f"{timeline.bubble_fraction:.3f}",
        ]
        fbw_verdicts.append(
            claim(f"{name} {row[0]}", idle == idle_time_formula(name, 4, f, b, w), f"{idle:g}")
        )
    fbw_rows.append(row)
heads = ["pp = 4, m = 8", "1F1B idle (form)", "bubble", "ZB-H1 idle (form)", "bubble"]
print(text_table(heads, fbw_rows))
print(verdict_table([summary("idle time per rank = closed form", fbw_verdicts)], "unequal F, B, W"))

# %% [markdown]
# 1F1B's bubble does not depend on the split: `(p-1)(F+B+W)` idle against `m(F+B+W)` busy.
# ZB-H1 idles `(p-1)(F+B-W)`, 2W less than 1F1B per stage boundary: the smaller W is against
# B, the less it saves (F = 1, B = 2, W = 0.5: 0.211 against 0.111 at F = B = W). A W larger
# than F or B does not make it zero-bubble: it never goes below `(p-1)·max(F, B)` idle (0.086
# at W = 2), because the first input gradient still needs `p-1` forwards to go out and `p-1`
# B's to come back.
#
# **Stages differ.** The first stage holds the embedding (a lookup: memory, little compute);
# the last holds the LM head and the loss, a `h × V` matmul per token. For Llama 3.1 8B's shape
# the head is 2.41 blocks of forward matmul (`paralab.scale.models`). At `pp = 4` an even split
# of its 32 blocks leaves the last stage 30% longer, and every stage waits for it. Megatron's
# fixes move layers off the heavy stage: `num_layers_in_last_pipeline_stage` (and
# `..._first_...`), or `account_for_embedding_in_pipeline_split` and
# `account_for_loss_in_pipeline_split`, which count each as one layer, so the number of layers
# must be `k·p - 2` (the Zero Bubble README's advice, for the same reason:
# `sail-sg/zero-bubble-pipeline-parallelism@39f2c18:README.md`). `megatron_layers_per_stage`
# splits as `get_num_layers_to_build` does
# (`NVIDIA/Megatron-LM@d98e8a6:megatron/core/transformer/transformer_block.py`):

# %% jupyter={"source_hidden": true}
# show: paralab.pp.costs.megatron_layers_per_stage

# %%
llama = model("llama3.1-8b")
head = llama.vocab * llama.hidden / lm_layer_matmul(llama)  # the head's matmul, in blocks
layouts = {
    "even, 32 blocks": megatron_layers_per_stage(32, 4),
    "num_layers_in_last_pipeline_stage=5": megatron_layers_per_stage(32, 4, last=5),
    "account_for_embedding/loss, 30 blocks": megatron_layers_per_stage(
        30, 4, account_for_embedding=True, account_for_loss=True
    ),
}
uneven, uneven_rows = {}, []
for label, layers in layouts.items():
    scale = [(n + (head if s == 3 else 0)) / 8 for s, n in enumerate(layers)]  # 8 blocks = 1
    plan = build_schedule("1f1b", 4, 8)
    times = action_times(False, stage_scale=scale)
    uneven[label] = run_clock(plan.actions, plan.owner, False, durations=times)
    row = [label, " ".join(map(str, layers)), " ".join(f"{x:.3f}" for x in scale)]
    uneven_rows.append(
        row
        + [f"{uneven[label].makespan / sum(layers):.4f}", f"{uneven[label].bubble_fraction:.3f}"]
    )
print(f"LM head = {head:.2f} blocks")
print(
    text_table(
        ["1F1B, pp = 4, m = 8", "blocks per stage", "F per stage", "step per block", "bubble"],
        uneven_rows,
    )
)
show(viz.plot_pipeline_timeline(list(uneven.items())))

# %% [markdown]
# Even, the last stage's head sets the pace: the bubble grows from 0.273 to 0.358, and the
# ranks before it idle between its slower backwards. Moving 3 blocks off it (`last = 5`) leaves
# the first three stages the longest (9 blocks) but shortens the step per block by 11%.
# Counting the loss as one layer helps less here, because this head weighs 2.41 layers: what
# the split should count is each piece's time, which is why the Zero Bubble README profiles
# F, B and W before it schedules.

# %% [markdown]
# ## 12. With data parallelism: one gradient sync, after the last micro-batch
#
# A pipeline is usually one of `dp` copies, each on its share of the global batch, and before
# the optimizer step every stage's gradients are summed over its dp group. Between
# micro-batches a stage only accumulates, so the sum can wait. Megatron sums once a step:
# after the schedule (`finalize_model_grads`), or, with `overlap_grad_reduce`, its schedules
# hold the model's DDP `no_sync` (`disable_grad_sync`) until the last micro-batch's backward
# or later; picotron sets `require_backward_grad_sync` for that backward only
# ([chapter 1](01_megatron_and_picotron.md#5-with-data-parallelism-the-gradient-sync-waits-for-the-last-micro-batch)).
# The executor calls `after_grads(stage, i)` once micro-batch `i`'s gradients of a stage are in
# (after B, or W when split); `dp_grad_sync` decides when to sum:

# %%
# show: paralab.pp.dp.dp_grad_sync paralab.pp.dp.sync_stage_grads

# %% [markdown]
# Four ranks, `pp = 2 × dp = 2`, in Megatron's order (dp before pp): the dp groups are
# neighbours, {0, 1} and {2, 3}, the pipelines {0, 2} and {1, 3} (`pp_dp_ranks`). Replica `d`
# runs micro-batches `d·m` to `d·m + m - 1` of the global batch's `dp·m`. The references: one
# process on all `dp·m` (`reference_run`), and one summing in the run's order, each replica's
# `m` first, then the two sums (`reference_replicas`). The launch hands the ranks this kernel's
# `dp_grad_sync`. What a rank sends for the sync:

# %% jupyter={"source_hidden": true}
# show: paralab.pp.dp.pp_dp_worker paralab.pp.dp.reference_replicas

# %%
# show: paralab.pp.costs.dp_sync_bytes

# %% [markdown]
# **Predict before you run.** At `m = 4`, how many all-reduces does a rank make in a step with
# the sync deferred, and with one after every micro-batch? Interleaved (`v = 2`)? Do the
# gradients differ?

# %%
DP_CONFIGS = [(name, 4, v, later) for name, v in SWEEP[1:3] for later in (True, False)]
dp_edit = {"paralab.pp.dp": {"dp_grad_sync": dp_grad_sync}}
dp_runs = run(pp_dp_sweep, 4, 2, DP_CONFIGS, patches=dp_edit, timeout=60)

# %%
dp_rows, dp_verdicts, dp_grads = [], [], {}
for index, (name, m, v, deferred) in enumerate(DP_CONFIGS):
    results = [r[index] for r in dp_runs]
    calls, nbytes = dp_sync_record(results)[0]
    mine = [stage_parameters(s, 2 * v) for s in range(0, 2 * v, 2)]  # rank 0's stages
    when = "the last micro-batch" if deferred else "every micro-batch"
    formula = (dp_sync_collectives(m, v, deferred), dp_sync_bytes(mine, 2, m, deferred))
    dp_rows.append([f"{name} v={v}", when, f"{calls} ({formula[0]})", f"{nbytes} ({formula[1]})"])
    found = check_pp_dp(results, 2, (name, m, v, deferred))
    dp_verdicts.append(summary(f"{name} v={v}, after {when}: = one process, formula", found))
    dp_grads[(name, deferred)] = pp_runs.merged(results[::2], "grads", 0)
heads = ["pp = 2 × dp = 2, m = 4", "dp sync after", "all-reduces (formula)", "bytes (formula)"]
print(text_table(heads, dp_rows))
for name, _ in SWEEP[1:3]:
    once, each = dp_grads[(name, True)], dp_grads[(name, False)]
    apart = max((once[k] - each[k]).abs().max().item() for k in once)
    same = claim(f"{name}: every micro-batch = last, to 1e-15", apart < 1e-15, f"{apart:.1e}")
    dp_verdicts.append(same)
print(verdict_table(dp_verdicts, "pp × dp"))

# %% [markdown]
# The same gradients, for `m` times fewer all-reduces of the same size. Deferred, they are
# bitwise the replica-grouped sums, and equal one process summing all eight micro-batches in
# order to rounding: only the grouping differs. A sync after every micro-batch is right too,
# since the part already accumulated is equal on both replicas and the average of equal
# numbers is that number; but it sends `m` times the bytes, each sum in the middle of the
# pipeline. Interleaved, a rank owns `v` chunks and syncs each once, after that chunk's last
# micro-batch, as Megatron enables the sync per model chunk: `v` all-reduces of `1/v` of the
# bytes. Here the sum runs where `after_grads` is called and blocks the rank. Megatron with
# `overlap_grad_reduce` launches it asynchronously and waits for it in `finalize_model_grads`.
# It launches it from the last backward's gradient hooks, bucket by bucket, so that it
# overlaps the rest of that backward; or, by default (`align_grad_reduce`) everywhere but
# 1F1B's first stage, with one `start_grad_sync` call after that backward (interleaved: `r`
# backwards after it on rank `r`;
# [chapter 1](01_megatron_and_picotron.md#5-with-data-parallelism-the-gradient-sync-waits-for-the-last-micro-batch)
# says where).

# %% [markdown]
# ## Closing note

# %%
closing = ["| pp | m | GPipe | 1F1B | interleaved (v = 2) | ZB-H1 |", "|---|---|---|---|---|---|"]
for pp in PP_SIZES:
    for m in (pp, 2 * pp):
        cells = [
            f"{executed_timeline(runs[(pp, n, m)][1], runs[(pp, n, m)][0]).bubble_fraction:.4f} ({bubble_formula(n, pp, m, v):.4f})"
            for n, v in SWEEP
        ]
        closing.append(f"| {pp} | {m} | " + " | ".join(cells) + " |")
display(
    Markdown(
        "Bubble fraction measured on the logical clock from the ranks' recorded order (closed form in brackets):\n\n"
        + "\n".join(closing)
        + f"\n\nEvery gradient and the parameters after 2 steps matched one process bitwise (pp = 2 and 4, "
        "m = 1, pp, 2pp, all four schedules); bytes per boundary per micro-batch: "
        f"{boundary_bytes()} B each way, ledger = formula on every rank; activations held: m (GPipe) "
        "against min(p − r, m) (1F1B). With dp = 2 beside the pipeline, the dp gradient sync "
        "deferred to the last micro-batch: one all-reduce per stage a step instead of m, the "
        "same gradients. Six of torch.distributed.pipelining's seven schedule classes ran on gloo "
        "with the same gradients bitwise (ScheduleLoopedBFS, which runs backwards last "
        "micro-batch first, agrees to rounding). The last cell prints this run's time."
    )
)

# %% [markdown]
# ## What to try
#
# 1. In the `one_f_one_b_order` cell, change the warm-up to `min(pp - r - 1, microbatches)`,
#    re-run that cell, then section 4's launch. What does each run say, and on which rank?
#
#    <details><summary>Hint</summary>The last rank's list now starts with a backward before its
#    forward: in the first launch (pp = 2) rank 1 raises `KeyError: (1, 0)` (no saved forward
#    for stage 1, micro-batch 0) and its peer fails after it; the launcher names them.
#    `with patched(KERNEL_EDIT): simulate("1f1b", 4, 8)` raises `Deadlock` instead, naming
#    what every rank waits for (rank 3: `F3.0 before B3.0`).</details>
# 2. `simulate("zbh1", 4, m).bubble_fraction` for `m = 1, 2, 3`: how far from `(p-1)/(3m+p-1)`?
#    Why does the form need `m >= p`?
#
#    <details><summary>Hint</summary>0.667, 0.455, 0.308 against 0.5, 0.333, 0.25: with fewer
#    micro-batches than stages, rank 0 has nothing left to run while the first gradient
#    travels back.</details>
# 3. `simulate("interleaved", 4, 8, 4).bubble_fraction`: does `v = 4` follow `(p-1)/(v·m+p-1)`?
#    And what does it cost on the wire: `step_bytes_sent(build_schedule("interleaved", 4, 8,
#    4).owner, 8, boundary_bytes())` against `v = 2`?
#
#    <details><summary>Hint</summary>Yes, `3/35`. Ranks 0 to 2 now feed 4 boundaries forward
#    instead of 2 (rank 3: 3 instead of 1), about twice `v = 2`'s bytes: the traffic grows
#    with `v` while the bubble shrinks.</details>
# 4. In `microbatch_loss`, drop the `/ microbatches` and re-run section 4. Which rows fail, and
#    by how much is every gradient off?
#
#    <details><summary>Hint</summary>All eight training rows fail (through their m = pp and 2pp
#    runs; m = 1 is unchanged), and so does the row against one backward: each gradient is m
#    times too large, and the parameters after the SGD steps differ with them. The reference
#    is the package's own `microbatch_loss`, not the edited one.</details>
# 5. Hand the clinic's change to ZB-H1: `run(pp_runs.pp_worker, 2, "zbh1", 4, 1, 1, timeout=3,
#    patches=p2p_clinic_change())`. Does it deadlock? At which step of the lists?
#
#    <details><summary>Hint</summary>Yes: ZB-H1 has 1F1B's F and B order, so the same turn,
#    `F0.1` then `B0.0` on rank 0 and `B1.0` then `F1.1` on rank 1, puts both ranks in a
#    blocking send at once.</details>
# 6. In the `dp_grad_sync` cell, sync at `done[stage] == microbatches - 1`, re-run that cell,
#    then section 12's launch. Which rows fail, and do the all-reduce counts notice?
#
#    <details><summary>Hint</summary>The two deferred rows fail on their gradients and
#    parameters: the last micro-batch's gradients stay on their replica, so the two replicas
#    step apart. Their all-reduces and bytes still equal the formula: counting collectives
#    cannot see when they run. The rows that sync after every micro-batch still pass.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
