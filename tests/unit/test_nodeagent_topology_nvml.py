"""Reading GPU topology from recorded NVML answers (a fake with pynvml's function names)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.topology.annotation import render
from nodeagent.topology.model import GpuDevice, TopologyReadError
from nodeagent.topology.nvml import load_nvml, nvlink_peers, read_nvml


# Names below follow pynvml (NVMLError_*, nvmlDevice*, busId): read_nvml looks them up by name.
class NVMLError(Exception):
    """pynvml's base error; the subclasses below are the ones pynvml raises for each return code."""


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


SINGLE, NODE, SYSTEM = 10, 40, 50


@dataclass(frozen=True)
class Recorded:
    """One GPU's recorded answers. `links`: link -> far-end busId (None: link there but down); links not
    listed answer InvalidArgument; `links is None` is a GPU without NVLink (NotSupported)."""

    bus_id: str | bytes
    uuid: str | bytes
    numa: int | NVMLError
    switch: str  # which PCIe switch it sits behind, to answer nvmlDeviceGetTopologyCommonAncestor
    socket: int
    links: dict[int, str | None] | None


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass(frozen=True)
class PciInfo:
    busId: str | bytes


@dataclass
class FakeNvml:
    """Answers like pynvml from `gpus`; `fail` makes the named call raise; `calls` records what was called."""

    gpus: list[Recorded]
    fail: dict[str, NVMLError] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_TOPOLOGY_SINGLE = SINGLE

    def _answer(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self) -> None:
        self._answer("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._answer("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._answer("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._answer("nvmlDeviceGetHandleByIndex")
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        self._answer("nvmlDeviceGetUUID")
        return self.gpus[handle.index].uuid

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        self._answer("nvmlDeviceGetPciInfo")
        return PciInfo(self.gpus[handle.index].bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        self._answer("nvmlDeviceGetNumaNodeId")
        numa = self.gpus[handle.index].numa
        if isinstance(numa, NVMLError):
            raise numa
        return numa

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Handle, second: Handle) -> int:
        self._answer("nvmlDeviceGetTopologyCommonAncestor")
        a, b = self.gpus[first.index], self.gpus[second.index]
        return SINGLE if a.switch == b.switch else NODE if a.socket == b.socket else SYSTEM

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._answer("nvmlDeviceGetNvLinkState")
        links = self.gpus[handle.index].links
        if links is None:
            raise NVMLError_NotSupported("Not Supported")
        if link not in links:
            raise NVMLError_InvalidArgument("Invalid Argument")
        return 0 if links[link] is None else 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> PciInfo:
        self._answer("nvmlDeviceGetNvLinkRemotePciInfo")
        links = self.gpus[handle.index].links
        assert links is not None and links[link] is not None, "asked for the far end of a link that is down"
        return PciInfo(links[link] or "")


class OldDriverNvml(FakeNvml):
    """nvidia-ml-py without nvmlDeviceGetNumaNodeId."""

    nvmlDeviceGetNumaNodeId = None  # type: ignore[assignment]


HGX_BUS = ["13", "14", "17", "18", "93", "94", "97", "98"]
NVSWITCHES = [f"00000000:C{k}:00.0" for k in range(1, 7)]


def hgx_gpu(i: int) -> Recorded:
    """A100-style: 12 NVLinks, link l to NVSwitch l % 6; link 11 of GPU 5 is down."""
    links: dict[int, str | None] = {link: NVSWITCHES[link % 6] for link in range(12)}
    if i == 5:
        links[11] = None
    bus = f"00000000:{HGX_BUS[i].upper()}:00.0"
    return Recorded(
        bus_id=bus.encode() if i % 2 else bus,  # pynvml versions differ: bytes or str
        uuid=f"GPU-{i}0000000-0000-0000-0000-000000000000",
        numa=i // 4,
        switch=f"sw{i // 2}",
        socket=i // 4,
        links=links,
    )


def hgx_expected() -> list[GpuDevice]:
    bus = [f"0000:{b}:00.0" for b in HGX_BUS]
    return [
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}0000000-0000-0000-0000-000000000000",
            pci_bus_id=bus[i],
            numa=i // 4,
            pcie_switch=f"pcie-{bus[i - i % 2]}",
            nvlink_peers=tuple(b for b in bus if b != bus[i]),
        )
        for i in range(8)
    ]


