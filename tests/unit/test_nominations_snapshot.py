"""Reading pods and nodes into the nomination snapshot, and our `gpuwarden.io/nomination` record (golden)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.gpus.model import ClusterModel
from controller.nominations.snapshot import (
    NodeState,
    NominationRecord,
    Victim,
    build_snapshot,
    node_state,
    pending_pod,
)
from controller.preemption.signals import parse_time
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION
from tests.unit.extender_support import node as gpu_node

GOLDEN = Path(__file__).parent / "golden" / "nominations"
NOW = 1_700_000_000.0


def test_record_golden_round_trip() -> None:
    text = (GOLDEN / "record_annotation.txt").read_text().strip()
    record = NominationRecord("gpu-node-3", NOW)
    assert record.encode() == text
    assert NominationRecord.decode(text) == record


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"node": "", "since": "2023-11-14T22:13:20Z"}',
        '{"node": "n1"}',
        '{"node": "n1", "since": "yesterday"}',
        '{"node": 3, "since": "2023-11-14T22:13:20Z"}',
    ],
)
def test_unreadable_records_are_ignored(text: Any) -> None:
    assert NominationRecord.decode(text) is None


def k8s_node(
    name: str = "n1",
    *,
    ready: str | None = "True",
    since: str = "2023-11-14T22:12:20Z",
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready, "lastTransitionTime": since}] if ready else []
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {"conditions": conditions}}  # fmt: skip


def taint(effect: str, key: str = "gpuwarden.io/gpu-unhealthy", value: str = "xid-79") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


@pytest.mark.parametrize(
    ("obj", "expect"),
    [
        pytest.param(k8s_node(), NodeState("n1", True, NOW - 60), id="ready"),
        pytest.param(k8s_node(ready="False"), NodeState("n1", False, NOW - 60), id="not-ready"),
        pytest.param(k8s_node(ready="Unknown"), NodeState("n1", False, NOW - 60), id="unknown-is-not-ready"),
        pytest.param(k8s_node(ready=None), NodeState("n1", None, None), id="no-ready-condition"),
        pytest.param(
            k8s_node(unschedulable=True), NodeState("n1", True, NOW - 60, cordoned=True), id="cordoned"
        ),
        pytest.param(
            k8s_node(taints=[taint("NoSchedule")]),
            NodeState("n1", True, NOW - 60, quarantine="xid-79"),
            id="our-taint",
        ),
        pytest.param(
            k8s_node(taints=[taint("NoExecute", value="")]),
            NodeState("n1", True, NOW - 60, quarantine="quarantined"),
            id="our-taint-no-value",
        ),
        pytest.param(
            k8s_node(taints=[taint("PreferNoSchedule")]),
            NodeState("n1", True, NOW - 60),
            id="prefer-is-left-to-the-model",
        ),
        pytest.param(
            k8s_node(taints=[taint("NoSchedule", key="other.io/x")]),
            NodeState("n1", True, NOW - 60),
            id="someone-elses-taint",
        ),
    ],
)
def test_node_state(obj: dict[str, Any], expect: NodeState) -> None:
    assert node_state(obj) == expect


def k8s_pod(
    name: str,
    *,
    node: str = "",
    nominated: str = "",
    record: str | None = None,
    phase: str = "Pending",
    deleting: bool = False,
    gpus: int = 1,
    owned: bool = True,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": {}}
    if record is not None:
        meta["annotations"][NOMINATION_ANNOTATION] = record
    if deleting:
        meta["deletionTimestamp"] = "2023-11-14T22:13:00Z"
    if owned:
        meta["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "j", "controller": True}]
    return {
        "metadata": meta,
        "spec": {"nodeName": node or None, "priority": 500,
                 "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "nominatedNodeName": nominated or None},
    }  # fmt: skip


RECORD = NominationRecord("n1", NOW - 30).encode()


@pytest.mark.parametrize(
    ("obj", "node", "record"),
    [
        pytest.param(k8s_pod("p", nominated="n1"), "n1", None, id="nominated"),
        pytest.param(
            k8s_pod("p", nominated="n1", record=RECORD),
            "n1",
            NominationRecord("n1", NOW - 30),
            id="nominated-with-record",
        ),
        pytest.param(k8s_pod("p", record=RECORD), "", NominationRecord("n1", NOW - 30), id="record-only"),
        pytest.param(k8s_pod("p", nominated="n1", record="garbage"), "n1", None, id="garbage-record"),
    ],
)
def test_pending_pods(obj: dict[str, Any], node: str, record: NominationRecord | None) -> None:
    pod = pending_pod(obj, "nvidia.com/gpu")
    assert pod is not None and (pod.node, pod.record, pod.priority, pod.owned) == (node, record, 500, True)
    assert pod.key == "ml/p" and pod.uid == "uid-p"
    assert (pod.gpu is not None) == bool(node)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(k8s_pod("p"), id="not-nominated"),
        pytest.param(k8s_pod("p", node="n1", nominated="n1"), id="bound"),
        pytest.param(k8s_pod("p", nominated="n1", deleting=True), id="being-deleted"),
        pytest.param(k8s_pod("p", nominated="n1", phase="Failed"), id="finished"),
    ],
)
def test_pods_that_are_not_pending_nominations(obj: dict[str, Any]) -> None:
    assert pending_pod(obj, "nvidia.com/gpu") is None


def test_build_snapshot_from_api_objects() -> None:
    victim = json.loads((GOLDEN / "pod_victim_terminating.json").read_text())
    victim_node = victim["spec"]["nodeName"]
    pods = [
        victim,
        k8s_pod("running", node=victim_node),
        k8s_pod("p", nominated=victim_node),
        k8s_pod("q", nominated="n2", record=NominationRecord("n2", NOW - 99).encode()),
        k8s_pod("r", nominated="n2"),
    ]
    model = ClusterModel("nvidia.com/gpu")
    model.upsert_node(gpu_node("n2", 8))
    remembered = {"uid-q": NominationRecord("n2", NOW - 5), "uid-r": NominationRecord("n2", NOW - 7)}
    snapshot = build_snapshot(pods, [k8s_node(victim_node), k8s_node("n2")], view_of=model.view,
                              remembered=remembered)  # fmt: skip
    assert [p.name for p in snapshot.pods] == ["p", "q", "r"]
    assert snapshot.terminating == {victim_node: (Victim(f"{victim['metadata']['namespace']}/low-a", 100),)}
    by_name = {p.name: p for p in snapshot.pods}
    assert by_name["q"].record == NominationRecord("n2", NOW - 99), "the annotation wins over memory"
    assert by_name["r"].record == NominationRecord("n2", NOW - 7), "memory stands in for an unwritten record"
    assert snapshot.views is not None and set(snapshot.views) == {"n2"}, (
        "only nominated nodes the model knows"
    )
    assert set(snapshot.nodes) == {victim_node, "n2"}
    assert parse_time("2023-11-14T22:13:20Z") == NOW
