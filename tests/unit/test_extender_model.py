"""The cluster model: parsing pods and nodes, incremental updates, and rebuilding views only when needed."""

from __future__ import annotations

from typing import Any

import pytest

from controller.gpus.model import Claim, ClusterModel, Holder, NodeView
from controller.gpus.objects import gpu_request, gpu_share_request, pod_info
from controller.gpus.topology import count_only
from gpuwarden.wellknown import parse_gpu_ids
from tests.unit.extender_support import RESOURCE, model, node, nrt, pod, quarantine_record, topology


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        (
            {
                "containers": [
                    {"resources": {"limits": {RESOURCE: "2"}}},
                    {"resources": {"requests": {RESOURCE: 1}}},
                ]
            },
            3,
        ),
        ({"containers": [{}], "initContainers": [{"resources": {"limits": {RESOURCE: "4"}}}]}, 4),
        (
            {
                "containers": [{"resources": {"limits": {RESOURCE: "1"}}}],
                "initContainers": [{"restartPolicy": "Always", "resources": {"limits": {RESOURCE: "1"}}}],
            },
            2,
        ),
        ({"containers": [{"resources": {"limits": {"cpu": "2"}}}]}, 0),
        ({}, 0),
    ],
    ids=["sum-of-containers", "init-peak", "sidecar-adds", "no-gpus", "empty-spec"],
)
def test_gpu_request(spec: dict[str, Any], gpus: int) -> None:
    assert gpu_request(spec, RESOURCE) == gpus


@pytest.mark.parametrize(
    ("spec", "shares"),
    [
        pytest.param({"containers": [{"resources": {"limits": {RESOURCE: "2"}}}]}, 2, id="whole-gpus"),
        pytest.param({"containers": [{"resources": {"limits": {RESOURCE + ".shared": "1"}}}]}, 1,
                     id="renamed-replica"),
        pytest.param({"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}},
                                     {"resources": {"requests": {"nvidia.com/mig-3g.40gb": 1}}}]}, 2,
                     id="mig-mixed-profiles-add-up"),
        pytest.param({"containers": [{}], "initContainers": [
            {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "3"}}}]}, 3, id="init-peak"),
        pytest.param({"containers": [{"resources": {"limits": {"nvidia.com/gpumem": "4000"}}}]}, 0,
                     id="not-a-gpu-resource"),
    ],
)  # fmt: skip
def test_gpu_share_request(spec: dict[str, Any], shares: int) -> None:
    assert gpu_share_request(spec, RESOURCE) == shares


def test_parse_gpu_ids() -> None:
    assert parse_gpu_ids("0, 1,,3,1") == ("0", "1", "3")
    assert parse_gpu_ids("") is None and parse_gpu_ids(None) is None and parse_gpu_ids(" , ") is None


def test_pod_info_reads_what_the_extender_needs() -> None:
    info = pod_info(
        pod("p", 4, node="n", ids="0,1,2,3", policy="prefer-numa", priority=-5, claim=("n", 12.5)), RESOURCE
    )
    assert (info.key, info.uid, info.gpus, info.priority, info.policy) == (
        "ml/p",
        "uid-p",
        4,
        -5,
        "prefer-numa",
    )
    assert (info.node_name, info.gpu_ids, info.claim_node, info.claimed_at) == (
        "n",
        ("0", "1", "2", "3"),
        "n",
        12.5,
    )
    assert info.holds_gpus and info.nodes() == {"n"}
    assert not pod_info(pod("q", 1, node="n", phase="Failed"), RESOURCE).holds_gpus


def test_view_accounts_bound_claimed_nominated_and_count_only_pods() -> None:
    m = model(
        [node("n")],
        [
            pod("a", 2, node="n", ids="0,1"),
            pod("b", 2, node="n"),  # bound by someone else: count-only
            pod("c", 2, ids="4,5", claim=("n", 10.0)),
            pod("d", 4, nominated="n", priority=7, policy="none"),
            pod("e", 1, node="other", ids="7"),
            pod("f", 0, node="n"),
        ],
    )
    view = m.view("n")
    assert view is not None
    assert view.used == frozenset({"0", "1"}) and view.used_unknown == 2
    assert [(c.pod, c.ids, c.claimed_at) for c in view.claims] == [("ml/c", ("4", "5"), 10.0)]
    assert [(n.pod, n.gpus, n.priority, n.policy) for n in view.nominated] == [("ml/d", 4, 7, "none")]


