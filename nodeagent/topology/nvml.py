"""Read GPU topology from NVML (libnvidia-ml through nvidia-ml-py's `pynvml`), the preferred source.

Why it exists: only NVML sees NVLink (direct GPU-GPU links and NVSwitch fabrics) and gives the UUIDs the
device plugin uses; it also answers "do these two GPUs share a PCIe switch" without walking sysfs. On a
MIG-enabled GPU it lists the MIG devices (UUID, GPU and compute instance): a current driver's MIG UUID is
opaque, so this is what ties the kubelet's `MIG-<uuid>` device IDs to their physical GPU for drain and idle.

This module is the one choke point to NVML: `read_nvml` takes the module (or a recorded fake with the same
function names), always balances `nvmlInit` with `nvmlShutdown`, and turns every NVML error into a
`TopologyReadError` naming the call. `load_nvml` is the only place that imports `pynvml`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nodeagent.topology.model import (
    DiscoveredTopology,
    GpuDevice,
    MigDevice,
    TopologyReadError,
    bus_id_sort_key,
    normalise_bus_id,
    sorted_topology,
)
from nodeagent.topology.sysfs import read_numa_node

# nvmlGpuTopologyLevel_t: how far up the PCIe tree two GPUs first meet. Up to MULTIPLE the path stays on
# PCIe switches (INTERNAL: two GPUs on one board); from HOSTBRIDGE on it crosses a CPU.
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_ENABLE = 1
# Used when the module has no NVML_NVLINK_MAX_LINKS of its own (nvidia-ml-py 13 defines 36).
NVML_NVLINK_MAX_LINKS = 18

# Errors meaning "this link (or NVLink itself) is not there", not "the read failed".
_LINK_ABSENT = ("NVMLError_NotSupported", "NVMLError_InvalidArgument", "NVMLError_FunctionNotFound")
_NUMA_UNKNOWN = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
# Errors meaning "no MIG here" (a GPU that is not MIG-capable, an old driver) or "no MIG device at this slot".
_MIG_ABSENT = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
_MIG_SLOT_EMPTY = ("NVMLError_NotFound", "NVMLError_InvalidArgument")

T = TypeVar("T")


class _Never(Exception):
    """Stands in for an error class the module does not define, so `except` never matches it."""


def _error_classes(nvml: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    found = []
    for name in names:
        cls = getattr(nvml, name, None)
        found.append(cls if isinstance(cls, type) and issubclass(cls, BaseException) else _Never)
    return tuple(found)


def _text(value: Any) -> str:
    return value.decode("ascii", errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class _Device:
    index: int
    handle: Any
    bus_id: str
    uuid: str | None


class _Reader:
    """One NVML session's reads; every call goes through `call` so errors name what failed."""

    def __init__(self, nvml: Any, sys_root: Path) -> None:
        self.nvml = nvml
        self.sys_root = sys_root
        self.error = _error_classes(nvml, ("NVMLError",))
        self.link_absent = _error_classes(nvml, _LINK_ABSENT)
        self.numa_unknown = _error_classes(nvml, _NUMA_UNKNOWN)
        self.mig_absent = _error_classes(nvml, _MIG_ABSENT)
        self.mig_slot_empty = _error_classes(nvml, _MIG_SLOT_EMPTY)

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self.error as exc:
            raise TopologyReadError(f"NVML {what} failed: {exc}") from None

    def devices(self) -> list[_Device]:
        nvml = self.nvml
        count = self.call("nvmlDeviceGetCount()", nvml.nvmlDeviceGetCount)
        devices = []
        for index in range(int(count)):
            handle = self.call(f"nvmlDeviceGetHandleByIndex({index})", nvml.nvmlDeviceGetHandleByIndex, index)
            what = f"nvmlDeviceGetPciInfo(GPU {index})"
            pci = self.call(what, nvml.nvmlDeviceGetPciInfo, handle)
            bus_id = normalise_bus_id(_text(pci.busId), f"NVML {what}.busId")
            uuid = _text(self.call(f"nvmlDeviceGetUUID(GPU {index})", nvml.nvmlDeviceGetUUID, handle)).strip()
            devices.append(_Device(index, handle, bus_id, uuid or None))
        return devices

    def numa(self, device: _Device) -> int | None:
        """NVML's answer when the driver gives one, else the PCI device's sysfs `numa_node`."""
        fn = getattr(self.nvml, "nvmlDeviceGetNumaNodeId", None)
        if fn is not None:
            try:
                node = int(fn(device.handle))
            except self.numa_unknown:
                node = -1
            except self.error as exc:
                what = f"nvmlDeviceGetNumaNodeId(GPU {device.index})"
                raise TopologyReadError(f"NVML {what} failed: {exc}") from None
            if node >= 0:
                return node
        return read_numa_node(self.sys_root / "bus" / "pci" / "devices" / device.bus_id / "numa_node")

    def pcie_switches(self, devices: list[_Device]) -> dict[str, str]:
        """Bus id -> "pcie-<smallest bus id of the group>", grouping GPUs that meet below a host bridge."""
        group = {d.bus_id: d.bus_id for d in devices}

        def root(bus_id: str) -> str:
            while group[bus_id] != bus_id:
                bus_id = group[bus_id]
            return bus_id

        below_host_bridge = {
            getattr(self.nvml, "NVML_TOPOLOGY_INTERNAL", NVML_TOPOLOGY_INTERNAL),
            getattr(self.nvml, "NVML_TOPOLOGY_SINGLE", NVML_TOPOLOGY_SINGLE),
            getattr(self.nvml, "NVML_TOPOLOGY_MULTIPLE", NVML_TOPOLOGY_MULTIPLE),
        }
        for i, first in enumerate(devices):
            for second in devices[i + 1 :]:
                level = self.call(
                    f"nvmlDeviceGetTopologyCommonAncestor(GPU {first.index}, GPU {second.index})",
                    self.nvml.nvmlDeviceGetTopologyCommonAncestor,
                    first.handle,
                    second.handle,
                )
                if level in below_host_bridge:
                    a, b = sorted((root(first.bus_id), root(second.bus_id)), key=bus_id_sort_key)
                    group[b] = a
        return {d.bus_id: f"pcie-{root(d.bus_id)}" for d in devices}

    def mig_devices(self, device: _Device) -> tuple[MigDevice, ...]:
        """The MIG devices of a MIG-enabled GPU, in slot order; empty when MIG is off or not supported."""
        nvml = self.nvml
        mode_fn = getattr(nvml, "nvmlDeviceGetMigMode", None)
        if mode_fn is None:
            return ()
        try:
            current = mode_fn(device.handle)[0]
        except self.mig_absent:
            return ()
        except self.error as exc:
            raise TopologyReadError(f"NVML nvmlDeviceGetMigMode(GPU {device.index}) failed: {exc}") from None
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE):
            return ()
        slots = self.call(
            f"nvmlDeviceGetMaxMigDeviceCount(GPU {device.index})",
            nvml.nvmlDeviceGetMaxMigDeviceCount,
            device.handle,
        )
        out: list[MigDevice] = []
        for slot in range(int(slots)):
            where = f"GPU {device.index}, MIG slot {slot}"
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device.handle, slot)
            except self.mig_slot_empty:
                continue
            except self.error as exc:
                raise TopologyReadError(
                    f"NVML nvmlDeviceGetMigDeviceHandleByIndex({where}) failed: {exc}"
                ) from None
            uuid = _text(self.call(f"nvmlDeviceGetUUID({where})", nvml.nvmlDeviceGetUUID, mig)).strip()
            gi = int(self.call(f"nvmlDeviceGetGpuInstanceId({where})", nvml.nvmlDeviceGetGpuInstanceId, mig))
            ci = int(
                self.call(
                    f"nvmlDeviceGetComputeInstanceId({where})", nvml.nvmlDeviceGetComputeInstanceId, mig
                )
            )
            name = _text(self.call(f"nvmlDeviceGetName({where})", nvml.nvmlDeviceGetName, mig))
            _, sep, profile = name.rpartition(" MIG ")
            out.append(MigDevice(uuid, gi, ci, profile.strip() if sep and profile.strip() else None))
        return tuple(out)

    def nvlink_remotes(self, device: _Device) -> set[str]:
        """Bus ids at the far end of this GPU's active NVLinks (GPUs or NVSwitches)."""
        nvml = self.nvml
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", NVML_FEATURE_ENABLED)
        remotes: set[str] = set()
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVML_NVLINK_MAX_LINKS))):
            what = f"nvmlDeviceGetNvLinkState(GPU {device.index}, link {link})"
            try:
                state = nvml.nvmlDeviceGetNvLinkState(device.handle, link)
            except self.link_absent:
                continue
            except self.error as exc:
                raise TopologyReadError(f"NVML {what} failed: {exc}") from None
            if state != enabled:
                continue
            what = f"nvmlDeviceGetNvLinkRemotePciInfo(GPU {device.index}, link {link})"
            pci = self.call(what, nvml.nvmlDeviceGetNvLinkRemotePciInfo, device.handle, link)
            remotes.add(normalise_bus_id(_text(pci.busId), f"NVML {what}.busId"))
        return remotes


