# %% [markdown]
# # Lab 09 — Expert parallelism: top-k routing, all-to-all dispatch and combine, capacity, imbalance
#
# **You will learn** how a mixture-of-experts (MoE) layer picks experts per token (a
# linear gate, softmax, top-k with a tie rule), what a capacity limit drops and where a
# dropped token goes, how the experts are split over the ranks of an `ep` group and
# two all-to-alls move the tokens there and back, why the backward of dispatch is
# combine's all-to-all, how ep is carved from the data-parallel ranks, what the routing
# costs in bytes, and how unbalanced it is; then what production changes: dropless routing,
# a grouped matmul over the local experts, a shared expert, balancing with a per-expert bias,
# where the gate weight sits, and what DeepEP sends across nodes. **Prerequisites:** the collectives primer
# (all-to-all and its backward), lab 01 (data parallelism, averaged gradients). **Time:**
# about 55 minutes to read; the run time of this notebook is printed by its last cell.
#
# **What is split.** The experts. An MoE layer replaces one MLP by `E` expert MLPs and a
# router; each token runs through only `k` of them. With `ep` ranks in an ep group, rank
# `r` holds experts `[r·E/ep, (r+1)·E/ep)`. The tokens are **not** split by ep: every rank
# of the group keeps its own data-parallel tokens, and for the MoE layer alone sends each
# token to the ranks of its experts and takes the results back. So ep uses no rank slots
# of its own: it groups the dp ranks a second time (here: dp = 4 with ep = 2, two ep
# groups of 2). One MoE layer on one rank:
#
# | step | what | collective |
# |---|---|---|
# | route | gate, softmax, top-k, capacity: which experts, which weights, what is dropped | none |
# | permute | order the kept assignments by expert, so by destination rank | none |
# | exchange counts | how many rows each rank sends each local expert of each rank | `all_to_all_single` of `E` int64 |
# | dispatch | the rows, with those counts as splits | `all_to_all_single(out, in, output_splits, input_splits)` |
# | experts | regroup the arrivals by local expert, run each expert on its block | none |
# | combine | undo the regroup, the reverse all-to-all (splits swapped), unpermute, gate-weighted sum per token | `all_to_all_single` |
# | backward | combine's all-to-all reversed, then dispatch's reversed | 2 × `all_to_all_single` |
#
# **Bytes.** The splits come from the routing, so they are not uniform. Let `M[i, j]` be the
# rows rank `i` sends to rank `j` (the split matrix) and `R = dim·8` bytes a row. Rank `r`
# sends `R·Σ_{j≠r} M[r, j]` in dispatch and `R·Σ_{i≠r} M[i, r]` in combine (what it
# received, sent back); the backward sends the same two amounts in reverse order; the count
# exchange sends `8·(E − E/ep)`. Section 5 checks every rank's ledger against this.

# %%
import time

import torch
from IPython.display import Markdown, display

from paralab import viz
from paralab.check import claim, summary, verdict_table
from paralab.ep import reference, train
from paralab.ep.costs import layer_bytes, split_matrix
from paralab.ep.model import MoEConfig, make_model
from paralab.ep.router import capacity, capacity_keep, top_k_route
from paralab.ep.runs import (
    check_bytes,
    check_layout,
    check_params,
    check_step,
    ep_worker,
    measured_bytes,
    reference_run,
    step_splits,
)
from paralab.exercises.lab09 import lean_dispatch, misrouted_tokens
from paralab.launch import LaunchError, run
from paralab.tables import text_table
from paralab.viz import show

LAB_START = time.monotonic()
EXPERTS = 4  # 4 or 8: both divide by ep = 2 and 4
CONFIG = MoEConfig(experts=EXPERTS)  # top-2, no capacity limit, 24 tokens of width 12 per rank
print(CONFIG)

# %% [markdown]
# ## 1. The router: top-k with a tie rule, renormalized or not
#
# A linear gate scores each token against every expert, a softmax turns the scores into
# probabilities, and the `k` best experts are kept, best first. Two decisions differ between
# engines and must be the same on every rank: **ties** (here: the lower expert index wins, a
# stable descending sort) and **renormalizing** the `k` weights to sum to 1 (Mixtral,
# GShard's top-2 and DeepSeek-V3 do; Switch, DeepSeek-V2 and this lab's default do not: with
# top-1 a renormalized weight is always 1 and the task loss no longer reaches the gate).

