"""Table-driven tests of `plan_nominations`: one row per scenario — snapshot in, action and reason per
pod out. The terminating-victim guard has rows against every stale reason."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel, NodeView
from controller.gpus.objects import pod_info
from controller.nominations.decide import plan_nominations
from controller.nominations.plan import NominationPlan, NominationPolicy, policy_from_config
from controller.nominations.snapshot import (
    NodeState,
    NominationRecord,
    NominationSnapshot,
    PendingPod,
    Victim,
)
from gpuwarden.config.nominations import NominationsConfig
from tests.unit.extender_support import node as gpu_node
from tests.unit.extender_support import quarantine_record

NOW = 1_700_000_000.0


def pending(
    name: str = "p",
    node: str = "n1",
    *,
    age: float | None = 10.0,
    record_node: str | None = None,
    priority: int = 1000,
    owned: bool = True,
    gpus: int = 0,
    policy: str | None = None,
    namespace: str = "ml",
) -> PendingPod:
    record = None if age is None else NominationRecord(record_node or node, NOW - age)
    spec: dict[str, Any] = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    annotations = {"gpuwarden.io/topology-policy": policy} if policy else {}
    obj = {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec,
           "status": {"nominatedNodeName": node}}  # fmt: skip
    return PendingPod(
        namespace, name, f"uid-{name}", node, priority, record, owned, pod_info(obj, "nvidia.com/gpu")
    )


def state(name: str = "n1", **kw: Any) -> NodeState:
    return NodeState(name, **kw)


def view(name: str = "n1", **kw: Any) -> NodeView:
    model = ClusterModel("nvidia.com/gpu")
    model.upsert_node(gpu_node(name, 8, **kw))
    found = model.view(name)
    assert found is not None
    return found


QUARANTINED_ALL = {"taint": "xid-79", "quarantine": quarantine_record("")}


@dataclass
class Row:
    id: str
    pods: list[PendingPod]
    expect: dict[str, str]  # pod name -> "clear:<reason>" | "hold:<reason>" | "evict" | "forget"
    nodes: list[NodeState] = field(default_factory=lambda: [state()])
    terminating: dict[str, tuple[Victim, ...]] = field(default_factory=dict)
    views: dict[str, NodeView] | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    stamps: int = 0


VICTIM = {"n1": (Victim("ml/low", 100),)}
EXPIRED = 301.0

ROWS = [
    Row("fresh-nomination-is-held", [pending()], {"p": "hold:fresh"}),
    Row("first-sight-is-stamped-and-held", [pending(age=None)], {"p": "hold:fresh"}, stamps=1),
    Row(
        "record-for-another-node-restarts-the-clock",
        [pending(age=EXPIRED, record_node="n2")],
        {"p": "hold:fresh"},
        stamps=1,
    ),
    Row("node-gone", [pending()], {"p": "clear:node-gone"}, nodes=[]),
    Row(
        "node-not-ready-past-grace",
        [pending()],
        {"p": "clear:node-not-ready"},
        nodes=[state(ready=False, ready_since=NOW - 61)],
    ),
    Row(
        "node-not-ready-within-grace",
        [pending()],
        {"p": "hold:not-ready-grace"},
        nodes=[state(ready=False, ready_since=NOW - 59)],
    ),
    Row(
        "node-not-ready-since-unknown-is-not-stale",
        [pending()],
        {"p": "hold:not-ready-grace"},
        nodes=[state(ready=False, ready_since=None)],
    ),
    Row("node-readiness-unknown-is-not-stale", [pending()], {"p": "hold:fresh"}, nodes=[state(ready=None)]),
    Row("cordoned", [pending()], {"p": "clear:node-cordoned"}, nodes=[state(cordoned=True)]),
    Row(
        "cordoned-beats-not-ready-grace",
        [pending()],
        {"p": "clear:node-cordoned"},
        nodes=[state(ready=False, ready_since=NOW - 5, cordoned=True)],
    ),
    Row(
        "quarantined-by-us", [pending()], {"p": "clear:node-quarantined"}, nodes=[state(quarantine="xid-79")]
    ),
    Row(
        "never-fits-topology",
        [pending(gpus=8, policy="single-numa")],
        {"p": "clear:never-fits"},
        views={"n1": view()},
    ),
    Row(
        "fits-the-topology",
        [pending(gpus=4, policy="single-numa")],
        {"p": "hold:fresh"},
        views={"n1": view()},
    ),
    Row(
        "never-fits-quarantined-gpus-prefer-no-schedule",
        [pending(gpus=1)],
        {"p": "clear:never-fits"},
        views={"n1": view(**QUARANTINED_ALL)},
    ),
    Row(
        "node-unknown-to-the-model-is-unknown-not-stale",
        [pending(gpus=8, policy="single-numa")],
        {"p": "hold:fresh"},
        views={},
    ),
    Row("no-model-no-never-fits-rule", [pending(gpus=8, policy="single-numa")], {"p": "hold:fresh"}),
    Row("ttl-expired", [pending(age=EXPIRED)], {"p": "clear:ttl-expired"}),
    Row("ttl-not-yet", [pending(age=299)], {"p": "hold:fresh"}),
    Row(
        "guard-holds-a-cordoned-node",
        [pending()],
        {"p": "hold:victim-terminating"},
        nodes=[state(cordoned=True)],
        terminating=VICTIM,
    ),
    Row(
        "guard-holds-past-the-ttl",
        [pending(age=EXPIRED)],
        {"p": "hold:victim-terminating"},
        terminating=VICTIM,
    ),
    Row(
        "guard-holds-a-quarantined-node",
        [pending()],
        {"p": "hold:victim-terminating"},
        nodes=[state(quarantine="xid-79")],
        terminating=VICTIM,
    ),
    Row(
        "guard-holds-even-when-the-node-is-gone",
        [pending()],
        {"p": "hold:victim-terminating"},
        nodes=[],
        terminating=VICTIM,
    ),
    Row(
        "guard-holds-never-fits",
        [pending(gpus=8, policy="single-numa")],
        {"p": "hold:victim-terminating"},
        views={"n1": view()},
        terminating=VICTIM,
    ),
    Row(
        "guard-ignores-pods-of-equal-or-higher-priority",
        [pending(age=EXPIRED)],
        {"p": "clear:ttl-expired"},
        terminating={"n1": (Victim("ml/peer", 1000), Victim("ml/boss", 5000))},
    ),
    Row(
        "guard-of-another-node-does-not-apply",
        [pending(age=EXPIRED)],
        {"p": "clear:ttl-expired"},
        nodes=[state(), state("n2")],
        terminating={"n2": (Victim("ml/low", 100),)},
    ),
    Row("escalation-is-off-by-default", [pending(age=4000)], {"p": "clear:ttl-expired"}),
    Row("escalation-evicts-an-owned-pod", [pending(age=3600)], {"p": "evict"}, policy={"escalate": True}),
    Row(
        "escalation-before-its-ttl-only-clears",
        [pending(age=3599)],
        {"p": "clear:ttl-expired"},
        policy={"escalate": True},
    ),
    Row(
        "escalation-never-evicts-a-bare-pod",
        [pending(age=4000, owned=False)],
        {"p": "clear:ttl-expired"},
        policy={"escalate": True},
    ),
    Row(
        "escalation-respects-the-guard",
        [pending(age=4000)],
        {"p": "hold:victim-terminating"},
        policy={"escalate": True},
        terminating=VICTIM,
    ),
    Row(
        "namespace-not-managed",
        [pending(namespace="other")],
        {"p": "hold:namespace-not-managed"},
        nodes=[state(cordoned=True)],
        policy={"namespaces": frozenset({"ml"})},
    ),
    Row(
        "managed-namespace",
        [pending()],
        {"p": "clear:node-cordoned"},
        nodes=[state(cordoned=True)],
        policy={"namespaces": frozenset({"ml"})},
    ),
    Row(
        "record-left-on-an-unnominated-pod-is-forgotten",
        [pending(node="", record_node="n1")],
        {"p": "forget"},
    ),
    Row(
        "each-pod-judged-on-its-own",
        [pending("a", age=EXPIRED), pending("b", "n2"), pending("c", "gone")],
        {"a": "hold:victim-terminating", "b": "clear:node-cordoned", "c": "clear:node-gone"},
        nodes=[state(), state("n2", cordoned=True)],
        terminating=VICTIM,
    ),
]


def outcome(plan: NominationPlan) -> dict[str, str]:
    out = {c.pod.name: f"clear:{c.reason.value}" for c in plan.clears}
    out |= {h.pod.name: f"hold:{h.reason.value}" for h in plan.holds}
    out |= {e.pod.name: "evict" for e in plan.evictions}
    out |= {f.pod.name: "forget" for f in plan.forgets}
    return out


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_plan_nominations(row: Row) -> None:
    snapshot = NominationSnapshot(
        pods=tuple(row.pods),
        nodes={n.name: n for n in row.nodes},
        terminating=row.terminating,
        views=row.views,
        fit_settings=Settings() if row.views is not None else None,
    )
    plan = plan_nominations(snapshot, replace(NominationPolicy(), **row.policy), NOW)
    assert outcome(plan) == row.expect
    assert len(plan.stamps) == row.stamps
    for clear in plan.clears:
        assert clear.message, "every clear says why (it becomes the Event note)"


def test_messages_name_the_cause() -> None:
    nodes = {"n1": state(cordoned=True), "n2": state("n2", ready=False, ready_since=NOW - 120)}
    pods = (pending("a"), pending("b", "n2"), pending("c", "n3"), pending("d", gpus=8, policy="single-numa"))
    snapshot = NominationSnapshot(
        pods, {**nodes, "n3": state("n3")}, terminating={"n3": (Victim("ml/low", 1),)}
    )
    plan = plan_nominations(snapshot, NominationPolicy(), NOW)
    messages = {c.pod.name: c.message for c in plan.clears} | {h.pod.name: h.message for h in plan.holds}
    assert messages["a"] == "node n1 is cordoned"
    assert messages["b"] == "node n2 NotReady for longer than the 60s grace"
    assert messages["c"] == "1 preemption victim(s) still terminating on n3 (ml/low)"
    never = plan_nominations(
        replace(snapshot, pods=(pending("d", gpus=8, policy="single-numa"),), views={"n1": view()},
                nodes={"n1": state()}, fit_settings=Settings()), NominationPolicy(), NOW,
    )  # fmt: skip
    assert "at most 4 healthy GPUs per NUMA node" in never.clears[0].message


def test_stamp_keeps_the_new_node_and_now() -> None:
    plan = plan_nominations(
        NominationSnapshot((pending(age=None),), {"n1": state()}), NominationPolicy(), NOW
    )
    assert plan.stamps[0].record == NominationRecord("n1", NOW)
    assert plan.counts == {"fresh": 1} and plan.oldest_age() == 0.0


def test_plan_summary_is_plain_json() -> None:
    snapshot = NominationSnapshot((pending("a", age=EXPIRED), pending("b")), {"n1": state()})
    doc = plan_nominations(snapshot, NominationPolicy(dry_run=True), NOW).to_json()
    assert json.loads(json.dumps(doc)) == {
        "now": "2023-11-14T22:13:20Z", "dry_run": True, "counts": {"fresh": 1, "ttl-expired": 1},
        "clear": [{"pod": "ml/a", "node": "n1", "reason": "ttl-expired",
                   "message": "nominated to n1 for longer than the 300s ttl with no victim terminating"}],
        "evict": [], "hold": [],
    }  # fmt: skip


def test_policy_from_config() -> None:
    cfg = NominationsConfig.model_validate(
        {
            "ttl_seconds": 120,
            "namespaces": ["ml"],
            "escalation": {"enabled": True, "evict_after_seconds": 900},
        }
    )
    assert policy_from_config(cfg) == NominationPolicy(120, 60, frozenset({"ml"}), True, 900, False)
    assert policy_from_config(cfg, dry_run=True).dry_run
