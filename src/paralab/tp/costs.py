"""Closed-form bytes each tensor-parallel rank sends, per phase and collective, for one training step.

A = b·s·h·itemsize: one activation of the full sequence (b sequences of s tokens, hidden h).
With the ledger's cost model an all-reduce of A sends 2(tp-1)/tp·A, an all-gather of a
shard A/tp sends (tp-1)/tp·A and a reduce-scatter of A sends (tp-1)/tp·A.

| where | TP forward | TP backward | TP+SP forward | TP+SP backward |
|---|---|---|---|---|
| each block | 2 all-reduces (g, g) | 2 all-reduces (f, f) | 2 AG + 2 RS | 2 RS + 2 AG, + 2 AG (re-gather) |
| embedding | 1 all-reduce (g) | - | 1 RS | 1 AG |
| head | - | 1 all-reduce (f) | 1 AG | 1 RS, + 1 AG (re-gather) |
| vocab-parallel loss | 3 all-reduces of b·s numbers | - | the same | - |
| replicated gradients | - | - | - | grad sync: 1 all-reduce of them all, flattened |

g: after attention and after the MLP; f: before q/k/v and before the MLP. The loss
reduces the max, the sum of exp and the target logit. Replicated: norm weights and
biases, row biases, the position table (their gradients are partial under SP). The
re-gather: under SP each column linear saves only its sequence shard and all-gathers it
again in the backward, for its weight gradient (`layers.SequenceParallelColumnLinear`).

So one block costs 4 all-reduces of A per step under TP; under SP the crossings cost the
same bytes as 4 all-gathers plus 4 reduce-scatters (an all-reduce is a reduce-scatter then
an all-gather), and the two re-gathers add 2(tp-1)/tp·A: 10(tp-1)/tp·A against
8(tp-1)/tp·A, one more all-gather per column linear bought with tp times less saved
input. The loss sends 3·2(tp-1)/tp·b·s·itemsize, where gathering the logits would send
(tp-1)·b·s·V/tp·itemsize.
"""

from __future__ import annotations

from paralab.tp.model import LMConfig

ITEMSIZE = 8  # float64

OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_single",
    "reduce_scatter": "reduce_scatter_single",
}


def all_reduce_bytes(nbytes: int, tp: int) -> int:
    return 2 * (tp - 1) * nbytes // tp


def all_gather_bytes(nbytes: int, tp: int) -> int:
    """Bytes sent to all-gather shards that make `nbytes` in full."""
    return (tp - 1) * (nbytes // tp)


def reduce_scatter_bytes(nbytes: int, tp: int) -> int:
    return (tp - 1) * nbytes // tp


def activation_bytes(config: LMConfig, samples: int = 1) -> int:
    """A: one (batch, seq, hidden) activation of the full sequence, in bytes."""
    return samples * config.batch * config.seq * config.hidden * ITEMSIZE


def block_bytes(
    activation: int, tp: int, sequence_parallel: bool
) -> dict[tuple[str, str], tuple[int, int]]:
    """One block's (phase, op) -> (calls, bytes sent) for one training step.

    Under SP the backward's 4 all-gathers are the 2 reduce-scatters' mirrors and the 2
    column linears' re-gathers of their saved input shard."""
    if not sequence_parallel:
        ar = (2, 2 * all_reduce_bytes(activation, tp))
        return {("forward", OPS["all_reduce"]): ar, ("backward", OPS["all_reduce"]): ar}
    ag = (2, 2 * all_gather_bytes(activation, tp))
    rs = (2, 2 * reduce_scatter_bytes(activation, tp))
    mirrors_and_regathers = (4, 4 * all_gather_bytes(activation, tp))
    return {
        ("forward", OPS["all_gather"]): ag,
        ("forward", OPS["reduce_scatter"]): rs,
        ("backward", OPS["all_gather"]): mirrors_and_regathers,
        ("backward", OPS["reduce_scatter"]): rs,
    }


def block_step_bytes(
    config: LMConfig, tp: int, sequence_parallel: bool, samples: int = 1
) -> dict[tuple[str, str], tuple[int, int]]:
    """One block alone, as `runs.block_job` runs it: `block_bytes`, plus under SP the sum of its
    6 replicated gradients (2 norms' weight and bias, 2 row biases, `hidden` numbers each), in
    one all-reduce of them flattened."""
    out = block_bytes(activation_bytes(config, samples), tp, sequence_parallel)
    if sequence_parallel:
        out[("grad sync", OPS["all_reduce"])] = (
            1,
            all_reduce_bytes(6 * config.hidden * ITEMSIZE, tp),
        )
    return out


def replicated_param_sizes(config: LMConfig) -> list[int]:
    """Bytes of each parameter every tp rank holds in full: norms, row biases, the position table."""
    h = config.hidden
    per_block = [h] * 6  # two norms (weight, bias), two row-parallel biases
    return [n * ITEMSIZE for n in [*per_block * config.blocks, h, h, config.seq * h]]


def step_bytes(
    config: LMConfig, tp: int, sequence_parallel: bool, samples: int = 1
) -> dict[tuple[str, str], tuple[int, int]]:
    """The whole model's (phase, op) -> (calls, bytes sent per rank) for one training step."""
    a = activation_bytes(config, samples)
    positions = samples * config.batch * config.seq * ITEMSIZE
    out: dict[tuple[str, str], list[int]] = {}

    def add(key: tuple[str, str], calls: int, nbytes: int) -> None:
        got = out.setdefault(key, [0, 0])
        got[0] += calls
        got[1] += nbytes

    for _ in range(config.blocks):
        for key, (calls, nbytes) in block_bytes(a, tp, sequence_parallel).items():
            add(key, calls, nbytes)
    if sequence_parallel:
        add(("forward", OPS["reduce_scatter"]), 1, reduce_scatter_bytes(a, tp))  # embedding
        add(("backward", OPS["all_gather"]), 1, all_gather_bytes(a, tp))
        add(("forward", OPS["all_gather"]), 1, all_gather_bytes(a, tp))  # head
        add(("backward", OPS["all_gather"]), 1, all_gather_bytes(a, tp))  # its re-gather
        add(("backward", OPS["reduce_scatter"]), 1, reduce_scatter_bytes(a, tp))
        replicated = sum(replicated_param_sizes(config))
        add(("grad sync", OPS["all_reduce"]), 1, all_reduce_bytes(replicated, tp))  # flattened
    else:
        add(("forward", OPS["all_reduce"]), 1, all_reduce_bytes(a, tp))  # embedding's g
        add(("backward", OPS["all_reduce"]), 1, all_reduce_bytes(a, tp))  # head's f
    add(("forward", OPS["all_reduce"]), 3, 3 * all_reduce_bytes(positions, tp))  # the loss
    return {k: (v[0], v[1]) for k, v in out.items()}


def gathered_logits_bytes(config: LMConfig, tp: int, samples: int = 1) -> int:
    """What an all-gather of the vocab-sharded logits would send per rank (the loss avoids it)."""
    return all_gather_bytes(samples * config.batch * config.seq * config.vocab * ITEMSIZE, tp)