# %%
# show: paralab.ep.router.top_k_route

# %% [markdown]
# **Predict** before running: a token whose four probabilities are all 0.25, top-2. Which
# experts does it get, with which weights, renormalized or not?

# %%
probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.4, 0.2]], dtype=torch.float64)
for renormalize in (False, True):
    weights, experts = top_k_route(probs, 2, renormalize)
    shown = [[f"{w:.4g}" for w in row] for row in weights.tolist()]
    print(f"renormalize={renormalize}: experts {experts.tolist()}, weights {shown}")

# %% [markdown]
# ## 2. Capacity: who is dropped, and where a dropped token goes
#
# Production MoE today drops nothing by default: Megatron-LM's `moe_expert_capacity_factor`
# is `None` ("no token will be dropped"), torchtitan has no capacity at all, and DeepSeek-V3
# dropped no token in training (section 8 runs that regime, which is this lab's
# `c = None`). A capacity is the older design (Switch, GShard), and the one for a buffer whose
# size must be known before the counts are. With capacity factor `c` each expert takes at most
# `ceil(c·tokens·k/E)` assignments from one rank's tokens. The **priority** this lab states:
# every token's first choice before any second choice, and, within one choice, earlier tokens
# first (GShard's order). Megatron, once a capacity is set, keeps each expert's
# highest-probability assignments by default (`moe_token_drop_policy="probs"`). A dropped
# assignment contributes nothing: its token's MoE output is the sum of its kept assignments
# only, and a token with none kept leaves the layer as its residual `x` (the layer computes
# `x + moe(x)`). Kept weights are not renormalized after drops.

# %%
# show: paralab.ep.router.capacity paralab.ep.router.capacity_keep

# %% [markdown]
# **Predict:** four tokens choose (expert, expert) = (0, 1), (0, 2), (1, 0), (0, 3) and every
# expert has 2 slots. Which assignments are dropped?

# %%
choices = torch.tensor([[0, 1], [0, 2], [1, 0], [0, 3]])
print("kept:", capacity_keep(choices, 4, 2).int().tolist())
model = make_model(CONFIG.with_(top_k=1, capacity_factor=0.5), seed=0)
x = torch.randn(
    CONFIG.seq, CONFIG.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
)
moe_out, routing = model.moe(x)
dropped = ~routing.keep.any(dim=1)
print(
    f"top-1, c = 0.5: {capacity(CONFIG.seq, EXPERTS, 1, 0.5)} slots per expert; "
    f"{int(dropped.sum())} of {CONFIG.seq} tokens dropped, and their MoE output is all zero:",
    bool((moe_out[dropped] == 0).all()),
)

# %% [markdown]
# ## 3. Dispatch and combine
#
# The count exchange first: each rank knows how many rows it *sends* each expert, but to
# allocate its receive buffer and to cut what arrives into blocks per local expert it must
# know how many rows every other rank sends *it*. That is one small all-to-all of the counts.

# %%
# show: paralab.ep.dispatch.exchange_counts paralab.ep.dispatch.expert_permutation

# %% [markdown]
# The rows then travel with `all_to_all_single` and those splits. Its backward is the same
# call with the splits swapped: a gradient row goes back exactly where its forward row came
# from. One autograd Function holds both; dispatch and combine each call it once, and since
# combine consumes what dispatch produced, every rank runs their backwards in one order.

# %%
# show: paralab.ep.dispatch.exchange_rows paralab.ep.dispatch.AllToAll

# %% [markdown]
# Dispatch orders the kept assignments by expert (`send_order`), exchanges the counts, sends
# the rows, and regroups what arrived by local expert; each local expert runs on its block,
# and combine brings the rows home.

# %%
# show: paralab.ep.dispatch.send_order

# %%
# show: paralab.ep.dispatch.dispatch

# %%
# show: paralab.ep.dispatch.run_local_experts paralab.ep.dispatch.combine

# %% jupyter={"source_hidden": true}
# show: paralab.ep.dispatch.DispatchPlan

# %% [markdown]
# The layer routes, then dispatches, runs its local experts and combines; without a group it
# runs every expert in this process (`one_process`, a plain loop over experts with no
# permutation: the reference the ranks are checked against).

# %%
# show: paralab.ep.model.MoELayer.route paralab.ep.model.MoELayer.forward

# %%
# show: paralab.ep.model.MoELayer.one_process paralab.ep.model.MoELayer.add_shared

