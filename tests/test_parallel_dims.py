"""ParallelDims: every rule of docs/parallel_dims.md, pure logic first, then real meshes."""

import logging
import multiprocessing
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.device_mesh import init_device_mesh

from paralab import ParallelDims, fsdp_mesh
from paralab.launch import LaunchError, run
from paralab.parallel_dims import mesh_coordinates, predict_groups


@pytest.mark.parametrize(
    "kwargs, axis_text",
    [
        (dict(world_size=0), "world_size=0"),
        (dict(world_size=2.0), "world_size=2.0"),
        (dict(world_size=8, cp=0), "cp=0"),
        (dict(world_size=8, cp=33), "cp=33"),
        (dict(world_size=8, cfgp=3, enable_inference_mode=True), "cfgp=3"),
        (dict(world_size=8, cfgp=0, enable_inference_mode=True), "cfgp=0"),
        (dict(world_size=8, cfgp=2), "cfgp=2 needs enable_inference_mode"),
        (dict(world_size=8, lb=0), "lb=0"),
        (dict(world_size=8, lb=16), "lb=16"),
        (dict(world_size=8, lb=3), "lb=3"),
        (dict(world_size=8, dp_replicate=0), "dp_replicate=0"),
        (dict(world_size=8, dp_replicate=-2), "dp_replicate=-2"),
        (dict(world_size=6, cp=4), "cfgp=1, cp=4"),
        (dict(world_size=4, cp=2, cfgp=2, enable_inference_mode=True, dp_shard=4, lb=1), None),
        (dict(world_size=8, dp_shard=3), "dp_shard=3 does not divide world_size=8"),
        (dict(world_size=8, dp_shard=3, dp_replicate=2), "dp_replicate=2 * dp_shard=3"),
        (dict(world_size=8, dp_shard=4, dp_replicate=4), "dp_replicate=4 * dp_shard=4"),
    ],
)
def test_each_rule_names_its_axis(kwargs, axis_text):
    if axis_text is None:
        ParallelDims(**kwargs)
        return
    with pytest.raises(ValueError, match=axis_text.replace("*", r"\*")):
        ParallelDims(**kwargs)


@pytest.mark.parametrize("axis", ["world_size", "dp_shard", "dp_replicate", "cp", "cfgp", "lb"])
@pytest.mark.parametrize(
    "value, shown",
    [(2.0, "2.0 (float)"), (2.5, "2.5 (float)"), ("2", "'2' (str)"), (None, "None (NoneType)")]
    + [(True, "True (bool)")],
)
def test_every_axis_must_be_an_int_naming_axis_and_value(axis, value, shown):
    kwargs = {"world_size": 8, "enable_inference_mode": True, axis: value}
    with pytest.raises(ValueError) as info:
        ParallelDims(**kwargs)
    message = str(info.value)
    assert f"{axis}={shown.split(' ')[0]}" in message
    assert shown in message or axis == "world_size"  # world_size keeps its range message


@pytest.mark.parametrize("value", ["no", 1, None, 0.0])
def test_enable_inference_mode_must_be_a_bool(value):
    with pytest.raises(ValueError, match=f"enable_inference_mode={value!r}"):
        ParallelDims(8, enable_inference_mode=value)


def test_a_dp_shard_that_does_not_divide_blames_dp_shard_not_an_inferred_replicate():
    with pytest.raises(ValueError) as info:
        ParallelDims(8, dp_shard=3)
    assert "dp_shard=3 does not divide world_size=8" in str(info.value)
    assert "dp_replicate=2" not in str(info.value)


