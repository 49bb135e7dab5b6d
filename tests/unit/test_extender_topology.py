"""Parsing GPU topology from the node annotation and from NodeResourceTopology objects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.gpus.topology import (
    Gpu,
    MigDevice,
    TopologyError,
    count_only,
    mig_devices,
    parse_annotation,
    parse_nrt,
)
from tests.unit.extender_support import RESOURCE, nrt

ANNOTATIONS = [
    (
        "mapping",
        {"1": {"numa": 0, "pcie": "p0", "nvlink": "a", "uuid": "GPU-1"}, "0": {"numa": 0}},
        (Gpu("0", 0), Gpu("1", 0, "p0", "a", "GPU-1")),
    ),
    (
        "list-with-ids",
        [{"id": 10, "numa": 1}, {"id": 2, "numaNode": 0, "pcieSwitch": 3, "nvlinkDomain": "x"}],
        (Gpu("2", 0, "3", "x"), Gpu("10", 1)),
    ),
    ("gpus-wrapper", {"gpus": {"0": {"numa_node": "1", "pcie_switch": "s"}}}, (Gpu("0", 1, "s"),)),
    ("attributes-optional", {"0": {}, "1": {"numa": None}}, (Gpu("0"), Gpu("1"))),
    (
        "mig-devices",
        {
            "0": {
                "uuid": "GPU-0",
                "mig": [
                    {"uuid": "MIG-a", "gi": 1, "ci": 0, "profile": "1g.10gb"},
                    {"uuid": "MIG-b", "gi": "2"},
                ],
            }
        },
        (Gpu("0", uuid="GPU-0", mig=(MigDevice("MIG-a", 1, 0, "1g.10gb"), MigDevice("MIG-b", 2))),),
    ),
    ("mig-empty-list", {"0": {"mig": []}}, (Gpu("0"),)),
]


@pytest.mark.parametrize(
    ("doc", "gpus"), [(d, g) for _, d, g in ANNOTATIONS], ids=[i for i, _, _ in ANNOTATIONS]
)
def test_parse_annotation(doc: Any, gpus: tuple[Gpu, ...]) -> None:
    topo = parse_annotation(json.dumps(doc))
    assert topo.gpus == gpus
    assert topo.source == "annotation" and topo.known


BAD_ANNOTATIONS = [
    ("not-json", "{", "is not JSON"),
    ("scalar", "3", "must be a JSON object or list"),
    ("empty", "{}", "lists no GPUs"),
    ("gpu-not-object", '{"0": 1}', "GPU '0': expected an object"),
    ("negative-numa", '{"0": {"numa": -1}}', "numa must be a non-negative integer"),
    ("bool-numa", '{"0": {"numa": true}}', "numa must be a non-negative integer"),
    ("list-entry-without-id", '[{"numa": 0}]', 'needs an "id"'),
    ("duplicate-ids", '[{"id": 1}, {"id": "1"}]', "listed twice: 1"),
    ("pcie-object", '{"0": {"pcie": {"a": 1}}}', "pcie must be a string"),
    ("mig-not-list", '{"0": {"mig": {"uuid": "MIG-a"}}}', "mig must be a list"),
    ("mig-without-uuid", '{"0": {"mig": [{"gi": 1}]}}', r'mig\[0\] needs a "uuid"'),
    ("mig-negative-gi", '{"0": {"mig": [{"uuid": "MIG-a", "gi": -1}]}}', "MIG gi must be a non-negative"),
    ("mig-profile-number", '{"0": {"mig": [{"uuid": "MIG-a", "profile": 1}]}}', "profile must be a string"),
    ("mig-twice-on-a-gpu", '{"0": {"mig": [{"uuid": "MIG-a"}, {"uuid": "MIG-a"}]}}', "listed twice"),
    (
        "mig-under-two-gpus",
        '{"0": {"mig": [{"uuid": "MIG-a"}]}, "1": {"mig": [{"uuid": "MIG-a"}]}}',
        "listed under two GPUs: MIG-a",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [(t, m) for _, t, m in BAD_ANNOTATIONS], ids=[i for i, _, _ in BAD_ANNOTATIONS]
)
def test_parse_annotation_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_annotation(text)


def test_nrt_zones_number_gpus_in_numa_order() -> None:
    topo = parse_nrt(nrt("n", [2, 3]), RESOURCE)
    assert topo is not None and topo.source == "nrt"
    assert [(g.id, g.numa) for g in topo.gpus] == [("0", 0), ("1", 0), ("2", 1), ("3", 1), ("4", 1)]


def test_nrt_zone_attribute_names_the_gpu_ids() -> None:
    topo = parse_nrt(nrt("n", [2, 2], ids=["3", "2", "1", "0"]), RESOURCE)
    assert topo is not None
    assert [(g.id, g.numa) for g in topo.gpus] == [("0", 1), ("1", 1), ("2", 0), ("3", 0)]


def test_nrt_without_the_gpu_resource_is_no_topology() -> None:
    obj = nrt("n", [0, 0])
    assert parse_nrt(obj, RESOURCE) is None
    assert parse_nrt({"metadata": {"name": "n"}}, RESOURCE) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["zones"][0].update(name="socket"), "has no NUMA id"),
        (lambda o: o["zones"][0]["resources"][1].update(allocatable="2.5"), "is not a device count"),
        (
            lambda o: o["zones"][0].update(attributes=[{"name": "gpuwarden.io/gpu-ids", "value": "0"}]),
            "lists 1 ids",
        ),
    ],
    ids=["zone-name-without-number", "fractional-count", "id-count-mismatch"],
)
def test_nrt_errors(mutate: Any, message: str) -> None:
    obj = nrt("n", [2, 2])
    mutate(obj)
    with pytest.raises(TopologyError, match=message):
        parse_nrt(obj, RESOURCE)


def test_count_only_stand_in() -> None:
    topo = count_only(3)
    assert [g.id for g in topo.gpus] == ["0", "1", "2"] and not topo.known
    assert count_only(-1).gpus == ()


def test_mig_devices_name_their_gpu_earlier_source_first() -> None:
    first = parse_annotation('{"0": {"uuid": "GPU-0", "mig": [{"uuid": "MIG-a", "gi": 3}]}}')
    second = parse_annotation('{"5": {"mig": [{"uuid": "MIG-a"}, {"uuid": "MIG-b"}]}}')
    got = mig_devices(first, None, second)
    assert {k: (g.id, m.gi) for k, (g, m) in got.items()} == {"MIG-a": ("0", 3), "MIG-b": ("5", None)}