# %% jupyter={"source_hidden": true}
# show: paralab.ep.model.MoELayer.__init__

# %% [markdown]
# **The token journey.** Two ranks, 12 top-1 tokens each, `E` experts: each cell is one token
# (`source.token`), coloured by its expert. Follow token `1.0`: where does it sit after the
# dispatch, and on which rank?

# %%
journey = reference_run(CONFIG.with_(top_k=1, seq=12), samples=2, steps=1)
show(viz.plot_token_journey([r.experts[:, 0] for r in journey["step0"]["routing"]], 2, EXPERTS))

# %% [markdown]
# ## 4. Ranks against one process: forward, loss, every gradient, two steps
#
# The model: a float64 embedding, one causal attention block and one MoE layer in place of
# its MLP, a linear head, cross-entropy plus `aux_coef` × the Switch load-balancing loss
# (section 6). Each rank loads its own sample; gradients are averaged like data parallelism:
#
# - dense parameters: all-reduce over all ranks, divide by the world;
# - experts: after the backward a rank's expert gradient already sums every token of its ep
#   group that chose that expert (combine's backward brought their gradients); all-reduce it
#   over the ranks that hold the same experts (`r, r + ep, ...`) and divide by the **world**,
#   not by that group's size.
#
# The reference is one process with every expert, routing each sample on its own (like its
# rank) and averaging the losses. **Predict:** are the routing decisions (which experts, which
# drops) equal bitwise? The floats? (Tolerance: `1e-12` of each tensor's largest magnitude:
# a rank's expert sees the rows of several samples in one matmul, so its sums run in another
# order.)

# %%
# show: paralab.ep.runs.sync_grads

# %%
# show: paralab.ep.runs.ep_worker

# %% jupyter={"source_hidden": true}
# show: paralab.ep.runs.step_record

# %%
RUNS = {}
for ep in (2, 4):
    for top_k in (1, 2):
        for factor in (None, 1.0):
            config = CONFIG.with_(top_k=top_k, capacity_factor=factor)
            RUNS[(ep, 1, top_k, factor)] = (config, run(ep_worker, ep, config, ep, 2, 0))
for top_k, factor in ((2, None), (1, 1.25)):
    config = CONFIG.with_(top_k=top_k, capacity_factor=factor)
    RUNS[(2, 4, top_k, factor)] = (config, run(ep_worker, 4, config, 2, 2, 0))

REFERENCES, step_claims, param_claims, byte_claims = {}, [], [], []
for (ep, dp, top_k, factor), (config, per_rank) in RUNS.items():
    ref = REFERENCES[(ep, dp, top_k, factor)] = reference_run(config, len(per_rank), 2, 0)
    label = f"ep={ep}" + (f" over dp={dp}" if dp > 1 else "") + f", top-{top_k}, c={factor}"
    step_claims.append(
        summary(f"{label}: step 0 = one process", check_step(per_rank, ref, ep, label))
    )
    param_claims.append(
        summary(f"{label}: params after 2 steps", check_params(per_rank, ref, label))
    )
    byte_claims.append(
        summary(f"{label}: ledger = routing formula", check_bytes(per_rank, config, ep, label))
    )
public = run(train, 4, 2, 4, experts=EXPERTS, top_k=2, steps=2)
param_claims.append(
    summary(
        "train(2, dp=4) = reference(samples=4), every expert on every rank",
        check_params(public, {"params": reference(experts=EXPERTS, samples=4)}, "public"),
    )
)
print(verdict_table(step_claims, "routing bitwise; output, loss, every gradient (rel. 1e-12)"))
print(verdict_table(param_claims, "every parameter after 2 SGD steps (rel. 1e-12)"))

# %% [markdown]
# ## 5. Bytes: the split matrix and the ledger
#
# The split matrix of the ep = 4, top-2 run without capacity: who sends how many rows to
# whom. **Predict** from the formula: which rank sends the most in dispatch, which in combine?

# %%
config, per_rank = RUNS[(4, 1, 2, None)]
splits = step_splits(per_rank, 4)[0]
show(viz.plot_split_matrix(splits, "ep = 4, top-2: rows from rank i to rank j"))
rows = []
for rank, result in enumerate(per_rank):
    want = layer_bytes(splits, rank, config.dim, config.experts)
    got = measured_bytes(result["step0"]["records"])
    rows.append([str(rank)] + [f"{got[k]} / {want[k]}" for k in want])
