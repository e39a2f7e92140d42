# %% [markdown]
# # Lab 02 — Context parallelism: ring attention vs Ulysses, forward and backward
#
# **You will learn** how one sequence is split over `cp` ranks (contiguous and zigzag
# shards), how ring attention merges key blocks with the log-sum-exp rule and passes K/V
# round the ring, how Ulysses turns a sequence split into a head split with all-to-alls,
# why both backwards are written by hand, and what each sends per rank (checked against
# the ledger). **Prerequisites:** lab 00 (`ParallelDims`, the cp mesh), the collectives
# primer (send/recv, all-to-all, all-gather), and softmax attention. **Time:** about 45
# minutes to read; the run time of this notebook is printed by its last cell.
#
# **What is split.** One sequence too long for one device: its tokens are cut into
# `cp` shards, one per rank of the cp group. Per-token layers (MLPs, norms,
# projections) run on the local shard unchanged, with three things the model around them
# must get right:
# - **global positions**: a rotary or learned position embedding needs each token's
#   position in the whole sequence, not in the shard (section 1 prints the positions each
#   rank holds, contiguous and zigzag);
# - **the loss normalized across the cp group**: a mean over tokens must divide the sum
#   over all shards by the global token count, not each shard's sum by its own count;
# - **parameter gradients reduced over the cp ranks**: each rank's weight gradient
#   covers only its tokens, so they must be summed over cp; torchtitan does it by
#   sharding FSDP over the flattened `dp_shard × cp` group (lab 00 section 4 builds it).
#
# This lab checks attention alone (its dq, dk, dv belong to each rank's own tokens); no
# lab of the suite runs a cp training step with a loss yet, so the last two are stated,
# not shown.
#
# Attention cannot run on the shard alone: every query must see every key. Two exact answers:
#
# | | **Ring attention** | **Ulysses** |
# |---|---|---|
# | idea | queries stay; K/V blocks travel round the ring, one hop per step | all-to-all from a *sequence* split to a *head* split, attend, all-to-all back |
# | forward | `cp-1` send/recv of the K/V block; partial outputs merged by log-sum-exp | 3 all-to-alls (q, k, v), full-sequence attention on `H/cp` heads, 1 all-to-all (out) |
# | backward | K/V travel again (`cp-1` hops) and their gradients dK/dV follow them home (`cp-1` hops) | mirror: all-to-all of dout in, attention backward, 3 all-to-alls of dq, dk, dv out |
# | limit | none on heads; traffic per rank does not shrink with cp | `H % cp == 0` (and in practice the K/V head count) |
#
# Tensors are laid out like `scaled_dot_product_attention`: `(batch, heads, seq, head_dim)`.
#
# **Why the backward is written by hand.** For the ring the reason is state: the backward
# sends K/V round the ring again, with dK/dV accumulators following them home, and every
# step needs the forward's *final* lse and `delta`; that is a send/recv schedule with
# state across steps, which autograd cannot derive from the forward's sends (a `send` has
# no gradient formula). For Ulysses autograd-visible collectives could work: the backward
# of an all-to-all is the reverse all-to-all, and torch's functional collectives (funcol)
# carry it. What goes wrong is several *independent* differentiable collectives in one
# graph: autograd may issue their backward collectives in a different order on different
# ranks, and the ranks then pair the wrong messages (seen on gloo with three independent
# all_gathers of q, k, v: silently wrong gradients). One fused collective, or
# collectives whose order the graph forces, are fine. Both algorithms here are
# `torch.autograd.Function`s with one fixed collective order on every rank (and the
# replicated layout's backward is not the autograd default at all: section 7 shows why).
#
# **Traffic, the formulas this lab checks.** Let `S` be the bytes of one rank's shard of
# ONE of q, k, v: `S = B·H·(N/cp)·D·8` in float64. Bytes each rank *sends*:
#
# | | forward | backward |
# |---|---|---|
# | ring | `2(cp-1)·S` (K and V, `cp-1` hops) | `4(cp-1)·S` (K/V again, plus dK/dV home) |
# | Ulysses, `sequence_sharded` | `4·(cp-1)/cp·S` (4 all-to-alls, each keeps `1/cp`) | `4·(cp-1)/cp·S` |
# | Ulysses, `replicated` | `(cp-1)·S` (all-gather of the output's heads) | `3(cp-1)·S` (all-gather of dq, dk, dv heads) |
#
# Ring over Ulysses in the forward: `2(cp-1)S / (4(cp-1)S/cp) = cp/2`: equal at cp = 2,
# Ulysses sends `cp/2` times less beyond.

# %%
import time

import torch
import torch.nn.functional as F
from IPython.display import Markdown, display

from paralab import viz
from paralab.check import CheckFailed, assert_match, claim, compare, summary, verdict_table
from paralab.cp import runs as cp_runs
from paralab.cp import shard_bytes
from paralab.cp.costs import ring_bytes, ulysses_bytes
from paralab.cp.runs import (
    CONFIGS,
    PHASES,
    assemble,
    bytes_formula,
    bytes_sent,
    check_bytes,
    check_config,
    sdpa_reference,
)
from paralab.exercises.lab02 import (
    merge_without_rescaling,
    replicated_clinic_bug,
    ring_clinic_bug,
)
from paralab.launch import run
from paralab.ledger import format_table, sent
from paralab.tables import text_table
from paralab.viz import show

