"""Tables for the controller's GPU preemption plan (controller/makeroom/plan.py): which pending pods are
preemptors, which nodes they may use, PodDisruptionBudgets as kube-scheduler reads them, and the plan
across nodes and preemptors of one pass."""

from __future__ import annotations

from typing import Any

import pytest

from controller.gpus.fit import Settings
from controller.gpus.objects import pod_info
from controller.makeroom.plan import (
    NodeFacts,
    Pending,
    budgets_from,
    candidate,
    node_facts,
    plan_room,
    usable,
)
from tests.unit.extender_support import RESOURCE, model, node, pod

NOW = 1_700_000_000.0
S = Settings(fleet_max_numa_gpus=4)
FRAG = "0/3 nodes are available: 1 fragmented: 4 free, largest NUMA node has 2 (...)"


def unschedulable(
    obj: dict[str, Any], message: str = FRAG, since: str = "2023-11-14T22:00:00Z"
) -> dict[str, Any]:
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
         "lastTransitionTime": since}
    ]  # fmt: skip
    return obj


def _candidate(obj: dict[str, Any], **kw: Any) -> Pending | str:
    return candidate(obj, pod_info(obj, RESOURCE), NOW, kw.get("min_pending", 5.0), 60.0, kw.get("ns", ()))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(unschedulable(pod("x", 4, priority=100)), None, id="fragmented-preemptor"),
        pytest.param(pod("x", 4), "not unschedulable", id="never-tried"),
        pytest.param(unschedulable(pod("x", 0)), "not a pending GPU pod", id="no-gpus"),
        pytest.param(unschedulable(pod("x", 4, node="n")), "not a pending GPU pod", id="bound"),
        pytest.param(unschedulable(pod("x", 4, deleting=True)), "not a pending GPU pod", id="deleting"),
        pytest.param(
            unschedulable(pod("x", 4, nominated="n")),
            "nominated to n by the scheduler's preemption",
            id="nominated",
        ),
        pytest.param(
            unschedulable(pod("x", 4), message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
            "idle-only",
            id="short-by-count-idle-reclaim-only",
        ),
        pytest.param(
            unschedulable(pod("x", 4), message="0/3 nodes are available: 3 Insufficient cpu."),
            "no fragmented node in the scheduler's verdict",
            id="short-of-something-else",
        ),
        pytest.param(
            unschedulable(pod("x", 4), since="2023-11-14T22:13:18Z"),
            "unschedulable for less than min_pending_seconds",
            id="too-fresh",
        ),
        pytest.param(
            unschedulable(pod("x", 4, namespace="other")), "namespace not managed", id="namespace-not-managed"
        ),
    ],
)
def test_candidate(obj: dict[str, Any], expected: str | None) -> None:
    got = _candidate(obj, ns=("ml",))
    if expected is None or expected == "idle-only":
        assert isinstance(got, Pending) and got.pod.key == "ml/x"
        assert got.idle_only == (expected == "idle-only")
    else:
        assert got == expected


def test_a_fresh_reservation_is_not_planned_again_and_an_expired_one_is() -> None:
    obj = unschedulable(pod("x", 4, claim=("n", NOW - 100)))
    obj["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] = "0,1,2,3"
    obj["metadata"]["annotations"]["gpuwarden.io/gpu-reserved-until"] = f"{NOW + 10:.3f}"
    assert _candidate(obj) == f"room reserved on n until {NOW + 10:.0f}"
    obj["metadata"]["annotations"]["gpuwarden.io/gpu-reserved-until"] = f"{NOW - 1:.3f}"
    assert isinstance(_candidate(obj), Pending)


TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("spec", "facts", "ok"),
    [
        pytest.param({}, NodeFacts(), True, id="plain"),
        pytest.param({}, NodeFacts(unschedulable=True), False, id="cordoned"),
        pytest.param({}, NodeFacts(taints=(("dedicated", "ml", "NoSchedule"),)), False, id="taint"),
        pytest.param({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}]},
                     NodeFacts(taints=(("dedicated", "ml", "NoSchedule"),)), True, id="tolerated"),
        pytest.param({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "other"}]},
                     NodeFacts(taints=(("dedicated", "ml", "NoSchedule"),)), False, id="wrong-value"),
        pytest.param({"tolerations": [{"operator": "Exists"}]},
                     NodeFacts(taints=(("dedicated", "ml", "NoExecute"),), unschedulable=True), True,
                     id="tolerate-everything"),
        pytest.param({"nodeSelector": {"pool": "a"}}, NodeFacts(labels={"pool": "a"}), True, id="selector"),
        pytest.param({"nodeSelector": {"pool": "a"}}, NodeFacts(labels={"pool": "b"}), False,
                     id="selector-miss"),
    ],
)  # fmt: skip
def test_usable(spec: dict[str, Any], facts: NodeFacts, ok: bool) -> None:
    assert usable(spec, facts) is ok