print(text_table(["rank", *(f"{k} (ledger / formula)" for k in want)], rows))
print(verdict_table(byte_claims, "every rank's all-to-alls and gradient all-reduces = formula"))

# %% [markdown]
# ## 6. Imbalance, measured
#
# Tokens per expert in the same run, stacked by source rank, and rows per rank (what each
# expert rank receives). The router starts unbalanced here on purpose (its weights are drawn
# `gate_scale` = 2 times larger than a default Linear's).

# %%
counts = torch.stack([r["step0"]["send_counts"] for r in per_rank])
show(
    viz.plot_tokens_per_expert(
        counts, 4, title="ep = 4, top-2, no capacity: assignments per expert"
    )
)
received = splits.sum(dim=0)
print(
    "rows each rank's experts receive:",
    received.tolist(),
    f"(max / mean {received.max().item() / received.double().mean().item():.3g})",
)

# %% [markdown]
# **Drops against the capacity factor.** The same first step, one process, every capacity
# factor (the routing does not depend on the limit, so one routing per k serves them all,
# through `capacity_keep`): what fraction of the assignments is dropped? **Predict:** at `c = 1` (exactly the
# mean load per expert), is it zero?

# %%
FACTORS = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]
drop_rates = {}
for top_k in (1, 2):
    routed = reference_run(CONFIG.with_(top_k=top_k), 4, 1)["step0"]["routing"]
    drop_rates[f"top-{top_k}"] = [
        1
        - sum(
            int(capacity_keep(r.experts, EXPERTS, capacity(CONFIG.seq, EXPERTS, top_k, c)).sum())
            for r in routed
        )
        / (4 * CONFIG.seq * top_k)
        for c in FACTORS
    ]
show(viz.plot_drop_rate(FACTORS, drop_rates))
print(
    text_table(
        ["c", *drop_rates],
        [
            [f"{c:g}", *(f"{drop_rates[k][i]:.3g}" for k in drop_rates)]
            for i, c in enumerate(FACTORS)
        ],
    )
)

# %% [markdown]
# **The auxiliary loss.** Switch's `E·Σ_e f_e·P_e` (`f_e` the fraction of assignments to
# expert `e`, `P_e` its mean router probability) is 1 for a uniform load (`f_e = 1/E`) and
# grows as load and probability pile onto the same experts; only `P_e` carries a gradient, and it pulls probability away from the overloaded
# experts. Twenty steps of the one-process model with `aux_coef` 0 and 0.5 (the ranks matched
# it for the 2 steps of section 4, at `aux_coef` 0.01; these 20 run in one process only):
# **predict** which one ends more balanced.

# %%
# show: paralab.ep.router.switch_aux_loss

# %%
history = {}
for coef in (0.0, 0.5):
    trained = reference_run(CONFIG.with_(aux_coef=coef), 4, 20)
    history[f"aux_coef = {coef:g}"] = [
        (sum(c).max() / sum(c).double().mean()).item() for c in trained["kept_counts"]
    ]
show(viz.plot_balance_history(history))
print(
    text_table(
        ["run", "max/mean at step 0", "step 10", "step 19"],
        [[k, *(f"{v[i]:.3g}" for i in (0, 10, 19))] for k, v in history.items()],
    )
)

# %% [markdown]
# ## 7. Bug clinic: one exchange skipped
#
# A bug from real MoE code, seeded as a patch set, `run(..., patches=lean_dispatch())`
# (`paralab.exercises.lab09`; do not read it yet): one decision of `dispatch` is swapped,
# the rest is the package's. It runs twice on 2 ranks: first on this lab's top-2 routing,
# then on a top-1 routing. **Predict** what each run does before opening the answer.

# %%
CLINIC = CONFIG.with_(experts=4)  # the routing the answer below talks about, whatever EXPERTS is
try:
    run(ep_worker, 2, CLINIC, 2, 1, 0, patches=lean_dispatch(), timeout=30)
    first_run = "finished"
except LaunchError as exc:
    first_run = str(exc).splitlines()[0]
aborted = "killed by SIGABRT" in first_run
print("top-2 run: a rank killed by SIGABRT inside all_to_all_single:", aborted)

# %% [markdown]
# Then the top-1 routing, against one process: which tokens' outputs differ?