LAB_START = time.monotonic()
B, H, N, D = (
    2,
    24,
    48,
    5,
)  # not powers of two: 24 heads (divisible by 2, 4, 8), 48 tokens = 16 chunks of 3
CPS = (2, 4, 8)

# %% [markdown]
# ## 1. Where the tokens live: contiguous and zigzag shards
#
# Contiguous: rank `r` holds chunk `r` of `cp` equal chunks. With a causal mask that is
# unfair: rank 0's queries see only their own chunk, the last rank's see everything.
# Zigzag cuts `2·cp` chunks and gives rank `r` chunks `r` and `2·cp-1-r`: one early,
# one late, the same causal work on every rank (section 3 draws it).

# %%
# show: paralab.cp.layout.chunk_ids paralab.cp.layout.shard_sequence paralab.cp.layout.unshard_sequence

# %%
positions = torch.arange(16).reshape(1, 1, 16, 1)
for zigzag in (False, True):
    shards = [shard_sequence(positions, r, 4, zigzag=zigzag) for r in range(4)]
    assert torch.equal(unshard_sequence(shards, zigzag=zigzag), positions)
    print(
        f"{'zigzag' if zigzag else 'contiguous':>10}:",
        "  ".join(f"rank {r} {s.flatten().tolist()}" for r, s in enumerate(shards)),
    )
try:
    shard_sequence(torch.zeros(1, 1, 12, 1), 0, 4, zigzag=True)
except ValueError as exc:
    print("ValueError:", exc)

# %% [markdown]
# ## 2. The log-sum-exp merge: attention over key blocks, one block at a time
#
# Split the keys into blocks. A block returns its softmax-normalized output `out_B` and
# `lse_B = log Σ_j exp(s_j)` over its own scores. The full softmax weight of a key is its
# block weight times `exp(lse_B - lse)`, where `lse = log(Σ_B exp(lse_B))` covers all
# keys. So two partial results merge into one by
#
# `lse' = logaddexp(lse_1, lse_2)`,  `out' = exp(lse_1 - lse')·out_1 + exp(lse_2 - lse')·out_2`.
#
# Both factors lie in `[0, 1]`: nothing overflows, however large the scores (that is the
# numerically stable form; `exp(lse)` itself would overflow). One case needs a guard: a
# query row that sees no key of either part. This lab's causal mask never makes one (a
# query always sees its own position), but padding, or a packed-sequence mask that hides
# a whole block from a query of another document, does: the block's partial is
# `(0, -inf)`, and `exp(-inf - (-inf))` is NaN. `merge_partials` keeps such rows at
# `(0, -inf)`, so later blocks still merge into them exactly
# (`tests/test_cp_blocks.py::test_merge_stays_finite_when_a_whole_block_is_masked`). The backward needs only the
# *final* `lse` and `delta = rowsum(dout * out)`: from them each block rebuilds its slice
# of the full softmax, `P = exp(S_B - lse)`, and its gradients, wherever its K/V happen to be.

# %%
# show: paralab.cp.blocks.attention_block

# %%
# show: paralab.cp.blocks.merge_partials

# %% [markdown]
# The backward of one block, from the final `lse` and `delta` only (its score helper
# `_scores`, the scaled and masked `q·kᵀ`, is folded below it):

# %%
# show: paralab.cp.blocks.attention_block_backward

# %% jupyter={"source_hidden": true}
# show: paralab.cp.blocks._scores


# %%
g = torch.Generator().manual_seed(0)
q1, k1, v1 = (
    4 * torch.randn(B, 3, 10, D, dtype=torch.float64, generator=g) for _ in range(3)
)  # large scores
reference = F.scaled_dot_product_attention(q1, k1, v1)
partials = [attention_block(q1, k1[:, :, a:b], v1[:, :, a:b]) for a, b in ((0, 3), (3, 7), (7, 10))]
out, lse = partials[0]
for block in partials[1:]:
    out, lse = merge_partials(out, lse, *block)
merge_verdicts = compare(
    out, reference, atol=1e-12 * reference.abs().max().item(), name="3 key blocks merged vs SDPA"
)

unscaled, unscaled_lse = partials[0]  # the classic bug: add partial outputs without rescaling
for block in partials[1:]:
    unscaled, unscaled_lse = merge_without_rescaling(unscaled, unscaled_lse, *block)
try:
    assert_match(
        unscaled,
        reference,
        atol=1e-12 * reference.abs().max().item(),
        name="merged WITHOUT rescaling",
    )
    print("broken merge NOT caught")
except CheckFailed as exc:
    print(
        "broken merge (no rescaling) caught by the check:",
        exc.verdicts[0].n_diff == exc.verdicts[0].numel,
        "(every element differs)",
    )
print(verdict_table(merge_verdicts, "log-sum-exp merge, one process"))