def test_node_facts_keeps_only_hard_taints() -> None:
    n = node("n", taint="xid-79")
    n["spec"]["taints"].append({"key": "soft", "effect": "PreferNoSchedule"})
    n["spec"]["unschedulable"] = True
    facts = node_facts(n)
    assert facts.taints == (("gpuwarden.io/gpu-unhealthy", "xid-79", "NoSchedule"),) and facts.unschedulable


def _pdb(name: str, selector: dict[str, Any] | None, allowed: int | None) -> dict[str, Any]:
    pdb: dict[str, Any] = {"metadata": {"name": name, "namespace": "ml"}, "spec": {}}
    if selector is not None:
        pdb["spec"]["selector"] = selector
    if allowed is not None:
        pdb["status"] = {"disruptionsAllowed": allowed}
    return pdb


def test_budgets_from_pdbs_as_the_scheduler_reads_them() -> None:
    pods = [pod("a"), pod("b"), pod("c", namespace="other")]
    pdbs = [
        _pdb("by-label", {"matchLabels": {"app": "a"}}, 0),
        _pdb("all", {}, 1),
        _pdb("none", None, 5),
        _pdb("expr", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["b"]}]}, None),
        _pdb("notin", {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["b"]}]}, 2),
    ]
    budgets = budgets_from(pdbs, pods)
    assert budgets.covering == {"ml/a": ("ml/by-label", "ml/all", "ml/notin"), "ml/b": ("ml/all", "ml/expr")}
    assert budgets.allowed["ml/expr"] == 0  # no status yet: no disruption allowed
    holders = {h.pod: h for h in model([node("n")], [pod(n, 1, node="n", ids=str(i)) for i, n in
                                                      enumerate("ab")]).view("n").holders}  # type: ignore[union-attr]  # fmt: skip
    assert budgets.violations([holders["ml/a"]]) == 1
    assert budgets.violations([holders["ml/b"]]) == 1
    assert budgets.violations([holders["ml/a"], holders["ml/b"]]) == 2


def _pending(name: str, gpus: int = 4, priority: int = 100, since: float = 0.0, **spec: Any) -> Pending:
    obj = pod(name, gpus, priority=priority)
    obj["spec"].update(spec)
    return Pending(pod_info(obj, RESOURCE), obj["spec"], since)


def _fleet(*nodes: str, low: int = 10) -> tuple[dict[str, Any], dict[str, NodeFacts]]:
    pods = []
    for n in nodes:
        pods += [
            pod(f"{n}-a", 2, node=n, ids="0,1", priority=low),
            pod(f"{n}-b", 2, node=n, ids="4,5", priority=low),
        ]
    m = model([node(n) for n in nodes], pods)
    return {n: m.view(n) for n in nodes}, {n: NodeFacts() for n in nodes}


def test_highest_priority_first_one_preemptor_per_node_victims_never_shared() -> None:
    views, facts = _fleet("n1", "n2")
    decisions = plan_room(
        [_pending("early", priority=100, since=1.0), _pending("vip", priority=500, since=9.0),
         _pending("late", priority=100, since=5.0)],
        views, facts, S, NOW,
    )  # fmt: skip
    got = [(d.pod.key, d.plan.node if d.plan else d.reason) for d in decisions]
    assert got == [
        ("ml/vip", "n1"),
        ("ml/early", "n2"),
        ("ml/late", "every node that could host it is taken this pass"),
    ]
    victims = [v.pod for d in decisions if d.plan for v in d.plan.victims]
    assert len(victims) == len(set(victims)) == 2


def test_limit_and_node_filters_apply() -> None:
    views, facts = _fleet("n1", "n2")
    facts["n1"] = NodeFacts(unschedulable=True)
    decisions = plan_room([_pending("a", since=1.0), _pending("b", since=2.0)], views, facts, S, NOW, limit=1)
    assert [(d.pod.key, d.plan.node if d.plan else d.reason) for d in decisions] == [
        ("ml/a", "n2"),
        ("ml/b", "limit of 1 preemptors per pass reached"),
    ]


