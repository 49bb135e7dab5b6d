"""Device IDs resolved to physical GPUs per sharing mode: whole (index and UUID strategies), time-slicing and
MPS replicas, MIG single and mixed (legacy and opaque MIG UUIDs), and what stays unknown."""

from __future__ import annotations

import json

import pytest

from controller.gpus.physical import Device, MigPlace, mig_places, physical_gpus
from controller.gpus.topology import parse_annotation

A = "GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71"
B = "GPU-7c1f5e9a-0d2b-4c3e-8f6a-1b9d0e2c5a84"
C = "GPU-11111111-2222-4333-8444-555555555555"  # not in the topology
INDEX_TOPOLOGY = {A: "0", B: "1"}  # --device-id-strategy=index: ids are indices
UUID_TOPOLOGY = {A: A, B: B}  # the device plugin's default: ids are the UUIDs
MIGS = {"MIG-aaaa": MigPlace(A, 1), "MIG-bbbb": MigPlace(B, 2)}


@pytest.mark.parametrize(
    ("ids", "topology", "gpus", "via_id", "unknown"),
    [
        pytest.param(["1"], INDEX_TOPOLOGY, {B}, True, [], id="whole-index"),
        pytest.param([A], UUID_TOPOLOGY, {A}, False, [], id="whole-uuid"),
        pytest.param([C], UUID_TOPOLOGY, {C}, False, [], id="whole-uuid-exact-without-topology"),
        pytest.param(["7"], INDEX_TOPOLOGY, set(), False, ["7: names no GPU"], id="index-not-in-topology"),
        pytest.param(["0"], {}, set(), False, ["0: names no GPU"], id="index-without-topology"),
        pytest.param([f"{A}::3"], UUID_TOPOLOGY, {A}, False, [], id="time-slicing-replica"),
        pytest.param([f"{A}::0", f"{A}::1"], UUID_TOPOLOGY, {A}, False, [], id="two-replicas-one-gpu"),
        pytest.param(["1::2"], INDEX_TOPOLOGY, {B}, True, [], id="replica-of-an-index"),
        pytest.param([f"MIG-{A}/7/0"], {}, {A}, False, [], id="legacy-mig-names-its-parent"),
        pytest.param(["MIG-aaaa"], UUID_TOPOLOGY, {A}, False, [], id="opaque-mig-via-topology"),
        pytest.param(["MIG-bbbb::1"], UUID_TOPOLOGY, {B}, False, [], id="shared-mig-replica"),
        pytest.param(["MIG-cccc"], UUID_TOPOLOGY, set(), False, ["MIG-cccc: an opaque MIG UUID"],
                     id="opaque-mig-unlisted"),
        pytest.param([f"{A}-2"], UUID_TOPOLOGY, set(), False, [f"{A}-2: names no GPU"], id="hami-compound"),
        pytest.param([A, "MIG-cccc"], UUID_TOPOLOGY, {A}, False, ["MIG-cccc"], id="one-unknown-of-two"),
    ],
)  # fmt: skip
def test_physical_gpus(
    ids: list[str], topology: dict[str, str], gpus: set[str], via_id: bool, unknown: list[str]
) -> None:
    held = physical_gpus(ids, topology, MIGS)
    assert held.gpus == gpus
    assert held.via_id is via_id
    assert len(held.unknown) == len(unknown)
    assert all(got.startswith(want) for got, want in zip(held.unknown, unknown, strict=True))


def test_mig_devices_carry_their_instance() -> None:
    held = physical_gpus(["MIG-aaaa", f"MIG-{B}/4/0", f"{A}::1"], UUID_TOPOLOGY, MIGS)
    assert held.devices == (
        Device("MIG-aaaa", A, gi=1, mig="MIG-aaaa"),
        Device(f"MIG-{B}/4/0", B, gi=4, mig=f"MIG-{B}/4/0"),
        Device(f"{A}::1", A, replica=1),
    )


def test_mig_places_from_the_topology_annotation() -> None:
    doc = {"0": {"uuid": A, "mig": [{"uuid": "MIG-aaaa", "gi": 1}]}, "1": {"mig": [{"uuid": "MIG-bbbb"}]}}
    topo = parse_annotation(json.dumps(doc))
    assert mig_places(topo) == {"MIG-aaaa": MigPlace(A, 1), "MIG-bbbb": MigPlace("1", None)}
    # a parent without a published UUID is named by its id, which resolves only through the topology
    assert physical_gpus(["MIG-bbbb"], {A: "0"}, mig_places(topo)).unknown
