"""What activation checkpointing is for: the bytes a forward keeps for backward, per AC mode.

Counted at autograd's own door: `torch.autograd.graph.saved_tensors_hooks` sees
every tensor an op saves for its backward (and the inputs a non-reentrant
checkpoint keeps, which it saves before it installs its own hooks; tensors saved
inside a checkpointed region go to the checkpoint's hooks and are not kept). A
tensor counts once per storage, parameters not at all: the number is the memory a
backward holds on to, which is what AC trades for recompute.

One process, no cp: the memory of one rank's block depends on its N/cp tokens,
and on the attention code it runs (lab 02's ring saves per step what
`LocalAttention` saves once); the closed form is for `LocalAttention`.
"""

from __future__ import annotations

import torch
from torch import nn

from paralab.train.model import SHAPE, build_model, loss_of
from paralab.train.parallelism import AC_MODES, apply_ac, apply_compile
from paralab.train.runs import make_sample

WORD = 8
"""Bytes per element: float64 (the positions index is int64, 8 bytes too)."""


def saved_for_backward(model: nn.Module) -> tuple[int, list[torch.Tensor]]:
    """Bytes of the storages one forward of sample 0 saves for backward, and the gradients after it.

    Parameters are left out (they are kept whatever AC does); a storage saved by
    several ops (a view, an output reused as an input) counts once.
    """
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, *make_sample(0, 0, 0))
    loss.backward()
    return sum(kept.values()), [p.grad for p in model.parameters()]


def activation_terms(ac: str, shape: dict = SHAPE, batch: int = 1) -> dict[str, int]:
    """The closed form, in bytes, by kind of tensor (for `LocalAttention`, one process).

    Per block, with T = batch*N tokens, d the width, F the MLP width, h heads:
    none keeps the block input, q/k/v, the scores and the probabilities (h*N*N each)
    and their log-sum-exp, the four other (T, d) inputs of norms and matmuls, the
    tanh output (T, F) and two norms' mean and rstd (4T); full keeps the block input
    only; selective (the region split) keeps the attention's tensors, the
    checkpoints' two inputs and the out projection's input. Outside the blocks,
    every mode keeps the inputs (tokens, position index, sigma), the final norm's
    input and statistics, the head's input and the loss difference.
    """
    if ac not in AC_MODES:
        raise ValueError(f"activation_terms: ac = {ac!r}, expected one of {AC_MODES}")
    n, d, h, blocks = shape["tokens"], shape["dim"], shape["heads"], shape["blocks"]
    t, c, f = batch * n, shape["channels"], shape["hidden"]
    attention = {
        "q, k, v": 3 * t * d,
        "scores and probabilities (h N^2 each)": 2 * batch * h * n * n,
        "log-sum-exp": batch * h * n,
    }
    per_block = {
        "none": {
            "block input": t * d,
            **attention,
            "other (T, d) and (T, F) tensors, norm statistics": 4 * t * d + t * f + 4 * t,
        },
        "full": {"block input": t * d},
        "selective": {
            "block input": t * d,
            **attention,
            "other (T, d) and (T, F) tensors, norm statistics": 2 * t * d,
        },
    }[ac]
    terms = {kind: blocks * WORD * count for kind, count in per_block.items()}
    terms["outside the blocks"] = WORD * (2 * t * c + batch + 2 * t * d + 2 * t + n)
    return terms


def activation_memory(*, compiled: bool = False) -> dict[str, dict]:
    """Per AC mode: bytes saved for backward (counted, and the closed form), and the gradients.

    `compiled`: AC then `torch.compile` per block, the engines' nesting, with the
    checkpoint traced inside the compiled block (no collective breaks the graph here).
    "graphs": the graphs Dynamo compiled for that mode (both blocks run the same code).
    A traced checkpoint's `context_fn` must return TorchDispatchModes, so the
    ledger's recompute label (a plain context manager) is left off
    (`apply_ac(..., label_recompute=False)`).
    """
    from torch._dynamo.utils import counters

    out = {}
    for ac in AC_MODES:
        graphs_before = counters["stats"]["unique_graphs"]
        model = apply_ac(build_model(), ac, label_recompute=not compiled)
        counted, grads = saved_for_backward(apply_compile(model, compiled))
        out[ac] = {
            "counted": counted,
            "formula": sum(activation_terms(ac).values()),
            "grads": grads,
            "graphs": counters["stats"]["unique_graphs"] - graphs_before,
        }
    return out
