"""Simulated GPU hardware: a node's GPUs, their identity (UUID, PCI bus id, NUMA node) and what DCGM reads.

Why it exists: the exposition needs stable, realistic identities (dcgm-exporter's `UUID`, `pci_bus_id`,
`device` labels) and per-GPU readings (utilization, memory, power, temperature, health counters); the fleet
needs to build and update them. This module holds that data and the physics of "utilization -> power,
temperature, memory"; it knows nothing of time, faults or HTTP.

Shared GPUs: a time-sliced GPU keeps the replicas its pods hold (`holders`); a MIG GPU is split into
`MigInstance`s, each with its own instance-level readings (utilization, framebuffer, XIDs attributed to it)
while GPU-level fields (temperature, power, ECC, remapped rows) are the parent's, read through it — as DCGM
remaps GPU-level fields of a GPU-instance watch to the parent.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.simulator.scenario import FleetSpec, GpuModel, SharingSpec, mig_memory_mib, mig_slices
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
    # Sharing (SharingSpec): time-slicing replicas per GPU (1 = not time-sliced) and who holds which;
    # `pod` is then the pod dcgm-exporter attributes the series to (the last holder). MIG: the instances.
    replicas: int = 1
    holders: list[tuple[int, Pod]] = field(default_factory=list)
    instances: list[MigInstance] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return self.replicas > 1 or bool(self.instances)


@dataclass(eq=False)
class MigInstance:
    """One MIG GPU instance: instance-level readings here, GPU-level ones read from the parent GPU."""

    gpu: Gpu
    position: int
    gi_id: int
    profile: str
    slices: int
    memory_mib: int
    pod: Pod | None = None
    util: float = 0.0
    fb_used_mib: int = 0
    fb_free_mib: int = 0
    last_xid: int | None = None
    xid_events: deque[tuple[float, int]] = field(default_factory=deque)

    def __getattr__(self, name: str) -> object:
        # Only reached for attributes an instance does not have: GPU-level fields and identity.
        if name == "gpu":  # not yet set (copy/pickle): never recurse
            raise AttributeError(name)
        return getattr(self.gpu, name)

    def set_load(self, util: float, fb_used: int) -> None:
        self.util = util
        self.fb_used_mib = min(fb_used, self.memory_mib)
        self.fb_free_mib = self.memory_mib - self.fb_used_mib

    @property
    def mig_uuid(self) -> str:
        """The MIG device's UUID as the device plugin lists it (opaque, stable per GPU and GI)."""
        return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{self.gpu.uuid}/{self.gi_id}')}"


# GPU instance IDs NVML hands out on an A100/H100 for uniform layouts: 7g -> 0, 3g -> 1-2, 2g -> 3-5,
# 1g -> 7-13 (a 4g instance takes 1); other layouts take the lowest free ID.
_GI_IDS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}


def gi_ids(profiles: list[str]) -> list[int]:
    """GPU instance IDs for a GPU's layout, in layout order."""
    used: set[int] = set()
    out = []
    for profile in profiles:
        free = [i for i in _GI_IDS.get(mig_slices(profile), ()) if i not in used]
        gi = free[0] if free else min(set(range(len(profiles) + 14)) - used)
        used.add(gi)
        out.append(gi)
    return out


def make_instances(g: Gpu, profiles: list[str]) -> list[MigInstance]:
    return [
        MigInstance(g, pos, gi, p, mig_slices(p), mig_memory_mib(p))
        for pos, (p, gi) in enumerate(zip(profiles, gi_ids(profiles), strict=True))
    ]


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
        sharing = spec.sharing_of(name)
        for g in gpus:
            set_readings(g, spec.gpu, 0.0, 0)
            if not spec.gpu.nvlink:
                g.fm_status, g.fabric_mask = 0, 0  # not supported
            share(g, sharing)
        nodes[name] = Node(name, gpus)
    return nodes


def share(g: Gpu, sharing: SharingSpec) -> None:
    """Make `g` time-sliced or MIG as `sharing` says (whole GPUs are left as they are)."""
    if sharing.time_sliced:
        g.replicas = sharing.replicas
    elif sharing.mig:
        g.instances = make_instances(g, sharing.profiles())
        for inst in g.instances:
            inst.set_load(0.0, 0)
