"""Hardware presets: one set of constants per GPU, each with the source it comes from.

Every figure is a datasheet number, a measurement in a public thread, or NCCL's own latency
table; none is tuned to a case. Link bandwidths are *bus* bandwidths as nccl-tests defines them,
so the time of a ring collective is simply (bytes one rank sends) / busbw, whatever the
collective: all-gather, reduce-scatter and all-to-all send (n-1)/n S, all-reduce 2(n-1)/n S,
and busbw is algbw times exactly that factor (nccl-tests' PERFORMANCE.md).

The bus bandwidth a ring reaches over NVLink is the per-direction line rate times NCCL's
protocol efficiency, 370 / 450 on H100 NVLink (S. Jeaugey, NVIDIA/nccl-tests#212: "450GB/s is the
line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
370GB/s"); the factor is applied to every NVLink generation and to the NVL bridges. It is a
statement about NVLink only. The network is set from what NCCL's maintainers expect of a NIC:
"For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA/nccl-tests#290; 46, the lower end,
is 92 % of the 50 GB/s line) and "24GB/s is the peak performance per 200G NIC"
(NVIDIA/nccl-tests#119, 96 %). PCIe between NVLink pairs is a measured share (`pcie-pairs`).

Latency per collective (alpha) follows NCCL's tuning model (`src/graph/tuning.cc`,
NVIDIA/nccl@b647562, `ncclTopoTuneModel`), for the ring and the Simple protocol only: a base
latency of 8.4 us per call plus a per-step latency of 3.4 us over NVLink, 5.7 us over PCI and
14.0 us over the network. NCCL models the other protocols too (LL: 6.6 us + 0.6 us a step on
NVLink; LL128) and picks the fastest per call (`ncclTopoGetAlgoTime`), so messages of a few KB
run LL and cost less than this model says; every message the cases move is MBs, where Simple's
bandwidth wins, and LL's and LL128's bandwidths depend on per-channel caps no preset carries.
Of a group that spans nodes, only the steps that cross a node boundary pay the network's
latency (`nInterSteps`: nodes - 1 of an all-gather's or reduce-scatter's n - 1 steps, 2 x nodes
of an all-reduce's 2 (n - 1)); the others pay the intra-node latency, at least 3 x NCCL's
network post overhead (`getNetOverhead`, 1 us on Intel and by default: 3 us for Simple).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

TB = 1e12
GB = 1e9
GiB = 2**30

PROTOCOL_EFFICIENCY = 370 / 450
"""NCCL's achieved busbw over the line rate on NVLink (NVIDIA/nccl-tests#212, H100 NVLink)."""

BASE_LATENCY = 8.4e-6
"""NCCL `baseLat` for Ring / Simple, seconds per collective call."""
STEP_LATENCY = {"nvlink": 3.4e-6, "pci": 5.7e-6, "net": 14.0e-6}
"""NCCL `hwLat` for Ring / Simple, seconds per ring step, by link class."""
NET_OVERHEAD = 3 * 1.0e-6
"""NCCL's floor on a node's intra-node step once its ring crosses nodes: `getNetOverhead` (1 us
on Intel CPUs and by default; AMD hosts get 2) times 3 for Simple."""
LL_BASE_LATENCY = 6.6e-6
LL_STEP_LATENCY = {"nvlink": 0.6e-6, "pci": 1.0e-6, "net": 2.7e-6}
"""NCCL's Ring / LL latencies (the same tables): not used by the model, which is Ring / Simple
only; the lab sets a small message's LL latency against Simple's."""

