"""Lab 09's experiments: the per-rank training job, the one-process reference, and the checks.

World = the data-parallel ranks; each rank loads its own sample (sample index = global
rank). The ep groups are carved from them, contiguous: with dp = 4 and ep = 2, ranks
{0, 1} and {2, 3} each hold all E experts between them, E/2 per rank. Gradients:

- dense parameters are data-parallel: all-reduce over the world, divide by world;
- expert parameters: after the backward, a rank's expert gradient already sums the
  tokens of its whole ep group (combine's backward brought them); all-reduce it over the
  ranks that hold the same experts (ranks r, r + ep, ...) and divide by the world too.
  Dividing by the size of that group instead would leave the expert gradients ep times
  too large.

With aux-loss-free balancing (`MoEConfig.bias_rate`) each step ends with one more
collective: the routed load per expert, all-reduced over the world, moves the expert bias
(`balance_experts`), as torchtitan does before its optimizer step.

`train` and `reference` are the public entry points; `ep_worker` and `reference_run` return
what the checks need besides the parameters (step 0's logits, losses, gradients, routing,
ledger records).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from paralab.check import Verdict, claim, compare
from paralab.ep.balance import updated_bias
from paralab.ep.costs import all_reduce_bytes, layer_bytes, split_matrix
from paralab.ep.layout import network_assignments, sent_per_node, tokens_per_node
from paralab.ep.model import (
    MoEConfig,
    MoETransformer,
    is_expert_param,
    make_model,
    sample,
    shard_experts,
)
from paralab.ledger import Ledger, Record

FORWARD_CALLS = ("counts", "dispatch", "combine")
BACKWARD_CALLS = ("combine backward", "dispatch backward")


def world_for(ep: int, dp: int) -> int:
    """dp ranks, or ep ranks when dp = 1 (each still loading its own sample)."""
    return ep if dp == 1 else dp


def ep_groups(ep: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(ep group, expert-data-parallel group) of this rank: a (world/ep, ep) mesh, ep inner."""
    world = dist.get_world_size()
    if world % ep:
        raise ValueError(f"ep = {ep} must divide the {world} data-parallel ranks")
    mesh = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("edp", "ep"))
    return mesh.get_group("ep"), mesh.get_group("edp")


def sync_grads(model: MoETransformer, edp_group: dist.ProcessGroup) -> None:
    """Dense gradients: mean over the world; expert gradients: sum over `edp_group`, / world.
    One flat all-reduce each."""
    world = dist.get_world_size()
    for expert, group in ((False, None), (True, edp_group)):
        grads = [p.grad for n, p in model.named_parameters() if is_expert_param(n) == expert]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if dist.get_world_size(group) > 1:
            dist.all_reduce(flat, group=group)
        flat /= world
        for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(chunk.reshape(g.shape))


def expert_load(experts: list[torch.Tensor], num_experts: int) -> torch.Tensor:
    """(E,) float64: assignments routed to each expert (before drops), over the given routings."""
    return sum(torch.bincount(e.reshape(-1), minlength=num_experts).double() for e in experts)


def balance_experts(model: MoETransformer, experts: torch.Tensor) -> None:
    """Aux-loss-free balancing's step on every rank: this rank's routed load, summed over the
    world (one all-reduce of E numbers), moves the expert bias (`balance.updated_bias`)."""
    load = expert_load([experts], model.config.experts)
    if dist.get_world_size() > 1:
        dist.all_reduce(load)
    bias = model.moe.expert_bias
    bias.copy_(updated_bias(bias, load, model.config.bias_rate))


def sgd_step(model: MoETransformer) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p -= model.config.lr * p.grad
            p.grad = None