# %%
top1 = CLINIC.with_(top_k=1)
correct = reference_run(top1, 2, 1)
buggy = run(ep_worker, 2, top1, 2, 1, 0, patches=lean_dispatch())
diff = torch.stack(
    [
        (b["step0"]["logits"] - c).abs().amax(dim=1)
        for b, c in zip(buggy, correct["step0"]["logits"])
    ]
)
show(
    viz.plot_rank_strip(
        torch.zeros_like(diff),
        diff,
        [("tokens", CONFIG.seq)],
        "top-1: largest |buggy - correct| logit per token",
    )
)
wrong = [torch.nonzero(d > 1e-12).flatten().tolist() for d in diff]
print("tokens whose output is wrong, per rank:", wrong)
print("split matrix:", split_matrix([r["step0"]["send_counts"] for r in buggy], 2).tolist())
predicted = misrouted_tokens([r.experts for r in correct["step0"]["routing"]], 2, 4)
print(
    verdict_table(
        [
            claim(
                "clinic: the top-2 run dies in the all-to-all",
                aborted,
                "a rank aborted (SIGABRT)",
            ),
            claim(
                "clinic: the top-1 run finishes with wrong outputs",
                all(wrong),
                f"{sum(map(len, wrong))} tokens differ",
            ),
            claim(
                "clinic: the wrong tokens are exactly the misrouted ones",
                wrong == predicted,
                str(predicted),
            ),
        ],
        "bug clinic",
    )
)

# %% [markdown]
# **What is wrong?** Look at the split matrix of the top-1 run and at which tokens differ.

# %% [markdown]
# <details><summary>Answer</summary>
#
# The count exchange is skipped: `lean_dispatch` replaces `exchange_counts` by
# `counts_as_sent`, which takes what a rank **sends** each rank as what it **receives** from
# it (the send splits used as the receive splits). An `all_to_all_single` with splits checks
# nothing across ranks; each rank only trusts its own numbers.
#
# - **Top-2**: rank 1 sends rank 0 more rows than rank 0 sends rank 1, so rank 0's receive
#   buffer is too small; gloo aborts the process (SIGABRT) and its peer is stopped. The shapes
#   fail: loud, at once.
# - **Top-1, this seed**: the totals agree (`M[0, 1] = M[1, 0] = 14`), so every buffer has the
#   right size and the run finishes. But the receiver cuts what arrived into blocks per local
#   expert with *its own* send counts: rows of one expert are handed to the other local
#   expert. The wrong tokens are exactly those whose rows landed in another expert's block
#   (`misrouted_tokens` computes them from the routing alone); every other token is right, so
#   a loss that is merely "close" could hide it. With padding to capacity (every count equal)
#   the bug is invisible, which is how it survives in code copied from a drop-and-pad path.
#
# The fix is the exchange: one all-to-all of `E` integers per layer.
# </details>

# %% [markdown]
# ## 8. Routing as production runs it
#
# Everything above is the textbook layer. Production MoE code changes five of its decisions
# ([chapter 02](02_routing_in_production.md) reads each in Megatron-LM and torchtitan).
# Dropless is already this notebook's default (`capacity_factor=None`, on the ranks in
# section 4); the other four are options of `MoEConfig`, off by default, and each runs on the
# ranks against one process below:
#
# | decision | above | production | option |
# |---|---|---|---|
# | capacity | optional | none: dropless (Megatron's and torchtitan's default) | `capacity_factor=None` |
# | local experts | a loop | one grouped matmul, blocks aligned to 8 rows (torchtitan's default) | `grouped_mm=True` |
# | shared expert | none | one dense MLP every token runs (torchtitan's default) | `shared_experts=1` |
# | balancing | Switch aux loss | a per-expert bias for the choice only (DeepSeek-V3, torchtitan's default) | `bias_rate` |
# | gate weight | on the expert's output | on its input (torchtitan's default) | `score_before_experts=True` |
#
# **Dropless.** With no capacity every assignment is sent and the all-to-all's splits are
# whatever the router produced: the count exchange of section 3 is what makes them known.
# **Predict:** in the runs of section 4, which ones kept every assignment, and do their splits
# vary from rank to rank?

# %%
from paralab.ep.dispatch import run_local_experts
from paralab.ep.grouped import aligned_layout, aligned_sizes, padded_batch, run_grouped_experts
from paralab.ep.layout import network_assignments, network_tokens, tokens_per_node