# %% [markdown]
# ## 3. The ring, step by step
#
# At step `s` rank `r` holds the K/V block of rank `(r - s) mod cp`; while it computes
# with it, the block is already on its way to rank `r+1` (`batch_isend_irecv`, started
# before the compute and waited after it). With a causal mask, a (query chunk, key chunk)
# pair is either fully in the past (full), on the diagonal (a triangle) or entirely in
# the future (skipped: no compute, but the block still travels, because the next rank
# needs it).

# %%
# show: paralab.cp.layout.kv_source paralab.cp.layout.block_kind paralab.cp.layout.ring_blocks paralab.cp.layout.causal_work

# %% [markdown]
# **Predict before you run.** Contiguous shards, causal mask, cp = 4: which rank does the
# most attention work, and how many times the work of the least busy rank?
#
# <details><summary>Answer</summary>
#
# The last rank, rank 3: its queries see all four chunks (3.5 blocks of work: three full
# blocks and its own diagonal triangle), while rank 0's see only its own chunk (half a
# block): 7 times more. Zigzag gives every rank 2 blocks.
# </details>

# %%
show(viz.plot_ring_timeline(4))
show(viz.plot_causal_ownership(4))
for cp in CPS:
    for zigzag in (False, True):
        work = [
            sum(causal_work(r, s, cp, causal=True, zigzag=zigzag) for s in range(cp))
            for r in range(cp)
        ]
        print(
            f"cp={cp} {'zigzag    ' if zigzag else 'contiguous'} causal work per rank {work}: "
            f"slowest/mean = {max(work) / (sum(work) / cp):.3f}"
        )

# %% [markdown]
# Contiguous: rank `r` does `r + 1/2` blocks of work; the slowest rank sets the pace, so
# the step takes `(cp - 1/2) / (cp/2) = 2 - 1/cp` times the balanced time. Zigzag: each
# rank does exactly `cp/2` blocks, and after step 0 exactly half a block per step (it
# either attends all its queries to the first half of the visiting K/V, or its second
# half of queries to all of it).
#
# The ring itself. The forward keeps one running `(out, lse)` per query chunk and merges
# each new block into it with `merge_partials`. The backward runs the ring again: K/V
# travel as in the forward, and a `dK/dV` accumulator travels with each block, gaining
# every rank's contribution, and arrives home after `cp-1` hops (each rank keeps its own
# contribution to its own block at home).

# %%
# show: paralab.cp.ring.ring_forward

# %% [markdown]
# One hop: every rank posts its send to `rank + 1` and its receive from `rank - 1` together,
# so no rank waits for another to start.

# %%
# show: paralab.cp.ring.ring_pass

# %% [markdown]
# The backward (folded: open it to read it) runs the same loop, with the `dK/dV`
# accumulators riding along with K/V; then the plumbing: the `autograd.Function` that
# pairs the two and the public entry point (shard checks, zigzag chunking).

# %% jupyter={"source_hidden": true}
# show: paralab.cp.ring.ring_backward

# %% jupyter={"source_hidden": true}
# show: paralab.cp.ring._wait paralab.cp.ring._chunks paralab.cp.ring.RingAttention paralab.cp.ring.ring_attention

# %% [markdown]
# A tiny run of what was just shown: 2 ranks, 8 tokens, causal and zigzag. Each rank
# holds 4 tokens of q, k, v, calls `ring_attention`, and backpropagates; the parent
# reassembles the shards of the output and of dq and compares them with full SDPA (the
# job and the check are folded; the run is the cell after them).


# %% jupyter={"source_hidden": true}
def tiny_attention(full, attention, zigzag=False, **kw):
    """This rank's shards of q, k, v in; its shards of out and dq (after out.sum().backward()) back."""
    import torch.distributed as dist

    rank, cp = dist.get_rank(), dist.get_world_size()  # the cp group is the whole world
    q, k, v = (shard_sequence(t, rank, cp, zigzag=zigzag).clone().requires_grad_() for t in full)
    out = attention(q, k, v, causal=True, **({"zigzag": zigzag} if zigzag else {}), **kw)
    out.sum().backward()
    return {
        "tokens": shard_sequence(
            torch.arange(full[0].shape[2]).reshape(1, 1, -1, 1), rank, cp, zigzag=zigzag
        )
        .flatten()
        .tolist(),
        "out": out.detach(),
        "dq": q.grad,
    }


def tiny_check(name, results, zigzag):
    full = [t.clone().requires_grad_() for t in TINY]
    ref = F.scaled_dot_product_attention(*full, is_causal=True)
    ref.sum().backward()
    for rank, r in enumerate(results):
        print(f"{name} rank {rank} holds tokens {r['tokens']}")
    found = []
    for key, expected in (("out", ref.detach()), ("dq", full[0].grad)):
        got = unshard_sequence([r[key] for r in results], zigzag=zigzag)
        found += compare(got, expected, atol=1e-12, name=f"{name}: {key} on 2 ranks = SDPA")
    return found