PCIE_BUS = ["0000:1a:00.0", "0000:3d:00.0", "0000:b1:00.0", "0000:d8:00.0"]


def pcie_box(numa: int | NVMLError, pairs: dict[int, int] | None = None) -> list[Recorded]:
    """4 GPUs, each on its own root port, 2 per socket; `pairs` adds NVLink bridges between two GPUs."""
    gpus = []
    for i, bus in enumerate(PCIE_BUS):
        links: dict[int, str | None] | None = None
        if pairs is not None:
            peer = pairs.get(i, next((k for k, v in pairs.items() if v == i), None))
            links = None if peer is None else {0: PCIE_BUS[peer].upper(), 1: PCIE_BUS[peer]}
        gpus.append(Recorded(bus.upper(), f"GPU-p{i}", numa, f"root{i}", i // 2, links))
    return gpus


def pcie_expected(numa: list[int | None], peers: list[tuple[str, ...]] | None = None) -> list[GpuDevice]:
    return [
        GpuDevice(i, f"GPU-p{i}", b, numa[i], f"pcie-{b}", () if peers is None else peers[i])
        for i, b in enumerate(PCIE_BUS)
    ]


def write_numa(sys_root: Path, numa: dict[str, str]) -> None:
    for bus, value in numa.items():
        path = sys_root / "bus" / "pci" / "devices" / bus / "numa_node"
        path.parent.mkdir(parents=True)
        path.write_text(value + "\n")


SYSFS_NUMA = dict(zip(PCIE_BUS, ["0", "0", "1", "-1"], strict=True))
FROM_SYSFS = [0, 0, 1, None]

RECORDED: list[tuple[str, FakeNvml, list[GpuDevice]]] = [
    ("hgx-8-gpus-2-numa-nvswitch-fabric", FakeNvml([hgx_gpu(i) for i in range(8)]), hgx_expected()),
    ("pcie-box-numa-from-nvml", FakeNvml(pcie_box(1)), pcie_expected([1, 1, 1, 1])),
    (
        "pcie-box-numa-not-supported-reads-sysfs",
        FakeNvml(pcie_box(NVMLError_NotSupported("Not Supported"))),
        pcie_expected(FROM_SYSFS),
    ),
    (
        "pcie-box-numa-function-not-found-reads-sysfs",
        FakeNvml(pcie_box(NVMLError_FunctionNotFound("Function Not Found"))),
        pcie_expected(FROM_SYSFS),
    ),
    ("pcie-box-old-binding-without-numa-call", OldDriverNvml(pcie_box(0)), pcie_expected(FROM_SYSFS)),
    ("pcie-box-nvml-numa-minus-one-reads-sysfs", FakeNvml(pcie_box(-1)), pcie_expected(FROM_SYSFS)),
    (
        "pcie-box-nvlink-bridges-direct-peers",
        FakeNvml(pcie_box(0, pairs={0: 1, 2: 3})),
        pcie_expected([0, 0, 0, 0], [(PCIE_BUS[1],), (PCIE_BUS[0],), (PCIE_BUS[3],), (PCIE_BUS[2],)]),
    ),
]


@pytest.mark.parametrize(("nvml", "gpus"), [r[1:] for r in RECORDED], ids=[r[0] for r in RECORDED])
def test_read_nvml(tmp_path: Path, nvml: FakeNvml, gpus: list[GpuDevice]) -> None:
    write_numa(tmp_path, SYSFS_NUMA)
    topo = read_nvml(nvml, sys_root=tmp_path)
    assert topo.source == "nvml"
    assert list(topo.gpus) == gpus
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlInit") == nvml.calls.count("nvmlShutdown") == 1


def test_hgx_renders_one_nvlink_domain_and_a_switch_per_pair() -> None:
    doc = render(read_nvml(FakeNvml([hgx_gpu(i) for i in range(8)])), "index")
    assert doc.startswith(
        '{"0":{"numa":0,"pcie":"pcie-0000:13:00.0","nvlink":"nvl0","uuid":"GPU-00000000-0000-0000-0000-000000000000"},'
        '"1":{"numa":0,"pcie":"pcie-0000:13:00.0","nvlink":"nvl0",'
    )
    assert doc.count('"nvlink":"nvl0"') == 8 and doc.count('"pcie":"pcie-0000:97:00.0"') == 2


def test_pcie_box_without_nvlink_renders_no_nvlink_key(tmp_path: Path) -> None:
    assert '"nvlink"' not in render(read_nvml(FakeNvml(pcie_box(0))), "uuid")


def test_nvlink_links_beyond_the_gpu_are_skipped_and_down_links_not_followed() -> None:
    nvml = FakeNvml([hgx_gpu(i) for i in range(8)])
    read_nvml(nvml)
    assert nvml.calls.count("nvmlDeviceGetNvLinkState") == 8 * 18
    assert nvml.calls.count("nvmlDeviceGetNvLinkRemotePciInfo") == 8 * 12 - 1


HGX = [hgx_gpu(i) for i in range(8)]
FAILURES = [
    (
        "count",
        "nvmlDeviceGetCount",
        NVMLError("Unknown Error"),
        r"nvmlDeviceGetCount\(\) failed: Unknown Error",
    ),
    (
        "handle",
        "nvmlDeviceGetHandleByIndex",
        NVMLError_GpuIsLost("GPU is lost"),
        r"HandleByIndex\(0\).*GPU is lost",
    ),
    ("uuid", "nvmlDeviceGetUUID", NVMLError("Unknown Error"), r"nvmlDeviceGetUUID\(GPU 0\)"),
    ("pci-info", "nvmlDeviceGetPciInfo", NVMLError("Unknown Error"), r"nvmlDeviceGetPciInfo\(GPU 0\)"),
    (
        "numa",
        "nvmlDeviceGetNumaNodeId",
        NVMLError_GpuIsLost("GPU is lost"),
        r"nvmlDeviceGetNumaNodeId\(GPU 0\)",
    ),
    (
        "common-ancestor",
        "nvmlDeviceGetTopologyCommonAncestor",
        NVMLError("Unknown Error"),
        r"nvmlDeviceGetTopologyCommonAncestor\(GPU 0, GPU 1\)",
    ),
    (
        "link-state",
        "nvmlDeviceGetNvLinkState",
        NVMLError_GpuIsLost("GPU is lost"),
        r"NvLinkState\(GPU 0, link 0\)",
    ),
    (
        "link-remote",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        NVMLError("Unknown Error"),
        r"nvmlDeviceGetNvLinkRemotePciInfo\(GPU 0, link 0\)",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "message"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES]
)
def test_a_failing_call_is_a_read_error_naming_it_and_nvml_is_shut_down(
    call: str, error: NVMLError, message: str
) -> None:
    nvml = FakeNvml(HGX, fail={call: error})
    with pytest.raises(TopologyReadError, match=message):
        read_nvml(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlShutdown") == 1


def test_failed_init_is_an_error_and_nothing_else_is_called() -> None:
    nvml = FakeNvml(HGX, fail={"nvmlInit": NVMLError_DriverNotLoaded("Driver Not Loaded")})
    with pytest.raises(TopologyReadError, match=r"nvmlInit\(\) failed: Driver Not Loaded"):
        read_nvml(nvml)
    assert nvml.calls == ["nvmlInit"]


def test_failed_shutdown_after_a_good_read_is_an_error() -> None:
    nvml = FakeNvml(HGX, fail={"nvmlShutdown": NVMLError("Unknown Error")})
    with pytest.raises(TopologyReadError, match=r"nvmlShutdown\(\) failed"):
        read_nvml(nvml)


def test_failed_shutdown_after_a_failed_read_reports_the_read() -> None:
    nvml = FakeNvml(HGX, fail={"nvmlDeviceGetCount": NVMLError("first"), "nvmlShutdown": NVMLError("second")})
    with pytest.raises(TopologyReadError, match=r"nvmlDeviceGetCount\(\) failed: first"):
        read_nvml(nvml)


def test_malformed_bus_id_is_an_error_naming_the_call() -> None:
    bad = Recorded("3B:00.0", "GPU-x", 0, "sw", 0, None)
    with pytest.raises(TopologyReadError, match=r"nvmlDeviceGetPciInfo\(GPU 0\)\.busId: '3B:00.0'"):
        read_nvml(FakeNvml([bad]))


def test_missing_sysfs_numa_after_nvml_not_supported_is_an_error(tmp_path: Path) -> None:
    nvml = FakeNvml(pcie_box(NVMLError_NotSupported("Not Supported")))
    with pytest.raises(TopologyReadError, match=r"cannot read .*0000:1a:00.0/numa_node"):
        read_nvml(nvml, sys_root=tmp_path)
    assert nvml.calls[-1] == "nvmlShutdown"


PEERS = [
    (
        "direct-links-count-both-ways",
        {"a": {"b"}, "b": set(), "c": set()},
        {"a": ("b",), "b": ("a",), "c": ()},
    ),
    (
        "one-nvswitch-joins-all-attached",
        {"a": {"sw1"}, "b": {"sw1"}, "c": {"sw1"}},
        {"a": ("b", "c"), "b": ("a", "c"), "c": ("a", "b")},
    ),
    (
        "two-separate-fabrics",
        {"a": {"sw1"}, "b": {"sw1"}, "c": {"sw2"}, "d": {"sw2"}},
        {"a": ("b",), "b": ("a",), "c": ("d",), "d": ("c",)},
    ),
    ("no-links", {"a": set(), "b": set()}, {"a": (), "b": ()}),
]


@pytest.mark.parametrize(("remotes", "peers"), [p[1:] for p in PEERS], ids=[p[0] for p in PEERS])
def test_nvlink_peers(remotes: dict[str, set[str]], peers: dict[str, tuple[str, ...]]) -> None:
    bus = {name: f"0000:{i + 1:02x}:00.0" for i, name in enumerate(["a", "b", "c", "d", "sw1", "sw2"])}
    as_bus = {bus[g]: {bus[e] for e in ends} for g, ends in remotes.items()}
    assert nvlink_peers(as_bus) == {bus[g]: tuple(bus[p] for p in ps) for g, ps in peers.items()}


def fake_module(init_error: Exception | None) -> Any:
    module: Any = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    module.calls = []

    def init() -> None:
        module.calls.append("nvmlInit")
        if init_error is not None:
            raise init_error

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.calls.append("nvmlShutdown")
    return module


def test_load_nvml_without_the_package_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert load_nvml() is None


def test_load_nvml_without_libnvidia_ml_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_module(NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert load_nvml() is None
    assert module.calls == ["nvmlInit"]


def test_load_nvml_returns_the_module_and_closes_its_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_module(None)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    loaded = load_nvml()
    assert module.calls == ["nvmlInit", "nvmlShutdown"]
    assert loaded is module


def test_load_nvml_with_a_broken_driver_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_module(NVMLError_DriverNotLoaded("Driver Not Loaded")))
    with pytest.raises(TopologyReadError, match=r"nvmlInit\(\) failed: Driver Not Loaded"):
        load_nvml()


# --- MIG devices ---------------------------------------------------------------------------------------
class NVMLError_NotFound(NVMLError):
    pass


@dataclass(frozen=True)
class MigHandle:
    gpu: int
    slot: int


class MigNvml(FakeNvml):
    """A pynvml with MIG: `mig` maps a GPU index to its slots (slot -> (uuid, gi, ci, name)); a GPU absent
    from it is not MIG-capable (NotSupported); `disabled` GPUs are MIG-capable with MIG off."""

    NVMLError_NotFound = NVMLError_NotFound
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[Recorded], mig: dict[int, dict[int, tuple[str, int, int, str]]],
                 disabled: tuple[int, ...] = ()) -> None:  # fmt: skip
        super().__init__(gpus)
        self.mig, self.disabled = mig, disabled

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._answer("nvmlDeviceGetMigMode")
        if handle.index in self.disabled:
            return [0, 0]
        if handle.index not in self.mig:
            raise NVMLError_NotSupported("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._answer("nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, slot: int) -> MigHandle:
        self._answer("nvmlDeviceGetMigDeviceHandleByIndex")
        if slot not in self.mig[handle.index]:
            raise NVMLError_NotFound("Not Found")
        return MigHandle(handle.index, slot)

    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str | bytes:  # type: ignore[override]
        if isinstance(handle, MigHandle):
            self._answer("nvmlDeviceGetUUID")
            return self.mig[handle.gpu][handle.slot][0].encode()
        return super().nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetGpuInstanceId(self, handle: MigHandle) -> int:
        self._answer("nvmlDeviceGetGpuInstanceId")
        return self.mig[handle.gpu][handle.slot][1]

    def nvmlDeviceGetComputeInstanceId(self, handle: MigHandle) -> int:
        self._answer("nvmlDeviceGetComputeInstanceId")
        return self.mig[handle.gpu][handle.slot][2]

    def nvmlDeviceGetName(self, handle: MigHandle) -> str:
        self._answer("nvmlDeviceGetName")
        return self.mig[handle.gpu][handle.slot][3]


H100_MIG = {
    0: {0: ("MIG-11111111-aaaa-5bbb-8ccc-000000000001", 7, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb"),
        2: ("MIG-11111111-aaaa-5bbb-8ccc-000000000002", 8, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb")},
    2: {0: ("MIG-11111111-aaaa-5bbb-8ccc-000000000003", 1, 0, "NVIDIA H100 80GB HBM3")},  # no profile in name
}  # fmt: skip


def test_mig_devices_read_per_gpu_and_published_for_drain_and_idle(tmp_path: Path) -> None:
    from controller.gpus.physical import MigPlace, mig_places
    from controller.gpus.topology import parse_annotation
    from nodeagent.topology.model import MigDevice

    write_numa(tmp_path, SYSFS_NUMA)
    nvml = MigNvml(pcie_box(0), H100_MIG, disabled=(1,))
    topo = read_nvml(nvml, sys_root=tmp_path)
    assert [g.mig for g in topo.gpus] == [
        (MigDevice(H100_MIG[0][0][0], 7, 0, "1g.10gb"), MigDevice(H100_MIG[0][2][0], 8, 0, "3g.40gb")),
        (),  # MIG-capable, MIG off
        (MigDevice(H100_MIG[2][0][0], 1, 0, None),),
        (),  # not MIG-capable
    ]
    assert nvml.calls.count("nvmlInit") == nvml.calls.count("nvmlShutdown") == 1
    text = render(topo, "uuid")
    assert (
        '"mig":[{"uuid":"MIG-11111111-aaaa-5bbb-8ccc-000000000001","gi":7,"ci":0,"profile":"1g.10gb"}' in text
    )
    places = mig_places(parse_annotation(text))
    assert places[H100_MIG[0][2][0]] == MigPlace("GPU-p0", 8)
    assert places[H100_MIG[2][0][0]] == MigPlace("GPU-p2", 1)


def test_nvml_without_mig_calls_lists_no_mig_devices(tmp_path: Path) -> None:
    write_numa(tmp_path, SYSFS_NUMA)
    topo = read_nvml(FakeNvml(pcie_box(0)), sys_root=tmp_path)
    assert all(g.mig == () for g in topo.gpus)
    assert '"mig"' not in render(topo, "index")


def test_a_failing_mig_call_is_a_read_error_naming_it() -> None:
    nvml = MigNvml(pcie_box(0), H100_MIG)
    nvml.fail["nvmlDeviceGetGpuInstanceId"] = NVMLError_GpuIsLost("GPU is lost")
    with pytest.raises(TopologyReadError, match=r"nvmlDeviceGetGpuInstanceId\(GPU 0, MIG slot 0\) failed"):
        read_nvml(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"
