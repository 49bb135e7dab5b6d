"""The topology model's checks and the `gpuwarden.io/gpu-topology` annotation the node agent writes.

The round trip goes through the extender's own parser: the annotation is only right if the consumer reads
back what the hardware said.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.gpus.topology import Gpu, parse_annotation
from nodeagent.topology.annotation import IdStrategy, nvlink_domains, render
from nodeagent.topology.model import (
    DiscoveredTopology,
    GpuDevice,
    MigDevice,
    TopologyReadError,
    normalise_bus_id,
    validate,
)


def bus(n: int) -> str:
    return f"0000:{n:02x}:00.0"


def gpu(
    index: int,
    *,
    uuid: str | None = "auto",
    numa: int | None = None,
    switch: str | None = None,
    peers: tuple[int, ...] = (),
    bus_id: str | None = None,
) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index:08x}" if uuid == "auto" else uuid,
        pci_bus_id=bus_id or bus(0x10 + index),
        numa=numa,
        pcie_switch=switch,
        nvlink_peers=tuple(bus(0x10 + p) for p in peers),
    )


def topo(*gpus: GpuDevice) -> DiscoveredTopology:
    return DiscoveredTopology(gpus, "file")


TWO_PAIRS = topo(
    gpu(0, numa=0, switch="pcie-a", peers=(1,)),
    gpu(1, numa=0, switch="pcie-a", peers=(0,)),
    gpu(2, numa=1, switch="pcie-b", peers=(3,)),
    gpu(3, numa=1, switch="pcie-b", peers=(2,)),
)
UNKNOWNS = topo(gpu(0, numa=None, switch=None), gpu(1, uuid=None, numa=1, switch="sw1"))

GOLDEN: list[tuple[str, DiscoveredTopology, IdStrategy, str]] = [
    (
        "two-nvlink-pairs-by-uuid",
        TWO_PAIRS,
        "uuid",
        '{"GPU-00000000":{"numa":0,"pcie":"pcie-a","nvlink":"nvl0","uuid":"GPU-00000000"},'
        '"GPU-00000001":{"numa":0,"pcie":"pcie-a","nvlink":"nvl0","uuid":"GPU-00000001"},'
        '"GPU-00000002":{"numa":1,"pcie":"pcie-b","nvlink":"nvl2","uuid":"GPU-00000002"},'
        '"GPU-00000003":{"numa":1,"pcie":"pcie-b","nvlink":"nvl2","uuid":"GPU-00000003"}}',
    ),
    (
        "two-nvlink-pairs-by-index",
        TWO_PAIRS,
        "index",
        '{"0":{"numa":0,"pcie":"pcie-a","nvlink":"nvl0","uuid":"GPU-00000000"},'
        '"1":{"numa":0,"pcie":"pcie-a","nvlink":"nvl0","uuid":"GPU-00000001"},'
        '"2":{"numa":1,"pcie":"pcie-b","nvlink":"nvl2","uuid":"GPU-00000002"},'
        '"3":{"numa":1,"pcie":"pcie-b","nvlink":"nvl2","uuid":"GPU-00000003"}}',
    ),
    (
        "unknown-values-omitted",
        UNKNOWNS,
        "index",
        '{"0":{"uuid":"GPU-00000000"},"1":{"numa":1,"pcie":"sw1"}}',
    ),
    (
        "index-order-whatever-the-input-order",
        topo(gpu(10, numa=0), gpu(2, numa=0)),
        "index",
        '{"2":{"numa":0,"uuid":"GPU-00000002"},"10":{"numa":0,"uuid":"GPU-0000000a"}}',
    ),
]


@pytest.mark.parametrize(
    ("discovered", "strategy", "golden"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_render_golden(discovered: DiscoveredTopology, strategy: IdStrategy, golden: str) -> None:
    assert render(discovered, strategy) == golden


DOMAINS = [
    ("no-links-no-domain", (gpu(0), gpu(1)), {}),
    (
        "named-after-smallest-index",
        (gpu(0), gpu(1, peers=(3,)), gpu(2), gpu(3)),
        {bus(0x11): "nvl1", bus(0x13): "nvl1"},
    ),
    (
        "chain-is-one-domain",
        (gpu(0, peers=(1,)), gpu(1, peers=(2,)), gpu(2), gpu(3)),
        {bus(0x10): "nvl0", bus(0x11): "nvl0", bus(0x12): "nvl0"},
    ),
    (
        "two-fabrics",
        (gpu(0, peers=(2,)), gpu(1, peers=(3,)), gpu(2, peers=(0,)), gpu(3, peers=(1,))),
        {bus(0x10): "nvl0", bus(0x12): "nvl0", bus(0x11): "nvl1", bus(0x13): "nvl1"},
    ),
]


@pytest.mark.parametrize(("gpus", "domains"), [d[1:] for d in DOMAINS], ids=[d[0] for d in DOMAINS])
def test_nvlink_domains(gpus: tuple[GpuDevice, ...], domains: dict[str, str]) -> None:
    assert nvlink_domains(gpus) == domains


def test_uuid_strategy_needs_every_uuid() -> None:
    with pytest.raises(TopologyReadError, match=r"GPU 1 \(0000:11:00.0\) has no known UUID"):
        render(UNKNOWNS, "uuid")


ROUND_TRIPS: list[tuple[str, DiscoveredTopology, IdStrategy, tuple[Gpu, ...]]] = [
    (
        "uuid-ids",
        TWO_PAIRS,
        "uuid",
        tuple(
            Gpu(
                f"GPU-{i:08x}",
                i // 2,
                "pcie-a" if i < 2 else "pcie-b",
                "nvl0" if i < 2 else "nvl2",
                f"GPU-{i:08x}",
            )
            for i in range(4)
        ),
    ),
    (
        "index-ids",
        TWO_PAIRS,
        "index",
        tuple(
            Gpu(str(i), i // 2, "pcie-a" if i < 2 else "pcie-b", "nvl0" if i < 2 else "nvl2", f"GPU-{i:08x}")
            for i in range(4)
        ),
    ),
    ("unknowns-stay-unknown", UNKNOWNS, "index", (Gpu("0", uuid="GPU-00000000"), Gpu("1", 1, "sw1"))),
    (
        "double-digit-indices",
        topo(*(gpu(i, numa=0) for i in range(12))),
        "index",
        tuple(Gpu(str(i), 0, uuid=f"GPU-{i:08x}") for i in range(12)),
    ),
]


@pytest.mark.parametrize(
    ("discovered", "strategy", "gpus"), [r[1:] for r in ROUND_TRIPS], ids=[r[0] for r in ROUND_TRIPS]
)
def test_the_extender_reads_back_what_was_discovered(
    discovered: DiscoveredTopology, strategy: IdStrategy, gpus: tuple[Gpu, ...]
) -> None:
    parsed = parse_annotation(render(discovered, strategy))
    assert parsed.source == "annotation"
    assert parsed.gpus == gpus


INCONSISTENT = [
    ("empty", topo(), "no GPUs found"),
    ("duplicate-index", topo(gpu(0), gpu(0, uuid="GPU-b", bus_id=bus(0x20))), "index listed twice: 0"),
    ("duplicate-uuid", topo(gpu(0, uuid="GPU-a"), gpu(1, uuid="GPU-a")), "UUID listed twice: GPU-a"),
    ("duplicate-bus-id", topo(gpu(0), gpu(1, bus_id=bus(0x10))), "PCI bus id listed twice: 0000:10:00.0"),
    ("peer-not-on-node", topo(gpu(0, peers=(7,)), gpu(1)), "NVLink peer 0000:17:00.0 is not on this node"),
    ("peer-is-itself", topo(gpu(0, peers=(0,))), "lists itself as an NVLink peer"),
    ("negative-numa", topo(gpu(0, numa=-1)), "numa -1 is negative"),
    ("not-sorted", topo(gpu(1), gpu(0)), "not sorted by index"),
    (
        "mig-uuid-under-two-gpus",
        topo(
            replace(gpu(0), mig=(MigDevice("MIG-a", 1, 0),)), replace(gpu(1), mig=(MigDevice("MIG-a", 2, 0),))
        ),
        "MIG UUID listed twice: MIG-a",
    ),
]


@pytest.mark.parametrize(
    ("discovered", "message"), [i[1:] for i in INCONSISTENT], ids=[i[0] for i in INCONSISTENT]
)
def test_validate_rejects_inconsistent_readings(discovered: DiscoveredTopology, message: str) -> None:
    with pytest.raises(TopologyReadError, match=message):
        validate(discovered)


def test_validate_reports_every_problem_at_once() -> None:
    bad = topo(gpu(0, uuid="GPU-a", peers=(9,)), gpu(1, uuid="GPU-a"))
    with pytest.raises(TopologyReadError, match=r"UUID listed twice.*; .*NVLink peer 0000:19:00.0"):
        validate(bad)


@pytest.mark.parametrize("discovered", [TWO_PAIRS, UNKNOWNS], ids=["two-pairs", "unknowns"])
def test_validate_accepts_consistent_readings(discovered: DiscoveredTopology) -> None:
    validate(discovered)


BUS_IDS = [
    ("nvml-8-digit-domain", "00000000:3B:00.0", "0000:3b:00.0"),
    ("already-normal", "0000:3b:00.0", "0000:3b:00.0"),
    ("vmd-domain", "00010000:01:00.0", "10000:01:00.0"),
    ("whitespace", " 0000:AF:1F.7\n", "0000:af:1f.7"),
]


@pytest.mark.parametrize(("raw", "normal"), [b[1:] for b in BUS_IDS], ids=[b[0] for b in BUS_IDS])
def test_normalise_bus_id(raw: str, normal: str) -> None:
    assert normalise_bus_id(raw, "test") == normal


@pytest.mark.parametrize("raw", ["3b:00.0", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "GPU-1"])
def test_normalise_bus_id_rejects_what_is_not_a_bus_id(raw: str) -> None:
    with pytest.raises(TopologyReadError, match=r"test: .* is not a PCI bus id"):
        normalise_bus_id(raw, "test")
