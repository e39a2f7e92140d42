"""Per-rank jobs of the collectives primer, the inputs they start from, and what one process expects.

Every value is an integer stored in float64, so every result is exact and
prints the same on every machine. Element c of rank r starts as `10 r + c`:
the tens digit says where a number came from, the units digit which chunk it is.

The collectives are the ones the suite calls, by their torch names:

| op | torch call | used by |
|---|---|---|
| all_gather | `all_gather_into_tensor` (also `all_gather`, `all_gather_single`) | FSDP units, Ulysses heads, cfgp, lb counts |
| reduce_scatter | `reduce_scatter_tensor` | FSDP gradients |
| all_reduce | `all_reduce` | HSDP replicas, DDP |
| all_to_all | `all_to_all_single` | Ulysses seq <-> heads |
| broadcast | `broadcast` | cfgp's shared noise |
| send_recv | `batch_isend_irecv` of `P2POp(isend)` + `P2POp(irecv)` | ring attention, cfgp swap, lb exchange |
"""  # noqa: E501 - table rows, one line each

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn

from paralab.collectives import ring
from paralab.collectives.ring import ring_shift
from paralab.ledger import Ledger, Record
from paralab.tables import text_table

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")


def value(rank: int, chunk: int) -> int:
    """The number rank `rank` starts with in slot `chunk`: tens digit = rank, units digit = chunk."""
    return 10 * rank + chunk


def op_input(op: str, rank: int, n: int) -> torch.Tensor:
    """What `rank` holds before `op`: its own shard for all-gather, n chunks for every other op."""
    slots = [rank] if op == "all_gather" else range(n)
    return torch.tensor([value(rank, c) for c in slots], dtype=torch.float64)


def upstream_grad(op: str, rank: int, n: int) -> torch.Tensor:
    """The gradient that arrives at `op`'s output on `rank` in the backward runs: again 10 r + c."""
    size = 1 if op == "reduce_scatter" else n
    return torch.tensor([value(rank, c) for c in range(size)], dtype=torch.float64)


def apply_collective(op: str, x: torch.Tensor, n: int) -> torch.Tensor:
    """This rank's result of collective `op` on its input `x`, called the way the suite calls it."""
    if op == "all_gather":
        out = torch.empty(n * x.numel(), dtype=x.dtype)
        dist.all_gather_into_tensor(out, x)
    elif op == "reduce_scatter":
        out = torch.empty(x.numel() // n, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x)  # op defaults to SUM
    elif op == "all_reduce":
        out = x.clone()
        dist.all_reduce(out)  # in place, SUM
    elif op == "all_to_all":
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)  # slice j of dim 0 goes to rank j
    elif op == "broadcast":
        out = x.clone()
        dist.broadcast(out, src=0)  # rank 0's tensor overwrites everyone's
    elif op == "send_recv":
        rank = dist.get_rank()
        out = torch.empty_like(x)
        for work in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x, (rank + 1) % n), dist.P2POp(dist.irecv, out, (rank - 1) % n)]
        ):
            work.wait()
    else:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return out


def forward_job(ops: tuple[str, ...] = OPS) -> dict[str, torch.Tensor]:
    """On every rank: each collective applied to this rank's input; also the two other all-gather spellings.

    A reader's edited `apply_collective` runs here when handed over with
    `run(forward_job, n, patches={"paralab.collectives.runs": {"apply_collective": edit}})`.
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    after = {op: apply_collective(op, op_input(op, rank, n), n) for op in ops}
    shard = op_input("all_gather", rank, n)
    pieces = [torch.empty_like(shard) for _ in range(n)]
    dist.all_gather(pieces, shard)
    single = torch.empty(n * shard.numel(), dtype=shard.dtype)
    dist.all_gather_single(single, shard)
    after["all_gather (list)"], after["all_gather_single"] = torch.cat(pieces), single
    return after


def expected_forward(op: str, n: int) -> list[torch.Tensor]:
    """What each rank holds after `op`, computed in one process from everybody's inputs."""
    inputs = [op_input(op, r, n) for r in range(n)]
    if op == "all_gather":
        return [torch.cat(inputs)] * n
    if op == "reduce_scatter":
        return list(sum(inputs).chunk(n))
    if op == "all_reduce":
        return [sum(inputs)] * n
    if op == "all_to_all":
        return [torch.stack([inputs[s][r] for s in range(n)]) for r in range(n)]
    if op == "broadcast":
        return [inputs[0]] * n
    if op == "send_recv":
        return [inputs[(r - 1) % n] for r in range(n)]
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


