"""Table-driven tests of `decide_preemption`: one row per scenario — history and candidates in, kept nodes,
dropped nodes with reasons and the veto reason out. History is a real `PreemptionGraph`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.preemption.graph import BackoffSpec, Preemption, PreemptionGraph, load
from controller.preemption.signals import PodMeta, Workload
from controller.preemption.throttle import (
    BudgetSpec,
    Candidate,
    Reason,
    ThrottlePolicy,
    decide_preemption,
    policy_from_config,
)
from gpuwarden.config.preemption import PreemptionConfig

NOW = 1_700_000_000.0
NS = "team-a"
TRAINER = Workload(NS, "trainer", "Deployment")
SERVE = Workload(NS, "serve", "Deployment")
BATCH = Workload(NS, "batch", "Job")
OTHER = Workload("team-b", "other", "Job")
PREEMPTOR = PodMeta("p-uid", NS, "trainer-abc12-x2x7k", TRAINER, priority=1000, created=NOW - 5)


def victim(
    uid: str, workload: Workload = BATCH, *, created: float = NOW - 3600, priority: int = 100
) -> PodMeta:
    return PodMeta(uid, workload.namespace, f"{workload.name}-{uid}", workload, priority, created, "n1")


POD_INDEX = {
    **{f"b{i}": victim(f"b{i}") for i in range(10)},
    "s1": victim("s1", SERVE),
    "new": victim("new", created=NOW - 5),
}


def rec(
    victim_uid: str,
    victim_wl: Workload,
    preemptor: Workload | None,
    *,
    ago: float = 10.0,
    node: str = "n1",
    preemptor_uid: str = "",
) -> Preemption:
    uid = preemptor_uid or (f"pod-of-{preemptor.name}" if preemptor else "")
    return Preemption(victim_uid, victim_wl, node, NOW - ago, preemptor_uid=uid, preemptor=preemptor)


def spent(n: int, preemptor: Workload, *, ago: float = 10.0, victim_wl: Workload = BATCH) -> list[Preemption]:
    """`n` victims preempted by `preemptor` on distinct nodes (so no back-off applies)."""
    return [rec(f"h{preemptor.name}{i}", victim_wl, preemptor, ago=ago, node=f"old{i}") for i in range(n)]


@dataclass
class Row:
    id: str
    candidates: dict[str, list[str]]
    kept: list[str]
    dropped: dict[str, Reason] = field(default_factory=dict)
    veto: Reason | None = None
    history: list[Preemption] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)
    preemptor: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None


TWO = {"n1": ["b1"], "n2": ["b2"]}

ROWS = [
    Row("no-history-passes-every-candidate", TWO, ["n1", "n2"], outcome="passed"),
    Row(
        "node-with-empty-victims-is-never-returned",
        {"n1": [], "n2": ["b2"]},
        ["n2"],
        {"n1": Reason.NO_VICTIMS},
        outcome="passed",
    ),
    Row(
        "only-empty-candidates-veto-without-throttling",
        {"n1": []},
        [],
        {"n1": Reason.NO_VICTIMS},
        Reason.NO_VICTIMS,
        outcome="vetoed",
    ),
    Row(
        "global-budget-spent-vetoes",
        TWO,
        [],
        {"n1": Reason.BUDGET_GLOBAL, "n2": Reason.BUDGET_GLOBAL},
        Reason.BUDGET_GLOBAL,
        history=spent(50, OTHER),
        outcome="vetoed",
    ),
    Row(
        "global-budget-narrows-to-a-smaller-candidate",
        {"n1": ["b1", "b2", "b3"], "n2": ["b4", "b5"]},
        ["n2"],
        {"n1": Reason.BUDGET_GLOBAL},
        history=spent(48, OTHER),
        outcome="narrowed",
    ),
    Row("global-budget-window-slides", TWO, ["n1", "n2"], history=spent(50, OTHER, ago=301)),
    Row(
        "namespace-budget-spent-in-own-namespace",
        TWO,
        [],
        {"n1": Reason.BUDGET_NAMESPACE, "n2": Reason.BUDGET_NAMESPACE},
        Reason.BUDGET_NAMESPACE,
        history=spent(20, SERVE),
    ),
    Row("namespace-budget-of-another-namespace-does-not-count", TWO, ["n1", "n2"], history=spent(20, OTHER)),
    Row(
        "workload-budget-spent",
        TWO,
        [],
        {"n1": Reason.BUDGET_WORKLOAD, "n2": Reason.BUDGET_WORKLOAD},
        Reason.BUDGET_WORKLOAD,
        history=spent(16, TRAINER, ago=500),
        policy={"namespace_budget": None},
    ),
    Row(
        "workload-budget-is-per-workload",
        TWO,
        ["n1", "n2"],
        history=spent(16, SERVE, ago=500),
        policy={"namespace_budget": None},
    ),
    Row(
        "no-budgets-configured",
        TWO,
        ["n1", "n2"],
        history=spent(60, TRAINER),
        policy={"global_budget": None, "namespace_budget": None, "workload_budget": None},
    ),
    Row(
        "one-follow-on-of-a-recent-victim-is-allowed",
        TWO,
        ["n1", "n2"],
        history=[rec("t-old", TRAINER, SERVE, ago=60)],
    ),
    Row(
        "chain-past-depth-2-vetoed",
        TWO,
        [],
        {"n1": Reason.CHAIN_DEPTH, "n2": Reason.CHAIN_DEPTH},
        Reason.CHAIN_DEPTH,
        history=[rec("s-old", SERVE, OTHER, ago=120), rec("t-old", TRAINER, SERVE, ago=60)],
    ),
    Row(
        "chain-link-outside-the-window-is-forgotten",
        TWO,
        ["n1", "n2"],
        history=[rec("s-old", SERVE, OTHER, ago=1000), rec("t-old", TRAINER, SERVE, ago=60)],
    ),
    Row(
        "max-depth-1-forbids-preemption-by-a-recent-victim",
        TWO,
        [],
        {"n1": Reason.CHAIN_DEPTH, "n2": Reason.CHAIN_DEPTH},
        Reason.CHAIN_DEPTH,
        history=[rec("t-old", TRAINER, SERVE, ago=60)],
        policy={"max_chain_depth": 1},
    ),
    Row(
        "victim-known-only-by-condition-still-counts-as-recent-victim",
        TWO,
        [],
        {"n1": Reason.CHAIN_DEPTH, "n2": Reason.CHAIN_DEPTH},
        Reason.CHAIN_DEPTH,
        history=[rec("t-old", TRAINER, None, ago=60)],
        policy={"max_chain_depth": 1},
    ),
    Row(
        "ping-pong-drops-the-node-of-the-workload-that-preempted-us",
        {"n1": ["s1"], "n2": ["b2"]},
        ["n2"],
        {"n1": Reason.PING_PONG},
        history=[rec("t-old", TRAINER, SERVE, ago=60)],
        outcome="narrowed",
    ),
    Row(
        "ping-pong-allowed-when-disabled",
        {"n1": ["s1"]},
        ["n1"],
        history=[rec("t-old", TRAINER, SERVE, ago=60)],
        policy={"prevent_ping_pong": False},
    ),
    Row(
        "victim-that-just-preempted-is-protected",
        {"n1": ["b1"], "n2": ["b2"]},
        ["n2"],
        {"n1": Reason.VICTIM_PREEMPTOR},
        history=[rec("x-old", OTHER, BATCH, ago=60, preemptor_uid="b1")],
    ),
    Row(
        "backoff-blocks-a-new-round-on-the-same-node",
        TWO,
        ["n2"],
        {"n1": Reason.BACKOFF},
        history=[rec("h1", SERVE, TRAINER, ago=40, node="n1")],
    ),
    Row(
        "backoff-lets-a-burst-continue-on-pods-that-were-already-there",
        TWO,
        ["n1", "n2"],
        history=[rec("h1", SERVE, TRAINER, ago=10, node="n1")],
    ),
    Row(
        "backoff-burst-does-not-cover-a-refilled-node",
        {"n1": ["new"], "n2": ["b2"]},
        ["n2"],
        {"n1": Reason.BACKOFF},
        history=[rec("h1", SERVE, TRAINER, ago=10, node="n1")],
    ),
    Row(
        "backoff-burst-does-not-cover-unknown-victims",
        {"n1": ["ghost"], "n2": ["b2"]},
        ["n2"],
        {"n1": Reason.BACKOFF},
        history=[rec("h1", SERVE, TRAINER, ago=10, node="n1")],
    ),
    Row("backoff-expires-after-base", TWO, ["n1", "n2"], history=[rec("h1", SERVE, TRAINER, ago=61)]),
    Row(
        "backoff-doubles-in-the-second-round",
        TWO,
        ["n2"],
        {"n1": Reason.BACKOFF},
        history=[rec("h1", SERVE, TRAINER, ago=200), rec("h2", SERVE, TRAINER, ago=100)],
    ),
    Row(
        "backoff-resets-after-a-quiet-period",
        TWO,
        ["n1", "n2"],
        history=[rec("h1", SERVE, TRAINER, ago=1000), rec("h2", SERVE, TRAINER, ago=80)],
    ),
    Row(
        "backoff-is-per-workload",
        TWO,
        ["n1", "n2"],
        history=[rec("h1", SERVE, OTHER, ago=40, node="n1")],
    ),
    Row(
        "exempt-priority-is-never-throttled",
        TWO,
        ["n1", "n2"],
        history=spent(50, OTHER),
        preemptor={"priority": 2_000_000_000},
        outcome="exempt",
    ),
    Row(
        "exempt-threshold-null-throttles-everyone",
        TWO,
        [],
        {"n1": Reason.BUDGET_GLOBAL, "n2": Reason.BUDGET_GLOBAL},
        Reason.BUDGET_GLOBAL,
        history=spent(50, OTHER),
        preemptor={"priority": 2_000_000_000},
        policy={"exempt_min_priority": None},
    ),
    Row("disabled-passes-everything", TWO, ["n1", "n2"], history=spent(50, OTHER), policy={"enabled": False}),
    Row(
        "retry-on-victims-already-being-preempted-costs-nothing",
        {"n1": ["hother0"], "n2": ["b2"]},
        ["n1"],
        {"n2": Reason.BUDGET_GLOBAL},
        history=spent(50, OTHER),
        outcome="narrowed",
    ),
    Row(
        "chain-limit-keeps-a-retry-on-victims-already-being-preempted",
        {"n1": ["s-old"], "n2": ["b2"]},
        ["n1"],
        {"n2": Reason.CHAIN_DEPTH},
        history=[rec("s-old", SERVE, OTHER, ago=120), rec("t-old", TRAINER, SERVE, ago=60)],
    ),
    Row(
        "most-severe-reason-is-the-veto",
        {"n1": ["s1"], "n2": ["b2", "b3"]},
        [],
        {"n1": Reason.PING_PONG, "n2": Reason.BUDGET_GLOBAL},
        Reason.BUDGET_GLOBAL,
        history=[rec("t-old", TRAINER, SERVE, ago=60), *spent(48, OTHER)],
    ),
]


def graph_of(history: list[Preemption], policy: ThrottlePolicy) -> PreemptionGraph:
    graph = PreemptionGraph(horizon=policy.horizon, chain_window=policy.chain_window, backoff=policy.backoff)
    load(graph, history)
    return graph


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decide_preemption(row: Row) -> None:
    policy = replace(ThrottlePolicy(), **row.policy)
    preemptor = replace(PREEMPTOR, **row.preemptor)
    candidates = [Candidate(node, tuple(uids)) for node, uids in row.candidates.items()]
    decision = decide_preemption(
        preemptor, candidates, POD_INDEX.get, graph_of(row.history, policy), policy, NOW
    )
    assert list(decision.kept) == row.kept
    assert dict(decision.dropped) == row.dropped
    assert decision.veto == row.veto
    if row.outcome is not None:
        assert decision.outcome == row.outcome
    if decision.throttled:
        assert decision.detail, "a throttled decision says why (the Event note)"


def test_chain_depth_is_reported() -> None:
    policy = ThrottlePolicy()
    history = [rec("s-old", SERVE, OTHER, ago=120), rec("t-old", TRAINER, SERVE, ago=60)]
    decision = decide_preemption(
        PREEMPTOR, [Candidate("n1", ("b1",))], POD_INDEX.get, graph_of(history, policy), policy, NOW
    )
    assert decision.depth == 3
    assert "depth 3" in decision.detail and "limit 2" in decision.detail


def test_reservation_counts_until_the_events_arrive() -> None:
    policy = replace(ThrottlePolicy(), global_budget=BudgetSpec(2, 300), namespace_budget=None)
    graph = graph_of([], policy)
    candidates = {"n7": [("b9", BATCH.key)], "n8": [("b8", BATCH.key), ("b7", "")]}
    graph.reserve("p-other", OTHER, candidates, NOW - 1)
    two = [Candidate("n1", ("b1", "b2")), Candidate("n2", ("b3",))]
    decision = decide_preemption(PREEMPTOR, two, POD_INDEX.get, graph, policy, NOW)
    assert decision.kept == ("n2",) and decision.dropped == {"n1": Reason.BUDGET_GLOBAL}
    graph.observe(rec("b9", BATCH, OTHER, preemptor_uid="p-other", node="n7"))  # the scheduler chose n7
    assert graph.victims(NOW, 300) == 1
    graph.reserve("p-third", OTHER, {"n9": [("b6", "")]}, NOW - 31)  # expired
    assert graph.victims(NOW, 300) == 1


def test_a_preemptors_retry_on_the_victims_it_was_allowed_is_free() -> None:
    policy = replace(ThrottlePolicy(), global_budget=BudgetSpec(1, 300), namespace_budget=None)
    graph = graph_of([], policy)
    first = decide_preemption(PREEMPTOR, [Candidate("n1", ("b1",))], POD_INDEX.get, graph, policy, NOW)
    assert first.kept == ("n1",)
    graph.reserve(PREEMPTOR.uid, TRAINER, {"n1": [("b1", BATCH.key)]}, NOW, first.depth)
    again = decide_preemption(PREEMPTOR, [Candidate("n1", ("b1",))], POD_INDEX.get, graph, policy, NOW + 0.05)
    assert again.kept == ("n1",) and not again.throttled
    other = replace(PREEMPTOR, uid="p2")
    third = decide_preemption(other, [Candidate("n1", ("b1",))], POD_INDEX.get, graph, policy, NOW + 0.05)
    assert third.veto == Reason.BUDGET_GLOBAL


def test_policy_from_default_config_matches_the_documented_defaults() -> None:
    policy = policy_from_config(PreemptionConfig())
    assert policy.global_budget == BudgetSpec(50, 300)
    assert policy.namespace_budget == BudgetSpec(20, 300)
    assert policy.workload_budget == BudgetSpec(16, 600)
    assert policy.max_chain_depth == 2 and policy.chain_window == 900
    assert policy.backoff == BackoffSpec(60, 3600, 600, 30)
    assert (
        policy_from_config(PreemptionConfig.model_validate({"backoff": {"burst_seconds": 5}})).backoff.burst
        == 5
    )
    assert policy.exempt_min_priority == 2_000_000_000 and policy.horizon == 900
    off = PreemptionConfig.model_validate({"global_budget": None, "dry_run": True})
    assert policy_from_config(off).global_budget is None
    assert policy_from_config(off).dry_run and not policy_from_config(off, dry_run=False).dry_run
