"""From raw Node/Pod JSON to the drain plan's inputs: what counts as quarantined, released, a GPU pod."""

from __future__ import annotations

import json
from typing import Any

from controller.drain.observe import build_snapshot
from controller.drain.state import DrainState, decode
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION

TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
TOPO = json.dumps({str(i): {"numa": 0, "uuid": f"GPU-{i}"} for i in range(4)})


def node(
    name: str, *, record: QuarantineRecord | None = None, taint: bool = False, **ann: str
) -> dict[str, Any]:
    annotations = {"gpuwarden.io/gpu-topology": TOPO, **ann}
    if record is not None:
        annotations["gpuwarden.io/quarantine"] = record.encode()
    return {"metadata": {"name": name, "annotations": annotations},
            "spec": {"taints": [TAINT] if taint else []},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}}  # fmt: skip


def pod(name: str, node_name: str, ids: str | None, **meta: Any) -> dict[str, Any]:
    ann = {"gpuwarden.io/gpu-ids": ids} if ids else {}
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}", "annotations": ann, **meta},
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def record(gpu: str | None, state: str = "quarantined") -> QuarantineRecord:
    ev = Evidence("xid-79", gpu=gpu, xid=79) if gpu else Evidence("gpu-missing")
    return QuarantineRecord(state, ev.reason, evidence=(ev,))  # type: ignore[arg-type]


def test_snapshot() -> None:
    drained = DrainState(started=100.0, scope="gpu").encode()
    nodes = [
        node("healthy"),
        node("gpu-fault", record=record("GPU-2"), taint=True, **{DRAIN_ANNOTATION: drained}),
        node("node-fault", record=record(None), taint=True, **{"gpuwarden.io/drain-pause": "true"}),
        node("released", record=record("GPU-1", "released"), **{DRAIN_ANNOTATION: drained}),
        node("garbled", taint=True, **{"gpuwarden.io/quarantine": "{not json"}),
    ]
    pods = [pod("a", "gpu-fault", "2"), pod("b", "gpu-fault", None), pod("c", "healthy", "0"),
            pod("m", "node-fault", "1", annotations={"kubernetes.io/config.mirror": "x"})]  # fmt: skip
    snap = build_snapshot(nodes, pods, resource="nvidia.com/gpu")
    by = {n.name: n for n in snap.nodes}
    assert set(by) == {"gpu-fault", "node-fault"}  # the garbled record is unknown: not drained
    assert by["gpu-fault"].fault_gpus == {"GPU-2"} and by["gpu-fault"].uuid_to_id["GPU-2"] == "2"
    assert by["gpu-fault"].started == 100.0 and not by["gpu-fault"].paused
    assert by["node-fault"].fault_gpus == frozenset() and by["node-fault"].paused
    assert snap.released == ("released",)
    assert [p.name for p in snap.pods_by_node["gpu-fault"]] == ["a", "b"]
    assert snap.pods_by_node["gpu-fault"][1].gpu_ids is None
    assert snap.pods_by_node["node-fault"][0].mirror
    assert "healthy" not in snap.pods_by_node  # pods of healthy nodes are not even parsed
    assert (snap.gpu_nodes, snap.schedulable_gpu_nodes) == (5, 2)
    assert any("garbled" in p for p in snap.problems)


def test_dra_backed_nodes_count_in_the_gates_floor() -> None:
    """A node whose GPUs DRA serves (no allocatable, a DeviceClass naming the resource) is a GPU node; our
    PreferNoSchedule marker of a device-scoped quarantine leaves it accepting pods, NoSchedule does not."""
    marker = {**TAINT, "effect": "PreferNoSchedule"}

    def dra(name: str, *taints: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name, "annotations": {}}, "spec": {"taints": list(taints)},
                "status": {"allocatable": {"cpu": "8"}}}  # fmt: skip

    nodes = [node("dp"), dra("dra-ok"), dra("dra-marker", marker), dra("dra-blocked", TAINT)]
    classes = {"nvidia.com/gpu": "gpu.example.com"}
    cases = [
        (classes, (4, 3)),
        ({"example.com/fpga": "fpga"}, (1, 1)),  # a class for another resource: not GPU nodes
        ({}, (1, 1)),  # no DeviceClass: nodes without GPUs
        (None, (1, 1)),  # not read this pass: only what the nodes themselves say
    ]
    for dra_classes, want in cases:
        snap = build_snapshot(nodes, [], resource="nvidia.com/gpu", dra_classes=dra_classes)
        assert (snap.gpu_nodes, snap.schedulable_gpu_nodes) == want, dra_classes


def test_drain_state_round_trip_and_garbage() -> None:
    from controller.drain.plan import PodHistory

    blocked = {"ns/a": "PodDisruptionBudget (429)"}
    history = {"ns/a": PodHistory(110.0, 120.0, 2)}
    state = DrainState(started=100.0, scope="node", pending=("ns/a",), blocked=blocked, history=history)
    back, why = decode(state.encode())
    assert why == "" and back == state
    assert decode(None) == (None, "")
    bad, why = decode('{"started": 3}')
    assert bad is None and "unreadable" in why
