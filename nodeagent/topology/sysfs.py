"""Read GPU topology from Linux sysfs (and the NVIDIA driver's /proc files) when NVML is not available.

Why it exists: the node agent must publish NUMA and PCIe-switch placement even where libnvidia-ml is not
mounted into its container. The kernel already knows both: every PCI device has a `numa_node` file, and the
real path of `/sys/bus/pci/devices/<bus id>` is the chain of bridges above the device. NVLink is not visible
here, so GPUs read this way have no NVLink peers (the annotation then carries no `nvlink` key).

It reads only what it is given (`sys_root`, `proc_root`; tests pass recorded trees) and never guesses: a
missing or malformed file that the result depends on is a `TopologyReadError` naming the path.
"""

from __future__ import annotations

import re
from pathlib import Path

from nodeagent.topology.model import (
    DiscoveredTopology,
    GpuDevice,
    TopologyReadError,
    bus_id_sort_key,
    normalise_bus_id,
    sorted_topology,
)

NVIDIA_VENDOR = "0x10de"
# PCI class codes (base class + subclass): VGA controller, 3D controller. Not audio (0x0403) or the NVSwitch
# bridges (0x0680) that NVIDIA also ships.
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")

_DEVICE_DIR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_ROOT_BUS_DIR = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}\Z")
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]+\Z")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyReadError(f"cannot read {path}: {exc}") from None


def read_numa_node(path: Path) -> int | None:
    """A sysfs `numa_node` file: the node number, or None for -1 (the kernel does not know)."""
    text = _read_text(path)
    try:
        node = int(text)
    except ValueError:
        raise TopologyReadError(f"{path}: {text!r} is not a NUMA node number") from None
    if node == -1:
        return None
    if node < 0:
        raise TopologyReadError(f"{path}: NUMA node {node} is neither -1 nor a node number")
    return node


def is_nvidia_gpu(device_dir: Path) -> bool:
    """An NVIDIA PCI function whose class is VGA or 3D controller."""
    if _read_text(device_dir / "vendor").lower() != NVIDIA_VENDOR:
        return False
    return _read_text(device_dir / "class").lower().startswith(GPU_CLASS_PREFIXES)


def pcie_switch_of(real_path: Path) -> str | None:
    """The id shared by GPUs behind one PCIe switch, from the device's resolved sysfs path.

    Behind a switch the parent is a downstream port and its parent the switch's upstream port, which all GPUs
    of that switch share: that port's bus id is the switch id. A GPU on a root port (the parent's parent is
    the `pciDDDD:BB` root bus) gets the root port. A GPU straight on a root bus (typical in VMs) has no
    bridge to name: None.
    """
    parent = real_path.parent
    if _ROOT_BUS_DIR.match(parent.name):
        return None
    grandparent = parent.parent
    if not _DEVICE_DIR.match(parent.name) or not (
        _DEVICE_DIR.match(grandparent.name) or _ROOT_BUS_DIR.match(grandparent.name)
    ):
        raise TopologyReadError(f"{real_path}: not under a PCI root bus (pciDDDD:BB), cannot place it")
    if _DEVICE_DIR.match(grandparent.name):
        return grandparent.name
    return parent.name


def read_uuid(information: Path) -> str | None:
    """The `GPU UUID:` line of /proc/driver/nvidia/gpus/<bus id>/information; None when absent or unset."""
    if not information.exists():
        return None
    for line in _read_text(information).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "GPU UUID":
            uuid = value.strip()
            return uuid if _UUID.match(uuid) else None
    return None


def read_sysfs(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> DiscoveredTopology:
    """All NVIDIA GPUs under `<sys_root>/bus/pci/devices`, indexed in PCI bus id order (like nvidia-smi)."""
    devices = sys_root / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise TopologyReadError(f"cannot list {devices}: {exc}") from None
    found: list[tuple[str, Path]] = []
    for entry in entries:
        if not _DEVICE_DIR.match(entry.name):
            continue
        if is_nvidia_gpu(entry):
            found.append((normalise_bus_id(entry.name, str(entry)), entry))
    found.sort(key=lambda item: bus_id_sort_key(item[0]))
    gpus = []
    for index, (bus_id, entry) in enumerate(found):
        gpus.append(
            GpuDevice(
                index=index,
                uuid=read_uuid(proc_root / "driver" / "nvidia" / "gpus" / bus_id / "information"),
                pci_bus_id=bus_id,
                numa=read_numa_node(entry / "numa_node"),
                pcie_switch=pcie_switch_of(entry.resolve()),
                nvlink_peers=(),
            )
        )
    return sorted_topology(gpus, "sysfs")