def test_no_room_reason_names_the_commonest_obstacle() -> None:
    views, facts = _fleet("n1", "n2", low=1000)
    (decision,) = plan_room([_pending("x", priority=100)], views, facts, S, NOW)
    assert decision.plan is None and decision.reason == "no node with lower-priority GPU pods it could use"
    views, facts = _fleet("n1", "n2")
    (decision,) = plan_room([_pending("x", priority=100)], views, facts, S, NOW, max_victims=1, limit=5)
    assert decision.plan is not None  # one victim suffices
    (decision,) = plan_room([_pending("x", 8, priority=100)], views, facts, S, NOW, max_victims=1)
    assert decision.reason == "no node can make room (2 node(s): more than 1 victims would be needed)"


def test_a_pod_that_fits_somewhere_already_is_left_to_the_scheduler() -> None:
    views, facts = _fleet("n1")
    (decision,) = plan_room([_pending("x", 2, priority=100)], views, facts, S, NOW)
    assert decision.plan is None and decision.reason == "fits on n1 now: left to the scheduler"


def test_gpuwarden_plan_table_lists_preemptors() -> None:
    from controller.app import ControllerPlan

    room = {"preemptions": [
        {"pod": "ml/p", "priority": 1000, "node": "n", "victims": ["ml/a"], "gpus": ["0", "1", "2", "3"],
         "reason": "", "throttled": ""},
        {"pod": "ml/q", "priority": 10, "node": None, "victims": [], "gpus": [], "reason": "no room"},
    ]}  # fmt: skip
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, {}, room).render_table()
    assert (
        "GPU PREEMPTION\n  ml/p (priority 1000) on n: evict ml/a -> GPUs 0,1,2,3\n"
        "  ml/q (priority 10): no room" in table
    )
    empty = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}).render_table()
    assert empty.endswith("GPU PREEMPTION: no pending pod rejected as fragmented")


def _idle(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["annotations"].update(
        {"gpuwarden.io/idle-since": "2023-11-14T20:00:00Z", "gpuwarden.io/idle-reclaimable": "true"}
    )
    return obj


def _full_node(name: str, *, idle_priority: int | None, busy_priority: int = 100) -> list[dict[str, Any]]:
    """Node `name` full by count: a busy pod on NUMA0 and another pod on NUMA1, idle-reclaimable when
    `idle_priority` is given."""
    busy = pod(f"{name}-busy", 4, node=name, ids="0,1,2,3", priority=busy_priority)
    other = pod(f"{name}-other", 4, node=name, ids="4,5,6,7", priority=idle_priority or busy_priority)
    return [busy, _idle(other) if idle_priority is not None else other]


@pytest.mark.parametrize(
    ("pods", "idle_only", "expected"),
    [
        pytest.param(_full_node("n", idle_priority=100), True, ("n", ("ml/n-other",)),
                     id="short-by-count-reclaims-the-equal-priority-idle-pod"),
        pytest.param(_full_node("n", idle_priority=None, busy_priority=10), True, None,
                     id="short-by-count-never-takes-busy-pods-the-scheduler-preempts-those"),
        pytest.param(_full_node("n", idle_priority=500), True, None, id="idle-pod-of-higher-priority-stays"),
        pytest.param(_full_node("n", idle_priority=10, busy_priority=10), False, ("n", ("ml/n-other",)),
                     id="fragmented-preemptor-takes-the-idle-pod-first"),
    ],
)  # fmt: skip
def test_idle_reclaim(pods: list[dict[str, Any]], idle_only: bool, expected: Any) -> None:
    m = model([node("n")], pods)
    pending = _pending("x", 4, priority=100)
    pending = Pending(pending.pod, pending.spec, pending.since, idle_only)
    decisions = plan_room([pending], {"n": m.view("n")}, {"n": NodeFacts()}, S, NOW)
    if expected is None:
        assert decisions == [], "no idle pod in reach: no decision, no Event - the scheduler's pod"
    else:
        (decision,) = decisions
        assert decision.plan is not None
        assert (decision.plan.node, tuple(v.pod for v in decision.plan.victims)) == expected
