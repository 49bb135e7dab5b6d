"""Simulated GPU hardware: a node's GPUs, their identity (UUID, PCI bus id, NUMA node) and what DCGM reads.

Why it exists: the exposition needs stable, realistic identities (dcgm-exporter's `UUID`, `pci_bus_id`,
`device` labels) and per-GPU readings (utilization, memory, power, temperature, health counters); the fleet
needs to build and update them. This module holds that data and the physics of "utilization -> power,
temperature, memory"; it knows nothing of time, faults or HTTP.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.simulator.scenario import FleetSpec, GpuModel
from harness.simulator.workload import numa_of

if TYPE_CHECKING:
    from harness.simulator.workload import Pod

_UUID_NAMESPACE = uuid.UUID("6a1f0c1e-4f5b-4a43-9d7e-7f3b3c2a9e10")
_HGX_BUS_IDS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # HGX H100 8-GPU board


@dataclass(eq=False)
class Gpu:
    """One GPU: identity, what the exporter would read from DCGM, and the pod holding it (if any)."""

    node: str
    index: int
    uuid: str
    pci_bus_id: str
    numa_node: int
    present: bool = True
    pod: Pod | None = None
    util: float = 0.0
    fb_used_mib: int = 0
    fb_free_mib: int = 0
    power_w: float = 0.0
    temp_c: int = 0
    mem_temp_c: int = 0
    energy_mj: float = 0.0
    last_xid: int | None = None
    xid_events: deque[tuple[float, int]] = field(default_factory=deque)
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    row_remap_failure: int = 0
    # Fabric and degradation signals (SignalFault); defaults are a healthy HGX GPU.
    nvlink_error_rate: float = 0.0  # CRC flit errors per second while a fault holds
    nvlink_crc_flit: float = 0.0
    pcie_replay_rate: float = 0.0
    pcie_replays: float = 0.0
    clock_reasons: int = 0
    margin_c: float = 0.0  # DCGM_FI_DEV_GPU_TEMP_LIMIT: degrees before thermal slowdown
    margin_override: float | None = None
    fm_status: int = 3  # success (0 not supported on a PCIe-only card)
    fm_error: int = 0
    fabric_mask: int = 0x1AA  # every boolean sub-field FALSE (healthy), configuration NONE
    stalled: bool = False


@dataclass(eq=False)
class Node:
    name: str
    gpus: list[Gpu]
    exporter_up: bool = True
    nvswitch_sxid: dict[int, tuple[int, bool]] = field(default_factory=dict)  # switch -> (SXid, fatal)


def gpu_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking GPU UUID derived from the node name and index."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def pci_bus_id(index: int, gpus_per_node: int) -> str:
    bus = (
        _HGX_BUS_IDS[index] if gpus_per_node <= len(_HGX_BUS_IDS) else 0x10 + index * (0xE0 // gpus_per_node)
    )
    return f"00000000:{bus:02X}:00.0"


def set_readings(g: Gpu, model: GpuModel, util: float, fb_used: int) -> None:
    """Utilization (%) and framebuffer use (MiB) -> every gauge DCGM would report for the GPU."""
    g.util = util
    usable = model.memory_mib - model.memory_reserved_mib
    g.fb_used_mib = min(fb_used, usable)
    g.fb_free_mib = usable - g.fb_used_mib
    g.power_w = model.power_idle_watts + (model.power_max_watts - model.power_idle_watts) * util / 100.0
    g.temp_c = round(model.temp_idle_c + (model.temp_max_c - model.temp_idle_c) * util / 100.0) + g.index % 3
    g.mem_temp_c = g.temp_c + 4
    g.margin_c = float(model.slowdown_temp_c - g.temp_c)


def build_nodes(spec: FleetSpec) -> dict[str, Node]:
    """Every node of the fleet with idle GPUs, in name order of the pattern."""
    nodes: dict[str, Node] = {}
    n = spec.gpus_per_node
    for name in spec.node_names():
        gpus = [
            Gpu(name, i, gpu_uuid(name, i), pci_bus_id(i, n), numa_of(i, n, spec.numa_nodes))
            for i in range(n)
        ]
        for g in gpus:
            set_readings(g, spec.gpu, 0.0, 0)
            if not spec.gpu.nvlink:
                g.fm_status, g.fabric_mask = 0, 0  # not supported
        nodes[name] = Node(name, gpus)
    return nodes