# ------------------------------------------------------------------------------ backward
def differentiable_collective(op: str, x: torch.Tensor, n: int) -> torch.Tensor:
    """The same collective, through an autograd function, so `.backward()` runs its mirror."""
    if op == "all_gather":
        return torch.cat(dnn.all_gather(x))
    if op == "reduce_scatter":
        return dnn.reduce_scatter(torch.empty(x.numel() // n, dtype=x.dtype), list(x.chunk(n)))
    if op == "all_reduce":
        return dnn.all_reduce(x)
    if op == "all_to_all":
        return dnn.all_to_all_single(torch.empty_like(x), x)
    if op == "broadcast":
        return dnn.broadcast(x, src=0)
    if op == "send_recv":
        return ring_shift(x)
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def mirror(op: str, grad_out: torch.Tensor, n: int) -> torch.Tensor:
    """The backward written with plain collectives: the forward's mirror applied to the output gradient.

    `grad_out` is the gradient of this rank's output of `op` (as `apply_collective` returns it);
    the result is the gradient of this rank's input of `op`, for every op of `OPS`.
    """
    ### BEGIN SOLUTION
    rank = dist.get_rank()
    if op == "all_gather":  # all-gather <-> reduce-scatter
        grad_in = torch.empty(grad_out.numel() // n, dtype=grad_out.dtype)
        dist.reduce_scatter_tensor(grad_in, grad_out)
    elif op == "reduce_scatter":  # reduce-scatter <-> all-gather
        grad_in = torch.empty(n * grad_out.numel(), dtype=grad_out.dtype)
        dist.all_gather_into_tensor(grad_in, grad_out)
    elif op == "all_reduce":  # all-reduce <-> all-reduce
        grad_in = grad_out.clone()
        dist.all_reduce(grad_in)
    elif op == "all_to_all":  # all-to-all <-> all-to-all, input/output splits swapped
        grad_in = torch.empty_like(grad_out)
        dist.all_to_all_single(grad_in, grad_out)
    elif op == "broadcast":  # broadcast <-> reduce to the root; the others' input was unused
        grad_in = grad_out.clone()
        dist.reduce(grad_in, dst=0)
        grad_in = grad_in if rank == 0 else torch.zeros_like(grad_in)
    elif op == "send_recv":  # send <-> recv: the gradient goes back to rank-1
        grad_in = torch.empty_like(grad_out)
        to_prev, from_next = (rank - 1) % n, (rank + 1) % n
        if rank % 2 == 0:  # blocking calls: half the ring sends first, or all would wait
            dist.send(grad_out, to_prev)
            dist.recv(grad_in, from_next)
        else:
            dist.recv(grad_in, from_next)
            dist.send(grad_out, to_prev)
    else:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return grad_in
    ### END SOLUTION


def backward_job(ops: tuple[str, ...] = OPS) -> dict[str, dict]:
    """On every rank, per op: autograd's input gradient, the mirror's, and the calls each backward made.

    One op per graph and one `.backward()` at a time, so every rank issues the
    backward collectives in the same order. A reader's edited `mirror` runs here
    when handed over with `patches={"paralab.collectives.runs": {"mirror": edit}}`.
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates some of these in favour of funcol
        for op in ops:
            x = op_input(op, rank, n).requires_grad_()
            grad_out = upstream_grad(op, rank, n)
            with Ledger() as ledger:
                with ledger.phase("forward"):
                    y = differentiable_collective(op, x, n)
                with ledger.phase("backward"):
                    (y * grad_out).sum().backward()
            out[op] = {
                "autograd": x.grad,
                "mirror": mirror(op, grad_out, n),
                "records": ledger.records,
            }
    return out


def expected_backward(op: str, n: int) -> list[torch.Tensor]:
    """d(sum of output * upstream grad)/d(input) on each rank, in one process, from the definitions."""
    g = [upstream_grad(op, r, n) for r in range(n)]
    if op == "all_gather":  # input of rank r feeds slot r of every rank's output
        return [torch.stack([g[s][r] for s in range(n)]).sum().reshape(1) for r in range(n)]
    if op == "reduce_scatter":  # chunk c of every input feeds rank c's output
        return [torch.cat(g)] * n
    if op == "all_reduce":
        return [sum(g)] * n
    if op == "all_to_all":  # slot c of rank r went to rank c, slot r
        return [torch.stack([g[c][r] for c in range(n)]) for r in range(n)]
    if op == "broadcast":  # only the root's input reaches any output
        return [sum(g) if r == 0 else torch.zeros(n, dtype=torch.float64) for r in range(n)]
    if op == "send_recv":  # rank r's input became rank r+1's output
        return [g[(r + 1) % n] for r in range(n)]
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def calls_by_phase(records: list[Record]) -> dict[str, str]:
    """'all_gather x1' per phase: which collectives a forward and its backward issued."""
    summary: dict[str, dict[str, int]] = {}
    for r in records:
        counts = summary.setdefault(r.phase, {})
        counts[r.op] = counts.get(r.op, 0) + 1
    return {
        phase: ", ".join(f"{op} x{k}" for op, k in counts.items())
        for phase, counts in summary.items()
    }


# ------------------------------------------------------------------------------ ring cost
RING_STEPS = {
    "reduce_scatter": ("ring_reduce_scatter", "reduce_scatter_tensor"),
    "all_gather": ("ring_all_gather", "all_gather_into_tensor"),
    "all_reduce": ("ring_all_reduce", "all_reduce"),
}
"""Each ring by hand, by its name in `paralab.collectives.ring` (looked up when the job runs, so
an edit handed over with `patches={"paralab.collectives.ring": {...}}` is what runs), and the
torch collective it is compared with."""


def ring_cost_job(numel: int) -> dict[str, dict]:
    """Each ring algorithm by hand next to torch's collective, both under the ledger.

    The full tensor S has `numel` float64 elements (numel divisible by n); the
    all-gather starts from this rank's S/n shard.
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    full = torch.arange(numel, dtype=torch.float64) + 1000 * rank
    out = {}
    for name, (by_hand_name, torch_op) in RING_STEPS.items():
        by_hand = getattr(ring, by_hand_name)
        x = full.chunk(n)[rank].clone() if name == "all_gather" else full
        with Ledger() as ledger:
            with ledger.phase("ring by hand"):
                mine = by_hand(x)
            with ledger.phase("torch"):
                if name == "all_gather":
                    theirs = torch.empty(numel, dtype=x.dtype)
                    dist.all_gather_into_tensor(theirs, x)
                elif name == "reduce_scatter":
                    theirs = torch.empty(numel // n, dtype=x.dtype)
                    dist.reduce_scatter_tensor(theirs, x)
                else:
                    theirs = x.clone()
                    dist.all_reduce(theirs)
        out[name] = {
            "by_hand": mine,
            "torch": theirs,
            "records": ledger.records,
            "torch_op": torch_op,
        }
    return out


# ------------------------------------------------------------------------------ printing
def _ints(t: torch.Tensor) -> str:
    return "[" + " ".join(str(int(v)) for v in t.tolist()) + "]"


def before_after_table(before: list[torch.Tensor], after: list[torch.Tensor]) -> str:
    """One row per rank: what it held before the collective and after it, as integers."""
    return text_table(
        ("rank", "before", "after"),
        [(r, _ints(b), _ints(a)) for r, (b, a) in enumerate(zip(before, after))],
    )