def gather_params(model: MoETransformer, ep_group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """Every parameter, every expert included: the experts collected from the ep group."""
    mine = {n: p.detach().clone() for n, p in model.named_parameters()}
    pieces: list[dict | None] = [None] * dist.get_world_size(ep_group)
    dist.all_gather_object(
        pieces, {n: t for n, t in mine.items() if is_expert_param(n)}, group=ep_group
    )
    for piece in pieces:
        mine.update(piece)
    return dict(sorted(mine.items()))


def step_record(loss: torch.Tensor, seen: dict, model: MoETransformer, records: list) -> dict:
    """What the checks read of one rank's step: logits, loss, synced gradients (its own experts
    only), routing and ledger records."""
    routing = seen["routing"]
    return {
        "logits": seen["logits"].detach(),
        "loss": loss.detach(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "experts": routing.experts,
        "keep": routing.keep,
        "send_counts": routing.send_counts,
        "recv_counts": routing.recv_counts,
        "sent_tokens": routing.sent_tokens,
        "records": records,
    }


def ep_worker(config: MoEConfig, ep: int, steps: int = 2, seed: int = 0) -> dict:
    """On every rank: `steps` SGD steps of the MoE model with experts over ep ranks.

    Returns the parameters after the steps (every expert), step 0's `step_record`, and every
    step's rows sent per expert and expert bias.
    """
    rank = dist.get_rank()
    ep_group, edp_group = ep_groups(ep)
    model = shard_experts(make_model(config, seed), ep_group)
    tokens, targets = sample(rank, config, seed)
    first: dict = {}
    counts, biases = [], []
    for step in range(steps):
        with Ledger() as led:
            with led.phase("forward"):
                loss, seen = model.loss(tokens, targets)
            with led.phase("backward"):
                loss.backward()
            with led.phase("grad sync"):
                sync_grads(model, edp_group)
            if config.bias_rate is not None:
                with led.phase("balance"):
                    balance_experts(model, seen["routing"].experts)
        counts.append(seen["routing"].send_counts)
        biases.append(model.moe.expert_bias.clone())
        if step == 0:
            first = step_record(loss, seen, model, led.records)
        sgd_step(model)
    params = gather_params(model, ep_group)
    return {"params": params, "step0": first, "send_counts": counts, "bias": biases}


def train(
    ep: int,
    dp: int = 1,
    *,
    experts: int = 4,
    top_k: int = 2,
    capacity_factor: float | None = None,
    steps: int = 2,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inside `launch.run` on dp ranks (ep ranks when dp = 1): the parameters after `steps`,
    every expert, identical on every rank."""
    world = world_for(ep, dp)
    if dist.get_world_size() != world:
        raise ValueError(
            f"train(ep={ep}, dp={dp}) runs on {world} ranks, not {dist.get_world_size()}"
        )
    config = MoEConfig(experts=experts, top_k=top_k, capacity_factor=capacity_factor)
    return ep_worker(config, ep, steps, seed)["params"]


def reference_run(config: MoEConfig, samples: int, steps: int = 2, seed: int = 0) -> dict:
    """One process, every expert here: `steps` SGD steps on the mean loss over `samples` samples
    (each routed on its own, like one rank's). Returns the parameters and step 0's per-sample
    logits, losses and routing, the gradients, and every step's tokens per expert per sample
    and expert bias."""
    model = make_model(config, seed)
    data = [sample(i, config, seed) for i in range(samples)]
    first: dict = {}
    counts, biases = [], []
    for step in range(steps):
        per_sample = [model.loss(tokens, targets) for tokens, targets in data]
        loss = torch.stack([loss for loss, _ in per_sample]).mean()
        loss.backward()
        routings = [seen["routing"] for _, seen in per_sample]
        counts.append(
            [torch.bincount(r.experts[r.keep], minlength=config.experts) for r in routings]
        )
        if config.bias_rate is not None:
            load = expert_load([r.experts for r in routings], config.experts)
            bias = model.moe.expert_bias
            bias.copy_(updated_bias(bias, load, config.bias_rate))
        biases.append(model.moe.expert_bias.clone())
        if step == 0:
            first = {
                "logits": [seen["logits"].detach() for _, seen in per_sample],
                "loss": [loss.detach() for loss, _ in per_sample],
                "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                "routing": routings,
            }
        sgd_step(model)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {
        "params": dict(sorted(params.items())),
        "step0": first,
        "kept_counts": counts,
        "bias": biases,
    }


def reference(
    *,
    experts: int = 4,
    top_k: int = 2,
    capacity_factor: float | None = None,
    samples: int,
    steps: int = 2,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """One process, the same model and data: the parameters after `steps` (samples = world)."""
    config = MoEConfig(experts=experts, top_k=top_k, capacity_factor=capacity_factor)
    return reference_run(config, samples, steps, seed)["params"]


def _relative(actual: torch.Tensor, expected: torch.Tensor, name: str) -> list[Verdict]:
    """Element by element within 1e-12 of the tensor's largest magnitude (float64 rounding)."""
    return compare(actual, expected, atol=1e-12 * expected.abs().max().item(), name=name)


def check_step(per_rank: list[dict], ref: dict, ep: int, label: str) -> list[Verdict]:
    """Step 0 on every rank vs one process: routing and drops bitwise; logits, loss and every
    gradient within float64 rounding (1e-12 of each tensor's largest magnitude)."""
    verdicts = []
    want = ref["step0"]
    for rank, result in enumerate(per_rank):
        got = result["step0"]
        routing = want["routing"][rank]
        verdicts.append(
            claim(
                f"{label}: rank {rank} routing and drops",
                torch.equal(got["experts"], routing.experts)
                and torch.equal(got["keep"], routing.keep),
                f"{int(got['keep'].sum())} of {got['keep'].numel()} assignments kept",
            )
        )
        verdicts += _relative(got["logits"], want["logits"][rank], f"{label}: rank {rank} output")
        verdicts += _relative(got["loss"], want["loss"][rank], f"{label}: rank {rank} loss")
        for name, grad in got["grads"].items():
            verdicts += _relative(grad, want["grads"][name], f"{label}: rank {rank} grad {name}")
    return verdicts


def check_params(per_rank: list[dict], ref: dict, label: str) -> list[Verdict]:
    """Every parameter, every expert, after the steps, on every rank vs one process; and the
    expert bias after every step, bitwise (it moves by signs of integer loads)."""
    verdicts = []
    for rank, result in enumerate(per_rank):
        params = result["params"] if "params" in result else result
        if any(b.any() for b in ref.get("bias", []) + result.get("bias", [])):
            verdicts.append(
                claim(
                    f"{label}: rank {rank} expert bias after every step",
                    all(map(torch.equal, result["bias"], ref["bias"])),
                    f"after the last step {ref['bias'][-1].tolist()}",
                )
            )
        verdicts.append(
            claim(
                f"{label}: rank {rank} holds every parameter",
                params.keys() == ref["params"].keys(),
                f"{len(params)} tensors",
            )
        )
        for name, p in params.items():
            verdicts += _relative(p, ref["params"][name], f"{label}: rank {rank} {name}")
    return verdicts


def step_splits(per_rank: list[dict], ep: int) -> list[torch.Tensor]:
    """Step 0's split matrix of each ep group: [i, j] rows group rank i sent to group rank j."""
    counts = [r["step0"]["send_counts"] for r in per_rank]
    return [split_matrix(counts[g : g + ep], ep) for g in range(0, len(counts), ep)]


def a2a_records(records: list[Record], phase: str) -> list[Record]:
    return [r for r in records if r.op == "all_to_all_single" and r.phase == phase]


def measured_bytes(records: list[Record]) -> dict[str, int]:
    """Bytes sent by each all-to-all of the step, named as in `costs.layer_bytes`."""
    calls = a2a_records(records, "forward") + a2a_records(records, "backward")
    return {name: r.bytes_sent for name, r in zip(FORWARD_CALLS + BACKWARD_CALLS, calls)}


def check_bytes(per_rank: list[dict], config: MoEConfig, ep: int, label: str) -> list[Verdict]:
    """Every rank's all-to-all bytes (counts, dispatch, combine and their backwards) vs the
    routing's formula, the backward calls mirrored (combine's backward sends what dispatch
    sent, and the reverse), and the gradient all-reduces vs the ring formula."""
    verdicts = []
    world = len(per_rank)
    splits = step_splits(per_rank, ep)
    for rank, result in enumerate(per_rank):
        records = result["step0"]["records"]
        want = layer_bytes(splits[rank // ep], rank % ep, config.dim, config.experts)
        got = measured_bytes(records)
        verdicts += compare(
            torch.tensor([got.get(k, -1) for k in want]),
            torch.tensor(list(want.values())),
            name=f"{label}: rank {rank} all-to-all bytes {list(want)}",
        )
        fwd, bwd = a2a_records(records, "forward"), a2a_records(records, "backward")
        verdicts.append(
            claim(
                f"{label}: rank {rank} backward = forward's all-to-alls reversed",
                len(fwd) == 3
                and len(bwd) == 2
                and (bwd[0].bytes_sent, bwd[0].bytes_received)
                == (fwd[1].bytes_sent, fwd[1].bytes_received)
                and (bwd[1].bytes_sent, bwd[1].bytes_received)
                == (fwd[2].bytes_sent, fwd[2].bytes_received),
                f"{len(fwd)} forward, {len(bwd)} backward all_to_all_single",
            )
        )
        grads = result["step0"]["grads"]
        dense = sum(g.numel() * 8 for n, g in grads.items() if not is_expert_param(n))
        local = sum(g.numel() * 8 for n, g in grads.items() if is_expert_param(n))
        sync = [r.bytes_sent for r in records if r.phase == "grad sync"]
        edp = world // ep
        expected = [all_reduce_bytes(dense, world)] + ([all_reduce_bytes(local, edp)] * (edp > 1))
        verdicts += compare(
            torch.tensor(sync),
            torch.tensor(expected),
            name=f"{label}: rank {rank} gradient all-reduce bytes",
        )
        balance = [r.bytes_sent for r in records if r.phase == "balance"]
        want_balance = [all_reduce_bytes(8 * config.experts, world)] * (
            config.bias_rate is not None
        )
        verdicts += compare(
            torch.tensor(balance, dtype=torch.long),
            torch.tensor(want_balance, dtype=torch.long),
            name=f"{label}: rank {rank} expert-load all-reduce bytes",
        )
    return verdicts


def check_layout(
    per_rank: list[dict], ref: dict, config: MoEConfig, ep: int, ranks_per_node: int, label: str
) -> list[Verdict]:
    """DeepEP's layout counts on one process's routing (dropped assignments count nowhere) vs
    what each rank's dispatch sent in step 0, exactly: the distinct tokens to each node, and
    the rows that crossed nodes."""
    verdicts = []
    for rank, result in enumerate(per_rank):
        routing = ref["step0"]["routing"][rank]
        chosen = routing.experts.where(routing.keep, -1)
        node = rank % ep // ranks_per_node
        rows, tokens = sent_per_node(
            result["step0"]["sent_tokens"], result["step0"]["send_counts"], ep, ranks_per_node
        )
        verdicts += compare(
            tokens,
            tokens_per_node(chosen, config.experts, ep, ranks_per_node),
            name=f"{label}: rank {rank} tokens sent to each node",
        )
        verdicts += compare(
            rows.sum() - rows[node],
            torch.tensor(network_assignments(chosen, config.experts, ep, ranks_per_node, node)),
            name=f"{label}: rank {rank} rows sent across nodes",
        )
    return verdicts