def test_pod_updates_move_gpus_between_nodes_and_deletes_free_them() -> None:
    m = model([node("n1"), node("n2")])
    m.upsert_pod(pod("a", 2, ids="0,1", claim=("n1", 1.0)))
    assert m.view("n1").claims and not m.view("n2").claims  # type: ignore[union-attr]
    m.upsert_pod(pod("a", 2, node="n2", ids="0,1"))
    assert m.view("n1").claims == () and m.view("n2").used == frozenset({"0", "1"})  # type: ignore[union-attr]
    m.upsert_pod(pod("a", 2, node="n2", ids="0,1", phase="Succeeded"))
    assert m.view("n2").used == frozenset()  # type: ignore[union-attr]
    m.upsert_pod(pod("b", 1, node="n2", ids="3"))
    m.delete_pod("ml/b")
    assert m.view("n2").used == frozenset() and m.pod("ml/b") is None  # type: ignore[union-attr]


def test_views_are_cached_until_something_on_the_node_changes() -> None:
    m = model([node("n1"), node("n2")])
    v1, v2 = m.view("n1"), m.view("n2")
    m.upsert_pod(pod("a", 1, node="n1", ids="0"))
    assert m.view("n2") is v2 and m.view("n1") is not v1
    again = m.view("n1")
    m.upsert_node(node("n1"))  # unchanged object: nothing to rebuild
    assert m.view("n1") is again
    m.set_error_trends({"n2": 3.0})
    assert m.view("n1") is again and m.view("n2").error_trend == 3.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "kept"),
    [
        (pod("a", 2, node="n1", ids="0,1", phase="Running", resource_version="101"), True),
        (pod("a", 2, node="n1", ids="0,1", phase="Pending", resource_version="102"), True),
        (pod("a", 2, node="n1", ids="0,1", priority=5, resource_version="103"), False),
        (pod("a", 2, node="n1", ids="0,2", resource_version="104"), False),
        (pod("b", 1, node="n1", ids="3"), False),
        (pod("c", 1, ids="5", claim=("n1", 1.0)), False),
        (pod("d", 1, nominated="n1"), False),
    ],
    ids=["status-only", "phase-back", "priority", "other-gpus", "new-holder", "new-claim", "new-nominee"],
)
def test_a_change_decisions_do_not_read_keeps_the_view_and_its_cached_answers(
    change: dict[str, Any], kept: bool
) -> None:
    m = model([node("n1")], [pod("a", 2, node="n1", ids="0,1", resource_version="100")])
    before = m.view("n1")
    assert before is not None
    before.memo["answer"] = "cached"
    m.upsert_pod(change)
    after = m.view("n1")
    assert after is not None
    assert (after is before) is kept and (after.memo.get("answer") == "cached") is kept


def test_a_write_that_changes_only_the_resource_version_tells_no_listener() -> None:
    m = model([node("n1")], [pod("a", 2, node="n1", ids="0,1", resource_version="100")])
    told: list[list[str]] = []
    m.add_change_listener(lambda names: told.append(sorted(names)))
    m.upsert_pod(pod("a", 2, node="n1", ids="0,1", phase="Running", resource_version="101"))
    assert told == [] and m.pod("ml/a").resource_version == "101"  # type: ignore[union-attr]
    m.upsert_pod(pod("a", 2, node="n1", ids="0,1", priority=5, resource_version="102"))
    assert told == [["n1"]]


def test_a_deleted_node_keeps_no_old_view() -> None:
    m = model([node("n1")], [pod("a", 2, node="n1", ids="0,1")])
    assert m.view("n1") is not None
    m.delete_node("n1")
    assert not m._stale  # not kept until someone asks for the node again (it may never come back)
    assert m.view("n1") is None
    m.upsert_node(node("n1"))
    assert m.view("n1") is not None


def test_quarantine_maps_uuids_to_gpu_ids() -> None:
    m = model([node("n", taint="xid-79", quarantine=quarantine_record("GPU-0002", "GPU-0005"))])
    view = m.view("n")
    assert (
        view is not None and view.quarantined == frozenset({"2", "5"}) and view.quarantine_reason == "xid-79"
    )


def test_nrt_overrides_annotation_and_can_be_removed() -> None:
    m = model([node("n", topo=topology(4, 2))])
    assert m.max_numa_gpus() == 2
    m.upsert_nrt(nrt("n", [4, 4]))
    assert m.view("n").topology.source == "nrt" and m.max_numa_gpus() == 4  # type: ignore[union-attr]
    m.delete_nrt("n")
    assert m.view("n").topology.source == "annotation" and m.max_numa_gpus() == 2  # type: ignore[union-attr]


