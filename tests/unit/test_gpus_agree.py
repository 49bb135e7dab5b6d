"""Every capability asks the one GPU model and the one quarantine rule, so they agree.

Three rules were once restated and disagreed: a restartable sidecar's GPU (counted by the extender, not by
drain), which GPUs a NodeResourceTopology node has quarantined (the whole node for the extender, one GPU for
drain), and a quarantine record without our taint (quarantine for the node agent, nothing for the
controller). Each row asks the extender's model view, drain's snapshot and scope, make-room's fit on the
same view, and the node agent's device health, and expects the same answer from all of them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.drain.observe import build_snapshot
from controller.drain.plan import in_scope
from controller.gpus.fit import Settings, choose_gpus
from controller.gpus.objects import pod_info
from nodeagent.app import quarantined_devices
from tests.unit.extender_support import RESOURCE, model, node, nrt, pod, quarantine_record, topology

TOPO = topology(2, 4)
UUID_BY_ID = {gpu_id: str(attrs["uuid"]) for gpu_id, attrs in TOPO.items()}
IDS = list(TOPO)


def _sidecar_pod(name: str, ids: str, node_name: str) -> dict[str, Any]:
    """A pod whose only GPU is held by a restartable init container (a sidecar)."""
    obj = pod(name, 0, node=node_name, ids=ids)
    obj["spec"]["initContainers"] = [
        {"name": "gpu-sidecar", "restartPolicy": "Always", "resources": {"limits": {RESOURCE: "1"}}}
    ]
    return obj


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], set[str], set[str]]] = [
    # (id, node, pods, nrts, quarantined GPU ids, pods drain must move)
    (
        "sidecar-holds-the-failed-gpu",
        node("n1", topo=TOPO, taint="xid-79", quarantine=quarantine_record(UUID_BY_ID["2"])),
        [_sidecar_pod("sidecar", "2", "n1"), pod("bystander", 1, node="n1", ids="5")],
        [],
        {"2"},
        {"ml/sidecar"},
    ),
    (
        "nrt-topology-uuid-quarantine",
        node("n1", topo=TOPO, taint="xid-79", quarantine=quarantine_record(UUID_BY_ID["2"])),
        [pod("on-failed", 1, node="n1", ids="2"), pod("elsewhere", 1, node="n1", ids="6")],
        [nrt("n1", [4, 4])],
        {"2"},
        {"ml/on-failed"},
    ),
    (
        "record-without-taint",
        node("n1", topo=TOPO, quarantine=quarantine_record(UUID_BY_ID["2"])),
        [pod("on-gpu-2", 1, node="n1", ids="2")],
        [],
        set(),
        set(),
    ),
    (
        "node-level-evidence",
        node("n1", topo=TOPO, taint="gpu-missing", quarantine=quarantine_record("", reason="gpu-missing")),
        [pod("a", 1, node="n1", ids="0"), pod("b", 1, node="n1", ids="7")],
        [],
        set(IDS),
        {"ml/a", "ml/b"},
    ),
]


@pytest.mark.parametrize(
    ("node_obj", "pods", "nrts", "quarantined", "moved"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_extender_drain_makeroom_and_node_agent_agree(
    node_obj: dict[str, Any],
    pods: list[dict[str, Any]],
    nrts: list[dict[str, Any]],
    quarantined: set[str],
    moved: set[str],
) -> None:
    # the extender's model (make-room and nominations read the same views)
    view = model([node_obj], pods, nrts).view("n1")
    assert view is not None
    assert set(view.quarantined) == quarantined
    if nrts:
        assert view.topology.source != "annotation"  # the NRT object is the topology source here
    held = {gpu for p in pods for gpu in (pod_info(p, RESOURCE).gpu_ids or ())}
    assert held <= set(view.used)  # every holder's GPUs count as used, sidecars included
    # make-room / bind: a new 1-GPU pod is never given a quarantined GPU
    choice = choose_gpus(pod_info(pod("new", 1), RESOURCE), view, Settings(), 0.0).choice
    if choice is not None:
        assert not set(choice.ids) & quarantined
    # drain: the same GPUs, the same holders
    snapshot = build_snapshot([node_obj], pods, resource=RESOURCE)
    if quarantined:
        (drain_node,) = snapshot.nodes
        _, scoped = in_scope(drain_node, snapshot.pods_by_node.get("n1", ()))
        assert {p.key for p in scoped} == moved
    else:
        assert snapshot.nodes == ()
    # the node agent's device plugin: the same GPUs Unhealthy
    assert quarantined_devices(node_obj, IDS, UUID_BY_ID) == quarantined


def test_the_record_format_is_the_one_the_node_agent_reads() -> None:
    """The node agent decodes the record the health controller writes (not a field of its own)."""
    record = quarantine_record(UUID_BY_ID["1"], UUID_BY_ID["3"])
    del record["gpus"]  # the rule reads the evidence, not the summary list
    n = node("n1", topo=TOPO, taint="xid-79", annotations={"x": json.dumps({})}, quarantine=record)
    assert quarantined_devices(n, IDS, UUID_BY_ID) == {"1", "3"}
