"""The topology file for simulated nodes, and `discover` choosing a source and validating what it read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.topology.discover import Source, discover
from nodeagent.topology.file import parse_file, read_file
from nodeagent.topology.model import GpuDevice, TopologyReadError
from tests.unit.test_nodeagent_topology_nvml import FakeNvml, pcie_box

YAML = """\
gpus:
  - index: 1
    uuid: GPU-b
    pciBusId: "0000:3C:00.0"
    numa: 0
    pcieSwitch: sw0
    nvlinkPeers: ["0000:3b:00.0"]
  - {index: 0, uuid: GPU-a, pciBusId: "00000000:3b:00.0", numa: 0, pcieSwitch: sw0,
     nvlinkPeers: ["0000:3c:00.0"]}
  - {index: 2, pciBusId: "0000:af:00.0"}
  - {index: 3, pciBusId: "0000:b0:00.0", uuid: null, numa: null, pcieSwitch: null, nvlinkPeers: null}
"""
EXPECTED = (
    GpuDevice(0, "GPU-a", "0000:3b:00.0", 0, "sw0", ("0000:3c:00.0",)),
    GpuDevice(1, "GPU-b", "0000:3c:00.0", 0, "sw0", ("0000:3b:00.0",)),
    GpuDevice(2, None, "0000:af:00.0", None, None, ()),
    GpuDevice(3, None, "0000:b0:00.0", None, None, ()),
)


def json_form() -> str:
    return json.dumps(
        {
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "pciBusId": "0000:3b:00.0", "numa": 0, "pcieSwitch": "sw0",
                 "nvlinkPeers": ["0000:3c:00.0"]},
                {"index": 1, "uuid": "GPU-b", "pciBusId": "0000:3c:00.0", "numa": 0, "pcieSwitch": "sw0",
                 "nvlinkPeers": ["0000:3b:00.0"]},
                {"index": 2, "pciBusId": "0000:af:00.0"},
                {"index": 3, "pciBusId": "0000:b0:00.0"},
            ]
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text"), [("gpus.yaml", YAML), ("gpus.json", json_form())], ids=["yaml", "json"]
)
def test_read_file(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    topo = read_file(path)
    assert topo.source == "file"
    assert topo.gpus == EXPECTED


def one(entry: dict[str, Any]) -> str:
    return json.dumps({"gpus": [{"index": 0, "pciBusId": "0000:3b:00.0", **entry}]})


BAD_FILES = [
    ("not-yaml", "gpus: [", r"not YAML or JSON"),
    ("no-gpus-list", "gpus: {}", r"expected a mapping with a list under 'gpus'"),
    ("unknown-top-level-key", '{"gpus": [], "node": "n1"}', r"unknown top-level field 'node'"),
    ("gpu-not-a-mapping", '{"gpus": [3]}', r"gpus\[0\]: expected a mapping, got int"),
    ("unknown-gpu-key", one({"numaNode": 0}), r"gpus\[0\] \(index 0\): unknown field 'numaNode'"),
    ("index-missing", '{"gpus": [{"pciBusId": "0000:3b:00.0"}]}', r"gpus\[0\]: index is required"),
    ("bus-id-missing", '{"gpus": [{"index": 4}]}', r"gpus\[0\] \(index 4\): pciBusId is required"),
    ("index-string", one({"index": "0"}), r"index must be a non-negative integer, got '0'"),
    ("index-bool", one({"index": True}), r"index must be a non-negative integer, got True"),
    ("numa-negative", one({"numa": -1}), r"numa must be a non-negative integer or null, got -1"),
    ("uuid-number", one({"uuid": 7}), r"uuid must be a non-empty string or null, got 7"),
    ("switch-empty", one({"pcieSwitch": ""}), r"pcieSwitch must be a non-empty string or null"),
    ("peers-not-list", one({"nvlinkPeers": "0000:3c:00.0"}), r"nvlinkPeers must be a list"),
    ("peer-not-bus-id", one({"nvlinkPeers": ["gpu1"]}), r"nvlinkPeers: 'gpu1' is not a PCI bus id"),
    ("bus-id-malformed", one({"pciBusId": "3b:00.0"}), r"pciBusId: '3b:00.0' is not a PCI bus id"),
    ("mig-not-list", one({"mig": {"uuid": "MIG-a"}}), r"gpus\[0\] \(index 0\): mig must be a list"),
    ("mig-entry-not-mapping", one({"mig": ["MIG-a"]}), r"mig\[0\]: expected a mapping, got str"),
    (
        "mig-unknown-key",
        one({"mig": [{"uuid": "MIG-a", "gi": 1, "ci": 0, "slot": 2}]}),
        r"mig\[0\]: unknown field 'slot'",
    ),
    ("mig-uuid-missing", one({"mig": [{"gi": 1, "ci": 0}]}), r"mig\[0\]: uuid must be a non-empty string"),
    (
        "mig-gi-missing",
        one({"mig": [{"uuid": "MIG-a", "ci": 0}]}),
        r"gi must be a non-negative integer, got None",
    ),
    ("mig-ci-negative", one({"mig": [{"uuid": "MIG-a", "gi": 1, "ci": -1}]}), r"ci must be a non-negative"),
    (
        "mig-profile-empty",
        one({"mig": [{"uuid": "MIG-a", "gi": 1, "ci": 0, "profile": ""}]}),
        r"profile must be a non-empty string or null",
    ),
    # YAML 1.1 reads an unquoted 0000:30:00.0 as a base-60 number: the message says to quote it.
    (
        "yaml-unquoted-bus-id",
        "gpus:\n  - {index: 0, pciBusId: 0000:30:00.0}\n",
        r"pciBusId must be a string \(quote",
    ),
]


@pytest.mark.parametrize(("text", "message"), [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_bad_file_names_the_gpu_and_the_field(text: str, message: str) -> None:
    with pytest.raises(TopologyReadError, match=rf"^gpus.yaml: .*{message}"):
        parse_file(text, "gpus.yaml")


def test_a_simulated_mig_gpu_lists_its_mig_devices() -> None:
    from nodeagent.topology.model import MigDevice

    mig = [{"uuid": "MIG-a", "gi": 1, "ci": 0, "profile": "1g.10gb"}, {"uuid": "MIG-b", "gi": 2, "ci": 0}]
    topo = parse_file(one({"uuid": "GPU-0", "mig": mig}), "gpus.yaml")
    assert topo.gpus[0].mig == (MigDevice("MIG-a", 1, 0, "1g.10gb"), MigDevice("MIG-b", 2, 0))
    assert parse_file(one({"mig": None}), "gpus.yaml").gpus[0].mig == ()


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = (
        '{"gpus": [{"index": 0, "pciBusId": "0000:3b:00.0", "colour": "red"}, {"index": -1, "pciBusId": 5}]}'
    )
    with pytest.raises(
        TopologyReadError, match=r"unknown field 'colour'.*; .*index must be.*; .*pciBusId must be"
    ):
        parse_file(text, "gpus.yaml")


def test_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TopologyReadError, match=r"cannot read topology file .*absent.yaml"):
        read_file(tmp_path / "absent.yaml")


def sysfs_tree(root: Path) -> tuple[Path, Path]:
    """One GPU on a root port, as sysfs shows it."""
    real = root / "sys" / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    real.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("numa_node", "1")):
        (real / name).write_text(value + "\n")
    link = root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    return root / "sys", root / "proc"


SYSFS_GPU = GpuDevice(0, None, "0000:3b:00.0", 1, "0000:3a:00.0", ())


def no_nvml() -> Any | None:
    return None


SOURCES: list[tuple[str, Source, bool, str]] = [
    ("auto-prefers-nvml", "auto", True, "nvml"),
    ("auto-falls-back-to-sysfs", "auto", False, "sysfs"),
    ("explicit-nvml", "nvml", True, "nvml"),
    ("explicit-sysfs-ignores-nvml", "sysfs", True, "sysfs"),
]


@pytest.mark.parametrize(
    ("source", "has_nvml", "used"), [s[1:] for s in SOURCES], ids=[s[0] for s in SOURCES]
)
def test_discover_picks_the_source(tmp_path: Path, source: Source, has_nvml: bool, used: str) -> None:
    sys_root, proc_root = sysfs_tree(tmp_path)
    nvml = FakeNvml(pcie_box(0))
    topo = discover(
        source,
        sys_root=sys_root,
        proc_root=proc_root,
        nvml_loader=(lambda: nvml) if has_nvml else no_nvml,
    )
    assert topo.source == used
    assert len(topo.gpus) == (4 if used == "nvml" else 1)
    if used == "sysfs":
        assert topo.gpus == (SYSFS_GPU,)


def test_explicit_nvml_without_the_library_is_an_error(tmp_path: Path) -> None:
    sys_root, proc_root = sysfs_tree(tmp_path)
    with pytest.raises(TopologyReadError, match=r"'nvml' requested but NVML is not available"):
        discover("nvml", sys_root=sys_root, proc_root=proc_root, nvml_loader=no_nvml)


def test_file_source_needs_a_path() -> None:
    with pytest.raises(TopologyReadError, match="needs a topology file path"):
        discover("file", nvml_loader=no_nvml)


def test_file_source_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(YAML)
    assert discover("file", topology_file=path, nvml_loader=no_nvml).gpus == EXPECTED


INCONSISTENT_FILES = [
    (
        "duplicate-uuid",
        '{"gpus": [{"index": 0, "uuid": "GPU-a", "pciBusId": "0000:3b:00.0"},'
        ' {"index": 1, "uuid": "GPU-a", "pciBusId": "0000:3c:00.0"}]}',
        "UUID listed twice: GPU-a",
    ),
    (
        "peer-not-on-node",
        '{"gpus": [{"index": 0, "pciBusId": "0000:3b:00.0", "nvlinkPeers": ["0000:3c:00.0"]}]}',
        "NVLink peer 0000:3c:00.0 is not on this node",
    ),
    ("no-gpus", '{"gpus": []}', "no GPUs found"),
]


@pytest.mark.parametrize(
    ("text", "message"), [i[1:] for i in INCONSISTENT_FILES], ids=[i[0] for i in INCONSISTENT_FILES]
)
def test_discover_validates_what_it_read(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(text)
    with pytest.raises(TopologyReadError, match=message):
        discover("file", topology_file=path, nvml_loader=no_nvml)


def test_discover_validates_nvml_readings(tmp_path: Path) -> None:
    gpus = pcie_box(0)
    gpus[1] = gpus[0]  # the same GPU reported twice
    with pytest.raises(TopologyReadError, match="UUID listed twice: GPU-p0"):
        discover("nvml", nvml_loader=lambda: FakeNvml(gpus))
