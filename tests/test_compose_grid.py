"""`compose.Grid` against torchtitan's `ParallelDims`, its rules re-expressed here.

torchtitan (pytorch/torchtitan@f64bbad, `ParallelDims._validate` and `build_mesh`) accepts
a configuration when every degree but dp_shard is >= 1, dp_shard is -1 (inferred as
world // the rest) or >= 1, the product is the world, and with ep > 1: etp is tp or 1,
ep a multiple of cp (etp = tp) or of cp·tp (etp = 1) and dividing dp_shard·cp (·tp). Its
groups are the rows of `arange(world)` reshaped to (pp, dp_replicate, dp_shard, cp, tp)
(with ep: dp_shard split as (dp_shard_mod_ep, dp_shard_in_ep)) along the named dims,
flattened in mesh order. On every configuration up to 64 ranks both decide alike and,
when accepted with `Grid(order=TORCHTITAN_ORDER)`, every rank's groups are the same lists.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from paralab.compose import DOC_ORDER, TORCHTITAN_ORDER, TP_OUTERMOST, Grid, GridError
from paralab.compose.bridge import from_overlay, to_overlay
from paralab.compose.grid import AXES, pipeline_neighbours, rank_coordinates
from paralab.launch import run
from paralab.parallel_dims import ParallelDims, predict_groups

MAX_WORLD = 64


def _groups_along(mesh: torch.Tensor, names: tuple, along: list) -> list[tuple]:
    """Per rank, the ranks of its group along the named dims of `mesh` (a rank -> group table)."""
    idx = [names.index(d) for d in along]
    rest = [i for i in range(len(names)) if i not in idx]
    rows = mesh.permute(rest + idx).reshape(-1, math.prod(mesh.shape[i] for i in idx))
    table: list = [None] * mesh.numel()
    for row in rows.tolist():
        for r in row:
            table[r] = tuple(row)
    return table


def torchtitan_dp_shard(world, dp_replicate, dp_shard, cp, tp, pp, ep, etp) -> int | None:
    """torchtitan's decision: the (inferred) dp_shard when accepted, None when an assert fires."""
    if any(d < 1 for d in (dp_replicate, cp, tp, pp, ep, etp)):
        return None
    if not (dp_shard == -1 or dp_shard >= 1):
        return None
    if dp_shard < 0:
        dp_shard = world // (dp_replicate * cp * tp * pp)
    if dp_shard < 1 or dp_replicate * dp_shard * cp * tp * pp != world:
        return None
    if ep > 1:
        if etp not in (tp, 1):
            return None
        if etp == tp:
            if ep % cp or (dp_shard * cp) % ep:
                return None
        elif ep % (cp * tp) or (dp_shard * cp * tp) % ep:
            return None
    return dp_shard


