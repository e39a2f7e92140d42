"""`ParallelDims`: which ranks talk to which, for every parallel axis.

Two kinds of axis. Partition axes (`dp_shard`, `dp_replicate`) divide the
world: `dp_replicate * dp_shard == world_size`. Overlay axes (`cp`, `cfgp`,
and the separate `lb`) take no rank slots of their own: they group the same
ranks a second time. The rules are pinned by `shared/spec/parallel_dims.md`
and by `tests/test_parallel_dims.py`.
"""
from __future__ import annotations

import logging
import math
import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

logger = logging.getLogger(__name__)

MAX_CP = 32


class ParallelDims:
    """Validated axis sizes plus the device meshes built from them."""

    def __init__(
        self,
        world_size: int,
        dp_shard: int = -1,
        dp_replicate: int = -1,
        cp: int = 1,
        cfgp: int = 1,
        lb: int = 1,
        enable_inference_mode: bool = False,
    ) -> None:
        self._world_size = world_size
        self._dp_shard = dp_shard
        self._dp_replicate = dp_replicate
        self._cp = cp
        self._cfgp = cfgp
        self._lb = lb
        self._enable_inference_mode = bool(enable_inference_mode)
        self._meshes: dict[str, DeviceMesh] = {}
        self._validate()

    def _validate(self) -> None:
        world = self._world_size
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world_size must be an int >= 1, got world_size={world!r}")
        if not 1 <= self._cp <= MAX_CP:
            raise ValueError(f"cp must be in [1, {MAX_CP}], got cp={self._cp}")
        if self._cfgp not in (1, 2):
            raise ValueError(f"cfgp must be 1 or 2 (cond + uncond branches), got cfgp={self._cfgp}")
        if self._cfgp > 1 and not self._enable_inference_mode:
            raise ValueError(
                f"cfgp={self._cfgp} needs enable_inference_mode=True: "
                "CFG parallelism is an inference-only axis"
            )
        if not 1 <= self._lb <= world or world % self._lb != 0:
            raise ValueError(
                f"lb must be in [1, world_size={world}] and divide it, got lb={self._lb}"
            )
        if self._dp_shard <= 0:
            self._dp_shard = world
            logger.info("dp_shard auto-inferred as world_size=%d (overlay axes use no dp budget)", world)
        elif self._dp_shard > world:
            warnings.warn(
                f"dp_shard={self._dp_shard} exceeds world_size={world}; clamped to dp_shard={world}. "
                "This launch runs a different topology than the one configured.",
                UserWarning,
                stacklevel=3,
            )
            self._dp_shard = world
        if self._dp_replicate != -1 and self._dp_replicate < 1:
            raise ValueError(f"dp_replicate must be -1 (infer) or >= 1, got dp_replicate={self._dp_replicate}")
        if self._dp_replicate == -1:
            self._dp_replicate = world // self._dp_shard
        if world % (self._cfgp * self._cp) != 0:
            raise ValueError(
                f"world_size={world} is not divisible by cfgp*cp={self._cfgp * self._cp} "
                f"(cfgp={self._cfgp}, cp={self._cp}); the overlay mesh (rest, cfgp, cp) "
                "would not tile the world"
            )
        if self._dp_replicate * self._dp_shard != world:
            raise ValueError(
                f"dp_replicate={self._dp_replicate} * dp_shard={self._dp_shard} = "
                f"{self._dp_replicate * self._dp_shard} != world_size={world}"
            )

    # ----------------------------------------------------------- meshes
    def build_meshes(self, device_type: str | None = None) -> dict[str, DeviceMesh]:
        """Build every enabled mesh with the real `init_device_mesh` (needs a process group)."""
        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self._device_type = device_type
        world = self._world_size
        meshes: dict[str, DeviceMesh] = {}
        if self.cp_enabled or self.cfgp_enabled:
            overlay = self._build_mesh(
                (world // (self._cfgp * self._cp), self._cfgp, self._cp), ("rest", "cfgp", "cp")
            )
            for axis in ("cfgp", "cp"):
                if getattr(self, f"_{axis}") > 1:
                    meshes[axis] = overlay[axis]
        if self.dp_enabled:
            dp = self._build_mesh((self._dp_replicate, self._dp_shard), ("dp_replicate", "dp_shard"))
            meshes["dp"] = dp
            for axis in ("dp_shard", "dp_replicate"):
                if getattr(self, f"_{axis}") > 1:
                    meshes[axis] = dp[axis]
        if self.lb_enabled:
            lb = self._build_mesh((world // self._lb, self._lb), ("lb_rest", "lb"))
            meshes["lb"] = lb["lb"]
        self._meshes = meshes
        return dict(meshes)

    def _build_mesh(self, dims: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        if len(dims) != len(names):
            raise ValueError(f"mesh dims {dims} and names {names} differ in length")
        bad = [f"{n}={d}" for d, n in zip(dims, names) if d <= 0]
        if bad:
            raise ValueError(f"mesh dims must be >= 1, got {', '.join(bad)}")
        if math.prod(dims) != self._world_size:
            raise ValueError(
                f"mesh {dict(zip(names, dims))} has {math.prod(dims)} ranks, "
                f"world_size is {self._world_size}"
            )
        device_type = getattr(self, "_device_type", "cpu")
        return init_device_mesh(device_type, tuple(dims), mesh_dim_names=tuple(names))

    # ----------------------------------------------------------- sizes
    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def dp_shard(self) -> int:
        return self._dp_shard

    @property
    def dp_replicate(self) -> int:
        return self._dp_replicate

    @property
    def cp(self) -> int:
        return self._cp

    @property
    def cfgp(self) -> int:
        return self._cfgp

    @property
    def lb(self) -> int:
        return self._lb

    @property
    def enable_inference_mode(self) -> bool:
        return self._enable_inference_mode

    # ----------------------------------------------------------- flags
    @property
    def dp_enabled(self) -> bool:
        """Training always wraps with FSDP (it installs the mixed-precision policy)."""
        if self._enable_inference_mode:
            return self._dp_shard > 1
        return True

    @property
    def dp_shard_enabled(self) -> bool:
        return self._dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._dp_replicate > 1

    @property
    def cp_enabled(self) -> bool:
        return self._cp > 1

    @property
    def cfgp_enabled(self) -> bool:
        return self._cfgp > 1

    @property
    def lb_enabled(self) -> bool:
        return self._lb > 1

    # ----------------------------------------------------------- meshes
    @property
    def mesh(self) -> dict[str, DeviceMesh]:
        return dict(self._meshes)

    @property
    def dp_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("dp")

    @property
    def dp_shard_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("dp_shard")

    @property
    def dp_replicate_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("dp_replicate")

    @property
    def cp_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("cp")

    @property
    def cfgp_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("cfgp")

    @property
    def lb_mesh(self) -> DeviceMesh | None:
        return self._meshes.get("lb")

    def _local(self, axis: str) -> tuple[int, int]:
        mesh = self._meshes.get(axis)
        if mesh is None:
            return 0, 1
        return mesh.get_local_rank(), mesh.size()

    @property
    def cp_rank(self) -> int:
        return self._local("cp")[0]

    @property
    def cp_size(self) -> int:
        return self._local("cp")[1]

    @property
    def cfgp_rank(self) -> int:
        return self._local("cfgp")[0]

    @property
    def cfgp_size(self) -> int:
        return self._local("cfgp")[1]

    @property
    def lb_rank(self) -> int:
        return self._local("lb")[0]

    @property
    def lb_size(self) -> int:
        return self._local("lb")[1]

    def group_ranks(self) -> dict[str, list[int]]:
        """This rank's group on every built 1-D mesh, read from the real DeviceMesh."""
        return {
            axis: mesh.mesh.flatten().tolist()
            for axis, mesh in self._meshes.items()
            if mesh.ndim == 1
        }

    def __repr__(self) -> str:
        return (
            f"ParallelDims(world_size={self._world_size}, dp_shard={self._dp_shard}, "
            f"dp_replicate={self._dp_replicate}, cp={self._cp}, cfgp={self._cfgp}, lb={self._lb}, "
            f"enable_inference_mode={self._enable_inference_mode})"
        )


def fsdp_mesh(parallel_dims: ParallelDims) -> DeviceMesh | None:
    """The mesh to hand `fully_shard`.

    FSDP2 picks HSDP from `mesh.ndim` alone, so the 2-D dp mesh with
    `dp_replicate == 1` would add an all-reduce over a one-rank group per unit
    per step. Hand it the 1-D shard mesh unless there really are replicas.
    """
    if parallel_dims.dp_replicate > 1:
        return parallel_dims.dp_mesh
    return parallel_dims.dp_shard_mesh


def predict_groups(parallel_dims: ParallelDims, rank: int) -> dict[str, list[int]]:
    """Row-major arithmetic for the groups `build_meshes` gives `rank`, without any process group.

    A mesh of shape (..., n) named (..., axis) puts rank r in the group of the
    n ranks that share every other coordinate: the ranks r - r % n ... when the
    axis is last, strided by the product of the later dims otherwise.
    """
    ### BEGIN SOLUTION
    pd, world = parallel_dims, parallel_dims.world_size
    layouts = {
        "cfgp": ((world // (pd.cfgp * pd.cp), pd.cfgp, pd.cp), 1),
        "cp": ((world // (pd.cfgp * pd.cp), pd.cfgp, pd.cp), 2),
        "dp_replicate": ((pd.dp_replicate, pd.dp_shard), 0),
        "dp_shard": ((pd.dp_replicate, pd.dp_shard), 1),
        "lb": ((world // pd.lb, pd.lb), 1),
    }
    sizes = {"cfgp": pd.cfgp, "cp": pd.cp, "dp_replicate": pd.dp_replicate, "dp_shard": pd.dp_shard, "lb": pd.lb}
    groups = {}
    for axis, (shape, dim) in layouts.items():
        if sizes[axis] == 1 or (axis.startswith("dp") and not pd.dp_enabled):
            continue
        stride = math.prod(shape[dim + 1:])
        first = rank - (rank // stride % shape[dim]) * stride
        groups[axis] = [first + i * stride for i in range(shape[dim])]
    return groups
    ### END SOLUTION
