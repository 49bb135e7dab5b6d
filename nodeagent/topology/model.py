"""What the node agent learns about this node's GPUs, whichever source it read (NVML, sysfs, a file).

Why it exists: the readers (`nvml`, `sysfs`, `file`) and the annotation writer (`annotation`) must agree on
one shape, and on what counts as consistent, so the annotation never says more than the hardware did. A
value that a source could not read is `None` (or an empty tuple) here and is left out downstream: nothing in
this package guesses. An inconsistent reading is a `TopologyReadError`, not a best effort.

Pure: no I/O, no logging, no clock. It must not import the controller (the deployables are independent).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

TopologySource = Literal["nvml", "sysfs", "file"]

# domain:bus:device.function, the domain 4 hex digits (Linux) or 8 (NVML's busId), any case.
_BUS_ID = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])\Z", re.IGNORECASE)


class TopologyReadError(Exception):
    """The hardware (or the topology file) is unreadable or inconsistent; the message says what and where."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device of a MIG-enabled GPU, as NVML names it: its UUID (the device ID NVIDIA's device plugin
    hands to the kubelet, opaque on current drivers), its GPU and compute instance ids (dcgm-exporter's
    `GPU_I_ID` is the former) and its profile (`1g.10gb`) when NVML's name says it."""

    uuid: str
    gi: int
    ci: int
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as the hardware describes it.

    `index` is the NVML / nvidia-smi index (the position in PCI bus id order); `pci_bus_id` is the
    lower-case Linux form "0000:3b:00.0"; `numa` is None when unknown (sysfs says -1); `pcie_switch` is an id
    shared by the GPUs behind one PCIe switch; `nvlink_peers` are the bus ids of the GPUs this one reaches
    over an active NVLink (directly or through an NVSwitch), sorted.
    """

    index: int
    uuid: str | None
    pci_bus_id: str
    numa: int | None
    pcie_switch: str | None
    nvlink_peers: tuple[str, ...] = ()
    mig: tuple[MigDevice, ...] = ()
    """Its MIG devices when MIG is enabled on it (only NVML sees them), else empty."""


@dataclass(frozen=True, slots=True)
class DiscoveredTopology:
    """All GPUs of the node, sorted by index, and the source that described them."""

    gpus: tuple[GpuDevice, ...]
    source: TopologySource


def bus_id_sort_key(bus_id: str) -> tuple[int, int, int, int]:
    """Numeric PCI order (domain, bus, device, function); plain string order breaks for 5-digit domains."""
    match = _BUS_ID.match(bus_id)
    if match is None:
        raise TopologyReadError(f"{bus_id!r} is not a PCI bus id (expected DDDD:BB:DD.F)")
    domain, bus, device, function = match.groups()
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 10)


def normalise_bus_id(raw: str, where: str) -> str:
    """ "00000000:3B:00.0" (NVML) or "0000:3b:00.0" (sysfs) -> "0000:3b:00.0"; `where` names the source."""
    match = _BUS_ID.match(raw.strip())
    if match is None:
        raise TopologyReadError(f"{where}: {raw!r} is not a PCI bus id (expected DDDD:BB:DD.F)")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def sorted_topology(gpus: Iterable[GpuDevice], source: TopologySource) -> DiscoveredTopology:
    """The readers' common last step: GPUs in index order."""
    return DiscoveredTopology(tuple(sorted(gpus, key=lambda g: g.index)), source)


def _twice(values: Iterable[object]) -> list[str]:
    return sorted(str(v) for v, n in Counter(values).items() if n > 1)


def validate(topo: DiscoveredTopology) -> None:
    """Raise `TopologyReadError` listing every inconsistency in `topo`; return None when it is usable."""
    where = f"GPU topology from {topo.source}"
    if not topo.gpus:
        raise TopologyReadError(f"{where}: no GPUs found")
    problems: list[str] = []
    if dup := _twice(g.index for g in topo.gpus):
        problems.append(f"index listed twice: {', '.join(dup)}")
    if dup := _twice(g.uuid for g in topo.gpus if g.uuid is not None):
        problems.append(f"UUID listed twice: {', '.join(dup)}")
    if dup := _twice(g.pci_bus_id for g in topo.gpus):
        problems.append(f"PCI bus id listed twice: {', '.join(dup)}")
    if dup := _twice(m.uuid for g in topo.gpus for m in g.mig):
        problems.append(f"MIG UUID listed twice: {', '.join(dup)}")
    bus_ids = {g.pci_bus_id for g in topo.gpus}
    for gpu in topo.gpus:
        if gpu.index < 0:
            problems.append(f"GPU {gpu.pci_bus_id}: index {gpu.index} is negative")
        if gpu.numa is not None and gpu.numa < 0:
            problems.append(f"GPU {gpu.index} ({gpu.pci_bus_id}): numa {gpu.numa} is negative")
        for peer in gpu.nvlink_peers:
            if peer == gpu.pci_bus_id:
                problems.append(f"GPU {gpu.index} ({gpu.pci_bus_id}) lists itself as an NVLink peer")
            elif peer not in bus_ids:
                problems.append(f"GPU {gpu.index} ({gpu.pci_bus_id}): NVLink peer {peer} is not on this node")
    if [g.index for g in topo.gpus] != sorted(g.index for g in topo.gpus):
        problems.append("GPUs are not sorted by index")
    if problems:
        raise TopologyReadError(f"{where} is inconsistent: {'; '.join(problems)}")