rows = []
for (ep, dp, top_k, factor), (_, per_rank) in RUNS.items():
    kept = sum(int(r["step0"]["keep"].sum()) for r in per_rank)
    splits = torch.cat([m.reshape(-1) for m in step_splits(per_rank, ep)])
    rows.append(
        [
            f"ep={ep}, dp={dp}, top-{top_k}",
            str(factor),
            f"{kept} / {len(per_rank) * CONFIG.seq * top_k}",
            f"{int(splits.min())} .. {int(splits.max())}",
        ]
    )
print(text_table(["run", "capacity", "assignments kept", "split matrix entries"], rows))

# %% [markdown]
# **The grouped matmul.** After dispatch a rank's rows are grouped by local expert, a different
# count each. torchtitan runs all its local experts in one `torch._grouped_mm` over the rows laid
# out flat, each expert's block padded with zero rows to a multiple of 8 and to at least 8 (an
# expert with no rows still gets a block). `torch._grouped_mm` has no float64 kernel, so the lab
# runs the honest CPU stand-in: the aligned blocks padded again to the longest one, a
# `(local experts, rows, dim)` batch for `torch.baddbmm`; the padding rows are computed and thrown
# away. (`tests/test_ep_production.py` runs `torch._grouped_mm` itself on the aligned layout in
# float32.) **Predict:** local experts receiving 5, 0 and 19 rows: what shape does each batch have?

# %%
# show: paralab.ep.grouped.aligned_sizes paralab.ep.grouped.run_grouped_experts

# %%
counts = [5, 0, 19]
rows = torch.randn(
    sum(counts), CONFIG.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
)
flat, offsets = aligned_layout(rows, counts, 8)
print(
    f"blocks {aligned_sizes(counts, 8)}: torch._grouped_mm's input {tuple(flat.shape)}, "
    f"offs {offsets.tolist()}; the stand-in's batch {tuple(padded_batch(rows, counts, 8).shape)}"
)
show(viz.plot_grouped_batch(counts, 8))
experts = [make_model(CONFIG.with_(experts=3), 0).moe.experts[str(e)] for e in range(3)]
loop, grouped = (
    run_local_experts(experts, rows, counts),
    run_grouped_experts(experts, rows, counts, 8),
)
close = (loop - grouped).abs().max() <= 1e-12 * loop.abs().max()
print("grouped = loop within 1e-12 of the largest output:", bool(close))

# %% [markdown]
# The grouped result equals the loop within float64 rounding, not bitwise in general: BLAS picks
# its blocking by the matrix's shape, so padding can change the order of a sum.
#
# **A shared expert** is a dense MLP that every token runs, added unweighted to the routed sum.
# Its parameters are dense: replicated on every rank, their gradients averaged over all
# data-parallel ranks like the attention's. **The gate weight** can scale a row before its
# expert (torchtitan) or its output (Megatron, and sections 1 to 7). For an expert with a
# nonlinearity, `expert(w·x)` is not `w·expert(x)`: another model, not a reordering.
# **Predict:** do the ranks still equal one process with each option? Does moving the weight
# change the layer's output?

# %%
PRODUCTION = {
    "grouped matmul": CONFIG.with_(grouped_mm=True),
    "shared expert": CONFIG.with_(shared_experts=1),
    "score before experts": CONFIG.with_(score_before_experts=True),
    "expert bias (rate 0.01, no aux loss)": CONFIG.with_(bias_rate=0.01, aux_coef=0.0),
    "all four, top-1, c = 1": CONFIG.with_(
        grouped_mm=True,
        shared_experts=1,
        score_before_experts=True,
        bias_rate=0.01,
        top_k=1,
        capacity_factor=1.0,
    ),
}
production_claims = []
for name, config in PRODUCTION.items():
    per_rank = run(ep_worker, 4, config, 2, 3, 0)
    ref = reference_run(config, 4, 3, 0)
    verdicts = check_step(per_rank, ref, 2, name) + check_params(per_rank, ref, name)
    verdicts += check_bytes(per_rank, config, 2, name)
    production_claims.append(summary(f"dp=4 ep=2, {name}: 3 steps = one process", verdicts))
print(
    verdict_table(
        production_claims,
        "routing bitwise; output, loss, gradients, params (rel. 1e-12); bias bitwise; bytes = formula",
    )
)
x = torch.randn(
    CONFIG.seq, CONFIG.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
)
after, _ = make_model(CONFIG, 0).moe(x)
before, _ = make_model(CONFIG.with_(score_before_experts=True), 0).moe(x)
print(f"largest |before - after| in the layer's output: {(before - after).abs().max().item():.3g}")

