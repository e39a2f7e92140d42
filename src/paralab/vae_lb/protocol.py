"""The lb protocol: share the costs, send the moved videos, encode, send the latents home.

Inside each lb group the ranks:

1. share the predicted encode cost of every video (`share_costs`);
2. all compute the SAME plan of moves (`planner.plan_rebalance`);
3. send the moved videos to their helpers in two phases, metadata (shape,
   dtype) then payloads, with batched point-to-point ops (`exchange`);
4. encode what they now hold;
5. send each helper-made latent back to its owner, again metadata then payload,

so every rank ends with the latents of its own videos in its original order
(`offload_encode`). Every rank of the group makes the same collective calls,
including ranks with no videos: a rank that skipped one would hang its peers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from paralab.launch import rank_device
from paralab.vae_lb.planner import Move, plan_rebalance

# ------------------------------------------------------------------ communication helpers
_DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
)
MAX_DIMS = 6
META_LEN = 2 + MAX_DIMS  # [ndim, dtype code, shape padded with zeros]
META_BYTES = META_LEN * 8  # int64


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    """Plans speak group ranks; point-to-point ops take global ranks."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def share_costs(
    costs: list[float], group: dist.ProcessGroup | None = None
) -> dict[int, list[float]]:
    """Every rank of the group learns every rank's costs, keyed by group rank.

    gloo cannot all_gather tensors of unequal sizes, so: all_gather the counts,
    then all_gather the costs padded to the largest count (float64: exact).
    """
    n, device = dist.get_world_size(group), rank_device()
    count = torch.tensor([len(costs)], dtype=torch.int64, device=device)
    counts = [torch.empty_like(count) for _ in range(n)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c.item()) for c in counts]
    width = max(sizes)
    if width == 0:
        return {r: [] for r in range(n)}
    padded = torch.zeros(width, dtype=torch.float64, device=device)
    padded[: len(costs)] = torch.tensor(costs, dtype=torch.float64)
    gathered = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(gathered, padded, group=group)
    return {r: gathered[r][: sizes[r]].tolist() for r in range(n)}


def metadata(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Fixed-size description (ndim, dtype, shape) so the receiver can allocate before the payload."""
    if tensor.dim() > MAX_DIMS or tensor.dtype not in _DTYPES:
        raise ValueError(
            f"lb exchange: cannot describe a tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype}"
        )
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    return torch.tensor(
        [tensor.dim(), _DTYPES.index(tensor.dtype), *shape], dtype=torch.int64, device=device
    )


def empty_from_metadata(meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The receive buffer a metadata record describes."""
    ndim, code, *shape = meta.tolist()
    return torch.empty(shape[:ndim], dtype=_DTYPES[code], device=device)


def batched_p2p(
    sends: list[tuple[int, torch.Tensor]],
    recvs: list[tuple[int, torch.Tensor]],
    group: dist.ProcessGroup | None,
) -> None:
    """Post every send and receive of this rank at once and wait for all of them.

    Messages between one pair in one direction are matched in the order
    posted: both sides post them in plan order. A rank with nothing to do
    posts nothing (allowed: this is not the group's first collective).
    """
    ops = [dist.P2POp(dist.isend, t, global_rank(group, peer), group) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, t, global_rank(group, peer), group) for peer, t in recvs]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def exchange(
    sends: list[tuple[int, torch.Tensor]], recv_from: list[int], group: dist.ProcessGroup | None
) -> list[torch.Tensor]:
    """Two phases: metadata to every receiver, then the payloads into buffers it allocated.

    `sends` are (peer group rank, tensor); returns the tensors received from
    `recv_from`, in that order.
    """
    device = rank_device()
    outgoing = [(peer, t.to(device).contiguous()) for peer, t in sends]
    metas = [torch.empty(META_LEN, dtype=torch.int64, device=device) for _ in recv_from]
    batched_p2p(
        [(peer, metadata(t, device)) for peer, t in outgoing], list(zip(recv_from, metas)), group
    )
    buffers = [empty_from_metadata(m, device) for m in metas]
    batched_p2p(outgoing, list(zip(recv_from, buffers)), group)
    return buffers


# ------------------------------------------------------------------ the whole step
def offload_encode(
    videos: list[torch.Tensor],
    costs: list[float],
    encode_fn: Callable[[torch.Tensor], torch.Tensor],
    group: dist.ProcessGroup | None = None,
) -> list[torch.Tensor]:
    """Encode this rank's videos with the lb group's help; return their latents in order.

    Every rank of `group` must call this, with or without videos. `group`
    is `ParallelDims(..., lb=n).lb_mesh.get_group()` (None: the whole world).
    """
    if len(costs) != len(videos):
        raise ValueError(f"lb rank {dist.get_rank()}: {len(videos)} videos but {len(costs)} costs")
    me = dist.get_rank(group)
    plan = plan_rebalance(share_costs(costs, group))
    outgoing = [m for m in plan if m.from_rank == me]
    incoming = [m for m in plan if m.to_rank == me]
    guests = exchange(
        [(m.to_rank, videos[m.local_index]) for m in outgoing],
        [m.from_rank for m in incoming],
        group,
    )
    sent_away = {m.local_index for m in outgoing}
    latents = {i: encode_fn(v) for i, v in enumerate(videos) if i not in sent_away}
    guest_latents = [encode_fn(v) for v in guests]
    returned = return_latents(guest_latents, incoming, outgoing, group)
    latents.update(returned)
    return [latents[i] for i in range(len(videos))]


def return_latents(
    guest_latents: list[torch.Tensor],
    incoming: list[Move],
    outgoing: list[Move],
    group: dist.ProcessGroup | None,
) -> dict[int, torch.Tensor]:
    """The latent return path: helpers send latents to owners; owners file them by local index."""
    ### BEGIN SOLUTION
    back = exchange(
        [(m.from_rank, z) for m, z in zip(incoming, guest_latents)],
        [m.to_rank for m in outgoing],
        group,
    )
    return {m.local_index: z for m, z in zip(outgoing, back)}
    ### END SOLUTION