def test_dp_replicate_minus_two_and_every_bad_value_raise_even_under_python_O():
    """`python -O` strips asserts: every bad value must still be refused. Upstream checks a
    negative dp_replicate with an `assert`, so under -O a -2 is inferred like -1."""
    probe = textwrap.dedent("""
        assert False, "this line proves asserts are off"
        from paralab import ParallelDims
        for kwargs in (dict(cp=2.0), dict(cp=True), dict(dp_shard=3), dict(lb=3), dict(cp=0),
                       dict(enable_inference_mode="no"), dict(cfgp=2),
                       dict(dp_shard=4, dp_replicate=-2)):
            try:
                ParallelDims(8, **kwargs)
                print("ACCEPTED", kwargs)
            except ValueError as exc:
                print("refused:", exc)
    """)
    done = subprocess.run(
        [sys.executable, "-O", "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ACCEPTED" not in done.stdout
    refusals = done.stdout.splitlines()
    assert len(refusals) == 8 and all(line.startswith("refused:") for line in refusals)
    assert "dp_replicate" in refusals[-1] and "-2" in refusals[-1]


def _two_rank_descriptor_on_this_group():
    ParallelDims(2).build_meshes("cpu")


def test_a_descriptor_used_on_a_group_of_another_size_names_both_sizes():
    with pytest.raises(LaunchError) as info:
        run(_two_rank_descriptor_on_this_group, 4)
    assert "ParallelDims(world_size=2) is used on a process group of 4 ranks" in str(info.value)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("paralab-rank")]


def test_rules_fire_in_spec_order():
    with pytest.raises(ValueError, match="cp=40"):  # cp (rule 2) before cfgp (rule 3)
        ParallelDims(8, cp=40, cfgp=5)
    with pytest.raises(ValueError, match="cfgp=2 needs"):  # rule 4 before lb (rule 5)
        ParallelDims(8, cfgp=2, lb=3)
    with pytest.raises(ValueError, match="lb=3"):  # rule 5 before dp (rule 9)
        ParallelDims(8, lb=3, dp_shard=3)
    with pytest.raises(ValueError, match="cfgp\\*cp"):  # rule 8 before rule 9
        ParallelDims(6, cp=4, dp_shard=4)


def test_dp_shard_auto_infers_world_and_logs(caplog):
    with caplog.at_level(logging.INFO, logger="paralab.parallel_dims"):
        pd = ParallelDims(8, cp=2)
    assert (pd.dp_shard, pd.dp_replicate) == (8, 1)
    assert "dp_shard auto-inferred as world_size=8" in caplog.text
    assert ParallelDims(8, dp_shard=0).dp_shard == 8


def test_dp_shard_above_world_is_clamped_loudly():
    with pytest.warns(UserWarning, match="dp_shard=16 exceeds world_size=8; clamped"):
        pd = ParallelDims(8, dp_shard=16)
    assert (pd.dp_shard, pd.dp_replicate) == (8, 1)


def test_dp_replicate_inferred_from_dp_shard():
    pd = ParallelDims(8, dp_shard=2)
    assert (pd.dp_shard, pd.dp_replicate) == (2, 4)


def test_flags_and_accessors_before_build():
    pd = ParallelDims(8, dp_replicate=2, dp_shard=4, cp=2, cfgp=2, lb=2, enable_inference_mode=True)
    assert pd.mesh == {}
    assert pd.dp_mesh is pd.cp_mesh is pd.cfgp_mesh is pd.lb_mesh is None
    assert (pd.cp_rank, pd.cp_size, pd.cfgp_rank, pd.cfgp_size, pd.lb_rank, pd.lb_size) == (
        0,
        1,
        0,
        1,
        0,
        1,
    )
    assert (
        pd.dp_shard_enabled
        and pd.dp_replicate_enabled
        and pd.cp_enabled
        and pd.cfgp_enabled
        and pd.lb_enabled
    )


def test_dp_enabled_training_vs_inference():
    assert ParallelDims(1).dp_enabled  # training: always, degree 1 included
    assert not ParallelDims(1, enable_inference_mode=True).dp_enabled
    assert not ParallelDims(
        4, dp_shard=1, enable_inference_mode=True
    ).dp_enabled  # ignores dp_replicate=4
    assert ParallelDims(4, dp_shard=2, enable_inference_mode=True).dp_enabled


def _valid(world, dp_shard, dp_replicate, cp, cfgp, lb, inference):
    """The spec's invariants, written independently of the implementation."""
    if world < 1 or not 1 <= cp <= 32 or cfgp not in (1, 2) or (cfgp > 1 and not inference):
        return False
    if not 1 <= lb <= world or world % lb:
        return False
    shard = world if dp_shard <= 0 else min(dp_shard, world)
    if dp_replicate != -1 and dp_replicate < 1:
        return False
    replicate = world // shard if dp_replicate == -1 else dp_replicate
    return world % (cfgp * cp) == 0 and replicate * shard == world


@settings(max_examples=400, deadline=None)
@given(
    world=st.integers(1, 16),
    dp_shard=st.integers(-1, 20),
    dp_replicate=st.integers(-2, 17),
    cp=st.integers(0, 34),
    cfgp=st.integers(0, 3),
    lb=st.integers(0, 17),
    inference=st.booleans(),
)
def test_construction_succeeds_exactly_when_invariants_hold(
    world, dp_shard, dp_replicate, cp, cfgp, lb, inference
):
    expected = _valid(world, dp_shard, dp_replicate, cp, cfgp, lb, inference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            pd = ParallelDims(world, dp_shard, dp_replicate, cp, cfgp, lb, inference)
        except ValueError:
            assert not expected
            return
    assert expected
    assert pd.dp_replicate * pd.dp_shard == world
    assert world % (pd.cfgp * pd.cp) == 0 and world % pd.lb == 0


# The example table of docs/parallel_dims.md, on real gloo meshes.
SPEC_TABLE = {
    0: {
        "dp_shard": [0, 1, 2, 3],
        "dp_replicate": [0, 4],
        "cfgp": [0, 2],
        "cp": [0, 1],
        "lb": [0, 1],
    },
    1: {
        "dp_shard": [0, 1, 2, 3],
        "dp_replicate": [1, 5],
        "cfgp": [1, 3],
        "cp": [0, 1],
        "lb": [0, 1],
    },
    2: {
        "dp_shard": [0, 1, 2, 3],
        "dp_replicate": [2, 6],
        "cfgp": [0, 2],
        "cp": [2, 3],
        "lb": [2, 3],
    },
    5: {
        "dp_shard": [4, 5, 6, 7],
        "dp_replicate": [1, 5],
        "cfgp": [5, 7],
        "cp": [4, 5],
        "lb": [4, 5],
    },
    7: {
        "dp_shard": [4, 5, 6, 7],
        "dp_replicate": [3, 7],
        "cfgp": [5, 7],
        "cp": [6, 7],
        "lb": [6, 7],
    },
}
SPEC_CONFIG = dict(dp_replicate=2, dp_shard=4, cfgp=2, cp=2, lb=2, enable_inference_mode=True)


def _mesh_report(config):
    pd = ParallelDims(dist.get_world_size(), **config)
    pd.build_meshes("cpu")
    fm = fsdp_mesh(pd)
    return {
        "groups": pd.group_ranks(),
        "keys": sorted(pd.mesh),
        "local": (pd.cp_rank, pd.cp_size, pd.cfgp_rank, pd.cfgp_size, pd.lb_rank, pd.lb_size),
        "dp_mesh": (pd.dp_mesh.ndim, tuple(pd.dp_mesh.mesh_dim_names), tuple(pd.dp_mesh.shape)),
        "fsdp_mesh": None if fm is None else (fm.ndim, tuple(fm.shape)),
    }


def test_world8_meshes_match_the_spec_table():
    reports = run(_mesh_report, 8, SPEC_CONFIG)
    pd = ParallelDims(8, **SPEC_CONFIG)
    for rank, report in enumerate(reports):
        if rank in SPEC_TABLE:
            assert report["groups"] == SPEC_TABLE[rank], f"rank {rank}"
        assert report["groups"] == predict_groups(pd, rank), f"rank {rank}"
        assert report["keys"] == ["cfgp", "cp", "dp", "dp_replicate", "dp_shard", "lb"]
        cp_rank, cp_size, cfgp_rank, cfgp_size, lb_rank, lb_size = report["local"]
        assert (cp_rank, cfgp_rank, lb_rank) == (rank % 2, rank // 2 % 2, rank % 2)
        assert (cp_size, cfgp_size, lb_size) == (2, 2, 2)
        assert report["dp_mesh"] == (2, ("dp_replicate", "dp_shard"), (2, 4))
        assert report["fsdp_mesh"] == (2, (2, 4))


def _real_coordinates(config):
    """This rank's coordinate on every dim of the three meshes, read off real `DeviceMesh`es."""
    pd = ParallelDims(dist.get_world_size(), **config)
    coordinates = {}
    for dims, names in pd.mesh_layouts().values():
        mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
        coordinates.update(zip(names, mesh.get_coordinate()))
    return coordinates


@pytest.mark.parametrize(
    "world, config", [(8, SPEC_CONFIG), (6, dict(dp_replicate=3, dp_shard=2, cp=2, lb=3))]
)
def test_mesh_coordinates_are_the_real_meshes_coordinates(world, config):
    pd = ParallelDims(world, **config)
    real = run(_real_coordinates, world, config)
    assert [mesh_coordinates(pd, rank) for rank in range(world)] == real


def test_singleton_axes_keep_2d_dp_mesh_and_drop_submeshes():
    reports = run(_mesh_report, 4, dict(dp_shard=4))
    for report in reports:
        assert report["keys"] == ["dp", "dp_shard"]
        assert report["dp_mesh"] == (2, ("dp_replicate", "dp_shard"), (1, 4))
        assert report["fsdp_mesh"] == (1, (4,))  # the 1-D mesh: no HSDP trap
        assert report["local"] == (0, 1, 0, 1, 0, 1)


def test_cp_only_overlay_and_lb_mesh():
    reports = run(_mesh_report, 4, dict(cp=4, lb=2))
    assert [r["groups"]["cp"] for r in reports] == [[0, 1, 2, 3]] * 4
    assert [r["groups"]["lb"] for r in reports] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all("cfgp" not in r["keys"] for r in reports)


def test_fsdp_mesh_none_for_one_rank_and_2d_for_pure_replication():
    assert run(_mesh_report, 1, {})[0]["fsdp_mesh"] is None
    assert [r["fsdp_mesh"] for r in run(_mesh_report, 2, dict(dp_shard=1))] == [(2, (2, 1))] * 2


@pytest.mark.parametrize(
    "dims, names, message",
    [
        ((2, 4), ("a",), "differ in length"),
        ((0, 8), ("a", "b"), "a=0"),
        ((2, 2), ("a", "b"), "has 4 ranks, world_size is 8"),
    ],
)
def test_build_mesh_rejects_bad_shapes(dims, names, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(8)._build_mesh("cpu", dims, names)