# %%
TINY = [
    torch.randn(1, 4, 8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    for _ in range(3)
]
tiny_verdicts = tiny_check(
    "ring", run(tiny_attention, 2, TINY, ring_attention, zigzag=True), zigzag=True
)
print(verdict_table(tiny_verdicts, "a tiny ring run"))


# %% [markdown]
# ## 4. Ulysses: a sequence split becomes a head split
#
# `seq_to_heads` cuts the local shard's heads into `cp` groups and sends group `j` to
# rank `j`; rank `j` receives its heads for every sequence shard, i.e. the full sequence
# on `H/cp` heads. Attention per head is independent, so each rank runs ordinary
# attention, and `heads_to_seq` (the same all-to-all, read backwards) returns the output
# to sequence shards. The backward of an all-to-all is the reverse all-to-all. Each is
# three steps: *pack* the local tensor into `cp` blocks (block `j` for rank `j`),
# *exchange* them (`all_to_all_single`), *unpack* the received blocks (block `i` came
# from rank `i`); every layout decision sits in a pack or an unpack.
#
# This implementation's Ulysses takes contiguous shards: after the all-to-all it reads the
# sequence in rank order and applies a plain causal mask to it. That is a choice of this
# code, not of Ulysses: with zigzag shards the gathered sequence is permuted, and the mask
# and positions must be permuted to match (as USP, the unified sequence-parallel code of
# xDiT/yunchang, does). Zigzag buys Ulysses nothing anyway: every rank attends over the
# full sequence, so its causal work is balanced by construction.
#
# **Replicated layout.** If every cp rank already holds the full q, k, v (and wants the
# full output), no input all-to-all is needed: take your heads locally, attend, and
# all-gather the output's heads. Backward: the output is consumed identically on every
# rank, so `dout` is the same everywhere and the backward of the all-gather is a **slice**.
# A reduce-scatter would sum `cp` identical copies and give `cp` times the gradient (it is
# the right backward only when each rank's downstream computation differs). The backward
# of "take my heads" is an all-gather of the heads of dq, dk, dv, so every rank ends with
# the full gradient, like the full input it started with.

# %% [markdown]
# Who holds which (token chunk, head group) block before and after the all-to-all, at
# cp = 4 with this lab's 24 heads and 48 tokens:

# %%
show(viz.plot_ulysses_reshape(4, H, N))

# %% [markdown]
# The two all-to-alls, each pack → exchange → unpack, and the attention between them:

# %%
# show: paralab.cp.ulysses.seq_to_heads paralab.cp.ulysses.heads_to_seq paralab.cp.ulysses.exchange_blocks

# %% [markdown]
# The packs and unpacks, where every layout decision sits:

# %%
# show: paralab.cp.ulysses.pack_heads paralab.cp.ulysses.unpack_heads paralab.cp.ulysses.pack_seq paralab.cp.ulysses.unpack_seq

# %%
# show: paralab.cp.ulysses.UlyssesAttention

# %% [markdown]
# Plumbing (folded): the head-count check, the replicated layout's `take_heads` /
# `gather_heads`, and the public entry point.

# %% jupyter={"source_hidden": true}
# show: paralab.cp.ulysses.check_heads_divisible paralab.cp.ulysses.take_heads paralab.cp.ulysses.gather_heads paralab.cp.ulysses.ulysses_attention

# %% [markdown]
# The same tiny run with Ulysses (contiguous shards; 4 heads over 2 ranks):

# %%
tiny_verdicts = tiny_check("Ulysses", run(tiny_attention, 2, TINY, ulysses_attention), zigzag=False)
print(verdict_table(tiny_verdicts, "a tiny Ulysses run"))


# %% [markdown]
# ## 5. Real runs at cp = 2, 4, 8: every output and gradient vs SDPA
#
# One launch per cp runs all eight configurations on the cp group from
# `ParallelDims(world, cp=world).cp_mesh`, under the ledger, forward and backward
# (`out.backward(dout)` with a fixed random `dout`). The reference is the full
# single-process `scaled_dot_product_attention` and its autograd gradients, here.
# The ranks import `paralab.cp` from its file and run the package's worker,
# `cp_runs.cp_worker`; an edit of a shown cell reaches them only when the launch passes
# it with `patches=`. This launch hands them this kernel's merge, hop and packs
# (`KERNEL_EDIT`), each keyed by the module that defines it, as its cell's header prints
# (a patch also reaches every module that imported the name). The configurations and
# the job each rank runs:

# %%
# show: paralab.cp.runs.cp_worker

# %% jupyter={"source_hidden": true}
# show: paralab.cp.runs.attend paralab.cp.runs.CPConfig paralab.cp.runs.rank_inputs

# %%
print("\n".join(config.name for config in CONFIGS))
g = torch.Generator().manual_seed(1)
FULL = [
    torch.randn(B, H, N, D, dtype=torch.float64, generator=g) for _ in range(4)
]  # q, k, v, dout
KERNEL_EDIT = {
    "paralab.cp.blocks": {"merge_partials": merge_partials},
    "paralab.cp.ring": {"ring_pass": ring_pass},
    "paralab.cp.ulysses": {
        "pack_heads": pack_heads,
        "unpack_heads": unpack_heads,
        "pack_seq": pack_seq,
        "unpack_seq": unpack_seq,
    },
}
runs = {
    cp: run(cp_runs.cp_worker, cp, FULL, CONFIGS, probe_heads=20, patches=KERNEL_EDIT, timeout=120)
    for cp in CPS
}
print("heads error at cp = 8:", runs[8][0]["heads_error"])
print("heads error at cp = 4:", runs[4][0]["heads_error"])

# %% [markdown]
# The claims first, one per configuration over cp = 2, 4, 8; the per-cp rows they
# stand on are in the folded output below. Each row stacks out, dq, dk, dv of one
# configuration into one tensor, each divided by the largest magnitude of its reference,
# so the `max |diff|` column is the error *relative to the reference* and the bound is `1e-12`. Sequence-sharded
# results are reassembled with `unshard_sequence`; replicated ones are checked on every
# rank. Ring and SDPA only agree closely, not bitwise: the ring sums the softmax in
# blocks in a different order. The last rows are bitwise (exact mode): Ulysses computes
# each head with the very same arithmetic as `attention_block` / `attention_block_backward`
# on the full tensors in one process, whatever cp is, because heads never mix.


# %%
def results(cp, config):
    """Every rank's result for one config at one cp."""
    return [r["results"][CONFIGS.index(config)] for r in runs[cp]]


by_config = {
    config.name: [v for cp in CPS for v in check_config(results(cp, config), config, FULL)]
    for config in CONFIGS
}
claims = [
    summary(f"{name} = SDPA at cp 2, 4, 8", [v for v in found if "vs SDPA" in v.path])
    for name, found in by_config.items()
]
claims.append(
    summary(
        "every Ulysses layout = attention_block, bitwise",
        [v for found in by_config.values() for v in found if "bitwise" in v.path],
    )
)
print(verdict_table(claims, "out, dq, dk, dv vs the one-process reference (relative, bound 1e-12)"))

# %% jupyter={"outputs_hidden": true}
verdicts = [v for found in by_config.values() for v in found]
print(verdict_table(verdicts, "the detail: one row per cp and configuration"))

# %% [markdown]
# ## 6. What crossed the wire: ledger vs formulas
#
# Every send, receive and all-to-all went through `torch.distributed` under the ledger.
# Per rank (in the ring every rank sends the same; in Ulysses too), bytes *sent*:

# %% jupyter={"outputs_hidden": true}
for config in (CONFIGS[2], CONFIGS[5], CONFIGS[7]):
    print(f"cp = 4, {config.name}, per rank:")
    print(format_table([r["records"] for r in results(4, config)]) + "\n")


# %% [markdown]
# **Predict before you run.** At cp = 8, how many times Ulysses' (sequence-sharded) bytes
# does the ring send per rank in the forward? And in the backward?
#
# <details><summary>Answer</summary>
#
# Forward `2(cp-1)S / (4(cp-1)S/cp) = cp/2 = 4`; backward `4(cp-1)S / (4(cp-1)S/cp) = cp = 8`.
# The table below prints both sides of every formula; the plot after it shows the trend.
# </details>

# %%
rows = []
for cp in CPS:
    for config in [
        c for c in CONFIGS if c.causal
    ]:  # masking changes compute, not traffic: print causal rows
        want, measured = bytes_formula(config, (B, H, N, D), cp), bytes_sent(results(cp, config))
        rows.append(
            (
                cp,
                shard_bytes(B, H, N, D, cp),
                config.name,
                *(x for k, p in enumerate(PHASES) for x in (want[p], int(measured[k].max()))),
            )
        )
print(
    text_table(
        ("cp", "S (B)", "configuration", "forward formula", "ledger", "backward formula", "ledger"),
        rows,
        align_right=(0, 1, 3, 4, 5, 6),
    )
)
FAMILIES = ("ring", "Ulysses sequence_sharded", "Ulysses replicated")
byte_verdicts = {name: [] for name in FAMILIES}
for cp in CPS:
    for config in CONFIGS:
        family = (
            FAMILIES[0] if config.algorithm == "ring" else FAMILIES[2 if config.replicated else 1]
        )
        byte_verdicts[family] += check_bytes(results(cp, config), config, (B, H, N, D))
byte_claims = [
    summary(f"{name}: ledger = formula, every rank, fwd and bwd", found)
    for name, found in byte_verdicts.items()
]
print(
    verdict_table(
        byte_claims,
        "\nbytes sent per rank, ledger vs closed form (exact), cp 2, 4, 8, causal or not",
    )
)

# %% jupyter={"outputs_hidden": true}
print(
    verdict_table(
        [v for found in byte_verdicts.values() for v in found],
        "the detail: one row per cp and configuration",
    )
)

# %%
series = {
    "ring": CONFIGS[2],
    "Ulysses sequence_sharded": CONFIGS[5],
    "Ulysses replicated": CONFIGS[7],
}
measured = {
    name: {p: [int(bytes_sent(results(cp, c))[k, 0]) for cp in CPS] for k, p in enumerate(PHASES)}
    for name, c in series.items()
}
formulas = {
    name: {p: [bytes_formula(c, (B, H, N, D), cp)[p] for cp in CPS] for p in PHASES}
    for name, c in series.items()
}
show(viz.plot_cp_bytes(list(CPS), measured, formulas, full_bytes=B * H * N * D * 8))

# %% [markdown]
# **What to conclude.** At a fixed sequence, the ring's bytes per rank *grow* towards
# `2×` (forward) and `4×` (backward) a full q tensor as cp grows, because every rank must
# see every other rank's K/V; Ulysses sequence-sharded *falls* as `4(cp-1)/cp²`, because
# each all-to-all moves only a shard. Divide the formulas: the ring sends `cp/2` times
# Ulysses' bytes in the forward, `cp` times in the backward (`4(cp-1)S` against
# `4(cp-1)S/cp`) and `3cp/4` times over a training step (`6(cp-1)S` against `8(cp-1)S/cp`).
# So they tie at cp = 2 in the forward only; over a training step the ring already sends
# more at cp = 2. The table below evaluates the same formulas the ledger was checked
# against:


# %%
def step_bytes(algo, layout, cp, s=1):
    per_phase = ring_bytes(s, cp) if algo == "ring" else ulysses_bytes(s, cp, layout)
    return {**per_phase, "step": per_phase["forward"] + per_phase["backward"]}


ratio_rows = [
    "| cp | ring / Ulysses: forward | backward | step | replicated / sequence_sharded: forward | backward | step |",
    "|---|---|---|---|---|---|---|",
]
for cp in CPS:
    unit = cp  # any S divisible by cp keeps the integer formulas exact
    ring, sharded, replicated = (
        step_bytes(a, lay, cp, unit)
        for a, lay in (("ring", None), ("ulysses", "sequence_sharded"), ("ulysses", "replicated"))
    )
    ratio_rows.append(
        f"| {cp} | "
        + " | ".join(f"{ring[p] / sharded[p]:g}" for p in ("forward", "backward", "step"))
        + " | "
        + " | ".join(f"{replicated[p] / sharded[p]:g}" for p in ("forward", "backward", "step"))
        + " |"
    )
display(Markdown("\n".join(ratio_rows)))

# %% [markdown]
# What limits Ulysses is the head count: cp must divide the number of heads (the
# 20-head run above shows where it fails), and with grouped-query attention the K/V heads
# are fewer still. The ring has no such limit, sends to one neighbour only, and overlaps
# each hop with a block of compute; on slow links or across nodes that overlap (and the
# absence of an all-to-all over the whole group) is why it is used, often combined with
# Ulysses inside a node.
#
# The **replicated** layout does not save traffic over a training step: it sends
# `(cp-1)·S + 3(cp-1)·S = 4(cp-1)·S` against `8(cp-1)·S/cp` for sequence-sharded, `cp/2`
# times *more* (equal only at cp = 2), and every rank holds the full sequence and runs
# every non-attention op (MLPs, norms, projections) on it, `cp` times the same work. It
# is the right choice only where the full sequence is on every rank anyway (the rest of
# the model is not split over cp, e.g. a model that parallelizes only its attention) and
# memory holds it; forward-only (inference) it also sends less than sequence-sharded
# below cp = 4 (`(cp-1)·S` against `4(cp-1)·S/cp`), the same at cp = 4.

# %% [markdown]
# ## 7. Bug clinic: a ring backward that is only half right
#
# A bug seen in real ring-attention code: the forward is right, so the loss matches a
# single-device run to the last digit, training runs, and only the gradients are wrong.
# Below, the same zigzag causal ring runs twice on 4 real ranks, once as in the package and
# once with a seeded bug handed to the ranks as a patch set, `run(..., patches=ring_clinic_bug())`
# (`paralab.exercises.lab02`; do not read it yet). The patch replaces a function of the
# backward only, so the forward is the package's own. The picture is, per
# token (in sequence order), the largest `|buggy dK - correct dK|` over batch, heads and
# head_dim, on a log scale; lines mark the 8 zigzag chunks and the rank that owns each,
# and a dot marks a token whose dK is bitwise right.

# %%
correct, buggy = (
    assemble(
        [r["results"][0] for r in run(cp_runs.cp_worker, 4, FULL, [CONFIGS[2]], patches=bug)],
        CONFIGS[2],
    )
    for bug in (None, ring_clinic_bug())
)
show(
    viz.plot_error_by_token(
        (buggy["dk"] - correct["dk"]).transpose(-1, -2),
        4,
        zigzag=True,
        title="ring attention, cp = 4, causal zigzag: dK, buggy vs correct",
    )
)
exact_tokens = (
    (buggy["dk"] == correct["dk"]).all(dim=-1).all(dim=1).all(dim=0).nonzero().flatten().tolist()
)
print("tokens whose dK is still bitwise right:", exact_tokens)
clinic_verdicts = []
for name, ref in sdpa_reference(FULL, causal=True).items():
    verdict = compare(buggy[name], ref, atol=1e-12 * ref.abs().max().item())[0]
    seen = (
        "matches SDPA"
        if verdict.passed
        else f"{verdict.n_diff} of {verdict.numel} elements differ from SDPA"
    )
    clinic_verdicts.append(
        claim(
            f"clinic: {name} {'still matches' if name == 'out' else 'caught by the check'}",
            verdict.passed == (name == "out"),
            seen,
        )
    )  # out must still match, gradients not
print(verdict_table(clinic_verdicts, "bug clinic: the check sees the bug"))

# %% [markdown]
# **What is wrong?** Look at which tokens' dK are still right, and at how much is wrong in
# each chunk of 6 tokens (zigzag gives rank `r` chunks `r` and `7-r`). Then open the answer.
# (The rows are the clinic's checks: the forward still matches, the gradients are caught.)

# %% [markdown]
# <details><summary>Answer</summary>
#
# The backward's ring does not rotate K/V. The patch set replaces `ring_backward` by
# `ring_backward_kv_stays` (`src/paralab/exercises/lab02.py`): the package's backward whose
# hop, `ring_pass_kv_stays`, returns the rank's own block for the K/V tag. So at every step
# each rank attends its queries to **its own step-0 K/V** again, while the dK/dV
# accumulators still travel home correctly. Step 0 (a rank's own block) is the only
# correct step. So
#
# - the forward, which runs the package's `ring_forward` and its real hop, is untouched:
#   `out` matches (What to try 8 freezes the hop for the whole run instead);
# - dQ is wrong: it sums contributions of the same own block, with the masks meant for
#   other blocks, instead of one per block (except tokens 0-5, whose queries see only their
#   own chunk);
# - dK/dV are wrong except on the last chunk (tokens 42-47, rank 0's second chunk): a
#   block's gradient sums the contributions of every query that sees its keys, and every
#   rank but the owner computed its part against the wrong keys. Under the causal mask an
#   early key is seen by many queries, so it collects the most wrong terms (the red fades
#   from left to right on the log scale); the last chunk's keys are seen only by their own queries, on their
#   owner's step 0, the one correct step, so they come out bitwise right.
#
# The fix is one line in a real implementation: after the hop, use the received block
# (`kv = next_kv` in `ring_backward`). A test that compares only the loss (or only the
# forward) cannot see this bug; comparing every gradient element by element does.
# </details>

# %% [markdown]
# ### Second case: the backward of an all-gather, slice or reduce-scatter?
#
# In the replicated Ulysses layout (section 4) the output's heads are all-gathered, and the
# backward of that all-gather is a *slice* of `dout`. Textbooks say "the backward of an
# all-gather is a reduce-scatter", and a reduce-scatter is what the seeded bug below uses
# (`patches=replicated_clinic_bug()`: it replaces `UlyssesAttention.backward` by the same
# backward with a reduce-scatter where the slice was; the forward is untouched). Which of
# the two is right here, and by how much is the other off? The picture puts every element
# of rank 1's dQ, buggy against correct.

# %%
cp = 4
correct_dq, buggy_dq = (
    [r["results"][0]["dq"] for r in run(cp_runs.cp_worker, cp, FULL, [CONFIGS[6]], patches=bug)]
    for bug in (None, replicated_clinic_bug())
)
show(
    viz.plot_scale_scatter(
        correct_dq[1],
        buggy_dq[1],
        cp,
        "Ulysses replicated, cp = 4, rank 1: dQ,\nreduce-scatter (buggy) vs slice (correct)",
    )
)
ratio = torch.stack([bad / good for good, bad in zip(correct_dq, buggy_dq)])
print(
    "buggy dQ / correct dQ on every rank and element: min",
    f"{ratio.min().item():.6g}",
    "max",
    f"{ratio.max().item():.6g}",
)
ref = sdpa_reference(FULL, causal=False)["dq"]
verdict = compare(buggy_dq[1], ref, atol=1e-12 * ref.abs().max().item())[0]
print(
    verdict_table(
        [
            claim(
                "clinic: reduce-scatter backward caught",
                not verdict.passed,
                f"{verdict.n_diff} of {verdict.numel} dq elements differ from SDPA",
            )
        ],
        "bug clinic, second case",
    )
)

# %% [markdown]
# <details><summary>Answer</summary>
#
# The slice is right. Every rank consumed the *same* replicated output in the *same* way,
# so every rank holds the same `dout`: the gradient of one copy. A reduce-scatter sums `cp`
# identical copies, so every dQ, dK, dV comes out exactly `cp` = 4 times too large (the
# ratio above), on every element: every point of the scatter lies on the line of slope 4. "The backward of an all-gather is a reduce-scatter"
# holds when each rank's downstream computation is different (each holds a different loss
# term, as in FSDP or sequence-sharded code): then the partial gradients differ and must be
# summed. With replicated downstream code it counts the same gradient `cp` times. A loss
# scaled by `1/cp` would hide the bug in this test and break it at another cp.
# </details>

# %% [markdown]
# ## Closing note

# %%
closing = [
    "| cp | S | ring fwd | ring bwd | Ulysses fwd = bwd | replicated fwd | replicated bwd |",
    "|---|---|---|---|---|---|---|",
    "| formula | | `2(cp\u20111)S` | `4(cp\u20111)S` | `4(cp\u20111)S/cp` | `(cp\u20111)S` | `3(cp\u20111)S` |",
]
for cp in CPS:
    ledger = {
        name: {
            p: sent(runs[cp][0]["results"][CONFIGS.index(c)]["records"], phase=p)
            for p in ("forward", "backward")
        }
        for name, c in series.items()
    }
    cells = [
        ledger["ring"]["forward"],
        ledger["ring"]["backward"],
        ledger["Ulysses sequence_sharded"]["forward"],
        ledger["Ulysses replicated"]["forward"],
        ledger["Ulysses replicated"]["backward"],
    ]
    closing.append(
        f"| {cp} | {shard_bytes(B, H, N, D, cp)} | " + " | ".join(str(c) for c in cells) + " |"
    )
display(
    Markdown(
        f"Bytes sent per rank by rank 0, as the ledger measured them (the second row: the formula of each column; B={B}, H={H}, N={N}, D={D}, float64; "
        "section 6 checks every one against its formula, on every rank, causal or not):\n\n"
        + "\n".join(closing)
        + "\n\nEvery output and gradient matched SDPA within the checked bound (`1e-12` relative; section 5 "
        "prints each row's error in its folded detail); Ulysses matched the one-process `attention_block` bitwise. The last cell "
        "prints this run's time."
    )
)

# %% [markdown]
# ## What to try
#
# 1. Set `CPS = (2, 3, 4, 8)` in the first code cell and re-run from the top (24 heads
#    and 48 tokens divide by 3 and by 6). Do every verdict and byte formula hold at an odd cp?
#
#    <details><summary>Hint</summary>Nothing in the ring or in the formulas assumes an even
#    cp; the zigzag split needs `N` divisible by `2·cp` (48 / 6 = 8).</details>
# 2. Set `H = 20` and re-run from the top. What stops the run at cp = 8, on which ranks,
#    with what message? With `CPS = (2, 4)`, does everything pass again?
#
#    <details><summary>Hint</summary>`check_heads_divisible` raises on every rank before any
#    all-to-all (20 % 8 ≠ 0); the launcher reports it per rank. 20 divides by 2 and 4.</details>
# 3. In the `merge_partials` cell of section 2, drop the rescaling: replace the statement
#    `out = (...)` (four lines) by `out = out + block_out`. Re-run that cell, then section 5's launch
#    and its claims cell. The edit reaches the ranks because that launch hands this
#    kernel's `merge_partials` over, `patches=KERNEL_EDIT`, under the `paralab.cp.blocks`
#    the cell's header names (`ring.py`, which imported the name, gets it too). Which rows
#    fail, and why does Ulysses still pass?
#
#    <details><summary>Hint</summary>Every ring row fails, every Ulysses row passes. Only
#    the ring merges partials; Ulysses attends over the whole sequence per head in one
#    `attention_block` and never calls `merge_partials`.</details>
# 4. `viz.plot_ring_timeline(8)`: what is the slowest/mean work ratio for contiguous
#    shards? Check it against `2 - 1/cp`.
#
#    <details><summary>Hint</summary>The printed line for cp = 8 in section 3 gives it:
#    `2 - 1/8`.</details>
# 5. In the bug clinic's second case set `cp = 2`, then `cp = 8`. Does the factor follow cp?
#    Why can the sequence-sharded layout not have this bug?
#
#    <details><summary>Hint</summary>Yes: a reduce-scatter sums `cp` identical copies. In the
#    sequence-sharded layout each rank's `dout` belongs to different tokens, so the
#    backward all-to-all moves, never sums.</details>
# 6. The ring backward sends K/V again (`4(cp-1)S` instead of `2(cp-1)S`). What would it
#    cost in memory to keep every visiting K/V block from the forward instead?
#
#    <details><summary>Hint</summary>Every rank would hold all `cp` K/V blocks, i.e. the
#    full sequence's K and V: the memory cp was meant to save.</details>
# 7. At which cp would the ring's forward traffic equal Ulysses' backward + forward? Read
#    it off the plot, then from the formulas.
#
#    <details><summary>Hint</summary>`2(cp-1)S = 8(cp-1)S/cp` gives cp = 4.</details>

# 8. Plant the clinic's frozen K/V hop for the whole run instead of the backward only, in a
#    new cell:
#
#    ```python
#    from paralab.exercises.lab02 import ring_pass_kv_stays
#
#    frozen = run(cp_runs.cp_worker, 4, FULL, [CONFIGS[2]],
#                 patches={"paralab.cp.ring": {"ring_pass": ring_pass_kv_stays}})
#    out = assemble([r["results"][0] for r in frozen], CONFIGS[2])["out"]
#    ref = sdpa_reference(FULL, causal=True)["out"]
#    print(compare(out, ref, atol=1e-12 * ref.abs().max().item())[0].describe())
#    ```
#
#    Does the forward still match? Why does the clinic replace `ring_backward`, not `ring_pass`?
#
#    <details><summary>Hint</summary>No: `ring_forward` calls the same `ring_pass`, so its
#    K/V stay home too and `out` is wrong on every token but chunk 0's (tokens 0-5), whose
#    queries see only their own keys. The loss would show that bug at once; the field bug
#    the clinic copies hides in the backward alone, which only a gradient check sees.</details>

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lab run time: {time.monotonic() - LAB_START:.1f} s")