def torchtitan_groups(
    world, dp_replicate, dp_shard, cp, tp, pp, ep, etp, only=None
) -> dict[str, list]:
    """Every rank's group per name (or per name in `only`), from the reshaped world mesh as
    torchtitan builds it."""
    if ep == 1:
        in_ep = 1
    else:
        in_ep = ep // cp if etp == tp else ep // (cp * tp)
    names = ("pp", "dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp")
    sizes = (pp, dp_replicate, dp_shard // in_ep, in_ep, cp, tp)
    mesh = torch.arange(world).reshape(sizes)
    dims = {
        "pp": ["pp"],
        "dp_replicate": ["dp_replicate"],
        "dp_shard": ["dp_shard_mod_ep", "dp_shard_in_ep"],
        "cp": ["cp"],
        "tp": ["tp"],
        "dp": ["dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep"],
        "dp_shard_cp": ["dp_shard_mod_ep", "dp_shard_in_ep", "cp"],
        "dp_cp": ["dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp"],
        "dp_shard_in_ep": ["dp_shard_in_ep"],
        "dp_shard_mod_ep": ["dp_shard_mod_ep"],
    }
    if ep > 1:
        dims["ep"] = ["dp_shard_in_ep", "cp"] + (["tp"] if etp == 1 else [])
    out = {
        name: _groups_along(mesh, names, along)
        for name, along in dims.items()
        if only is None or name in only
    }
    if ep == 1 and (only is None or "ep" in only):
        out["ep"] = [(r,) for r in range(world)]
    return out


def configurations():
    """Every (dp_replicate, cp, tp, pp) whose product divides world <= 64, with dp_shard -1,
    the exact value and one too many, ep over the divisors of world up to 8 and 3, etp 1 and tp."""
    for world in range(1, MAX_WORLD + 1):
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        for dpr, cp, tp, pp in itertools.product(divisors, repeat=4):
            rest = dpr * cp * tp * pp
            if world % rest:
                continue
            for dp_shard in (-1, world // rest, world // rest + 1):
                for ep in sorted({e for e in divisors if e <= 8} | {3}):
                    for etp in sorted({1, tp}):
                        yield world, dpr, dp_shard, cp, tp, pp, ep, etp


def test_accept_reject_and_every_group_agree_with_torchtitan_up_to_64_ranks():
    decided = accepted = compared = 0
    for world, dpr, dps, cp, tp, pp, ep, etp in configurations():
        want = torchtitan_dp_shard(world, dpr, dps, cp, tp, pp, ep, etp)
        try:
            grid = Grid(world, dpr, dps, cp, tp, pp, ep, etp, order=TORCHTITAN_ORDER)
        except GridError:
            grid = None
        decided += 1
        assert (grid is None) == (want is None), (world, dpr, dps, cp, tp, pp, ep, etp)
        if grid is None:
            continue
        accepted += 1
        assert grid.dp_shard == want
        if dps == -1:
            continue  # the same configuration as the exact dp_shard: compare its groups once
        # the dense groups do not depend on ep: compared at ep = 1
        only = ("ep", "dp_shard_in_ep", "dp_shard_mod_ep") if ep > 1 else None
        theirs = torchtitan_groups(world, dpr, want, cp, tp, pp, ep, etp, only)
        if ep > 1:
            assert set(theirs) == set(only)
        for name, table in theirs.items():
            assert grid.table(name) == table, (name, world, dpr, dps, cp, tp, pp, ep, etp)
            compared += world
    assert decided > 50_000 and accepted > 5_000 and compared > 100_000, (
        decided,
        accepted,
        compared,
    )


def test_coordinates_and_pipeline_neighbours_agree_with_the_reshaped_world_in_every_order():
    """A rank's coordinates are its index in `arange(world)` reshaped to the order's sizes (and
    `Grid.coords` says the same); its pipeline neighbours are the entries before and after it in
    its pp group, None past either end. Every order of the five axes, grids of 3 to 24 ranks."""
    checked = 0
    for order in itertools.permutations(AXES):
        for sizes in ((2, 1, 2, 2, 2), (1, 2, 1, 4, 3), (1, 1, 1, 1, 3), (3, 1, 2, 1, 2)):
            grid = Grid(math.prod(sizes), *sizes, order=order)
            mesh = torch.arange(grid.world).reshape([grid.sizes[a] for a in order])
            for rank in range(grid.world):
                where = dict(zip(order, (mesh == rank).nonzero()[0].tolist()))
                assert rank_coordinates(rank, grid.sizes, order) == where, (order, sizes, rank)
                assert grid.coords(rank) == where
                stages = grid.group(rank, "pp")
                i = stages.index(rank)
                assert pipeline_neighbours(rank, grid.sizes, order) == (
                    stages[i - 1] if i > 0 else None,
                    stages[i + 1] if i + 1 < len(stages) else None,
                ), (order, sizes, rank)
                checked += 1
    assert checked == 120 * (16 + 24 + 3 + 12)


def test_rejections_name_the_axis():
    cases = {
        "cp": dict(cp=0),
        "dp_shard": dict(dp_shard=0),
        "world": dict(tp=3),
        "etp": dict(tp=2, ep=2, etp=4, dp_shard=4),
        "ep = 3": dict(ep=3),
    }
    for word, sizes in cases.items():
        with pytest.raises(GridError, match=word):
            Grid(8, **sizes)


def test_doc_order_puts_tp_innermost_and_dp_outermost():
    grid = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=DOC_ORDER)
    assert [grid.stride(a) for a in ("tp", "cp", "pp", "dp_replicate")] == [1, 2, 4, 8]
    titan = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=TORCHTITAN_ORDER)
    assert [titan.stride(a) for a in ("tp", "cp", "dp_replicate", "pp")] == [1, 2, 4, 8]
    wrong = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=TP_OUTERMOST)
    assert wrong.stride("tp") == 8 and wrong.stride("cp") == 1


