"""Scenario table for the topology-aware victim choice (controller/gpus/victims.py) and the filter's
honest answer for fragmented nodes.

Node "n" is 2 NUMA x 4 GPUs: ids 0-3 on NUMA0 (PCIe switches pci0-0: 0,1 and pci0-1: 2,3), 4-7 on NUMA1.
The preemptor is "x" (priority 100, 4 GPUs, single-numa) unless a row says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.gpus.fit import Settings, filter_nodes
from controller.gpus.objects import pod_info
from controller.gpus.victims import (
    EXPLAIN_BUDGET,
    Budgets,
    NoPlan,
    VictimPlan,
    better,
    explain_room,
    plan_victims,
    revise_candidates,
)
from tests.unit.extender_support import RESOURCE, model, node, pod, quarantine_record

NOW = 1_700_000_000.0
S = Settings(fleet_max_numa_gpus=4)


def _x(**kw: Any) -> dict[str, Any]:
    return pod("x", kw.pop("gpus", 4), priority=kw.pop("priority", 100), **kw)


@dataclass
class Case:
    id: str
    pods: list[dict[str, Any]]
    incoming: dict[str, Any] = field(default_factory=_x)
    nodes: list[dict[str, Any]] = field(default_factory=lambda: [node("n")])
    victims: tuple[str, ...] | None = None  # expected victims (pod names); None = no plan
    ids: tuple[str, ...] = ()  # expected GPU set for the preemptor
    reason: str = ""  # substring of NoPlan.reason
    budgets: Budgets = field(default_factory=Budgets)
    exclude: frozenset[str] = frozenset()
    max_victims: int = 0
    pdb_violations: int = 0


A = pod("a", 2, node="n", ids="0,1", priority=10)
B = pod("b", 2, node="n", ids="4,5", priority=10)


def idle(obj: dict[str, Any], ack_until: str | None = None) -> dict[str, Any]:
    """`obj` as the idle loop leaves a pod under a prefer-as-victim rule (and its owner's acknowledgement)."""
    annotations = obj["metadata"]["annotations"]
    annotations["gpuwarden.io/idle-since"] = "2023-11-14T20:00:00Z"
    annotations["gpuwarden.io/idle-reclaimable"] = "true"
    if ack_until is not None:
        annotations["gpuwarden.io/idle-ack-until"] = ack_until
    return obj


LATER = "2023-11-15T00:00:00Z"  # after NOW: an acknowledgement still in force
EARLIER = "2023-11-14T00:00:00Z"  # before NOW: an acknowledgement that ran out

CASES = [
    Case("fragmented-2+2-one-victim-by-name", [A, B], victims=("a",), ids=("0", "1", "2", "3")),
    Case(
        "lowest-priority-victim-first",
        [A, pod("b", 2, node="n", ids="4,5", priority=5)],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "only-higher-priority-pods",
        [pod("a", 2, node="n", ids="0,1", priority=500), pod("b", 2, node="n", ids="4,5", priority=500)],
        reason="no lower-priority pods to preempt (priority < 100)",
    ),
    Case(
        "equal-priority-is-not-a-victim",
        [pod("a", 2, node="n", ids="0,1", priority=100), pod("b", 2, node="n", ids="4,5", priority=100)],
        reason="no lower-priority pods to preempt",
    ),
    Case(
        "pdb-moves-the-choice-to-the-other-pod",
        [A, pod("b", 2, node="n", ids="4,5", priority=50)],
        budgets=Budgets({"ml/a": ("ml/pdb-a",)}, {"ml/pdb-a": 0}),
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "pdb-with-room-left-is-no-violation",
        [A, B],
        budgets=Budgets({"ml/a": ("ml/pdb",), "ml/b": ("ml/pdb",)}, {"ml/pdb": 1}),
        victims=("a",),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "every-victim-violates-then-fewest-violations",
        [A, B],
        budgets=Budgets({"ml/a": ("ml/pdb",), "ml/b": ("ml/pdb",)}, {"ml/pdb": 0}),
        victims=("a",),
        ids=("0", "1", "2", "3"),
        pdb_violations=1,
    ),
    Case(
        "fewest-victims-beat-lower-priority",
        [
            pod("a", 1, node="n", ids="0", priority=1),
            pod("c", 1, node="n", ids="1", priority=1),
            pod("b", 2, node="n", ids="4,5", priority=50),
        ],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "fewest-gpus-disturbed",
        [A, pod("b", 3, node="n", ids="4,5,6", priority=10)],
        victims=("a",),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "quarantined-gpu-rules-out-its-numa-node",
        [A, B],
        nodes=[node("n", taint="xid-79", quarantine=quarantine_record("GPU-0002"))],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "count-only-pod-is-a-victim",
        [pod("c", 2, node="n", priority=10), pod("a", 2, node="n", ids="4,5", priority=50)],
        victims=("c",),
    ),
    Case(
        "nominated-higher-priority-pod-keeps-its-promise",
        [A, B, pod("y", 4, priority=200, nominated="n")],
        victims=("a", "b"),
    ),
    Case(
        "nominated-lower-priority-pod-is-ignored",
        [A, B, pod("y", 4, priority=50, nominated="n")],
        victims=("a",),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "max-victims-limit",
        [A, B, pod("y", 4, priority=200, nominated="n")],
        max_victims=1,
        reason="more than 1 victims would be needed",
    ),
    Case("excluded-pod-is-not-chosen", [A, B], exclude=frozenset({"ml/a"}), victims=("b",)),
    Case(
        "terminating-holder-counts-as-free",
        [pod("a", 2, node="n", ids="0,1", priority=10, deleting=True), B],
        victims=(),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "single-pcie-frees-one-switch",
        [
            pod("p0", 1, node="n", ids="0", priority=10),
            pod("p1", 1, node="n", ids="2", priority=5),
            pod("p2", 1, node="n", ids="4", priority=10),
            pod("p3", 1, node="n", ids="6", priority=10),
        ],
        incoming=_x(gpus=2, policy="single-pcie"),
        victims=("p1",),
        ids=("2", "3"),
    ),
    Case(
        "policy-impossible-even-on-an-empty-node",
        [A],
        incoming=_x(gpus=3, policy="single-pcie"),
        reason="at most 2 healthy GPUs per PCIe switch",
    ),
    Case(
        "preempting-everything-still-not-enough",
        [
            pod("h0", 1, node="n", ids="0", priority=500),
            pod("h1", 1, node="n", ids="4", priority=500),
            pod("low", 1, node="n", ids="1", priority=1),
        ],
        reason="preempting all 1 lower-priority pods would still leave no set for policy single-numa",
    ),
    Case(
        "idle-pod-before-a-busy-lower-priority-one",
        [A, idle(pod("b", 2, node="n", ids="4,5", priority=50))],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "idle-pod-of-equal-priority-is-reclaimable",
        [
            pod("a", 2, node="n", ids="0,1", priority=100),
            idle(pod("b", 2, node="n", ids="4,5", priority=100)),
        ],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "acknowledged-idle-pod-is-not-reclaimable",
        [
            pod("a", 2, node="n", ids="0,1", priority=100),
            idle(pod("b", 2, node="n", ids="4,5", priority=100), ack_until=LATER),
        ],
        reason="no lower-priority pods to preempt",
    ),
    Case(
        "expired-acknowledgement-counts-for-nothing",
        [A, idle(pod("b", 2, node="n", ids="4,5", priority=50), ack_until=EARLIER)],
        victims=("b",),
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "idle-pod-of-higher-priority-is-never-a-victim",
        [A, idle(pod("b", 2, node="n", ids="4,5", priority=500))],
        victims=("a",),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "two-idle-pods-beat-one-busy-pod",
        [
            idle(pod("c", 1, node="n", ids="0", priority=50)),
            idle(pod("d", 1, node="n", ids="1", priority=50)),
            pod("b", 2, node="n", ids="4,5", priority=5),
        ],
        victims=("c", "d"),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "budgets-still-come-before-idleness",
        [A, idle(pod("b", 2, node="n", ids="4,5", priority=50))],
        budgets=Budgets({"ml/b": ("ml/pdb-b",)}, {"ml/pdb-b": 0}),
        victims=("a",),
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "fits-already-no-victims",
        [pod("a", 2, node="n", ids="0,1", priority=10)],
        victims=(),
        ids=("4", "5", "6", "7"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_victims(case: Case) -> None:
    m = model(case.nodes, case.pods)
    incoming = pod_info(case.incoming, RESOURCE)
    plan = plan_victims(
        incoming,
        m.view("n"),
        S,
        NOW,
        budgets=case.budgets,
        exclude=case.exclude,
        max_victims=case.max_victims,
    )
    if case.victims is None:
        assert isinstance(plan, NoPlan), plan
        assert case.reason in plan.reason
        return
    assert isinstance(plan, VictimPlan), plan
    assert tuple(v.pod.split("/")[1] for v in plan.victims) == case.victims
    if case.ids:
        assert plan.choice.ids == case.ids
    assert len(plan.choice.ids) == incoming.gpus
    assert plan.pdb_violations == case.pdb_violations
    assert all(v.priority < incoming.priority or v.reclaimable(NOW) for v in plan.victims)
    assert plan.busy == sum(not v.reclaimable(NOW) for v in plan.victims)


def _uids(plan_uids: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(plan_uids))


@pytest.mark.parametrize(
    ("pods", "sent", "expected"),
    [
        pytest.param(
            [A, idle(pod("b", 2, node="n", ids="4,5", priority=10))],
            ["uid-a"],
            ("uid-b",),
            id="scheduler-chose-the-busy-pod-idle-one-instead",
        ),
        pytest.param(
            [A, B],
            ["uid-a"],
            ("uid-a",),
            id="no-idle-pod-the-schedulers-choice-stays",
        ),
        pytest.param(
            [A, idle(pod("b", 2, node="n", ids="4,5", priority=10))],
            ["uid-a", "uid-cpu-only"],
            ("uid-a", "uid-cpu-only"),
            id="a-victim-we-do-not-know-keeps-the-schedulers-choice",
        ),
        pytest.param(
            [A, idle(pod("b", 2, node="n", ids="4,5", priority=10), ack_until=LATER)],
            ["uid-a"],
            ("uid-a",),
            id="acknowledged-idle-pod-is-left-alone",
        ),
        pytest.param(
            [A, idle(pod("b", 2, node="n", ids="4,5", priority=10))],
            ["uid-b"],
            ("uid-b",),
            id="scheduler-chose-the-idle-pod-already",
        ),
    ],
)
def test_preempt_verb_takes_idle_pods_instead_of_busy_ones(
    pods: list[dict[str, Any]], sent: list[str], expected: tuple[str, ...]
) -> None:
    m = model([node("n")], pods)
    got = revise_candidates(pod_info(_x(), RESOURCE), {"n": sent}, {"n": m.view("n")}, S, NOW)
    assert _uids(got.victims["n"]) == _uids(expected)


def test_victims_come_in_decreasing_priority_order_with_their_uids() -> None:
    m = model(
        [node("n")],
        [pod("a", 2, node="n", ids="0,1", priority=10), pod("b", 2, node="n", ids="2,3", priority=20),
         pod("c", 4, node="n", ids="4,5,6,7", priority=300)],
    )  # fmt: skip
    plan = plan_victims(pod_info(_x(), RESOURCE), m.view("n"), S, NOW)
    assert isinstance(plan, VictimPlan)
    assert [(v.pod, v.uid) for v in plan.victims] == [("ml/b", "uid-b"), ("ml/a", "uid-a")]
    assert plan.describe() == "ml/b (priority 20, GPUs 2,3), ml/a (priority 10, GPUs 0,1)"


def test_better_prefers_cheaper_then_better_scoring_then_name() -> None:
    m = model(
        [node("n1"), node("n2")],
        [pod("a", 2, node="n1", ids="0,1", priority=10), pod("a2", 2, node="n1", ids="4,5", priority=10),
         pod("b", 2, node="n2", ids="0,1", priority=5), pod("b2", 2, node="n2", ids="4,5", priority=5)],
    )  # fmt: skip
    p1 = plan_victims(pod_info(_x(), RESOURCE), m.view("n1"), S, NOW)
    p2 = plan_victims(pod_info(_x(), RESOURCE), m.view("n2"), S, NOW)
    assert isinstance(p1, VictimPlan) and isinstance(p2, VictimPlan)
    assert better(p2, p1) and not better(p1, p2)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([A, B], "gpuwarden can make room by preempting 1 lower-priority pod", id="room"),
        pytest.param(
            [pod("a", 2, node="n", ids="0,1", priority=500), pod("b", 2, node="n", ids="4,5", priority=500)],
            "gpuwarden cannot make room: no lower-priority pods to preempt (priority < 100)",
            id="no-lower-priority",
        ),
        pytest.param(
            [pod("a", 2, node="n", ids="0,1", priority=10, deleting=True), B],
            "waiting for terminating pods to release their GPUs",
            id="victim-terminating",
        ),
    ],
)
def test_filter_reports_fragmented_nodes_unresolvable_with_what_would_help(
    pods: list[dict[str, Any]], expected: str
) -> None:
    m = model([node("n")], pods)
    incoming = pod_info(_x(), RESOURCE)
    views = {"n": m.view("n")}
    result = explain_room(incoming, filter_nodes(incoming, list(views.items()), S, NOW), views, S, NOW)
    assert result.failed == {} and result.passed == ()
    assert result.fragmented == ("n",)
    reason = result.unresolvable["n"]
    assert reason.startswith("fragmented: 4 free, largest NUMA node has 2 (NUMA0: 2 free, NUMA1: 2 free; ")
    assert reason.endswith(expected)


def test_short_by_count_stays_resolvable_for_the_schedulers_own_preemption() -> None:
    m = model([node("n")], [A, B, pod("c", 1, node="n", ids="2", priority=10)])
    incoming = pod_info(_x(), RESOURCE)
    result = filter_nodes(incoming, [("n", m.view("n"))], S, NOW)
    assert (
        set(result.failed) == {"n"} and not result.fragmented
    )  # 3 free by count: the scheduler picks victims


def test_explaining_many_fragmented_nodes_is_bounded_and_cached() -> None:
    names = [f"n{i:02d}" for i in range(EXPLAIN_BUDGET + 4)]
    pods = [p for n in names for p in (pod(f"{n}-a", 2, node=n, ids="0,1", priority=10),
                                       pod(f"{n}-b", 2, node=n, ids="4,5", priority=10))]  # fmt: skip
    m = model([node(n) for n in names], pods)
    incoming = pod_info(_x(), RESOURCE)
    views = {n: m.view(n) for n in names}
    first = explain_room(incoming, filter_nodes(incoming, list(views.items()), S, NOW), views, S, NOW)
    searched = [n for n in names if first.unresolvable[n].endswith("by preempting 1 lower-priority pod")]
    assert len(searched) == EXPLAIN_BUDGET
    rest = [n for n in names if n not in searched]
    assert all(first.unresolvable[n].endswith("GPU preemption may make room") for n in rest)
    again = explain_room(incoming, filter_nodes(incoming, list(views.items()), S, NOW), views, S, NOW)
    assert sum(r.endswith("by preempting 1 lower-priority pod") for r in again.unresolvable.values()) == len(
        names
    )


@pytest.mark.parametrize("seed", range(40))
def test_the_fast_group_check_chooses_what_the_full_check_chooses(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from controller.gpus import victims as victims_module

    rng = random.Random(seed)
    gpus = rng.sample(range(8), rng.randrange(3, 8))
    pods, i = [], 0
    while gpus:
        take = [str(gpus.pop()) for _ in range(min(len(gpus), rng.choice((1, 1, 2, 3))))]
        pods.append(
            pod(f"p{i}", len(take), node="n", ids=",".join(take), priority=rng.choice((5, 10, 50, 500)))
        )
        i += 1
    budgets = Budgets({f"ml/p{j}": ("ml/pdb",) for j in range(i) if rng.random() < 0.3}, {"ml/pdb": 0})
    m = model([node("n")], pods)
    incoming = pod_info(
        _x(gpus=rng.choice((2, 3, 4)), policy=rng.choice(("single-numa", "single-pcie"))), RESOURCE
    )
    fast = plan_victims(incoming, m.view("n"), S, NOW, budgets=budgets)
    monkeypatch.setattr(victims_module, "_group_check", lambda *a: None)
    full = plan_victims(incoming, model([node("n")], pods).view("n"), S, NOW, budgets=budgets)
    assert type(fast) is type(full)
    if isinstance(fast, VictimPlan) and isinstance(full, VictimPlan):
        assert [v.pod for v in fast.victims] == [v.pod for v in full.victims]
        assert fast.choice == full.choice and fast.pdb_violations == full.pdb_violations