def nvlink_peers(remotes: dict[str, set[str]]) -> dict[str, tuple[str, ...]]:
    """GPU bus id -> sorted peer GPUs, from each GPU's link ends.

    A far end that is a GPU of this node is a direct peer (in both directions); any other far end is an
    NVSwitch, and every GPU attached to it is a peer of every other.
    """
    peers: dict[str, set[str]] = {gpu: set() for gpu in remotes}
    attached: dict[str, set[str]] = {}
    for gpu, ends in remotes.items():
        for end in ends:
            if end in peers:
                peers[gpu].add(end)
                peers[end].add(gpu)
            else:
                attached.setdefault(end, set()).add(gpu)
    for gpus in attached.values():
        for gpu in gpus:
            peers[gpu] |= gpus
    return {gpu: tuple(sorted(found - {gpu}, key=bus_id_sort_key)) for gpu, found in peers.items()}


def read_nvml(nvml: Any, *, sys_root: Path = Path("/sys")) -> DiscoveredTopology:
    """Every GPU NVML reports; `sys_root` is read only for NUMA nodes the driver does not report."""
    reader = _Reader(nvml, sys_root)
    reader.call("nvmlInit()", nvml.nvmlInit)
    read = False
    try:
        devices = reader.devices()
        switches = reader.pcie_switches(devices)
        peers = nvlink_peers({d.bus_id: reader.nvlink_remotes(d) for d in devices})
        gpus = [
            GpuDevice(
                index=d.index,
                uuid=d.uuid,
                pci_bus_id=d.bus_id,
                numa=reader.numa(d),
                pcie_switch=switches[d.bus_id],
                nvlink_peers=peers[d.bus_id],
                mig=reader.mig_devices(d),
            )
            for d in devices
        ]
        read = True
    finally:
        try:
            nvml.nvmlShutdown()
        except reader.error as exc:
            if read:  # otherwise the read's own error is the one worth reporting
                raise TopologyReadError(f"NVML nvmlShutdown() failed: {exc}") from None
    return sorted_topology(gpus, "nvml")


def load_nvml() -> Any | None:
    """The `pynvml` module (package nvidia-ml-py) when it and libnvidia-ml load, else None (use sysfs).

    Probes with nvmlInit/nvmlShutdown; `read_nvml` opens its own session. Other init failures (driver not
    loaded, no permission) are errors: the library is there, so falling back would hide a broken node.
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    not_found = _error_classes(nvml, ("NVMLError_LibraryNotFound",))
    error = _error_classes(nvml, ("NVMLError",))
    try:
        nvml.nvmlInit()
    except not_found:
        return None
    except error as exc:
        raise TopologyReadError(f"NVML nvmlInit() failed: {exc}") from None
    try:
        nvml.nvmlShutdown()
    except error as exc:
        raise TopologyReadError(f"NVML nvmlShutdown() failed: {exc}") from None
    return nvml