# %% [markdown]
# **Balancing without an auxiliary loss.** DeepSeek-V3 adds a per-expert bias to the scores it
# chooses by, and only there: a chosen expert's gate weight is its unbiased probability. The
# bias is not trained. After each step every rank sums its tokens per expert (one all-reduce of
# `E` numbers, in the ledger above), and the bias of an overloaded expert falls by a fixed rate,
# that of an underloaded one rises (torchtitan's update, which also removes the mean).

# %%
# show: paralab.ep.balance.biased_top_k paralab.ep.balance.updated_bias

# %% [markdown]
# Twenty steps of the one-process model from the same unbalanced start: no balancing, the
# Switch loss of section 6 at `aux_coef` 0.5, and the bias at rate 0.01 with no aux loss. (The
# ranks matched the bias run for its first 3 steps above, the bias bitwise; these 20 run in one
# process only.) **Predict:** which ends closest to the mean, and which experts' lines move?

# %%
BALANCING = {
    "no balancing": CONFIG.with_(aux_coef=0.0),
    "Switch aux loss, coef 0.5": CONFIG.with_(aux_coef=0.5),
    "expert bias, rate 0.01": CONFIG.with_(aux_coef=0.0, bias_rate=0.01),
}
loads, biases = {}, {}
for name, config in BALANCING.items():
    trained = reference_run(config, 4, 20)
    loads[name] = torch.stack([sum(c) for c in trained["kept_counts"]])
    biases[name] = trained["bias"][-1]
show(viz.plot_load_over_steps(loads))
print(
    text_table(
        ["run", "max/mean at step 0", "step 10", "step 19", "bias after step 19"],
        [
            [
                name,
                *(f"{(load[i].max() / load[i].double().mean()).item():.3g}" for i in (0, 10, 19)),
                str([round(b, 3) for b in biases[name].tolist()]),
            ]
            for name, load in loads.items()
        ],
    )
)

# %% [markdown]
# **Across nodes: what DeepEP would send.** This lab's all-to-all sends one row per assignment.
# DeepEP's internode dispatch sends a token over the network once per destination **node**,
# however many of its experts sit there, and fans it out over NVLink inside the node; its
# `get_dispatch_layout` counts these per node first (`num_tokens_per_rdma_rank`,
# [chapter 01](01_dispatchers_upstream.md)). Read the ep = 4 run of section 4 as 2 nodes of 2
# ranks. **Predict:** per rank, how many rows cross nodes in the lab's all-to-all, and how many
# tokens in DeepEP's?

# %%
# show: paralab.ep.layout.tokens_per_node

# %%
rows = []
for rank, result in enumerate(RUNS[(4, 1, 2, None)][1]):
    experts, node = result["step0"]["experts"], rank // 2
    rows.append(
        [
            str(rank),
            str(node),
            str(tokens_per_node(experts, EXPERTS, 4, 2).tolist()),
            str(network_assignments(experts, EXPERTS, 4, 2, node)),
            str(network_tokens(experts, EXPERTS, 4, 2, node)),
        ]
    )
print(
    text_table(
        [
            "rank",
            "node",
            "tokens per node",
            "lab: rows across nodes",
            "DeepEP: tokens across nodes",
        ],
        rows,
    )
)

# %% [markdown]
# Those counts come from the routing. **Check** them against what the ranks sent:
# `sent_per_node` reads, off a rank's step-0 dispatch, the rows it sent to each node and the
# distinct tokens among them; `check_layout` compares both, exactly, with DeepEP's counts on the
# routing of section 4's one-process reference, for 2 nodes of 2 ranks and for 4 nodes of 1.

# %%
# show: paralab.ep.layout.sent_per_node

# %%
shown = (4, 1, 2, None)  # the run in the table: ep = 4, top-2, no capacity
config, per_rank = RUNS[shown]
layout_claims = [
    summary(
        f"ep=4 as {4 // per_node} nodes of {per_node}: each rank's dispatch = DeepEP's layout",
        check_layout(per_rank, REFERENCES[shown], config, 4, per_node, f"{per_node} a node"),
    )
    for per_node in (2, 1)
]
print(verdict_table(layout_claims, "tokens sent to each node, rows across nodes (exact)"))

# %% [markdown]
# ## Closing note