def test_every_order_partitions_the_world_the_same_way_in_size():
    """Each group is a partition of the world into groups of the axis's size, in every order."""
    for order in (DOC_ORDER, TORCHTITAN_ORDER, TP_OUTERMOST):
        grid = Grid(16, dp_shard=2, cp=2, tp=2, pp=2, ep=4, etp=2, order=order)
        for name in grid.names():
            groups = grid.groups(name)
            assert sorted(r for g in groups for r in g) == list(range(16)), (order, name)
            assert {len(g) for g in groups} == {grid.size(name)}
        assert grid.size("ep") == 4 and grid.size("dp_shard_cp") == 4


def test_the_bridge_to_the_overlay_reading_keeps_every_group_where_one_exists():
    """Every overlay configuration up to 32 ranks: where `from_overlay` accepts, Grid's cp,
    dp_shard_cp and dp_replicate groups are the overlay's cp, dp_shard and dp_replicate groups
    (`parallel_dims.predict_groups`), and `to_overlay` brings the same configuration back."""
    bridged = refused = 0
    for world in range(1, 33):
        for dp_shard in range(1, world + 1):
            for cp in (1, 2, 4, 8):
                if world % dp_shard or world % cp:
                    continue
                dims = ParallelDims(world, dp_shard=dp_shard, cp=cp)
                if dp_shard % cp:
                    with pytest.raises(GridError, match="does not divide dp_shard"):
                        from_overlay(dims)
                    refused += 1
                    continue
                grid = from_overlay(dims)
                for rank in range(world):
                    theirs = predict_groups(dims, rank)
                    ours = {"cp": "cp", "dp_shard": "dp_shard_cp", "dp_replicate": "dp_replicate"}
                    for axis, name in ours.items():
                        assert list(grid.group(rank, name)) == theirs.get(axis, [rank])
                back = to_overlay(grid)
                assert (back.dp_shard, back.dp_replicate, back.cp) == (
                    dp_shard,
                    world // dp_shard,
                    cp,
                )
                bridged += 1
    assert bridged > 100 and refused > 10
    for axis in ("tp", "pp"):
        with pytest.raises(GridError, match=axis):
            to_overlay(Grid(8, **{axis: 2}))


def test_the_rank_places_and_group_bytes_pictures_draw():
    from paralab.compose.costs import per_group
    from paralab.compose.model import CONFIG
    from paralab.viz import plot_group_bytes, plot_rank_places

    grid = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2)
    assert len(plot_rank_places(grid).axes) == 4
    assert len(plot_group_bytes({"toy": per_group(grid, CONFIG, 4)}).axes) == 1


def torchtitan_238fa99_groups(world, dp_replicate, dp_shard, cp, tp, pp, ep, etp) -> dict | None:
    """pytorch/torchtitan@238fa99's `build_mesh`, re-expressed: three meshes unflattened from
    the world, (pp, batch, cp, tp), (pp, dp_replicate, fsdp, tp) and (pp, dp_replicate, efsdp,
    ep, etp), with loss = batch x cp flattened. `_validate` no longer states the ep rules; a
    configuration fails when an unflatten does not multiply back to the world. None then."""
    batch, fsdp = dp_replicate * dp_shard, dp_shard * cp
    efsdp = fsdp * tp // (etp * ep)
    meshes = {
        "dataloading": (("pp", "batch", "cp", "tp"), (pp, batch, cp, tp)),
        "dense": (("pp", "dp_replicate", "fsdp", "tp"), (pp, dp_replicate, fsdp, tp)),
        "sparse": (
            ("pp", "dp_replicate", "efsdp", "ep", "etp"),
            (pp, dp_replicate, efsdp, ep, etp),
        ),
    }
    if any(math.prod(sizes) != world for _, sizes in meshes.values()):
        return None
    wanted = {
        "dataloading": {
            "pp": ["pp"],
            "batch": ["batch"],
            "cp": ["cp"],
            "tp": ["tp"],
            "loss": ["batch", "cp"],
        },
        "dense": {"dp_replicate": ["dp_replicate"], "fsdp": ["fsdp"]},
        "sparse": {"ep": ["ep"], "efsdp": ["efsdp"]},
    }
    out = {}
    for mesh_name, (names, sizes) in meshes.items():
        mesh = torch.arange(world).reshape(sizes)
        for name, along in wanted[mesh_name].items():
            out[name] = _groups_along(mesh, names, along)
    return out