SOURCES = {
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/): "
    "SXM 989 TFLOP/s bf16 dense (1,979 with sparsity), fp8 1,979 dense, HBM3 80 GB at "
    "3.35 TB/s, NVLink 900 GB/s, max TDP up to 700 W; NVL 835 TFLOP/s bf16 dense, fp8 1,671, 94 GB at 3.9 TB/s, "
    "NVLink bridge 600 GB/s between a pair, PCIe Gen5 128 GB/s, max board power 350-400 W",
    "h100-96gb": "the H100 torchtitan's benchmark ran on "
    "(pytorch/torchtitan@820504e:benchmarks/llama3_h100_202412_torchtitan.md, Hardware): "
    "'96GB HBM2e with 2.4 TB/sec peak memory bandwidth', 'the default 500W power limit', "
    "NVLink within a host of 8, 400 Gb/s RDMA per GPU; its peak is 'between SXM and NVL, and we "
    "don't know its exact value': the SXM figures are kept and the fitted efficiencies (of these "
    "very rows) absorb the difference",
    "h200": "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/): 141 GB HBM3e at "
    "4.8 TB/s; SXM 989 TFLOP/s bf16 dense, NVLink 900 GB/s; NVL 835 TFLOP/s, NVLink bridge "
    "900 GB/s (2- or 4-way), PCIe Gen5 128 GB/s, max board power up to 600 W",
    "h800": "NVIDIA H800 SXM5 (the H100 SXM die with NVLink cut to 400 GB/s): 989 TFLOP/s bf16 "
    "dense, 80 GB HBM3 at 3.35 TB/s (NVIDIA/nccl-tests#153 runs 8 of them per node)",
    "a100": "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100/): SXM 80 GB, 312 TFLOP/s "
    "bf16 dense, no fp8, HBM2e 2,039 GB/s, NVLink 600 GB/s, max TDP 400 W, 200 Gb/s HDR per GPU in a DGX A100",
    "b200": "NVIDIA DGX B200 datasheet: 8 B200, 72 PFLOP/s fp8 training (sparse) = 4.5 dense "
    "per GPU, bf16 2.25 PFLOP/s dense, 1,440 GB HBM3e (180 per GPU) at 8 TB/s, NVLink 5 "
    "1.8 TB/s, 400 Gb/s ConnectX-7 per GPU",
    "pcie-pairs": "in NVIDIA/nccl-tests#178 a node of 8 A100s joined by NVLink in pairs (PCIe "
    "between the pairs) reaches 20 GB/s all-reduce busbw once the group (3 GPUs there) crosses "
    "PCIe Gen4 (32 GB/s a direction): 62 % of the line; the same share of Gen5's 64 GB/s is "
    "40 GB/s",
    "ib-400": "400 Gb/s RDMA per GPU between hosts (torchtitan's benchmark hosts, "
    "pytorch/torchtitan@820504e:benchmarks/llama3_h100_202412_torchtitan.md; DGX H100/H200); "
    "busbw 46 GB/s, the lower end of 'For NDR @ 400Gbps you should see 46-48GB/s per NIC' "
    "(NVIDIA/nccl-tests#290)",
    "hdr-200": "200 Gb/s HDR per GPU (DGX A100): busbw 24 GB/s, '24GB/s is the peak "
    "performance per 200G NIC' (NVIDIA/nccl-tests#119)",
    "nvl-bridge": "NVL cards are modelled as bridged in pairs (`pair_busbw`), every larger "
    "group on PCIe; the H200 NVL datasheet allows 2- or 4-way bridges, and no source of the "
    "Cosmos rows says which the measured machines had: an assumption, the same for H100 NVL "
    "(whose bridge joins a pair) and H200 NVL",
}


@dataclass(frozen=True)
class Hardware:
    """One GPU of an 8-GPU node: peaks, memory, and the links its collectives cross.

    `pair_busbw` is for NVL cards, bridged in pairs: a group of 2 neighbours uses the bridge,
    any larger group in the node runs at `intra_busbw` (PCIe). Pairs are an assumption for
    H200 NVL too, whose bridge may join 4 (`SOURCES["nvl-bridge"]`). `intra_link` names NCCL's
    latency class of `intra_busbw`.
    """

    name: str
    peak_bf16: float
    peak_fp8: float
    hbm_bandwidth: float
    hbm_bytes: float
    intra_busbw: float
    inter_busbw: float
    intra_link: str = "nvlink"
    pair_busbw: float | None = None
    gpus_per_node: int = 8
    efficiency_from: str = ""
    """The preset whose fitted kernel efficiencies this one uses (its own name if fitted)."""
    source: str = ""
    power_w: int = 0
    """The board's power limit where its source states it (0: not stated)."""

    def peak(self, dtype: str) -> float:
        if dtype == "fp8" and self.peak_fp8 <= 0:
            raise ValueError(f"{self.name} has no fp8 tensor cores")
        return self.peak_fp8 if dtype == "fp8" else self.peak_bf16


def _line(per_direction_bytes_per_s: float) -> float:
    """A link's per-direction line rate turned into the busbw NCCL reaches on it."""
    return per_direction_bytes_per_s * PROTOCOL_EFFICIENCY


IB_400 = 46 * GB
"""400 Gb/s NDR: NCCL's maintainers expect 46-48 GB/s busbw a NIC (NVIDIA/nccl-tests#290)."""
HDR_200 = 24 * GB
"""200 Gb/s HDR: "24GB/s is the peak performance per 200G NIC" (NVIDIA/nccl-tests#119)."""
PCIE_PAIRS = 0.62 * 64 * GB

NETWORKS = {"ib-400": IB_400, "hdr-200": HDR_200}
PRESETS = Path(__file__).with_name("HARDWARE.toml")


def _preset(row: dict) -> Hardware:
    """A row of `HARDWARE.toml` in the units the model computes in."""
    pcie = row.get("intra") == "pcie-pairs"
    return Hardware(
        row["name"],
        row["peak_bf16"] * TB,
        row["peak_fp8"] * TB,
        row["hbm_tb_s"] * TB,
        row["hbm_gb"] * GB,
        PCIE_PAIRS if pcie else _line(row["nvlink_gb_s"] * GB),
        NETWORKS[row["network"]],
        intra_link="pci" if pcie else "nvlink",
        pair_busbw=_line(row["bridge_gb_s"] * GB) if pcie else None,
        efficiency_from=row["efficiency_from"],
        source=row["source"],
        power_w=row.get("power_w", 0),
    )


HARDWARE: dict[str, Hardware] = {
    row["name"]: _preset(row) for row in tomllib.loads(PRESETS.read_text())["preset"]
}
"""Only the H100 SXM and H100 NVL fits exist (`scale.fit`): the rest borrow one (the same
kernels on a faster or slower chip). The 500 W 96 GB H100 is the part torchtitan's rows ran
on; the h100-sxm fit is of those rows, so it borrows its own."""


def hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; presets: {sorted(HARDWARE)}")
    return HARDWARE[name]
