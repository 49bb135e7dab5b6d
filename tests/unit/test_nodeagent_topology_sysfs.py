"""Reading GPU topology from recorded sysfs and /proc trees (real directories and symlinks under tmp_path)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.topology.annotation import render
from nodeagent.topology.model import GpuDevice, TopologyReadError
from nodeagent.topology.sysfs import pcie_switch_of, read_sysfs, read_uuid

NVIDIA, BROADCOM, ASPEED = "0x10de", "0x10b5", "0x1a03"
GPU_3D, GPU_VGA, BRIDGE, AUDIO, NVSWITCH = "0x030200", "0x030000", "0x060400", "0x040300", "0x068000"


class Tree:
    """A recorded /sys and /proc: devices under sys/devices/pciDDDD:BB/..., linked from bus/pci/devices."""

    def __init__(self, root: Path) -> None:
        self.sys_root = root / "sys"
        self.proc_root = root / "proc"
        (self.sys_root / "bus" / "pci" / "devices").mkdir(parents=True)

    def device(self, chain: str, *, vendor: str = NVIDIA, cls: str = GPU_3D, numa: str | None = "0") -> None:
        """`chain` is the real path below sys/devices, e.g. "pci0000:3a/0000:3a:00.0/0000:3b:00.0".

        Bridges on the way that were not added yet are added as Broadcom PCIe bridges on the same NUMA node.
        """
        parts = chain.split("/")
        for depth in range(2, len(parts)):
            if not (self.sys_root / "bus" / "pci" / "devices" / parts[depth - 1]).exists():
                self.device("/".join(parts[:depth]), vendor=BROADCOM, cls=BRIDGE, numa=numa)
        real = self.sys_root / "devices" / chain
        real.mkdir(parents=True)
        (real / "vendor").write_text(vendor + "\n")
        (real / "class").write_text(cls + "\n")
        if numa is not None:
            (real / "numa_node").write_text(numa + "\n")
        link = self.sys_root / "bus" / "pci" / "devices" / parts[-1]
        link.symlink_to(os.path.relpath(real, link.parent))

    def information(self, bus_id: str, uuid_line: str) -> None:
        path = self.proc_root / "driver" / "nvidia" / "gpus" / bus_id / "information"
        path.parent.mkdir(parents=True)
        path.write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n{uuid_line}\nBus Location: \t {bus_id}\n"
        )


# 2 NUMA nodes x 2 PCIe switches x 2 GPUs: root port -> switch upstream port -> downstream port -> GPU.
HGX = [
    # (real path below sys/devices, numa, switch upstream port = expected pcie_switch)
    ("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0", 0, "0000:11:00.0"),
    ("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:14:00.0", 0, "0000:11:00.0"),
    ("pci0000:10/0000:10:02.0/0000:15:00.0/0000:16:00.0/0000:17:00.0", 0, "0000:15:00.0"),
    ("pci0000:10/0000:10:02.0/0000:15:00.0/0000:16:01.0/0000:18:00.0", 0, "0000:15:00.0"),
    ("pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:00.0/0000:93:00.0", 1, "0000:91:00.0"),
    ("pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:01.0/0000:94:00.0", 1, "0000:91:00.0"),
    ("pci0000:90/0000:90:02.0/0000:95:00.0/0000:96:00.0/0000:97:00.0", 1, "0000:95:00.0"),
    ("pci0000:90/0000:90:02.0/0000:95:00.0/0000:96:01.0/0000:98:00.0", 1, "0000:95:00.0"),
]


def uuid_of(bus_id: str) -> str:
    return f"GPU-{bus_id[5:7]}000000-0000-0000-0000-000000000000"


def hgx(
    tree: Tree, *, without: frozenset[str] = frozenset(), unknown_numa: frozenset[str] = frozenset()
) -> None:
    """Add the HGX GPUs in reverse order (so directory order is not bus order), skipping `without`."""
    for chain, numa, _ in reversed(HGX):
        bus_id = chain.rsplit("/", 1)[1]
        if bus_id in without:
            continue
        tree.device(chain, numa="-1" if bus_id in unknown_numa else str(numa))
        tree.information(bus_id, f"GPU UUID: \t {uuid_of(bus_id)}")


def expected_hgx(without: frozenset[str] = frozenset()) -> list[GpuDevice]:
    present = [(c.rsplit("/", 1)[1], n, s) for c, n, s in HGX if c.rsplit("/", 1)[1] not in without]
    return [GpuDevice(i, uuid_of(b), b, n, s, ()) for i, (b, n, s) in enumerate(present)]


def with_extras(tree: Tree) -> None:
    hgx(tree)
    # NVIDIA functions that are not GPUs: the GPU's HDMI audio function and NVSwitch bridges.
    tree.device("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.1", cls=AUDIO)
    tree.device("pci0000:c0/0000:c0:01.0/0000:c1:00.0", cls=NVSWITCH, numa="1")
    tree.device("pci0000:c0/0000:c0:01.0/0000:c2:00.0", cls=NVSWITCH, numa="1")
    # The BMC's VGA controller is a display controller, but not NVIDIA's.
    tree.device("pci0000:00/0000:00:1c.0/0000:02:00.0", vendor=ASPEED, cls=GPU_VGA)


DROPPED = frozenset({"0000:17:00.0"})
SCENARIOS: list[tuple[str, Callable[[Tree], None], list[GpuDevice]]] = [
    ("hgx-2-numa-4-switches", hgx, expected_hgx()),
    ("one-gpu-missing-indices-stay-dense", lambda t: hgx(t, without=DROPPED), expected_hgx(DROPPED)),
    ("non-gpu-nvidia-functions-ignored", with_extras, expected_hgx()),
    (
        "numa-minus-one-is-unknown",
        lambda t: hgx(t, unknown_numa=frozenset({"0000:93:00.0"})),
        [
            g if g.pci_bus_id != "0000:93:00.0" else GpuDevice(4, g.uuid, g.pci_bus_id, None, g.pcie_switch)
            for g in expected_hgx()
        ],
    ),
    (
        "gpu-on-root-port-vga-class-no-proc-file",
        lambda t: t.device("pci0000:3a/0000:3a:00.0/0000:3b:00.0", cls=GPU_VGA, numa="1"),
        [GpuDevice(0, None, "0000:3b:00.0", 1, "0000:3a:00.0", ())],
    ),
    (
        "gpu-on-root-bus-vm-has-no-switch",
        lambda t: t.device("pci0000:00/0000:00:1e.0"),
        [GpuDevice(0, None, "0000:00:1e.0", 0, None, ())],
    ),
]


@pytest.mark.parametrize(("build", "gpus"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_read_sysfs(tmp_path: Path, build: Callable[[Tree], None], gpus: list[GpuDevice]) -> None:
    tree = Tree(tmp_path)
    build(tree)
    topo = read_sysfs(tree.sys_root, tree.proc_root)
    assert topo.source == "sysfs"
    assert list(topo.gpus) == gpus


def test_a_missing_gpu_leaves_the_others_dense_in_bus_order(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    hgx(tree, without=DROPPED)
    topo = read_sysfs(tree.sys_root, tree.proc_root)
    assert [(g.index, g.pci_bus_id) for g in topo.gpus] == [
        (0, "0000:13:00.0"),
        (1, "0000:14:00.0"),
        (2, "0000:18:00.0"),
        (3, "0000:93:00.0"),
        (4, "0000:94:00.0"),
        (5, "0000:97:00.0"),
        (6, "0000:98:00.0"),
    ]
    assert topo.gpus[2].pcie_switch == "0000:15:00.0"


def test_unknown_numa_is_left_out_of_the_annotation(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    hgx(tree, unknown_numa=frozenset({"0000:13:00.0"}))
    doc = json.loads(render(read_sysfs(tree.sys_root, tree.proc_root), "index"))
    assert doc["0"] == {"pcie": "0000:11:00.0", "uuid": uuid_of("0000:13:00.0")}
    assert doc["1"]["numa"] == 0
    assert all("nvlink" not in attrs for attrs in doc.values())  # sysfs cannot see NVLink


ERRORS: list[tuple[str, Callable[[Tree], None], str]] = [
    (
        "numa-node-file-missing",
        lambda t: t.device("pci0000:3a/0000:3a:00.0/0000:3b:00.0", numa=None),
        r"cannot read .*0000:3b:00.0/numa_node",
    ),
    (
        "numa-node-not-a-number",
        lambda t: t.device("pci0000:3a/0000:3a:00.0/0000:3b:00.0", numa="zero"),
        r"numa_node: 'zero' is not a NUMA node number",
    ),
    (
        "numa-node-below-minus-one",
        lambda t: t.device("pci0000:3a/0000:3a:00.0/0000:3b:00.0", numa="-2"),
        r"NUMA node -2",
    ),
]


@pytest.mark.parametrize(("build", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_unreadable_sysfs_is_an_error_naming_the_path(
    tmp_path: Path, build: Callable[[Tree], None], message: str
) -> None:
    tree = Tree(tmp_path)
    build(tree)
    with pytest.raises(TopologyReadError, match=message):
        read_sysfs(tree.sys_root, tree.proc_root)


def test_missing_pci_bus_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyReadError, match=r"cannot list .*bus/pci/devices"):
        read_sysfs(tmp_path / "nosys", tmp_path / "proc")


def test_unreadable_vendor_file_is_an_error(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.device("pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    (tree.sys_root / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0" / "vendor").unlink()
    with pytest.raises(TopologyReadError, match=r"0000:3b:00.0/vendor"):
        read_sysfs(tree.sys_root, tree.proc_root)


SWITCHES = [
    (
        "behind-switch",
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3d:00.0",
        "0000:3b:00.0",
    ),
    (
        "behind-two-switches-nearest-wins",
        "/s/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0/0000:3d:00.0/0000:3e:10.0/0000:3f:00.0",
        "0000:3d:00.0",
    ),
    ("on-root-port", "/sys/devices/pci0000:3a/0000:3a:02.0/0000:3b:00.0", "0000:3a:02.0"),
    ("on-root-bus", "/sys/devices/pci0000:00/0000:00:1e.0", None),
    ("five-digit-domain", "/sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0", "10000:00:02.0"),
]


@pytest.mark.parametrize(("path", "switch"), [s[1:] for s in SWITCHES], ids=[s[0] for s in SWITCHES])
def test_pcie_switch_of(path: str, switch: str | None) -> None:
    assert pcie_switch_of(Path(path)) == switch


def test_pcie_switch_of_a_path_outside_the_pci_tree_is_an_error() -> None:
    with pytest.raises(TopologyReadError, match="not under a PCI root bus"):
        pcie_switch_of(Path("/sys/devices/platform/0000:3b:00.0"))


UUID_LINES = [
    (
        "present",
        "GPU UUID: \t GPU-6f2c1d2e-0000-1111-2222-333344445555",
        "GPU-6f2c1d2e-0000-1111-2222-333344445555",
    ),
    ("not-yet-known", "GPU UUID: \t ????????-????-????-????-????????????", None),
    ("line-missing", "Video BIOS: \t 96.00.61.00.01", None),
]


@pytest.mark.parametrize(("line", "uuid"), [u[1:] for u in UUID_LINES], ids=[u[0] for u in UUID_LINES])
def test_read_uuid(tmp_path: Path, line: str, uuid: str | None) -> None:
    tree = Tree(tmp_path)
    tree.information("0000:3b:00.0", line)
    assert read_uuid(tree.proc_root / "driver" / "nvidia" / "gpus" / "0000:3b:00.0" / "information") == uuid