def test_grid_answers_to_torchtitan_238fa99_names_and_its_looser_ep_rule():
    """Up to 32 ranks (64 take 12 s), where f64bbad's rules accept (Grid), 238fa99's unflattened
    meshes accept too and give the same groups under its names (batch, fsdp, loss; ep and efsdp
    when ep > 1, where efsdp exists). 238fa99 also accepts an ep that does not cover cp, which
    f64bbad refused."""
    compared = 0
    for world, dpr, dps, cp, tp, pp, ep, etp in configurations():
        if dps == -1 or world > 32:
            continue
        try:
            grid = Grid(world, dpr, dps, cp, tp, pp, ep, etp, order=TORCHTITAN_ORDER)
        except GridError:
            continue
        theirs = torchtitan_238fa99_groups(world, dpr, dps, cp, tp, pp, ep, etp)
        assert theirs is not None, (world, dpr, dps, cp, tp, pp, ep, etp)
        names = (
            ("ep", "efsdp")
            if ep > 1
            else ("pp", "batch", "cp", "tp", "loss", "dp_replicate", "fsdp")
        )
        for name in names:
            assert grid.table(name) == theirs[name], (name, world, dpr, dps, cp, tp, pp, ep, etp)
            compared += 1
    assert compared > 10_000, compared
    # cp 4, ep 2 on 8 ranks: refused at f64bbad (ep % cp), accepted at 238fa99, whose ep
    # group {0, 1} is half of the cp group {0, 1, 2, 3}
    with pytest.raises(GridError, match="multiple of cp"):
        Grid(8, dp_shard=2, cp=4, ep=2, etp=1, order=TORCHTITAN_ORDER)
    looser = torchtitan_238fa99_groups(8, 1, 2, 4, 1, 1, 2, 1)
    assert looser is not None and looser["ep"][0] == (0, 1) and looser["cp"][0] == (0, 1, 2, 3)


def test_what_to_try_hints_hold():
    """The lab's "What to try" hints that need no ranks: torchtitan's order on two 8-rank nodes
    sends only pp across them; without replicas and cp the clinic's dp_cp is dp_shard_cp; the
    etp = 1 refusal; tp heaviest at 64 GPUs with no replica group."""
    from paralab.compose.costs import per_group
    from paralab.tp.model import LMConfig

    def spans_nodes(group):
        return len({r // 8 for r in group}) > 1

    titan = Grid(16, dp_replicate=2, cp=2, tp=2, pp=2, order=TORCHTITAN_ORDER)
    crossing = {
        n
        for n in ("tp", "cp", "pp", "dp_replicate", "dp_shard_cp")
        if any(map(spans_nodes, titan.groups(n)))
    }
    assert crossing == {"pp"}
    flat = Grid(8, dp_shard=2, tp=2, pp=2)
    assert flat.table("dp_cp") == flat.table("dp_shard_cp")
    with pytest.raises(GridError, match="ep = 2 must be a multiple of cp x tp = 4"):
        Grid(8, dp_shard=2, cp=2, tp=2, ep=2, etp=1)
    llama = LMConfig(vocab=128256, hidden=4096, heads=32, ffn=14336, blocks=32, seq=8192, batch=8)
    grid = Grid(64, cp=2, tp=8, pp=4)
    table = per_group(grid, llama, 8, itemsize=2)
    assert grid.dp_shard == 1 and "dp_replicate" not in table
    assert table["tp"] > 9 * max(v for k, v in table.items() if k != "tp")


def _unflatten_efsdp(*candidates: tuple[int, ...]) -> list[str]:
    """On every rank: torchtitan@238fa99's sparse mesh unflattened out of the world mesh."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("world",))
    out = []
    for sizes in candidates:
        try:
            mesh._unflatten(0, sizes, ("pp", "dp_replicate", "efsdp", "ep", "etp"))
            out.append("accepted")
        except ValueError as exc:
            out.append(str(exc))
    return out


def test_unflatten_refuses_sizes_that_miss_the_world():
    """Chapter 1 §1: dp_shard 3, ep 2 on 6 ranks gives efsdp = 3 // 2 = 1, and the sparse mesh
    (1, 1, 1, 2, 1) is refused inside torch's `DeviceMesh._unflatten`; (1, 1, 3, 2, 1) is not."""
    refused, accepted = run(_unflatten_efsdp, 6, (1, 1, 3 // 2, 2, 1), (1, 1, 3, 2, 1))[0]
    assert "product of mesh_sizes" in refused, refused
    assert accepted == "accepted"