def test_unreadable_nrt_is_reported_not_guessed() -> None:
    bad = nrt("n", [2, 2])
    bad["zones"][0]["name"] = "socket"
    m = model([node("n")], nrts=[bad])
    view = m.view("n")
    assert view is not None and not view.topology.known
    assert view.topology_error.startswith("NodeResourceTopology unreadable")


def test_fleet_max_numa_tracks_node_changes() -> None:
    m = ClusterModel(RESOURCE)
    assert m.max_numa_gpus() == 0 and not m.synced
    m.upsert_node(node("a", topo=topology(2, 4)))
    m.upsert_node(node("b", topo=topology(1, 8)))
    assert m.max_numa_gpus() == 8
    m.delete_node("b")
    assert m.max_numa_gpus() == 4 and m.view("b") is None
    m.upsert_node(node("a", topo=None))
    assert m.max_numa_gpus() == 0
    assert m.node_names() == ["a"]


@pytest.mark.parametrize(
    ("source", "expected"), [("auto", "nrt"), ("nrt", "nrt"), ("annotation", "annotation")]
)
def test_topology_source_setting(source: str, expected: str) -> None:
    m = ClusterModel(RESOURCE, topology_source=source)
    m.upsert_node(node("n"))
    m.upsert_nrt(nrt("n", [4, 4]))
    m.upsert_node(node("bare", topo=topology(2, 4)))
    assert m.view("n").topology.source == expected  # type: ignore[union-attr]
    assert m.view("bare").topology.source == ("count" if source == "nrt" else "annotation")  # type: ignore[union-attr]


def test_topology_source_is_validated() -> None:
    with pytest.raises(ValueError, match="topology_source"):
        ClusterModel(RESOURCE, topology_source="both")


@pytest.mark.parametrize(
    ("kw", "terminating"),
    [
        pytest.param({}, False, id="live"),
        pytest.param({"deleting": True}, True, id="deletion-timestamp"),
        pytest.param({"disrupted": "PreemptionByScheduler"}, True, id="preempted-disruption-target"),
    ],
)
def test_pod_info_reads_terminating(kw: dict[str, Any], terminating: bool) -> None:
    info = pod_info(pod("v", 2, node="n", ids="0,1", **kw), RESOURCE)
    assert info.terminating is terminating and info.holds_gpus
    view = model([node("n")], [pod("v", 2, node="n", ids="0,1", **kw)]).view("n")
    assert view is not None and [(h.pod, h.ids, h.terminating) for h in view.holders] == [
        ("ml/v", ("0", "1"), terminating)
    ]


def test_fresh_view_takes_recorded_sets_from_the_list_and_the_rest_from_the_cache() -> None:
    cached = [pod("gone", 2, node="n", ids="0,1"), pod("count-only", 1, node="n")]
    m = model([node("n")], cached)
    listed = [pod_info(pod("new", 2, node="n", ids="4,5"), RESOURCE)]
    view = m.fresh_view("n", listed)
    assert view is not None and view.used == frozenset({"4", "5"}) and view.used_unknown == 1
    assert m.fresh_view("unknown", listed) is None


@pytest.mark.parametrize(
    ("holders", "incoming", "yields", "preempting"),
    [
        ([], 100, False, False),
        ([Holder("ml/a", ("0",), 0, 10, False)], 11, True, False),
        ([Holder("ml/a", ("0",), 0, 10, False)], 10, False, False),
        ([Holder("ml/a", ("0",), 0, 10, False), Holder("ml/b", ("1",), 0, 5, False)], 6, True, False),
        ([Holder("ml/a", ("0",), 0, 10, True)], -1000, True, False),
        ([Holder("ml/a", ("0",), 0, 10, False, preempted=True)], 0, False, True),
    ],
    ids=["no-holders", "lower-priority", "equal-priority", "lowest-counts", "terminating", "preempted"],
)
def test_view_derives_what_preemption_could_free_once(
    holders: list[Holder], incoming: int, yields: bool, preempting: bool
) -> None:
    view = NodeView("n", 8, count_only(8), holders=tuple(holders))
    assert view.may_yield_to(incoming) is yields
    assert view.preempting is preempting
    assert view.with_claims([Claim("ml/c", ("2",), None)]).may_yield_to(incoming) is yields  # kept on copies
