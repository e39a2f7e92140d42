"""`ParallelDims`: which ranks talk to which, for every parallel axis.

Two kinds of axis. Partition axes (`dp_shard`, `dp_replicate`) divide the
world: `dp_replicate * dp_shard == world_size`. Overlay axes (`cp`, `cfgp`,
and the separate `lb`) take no rank slots of their own: they group the same
ranks a second time. The rules are written out in `docs/parallel_dims.md` and
pinned by `tests/test_parallel_dims.py`. Like torchtitan's `ParallelDims`, it
is a dataclass validated in `__post_init__`.
"""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

logger = logging.getLogger(__name__)

MAX_CP = 32
AXES = ("world_size", "dp_shard", "dp_replicate", "cp", "cfgp", "lb")
"""The integer fields: each must be a real int (not a float, a string, None or a bool)."""


@dataclass(frozen=True)
class ParallelDims:
    """Validated axis sizes plus the device meshes built from them.

    `dp_shard` and `dp_replicate` of -1 (or `dp_shard <= 0`) are inferred at
    construction; the object is frozen afterwards, so a size cannot change
    under meshes already built.
    """

    world_size: int
    dp_shard: int = -1
    dp_replicate: int = -1
    cp: int = 1
    cfgp: int = 1
    lb: int = 1
    enable_inference_mode: bool = False
    _meshes: dict[str, DeviceMesh] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._validate()

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # the frozen dataclass's own fields, while validating

    def _check_types(self) -> None:
        """Sizes are ints and the mode a bool, named with the value: `cp=2.0` or `cp=True`
        would pass the range checks and fail later, deep in torch."""
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(
                    f"{axis} must be an int, got {axis}={value!r} ({type(value).__name__})"
                )
            self._set(axis, int(value))
        if not isinstance(self.enable_inference_mode, bool):
            raise ValueError(
                "enable_inference_mode must be True or False, got "
                f"enable_inference_mode={self.enable_inference_mode!r}"
            )

    def _validate(self) -> None:
        world = self.world_size
        if isinstance(world, bool) or not isinstance(world, numbers.Integral) or world < 1:
            raise ValueError(f"world_size must be an int >= 1, got world_size={world!r}")
        self._check_types()
        if not 1 <= self.cp <= MAX_CP:
            raise ValueError(f"cp must be in [1, {MAX_CP}], got cp={self.cp}")
        if self.cfgp not in (1, 2):
            raise ValueError(f"cfgp must be 1 or 2 (cond + uncond branches), got cfgp={self.cfgp}")
        if self.cfgp > 1 and not self.enable_inference_mode:
            raise ValueError(
                f"cfgp={self.cfgp} needs enable_inference_mode=True: "
                "CFG parallelism is an inference-only axis"
            )
        if not 1 <= self.lb <= world or world % self.lb != 0:
            raise ValueError(
                f"lb must be in [1, world_size={world}] and divide it, got lb={self.lb}"
            )
        if self.dp_shard <= 0:
            self._set("dp_shard", world)
            logger.info(
                "dp_shard auto-inferred as world_size=%d (overlay axes use no dp budget)", world
            )
        elif self.dp_shard > world:
            warnings.warn(
                f"dp_shard={self.dp_shard} exceeds world_size={world}; clamped to dp_shard={world}. "
                "This launch runs a different topology than the one configured.",
                UserWarning,
                stacklevel=4,
            )
            self._set("dp_shard", world)
        if self.dp_replicate != -1 and self.dp_replicate < 1:
            raise ValueError(
                f"dp_replicate must be -1 (infer) or >= 1, got dp_replicate={self.dp_replicate}"
            )
        replicate_inferred = self.dp_replicate == -1
        if replicate_inferred:
            self._set("dp_replicate", world // self.dp_shard)
        if world % (self.cfgp * self.cp) != 0:
            raise ValueError(
                f"world_size={world} is not divisible by cfgp*cp={self.cfgp * self.cp} "
                f"(cfgp={self.cfgp}, cp={self.cp}); the overlay mesh (rest, cfgp, cp) "
                "would not tile the world"
            )
        if replicate_inferred and world % self.dp_shard != 0:
            raise ValueError(
                f"dp_shard={self.dp_shard} does not divide world_size={world}: dp_replicate "
                "(not given) is inferred as world_size / dp_shard"
            )
        if self.dp_replicate * self.dp_shard != world:
            raise ValueError(
                f"dp_replicate={self.dp_replicate} * dp_shard={self.dp_shard} = "
                f"{self.dp_replicate * self.dp_shard} != world_size={world}"
            )

    # ----------------------------------------------------------- meshes
    def mesh_layouts(self) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        """Each family's mesh, row-major: its dims and their names. One table for
        `build_meshes` (the real meshes) and `predict_groups` (the arithmetic).

        - overlay: (world/(cfgp*cp), cfgp, cp); its `cfgp` slice pairs the two
          guidance branches (`paralab.cfgp`), its `cp` slice is the ring / Ulysses
          group (`paralab.cp`). cp is last, so cp partners are neighbours.
        - dp: (dp_replicate, dp_shard), 2-D even with one replica; its `dp_shard`
          slice splits one model copy, its `dp_replicate` slice holds the same
          shard (`paralab.fsdp`, FSDP2 through `fsdp_mesh`).
        - lb: (world/lb, lb); its `lb` slice shares raw videos before the VAE
          encode (`paralab.vae_lb`).
        """
        world = self.world_size
        return {
            "overlay": (
                (world // (self.cfgp * self.cp), self.cfgp, self.cp),
                ("rest", "cfgp", "cp"),
            ),
            "dp": ((self.dp_replicate, self.dp_shard), ("dp_replicate", "dp_shard")),
            "lb": ((world // self.lb, self.lb), ("lb_rest", "lb")),
        }

    def axes_enabled(self) -> list[str]:
        """The axes that get a group: size > 1 (and the dp axes only when `dp_enabled`)."""
        dp = ["dp_shard", "dp_replicate"] if self.dp_enabled else []
        return [axis for axis in ("cfgp", "cp", *dp, "lb") if getattr(self, axis) > 1]

    def build_meshes(self, device_type: str | None = None) -> dict[str, DeviceMesh]:
        """Build the meshes of `mesh_layouts` with the real `init_device_mesh` (needs a process group),
        and keep each enabled axis' 1-D slice under the axis' name. The 2-D dp mesh is kept whole
        as "dp" (HSDP hands it to FSDP2). `device_type` defaults to "cuda" when CUDA is there."""
        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        if dist.is_initialized() and dist.get_world_size() != self.world_size:
            raise ValueError(
                f"ParallelDims(world_size={self.world_size}) is used on a process group of "
                f"{dist.get_world_size()} ranks: build it with "
                "world_size=dist.get_world_size(), or launch that many ranks"
            )
        enabled = self.axes_enabled()
        meshes: dict[str, DeviceMesh] = {}
        for family, (dims, names) in self.mesh_layouts().items():
            wanted = [axis for axis in enabled if axis in names]
            if not wanted and not (family == "dp" and self.dp_enabled):
                continue
            mesh = self._build_mesh(device_type, dims, names)
            if family == "dp":
                meshes["dp"] = mesh
            meshes.update({axis: mesh[axis] for axis in wanted})
        self._meshes.clear()
        self._meshes.update(meshes)
        return dict(meshes)

    def _build_mesh(
        self, device_type: str, dims: tuple[int, ...], names: tuple[str, ...]
    ) -> DeviceMesh:
        if len(dims) != len(names):
            raise ValueError(f"mesh dims {dims} and names {names} differ in length")
        bad = [f"{n}={d}" for d, n in zip(dims, names) if d <= 0]
        if bad:
            raise ValueError(f"mesh dims must be >= 1, got {', '.join(bad)}")
        if math.prod(dims) != self.world_size:
            raise ValueError(
                f"mesh {dict(zip(names, dims))} has {math.prod(dims)} ranks, "
                f"world_size is {self.world_size}"
            )
        return init_device_mesh(device_type, tuple(dims), mesh_dim_names=tuple(names))

    # ----------------------------------------------------------- flags
    @property
    def dp_enabled(self) -> bool:
        """Training always wraps with FSDP (it installs the mixed-precision policy)."""
        if self.enable_inference_mode:
            return self.dp_shard > 1
        return True

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def cfgp_enabled(self) -> bool:
        return self.cfgp > 1

    @property
    def lb_enabled(self) -> bool:
        return self.lb > 1

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
    groups, enabled = {}, parallel_dims.axes_enabled()
    for dims, names in parallel_dims.mesh_layouts().values():
        for dim, axis in enumerate(names):
            if axis not in enabled:
                continue
            stride = math.prod(dims[dim + 1 :])
            first = rank - (rank // stride % dims[dim]) * stride
            groups[axis] = [first + i * stride for i in range(dims[dim])]
    return groups
    ### END SOLUTION


def mesh_coordinates(parallel_dims: ParallelDims, rank: int) -> dict[str, int]:
    """`rank`'s coordinate on every dim of every mesh of `mesh_layouts`, keyed by the dim's name.

    The coordinates say what a rank works on: `rest` is its sample group, `cfgp` its guidance
    branch, `cp` its token slice, `dp_replicate` its model copy, `dp_shard` its weight shard.
    Ranks that share every coordinate of a mesh but one form that one axis' group.
    """
    ### BEGIN SOLUTION
    coordinates = {}
    for dims, names in parallel_dims.mesh_layouts().values():
        for dim, name in enumerate(names):
            coordinates[name] = rank // math.prod(dims[dim + 1 :]) % dims[dim]
    return coordinates
    ### END SOLUTION