# %%
config, per_rank = RUNS[(2, 4, 2, None)]
group_splits = step_splits(per_rank, 2)
table = [
    "| rank | ep group | dispatch B | combine B | count exchange B | formula |",
    "|---|---|---|---|---|---|",
]
for rank, result in enumerate(per_rank):
    got = measured_bytes(result["step0"]["records"])
    table.append(
        f"| {rank} | {rank // 2} | {got['dispatch']} | {got['combine']} | {got['counts']} | "
        "`R·Σ_{j≠r} M[r,j]`, `R·Σ_{i≠r} M[i,r]`, `8(E−E/ep)` |"
    )
display(
    Markdown(
        f"dp = 4 with ep = 2, top-2, no capacity: bytes each rank sent in step 0 as the ledger counted "
        f"them (the modelled bytes at the API; R = {config.dim}·8). Split matrices per ep group: "
        f"{[m.tolist() for m in group_splits]}. Section 5 checks every one against the formula.\n\n"
        + "\n".join(table)
    )
)

# %% [markdown]
# ## What to try
#
# 1. Set `EXPERTS = 8` in the first code cell and re-run from the top. Do all verdicts still
#    hold at ep = 2 and 4? How does the split matrix change?
#
#    <details><summary>Hint</summary>Everything passes: nothing assumes E = 4, only that ep
#    divides E. Each rank now holds 2 or 4 experts, and the regroup step of dispatch has
#    more blocks to cut.</details>
# 2. Predict, then run in a new cell: `run(ep_worker, 4, CONFIG, 4, 2, 0)` — ep = 4 over the
#    4 dp ranks (one ep group, each expert on one rank). Check it with `check_params(...,
#    reference_run(CONFIG, 4, 2, 0), "ep=4 dp=4")`. How many all-reduces does the gradient
#    sync make now?
#
#    <details><summary>Hint</summary>One: the expert-data-parallel groups have a single rank,
#    so only the dense all-reduce runs, and the expert gradients are divided by the world.</details>
# 3. In the clinic, run the top-1 case with `reference_run(top1, 2, 1, 4)` and seed 4 in the
#    `run(...)` call (its last argument). Which tokens are wrong now?
#
#    <details><summary>Hint</summary>Seed 4's totals also agree (12 and 12), so it runs;
#    `misrouted_tokens` on its routing names the wrong tokens before you run.</details>
# 4. Hand the ranks a renormalized router: `run(ep_worker, 2, CONFIG.with_(renormalize=True),
#    2, 2, 0)` against `reference_run(CONFIG.with_(renormalize=True), 2, 2, 0)` with
#    `check_params`. Still equal? Then, in one process, compare
#    `reference_run(CONFIG.with_(top_k=1, renormalize=True, aux_coef=0.0), 2, 1)["step0"]["grads"]["moe.gate.weight"]`
#    with the same run at `renormalize=False`.
#
#    <details><summary>Hint</summary>Equal. With top-1 a renormalized weight is `p / p = 1`,
#    so without the aux loss the gate's gradient is zero up to rounding (about 1e-18 against
#    about 0.02 unrenormalized): nothing trains the router but the aux loss.</details>
# 5. In section 8's DeepEP table cell, read the ep = 4 run as 4 nodes of one rank
#    (`tokens_per_node(experts, EXPERTS, 4, 1)`, and `network_tokens(..., 4, 1, rank)`). Which
#    tokens does DeepEP now send once where the lab sends two rows? Then set `EXPERTS = 8`.
#
#    <details><summary>Hint</summary>None at `EXPERTS = 4`: each rank holds one expert, and a
#    token's two experts are distinct, so every rank's two columns are equal. With one rank a
#    node, a node count is DeepEP's `num_tokens_per_rank`: a top-2 token is sent once when both
#    its experts sit on one rank, which needs two experts a rank, as at `EXPERTS = 8`. With more
#    experts a rank that happens more often, and the per-node saving grows with the ranks a node
#    holds.</details>
# 6. Megatron's `get_updated_expert_bias` moves the bias by `rate·sign(mean − load)` without
#    removing the mean. Patch `updated_bias` with that rule (`from paralab.patches import
#    patched`, then `with patched({"paralab.ep.balance": {"updated_bias": ...}}):`) and re-run
#    the balancing cell. Does the bias still sum to zero? Does the choice change?
#
#    <details><summary>Hint</summary>The sum drifts, but adding the same number to every
#    expert's score changes no top-k choice (up to rounding): here every step routes the same
#    tokens to the same experts, and only the bias values differ.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
