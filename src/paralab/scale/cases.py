"""Published measurements as cases: the TOML format `python -m paralab.scale check` reads.

```toml
[[case]]
name = "..."
source = "owner/repo@commit:path, the table and row"
hardware = "h100-sxm"          # a preset of `paralab.scale.hardware`
gpus = 8
model = "llama3.1-8b"          # a preset of `paralab.scale.models`, or an inline table
workload = { kind = "train", seq = 8192, micro_batch = 2, dtype = "bf16", ac = "selective" }
layout = { dp_shard = 8 }      # missing keys: 1 / none
measured = { tokens_per_s_per_gpu = 5762, memory_gib = 82.4 }
```

`measured` holds exactly one time measure (`tokens_per_s_per_gpu`, `seconds`, `efficiency`, or,
as papers publish training runs, `tflops_per_gpu` (model TFLOP/s per GPU) or `mfu`), and
optionally `memory_gib`, the peak memory per GPU the run reported (training rows), which
`check --json` sets against `paralab.scale.memory.train_memory`. TFLOP/s and MFU are turned
into tokens/s with a token's FLOPs counted the way the source counts them: `flops =
"torchtitan"` (the default, `paralab.scale.predict.flops_per_token`) or `"megatron"`
(`megatron_flops_per_token`); MFU is over the dense bf16 peak.

`workload`: `kind` ("train", "diffusion", "attention", "vae"), `seq` or `tokens`, `micro_batch`,
`steps`, `video` ([frames, height, width], what a priced autoencoder encodes and decodes),
`dtype` ("bf16", "fp8"), `ac` ("none", "selective", "full"), `compile`, `engine`
("torchtitan", "megatron": whose kernels and overlap), and this package's extra
`forward_only` ("attention" rows timed without the backward). `layout`: `dp_shard`,
`dp_replicate`, `cp`, `cp_kind` ("ring", "zigzag", "ulysses", and the extra "stripe"), `cfgp`,
`tp`, `pp`, `schedule`, `microbatches`, and this package's extras `ulysses` (USP's all-to-all
degree), `virtual` (stages per rank, interleaved) and `async_tp`. `model` may also be a preset
with fields changed: `{ preset = "cosmos-transfer2.5-2b", branches = 1 }`. Keys it does not know are reported
and ignored, so a newer file still loads.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import tomllib

from paralab.scale.hardware import Hardware, hardware
from paralab.scale.models import ModelShape, model
from paralab.scale.predict import ENGINES, FLOP_COUNTS, Layout, Workload, inference_world

MEASURES = ("tokens_per_s_per_gpu", "seconds", "efficiency", "tflops_per_gpu", "mfu")
SHIPPED = Path(__file__).with_name("CASES.toml")


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    hardware: Hardware
    gpus: int
    model: ModelShape
    workload: Workload
    layout: Layout
    measure: str
    measured: float
    memory_gib: float | None = None
    flops: str = "torchtitan"
    """How the source counts a token's FLOPs, for `tflops_per_gpu` and `mfu` (`FLOP_COUNTS`)."""


def _known(table: dict, cls: type, where: str, renames: dict[str, str] | None = None) -> dict:
    names = {f.name for f in fields(cls)}
    out = {}
    for key, value in table.items():
        key = (renames or {}).get(key, key)
        if key in names:
            out[key] = value
        else:
            warnings.warn(f"{where}: unknown key {key!r} ignored", stacklevel=3)
    return out


def parse_case(raw: dict) -> Case:
    name = raw.get("name", "?")
    for key in ("name", "source", "hardware", "gpus", "model", "workload", "measured"):
        if key not in raw:
            raise ValueError(f"case {name!r}: missing {key!r}")
    measured = raw["measured"]
    given = [k for k in MEASURES if k in measured]
    if len(given) != 1:
        raise ValueError(f"case {name!r}: measured needs exactly one of {MEASURES}, got {given}")
    known = _known(raw["workload"], Workload, name, {"tokens": "seq"})
    if "video" in known:
        known["video"] = tuple(known["video"])
    workload = Workload(**known)
    if workload.engine not in ENGINES:
        raise ValueError(f"case {name!r}: engine must be one of {ENGINES}, got {workload.engine!r}")
    flops = measured.get("flops", "torchtitan")
    if flops not in FLOP_COUNTS:
        raise ValueError(
            f"case {name!r}: flops must be one of {sorted(FLOP_COUNTS)}, got {flops!r}"
        )
    layout = _known(raw.get("layout", {}), Layout, name)
    case = Case(
        name,
        raw["source"],
        hardware(raw["hardware"]),
        int(raw["gpus"]),
        model(raw["model"]),
        workload,
        Layout(**layout),
        given[0],
        float(measured[given[0]]),
        float(measured["memory_gib"]) if "memory_gib" in measured else None,
        flops,
    )
    used = inference_world(case.layout) if workload.kind == "diffusion" else case.layout.world
    if used != case.gpus:
        raise ValueError(f"case {name!r}: layout uses {used} GPUs, the case says {case.gpus}")
    return case


def load_cases(path: str | Path = SHIPPED) -> list[Case]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return [parse_case(raw) for raw in data.get("case", [])]
