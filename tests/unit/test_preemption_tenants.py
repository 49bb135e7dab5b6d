"""The cross-tenant rule wired into every preemption path: the GPU victim choice (`plan_victims`,
`revise_candidates`), the throttle's decision (`decide_preemption` with a `TenantGate`), the preempt verb
over HTTP (answer, Event, metric), make-room's plan across preemptors of one pass and its loop's Events.

Node "n" is 2 NUMA x 4 GPUs (ids 0-3 on NUMA0, 4-7 on NUMA1). Tenant "a" owns namespaces a1 and a2,
tenant "b" owns namespace b; both are guaranteed 4 GPUs unless a row says otherwise.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService, add_extender_routes
from controller.gpus.fit import Settings
from controller.gpus.objects import pod_info
from controller.gpus.tenants import Rule, Tenancy
from controller.gpus.victims import TENANT_MARKER, NoPlan, VictimPlan, plan_victims, revise_candidates
from controller.makeroom.loop import RoomLoop
from controller.makeroom.plan import NodeFacts, Pending, plan_room
from controller.preemption.graph import PreemptionGraph
from controller.preemption.hook import PreemptionThrottle
from controller.preemption.signals import PodMeta, Workload
from controller.preemption.throttle import (
    Candidate,
    Reason,
    TenantGate,
    ThrottlePolicy,
    decide_preemption,
)
from gpuwarden.config.root import Config
from gpuwarden.kube import ADDED, SYNCED, WatchEvent
from tests.unit.extender_support import RESOURCE, model, node, pod
from tests.unit.preemption_support import RecordSink
from tests.unit.test_preemption_room_loop import FakeApi, FakeInformer, FakeRecorder

NOW = 1_700_000_000.0
S = Settings(fleet_max_numa_gpus=4, resource=RESOURCE)
TENANT_OF = {"a1": "a", "a2": "a", "b": "b"}


def tenancy(rule: Rule, held_b: int, *, share_b: int = 4, held_a: int = 0) -> Tenancy:
    return Tenancy(rule, TENANT_OF, {"a": 4, "b": share_b}, {"a": held_a, "b": held_b})


def x(gpus: int = 4, ns: str = "a1", priority: int = 100) -> dict[str, Any]:
    return pod("x", gpus, namespace=ns, priority=priority)


# --- the victim choice -------------------------------------------------------------------------------------


@dataclass
class VictimRow:
    id: str
    pods: list[dict[str, Any]]
    tenancy: Tenancy | None
    victims: tuple[str, ...] | None  # expected victims (pod keys); None = NoPlan
    reason: str = ""  # substring of NoPlan.reason
    tenant_refused: bool = False  # NoPlan says the tenant rule is what stands in the way


MINE = pod("mine", 2, namespace="a2", node="n", ids="0,1", priority=50)
THEIRS = pod("theirs", 2, namespace="b", node="n", ids="4,5", priority=10)
B1 = pod("b1", 2, namespace="b", node="n", ids="0,1", priority=10)
B2 = pod("b2", 2, namespace="b", node="n", ids="2,3", priority=10)
B_BIG = pod("big", 4, namespace="b", node="n", ids="4,5,6,7", priority=10)

VICTIM_ROWS = [
    VictimRow("any-cheapest-other-tenant", [MINE, THEIRS], tenancy(Rule.ANY, 2), ("b/theirs",)),
    VictimRow("no-tenancy-as-any", [MINE, THEIRS], None, ("b/theirs",)),
    VictimRow(
        "within-own-tenant-though-dearer", [MINE, THEIRS], tenancy(Rule.WITHIN_TENANT, 9), ("a2/mine",)
    ),
    VictimRow(
        "within-only-other-tenant-refused",
        [THEIRS, pod("c", 2, namespace="a2", node="n", ids="0,1", priority=500)],
        tenancy(Rule.WITHIN_TENANT, 9),
        None,
        "rule within-tenant",
        tenant_refused=True,
    ),
    VictimRow("over-share-b-at-share-own-tenant", [MINE, THEIRS], tenancy(Rule.OVER_SHARE, 4), ("a2/mine",)),
    VictimRow("over-share-b-over-share-cheapest", [MINE, THEIRS], tenancy(Rule.OVER_SHARE, 6), ("b/theirs",)),
    VictimRow(
        "over-share-b-one-over-two-gpu-victim-refused",
        [THEIRS, pod("c", 2, namespace="a2", node="n", ids="0,1", priority=500)],
        tenancy(Rule.OVER_SHARE, 5),
        None,
        "1 GPUs preemptable",
        tenant_refused=True,
    ),
    VictimRow(
        "over-share-set-of-two-beyond-excess-refused",
        [B1, B2, pod("c", 4, namespace="a2", node="n", ids="4,5,6,7", priority=500)],
        tenancy(Rule.OVER_SHARE, 6),
        None,
        "rule over-share",
        tenant_refused=True,
    ),
    VictimRow(
        "over-share-set-of-two-within-excess",
        [B1, B2, pod("c", 4, namespace="a2", node="n", ids="4,5,6,7", priority=500)],
        tenancy(Rule.OVER_SHARE, 8),
        ("b/b1", "b/b2"),
    ),
    VictimRow(
        "over-share-multi-gpu-victim-exactly-to-share",
        [B_BIG, pod("c", 4, namespace="a2", node="n", ids="0,1,2,3", priority=500)],
        tenancy(Rule.OVER_SHARE, 8),
        ("b/big",),
    ),
    VictimRow(
        "unknown-tenant-refused",
        [pod("u", 2, namespace="gone", node="n", ids="4,5", priority=10), MINE],
        tenancy(Rule.OVER_SHARE, 0),
        ("a2/mine",),
    ),
    VictimRow(
        "no-lower-priority-is-not-a-tenant-reason",
        [
            pod("c", 2, namespace="b", node="n", ids="0,1", priority=500),
            pod("d", 2, namespace="b", node="n", ids="4,5", priority=500),
        ],
        tenancy(Rule.WITHIN_TENANT, 4),
        None,
        "no lower-priority pods",
    ),
]


@pytest.mark.parametrize("row", VICTIM_ROWS, ids=lambda r: r.id)
def test_plan_victims_obeys_the_rule(row: VictimRow) -> None:
    view = model([node("n")], row.pods).view("n")
    plan = plan_victims(pod_info(x(), RESOURCE), view, S, NOW, tenancy=row.tenancy)
    if row.victims is None:
        assert isinstance(plan, NoPlan), plan
        assert row.reason in plan.reason
        assert plan.reason.startswith(TENANT_MARKER) is row.tenant_refused
        return
    assert isinstance(plan, VictimPlan), plan
    assert tuple(sorted(v.pod for v in plan.victims)) == row.victims


def test_taken_earlier_counts_against_the_excess() -> None:
    view = model([node("n")], [MINE, THEIRS]).view("n")
    incoming = pod_info(x(), RESOURCE)
    fresh = plan_victims(incoming, view, S, NOW, tenancy=tenancy(Rule.OVER_SHARE, 6))
    later = plan_victims(incoming, view, S, NOW, tenancy=tenancy(Rule.OVER_SHARE, 6), taken={"b": 1})
    assert isinstance(fresh, VictimPlan) and [v.pod for v in fresh.victims] == ["b/theirs"]
    assert isinstance(later, VictimPlan) and [v.pod for v in later.victims] == ["a2/mine"]


def test_revise_candidates_reports_nodes_the_rule_refused() -> None:
    m = model(
        [node("n"), node("m")],
        [THEIRS, pod("c", 2, namespace="a2", node="n", ids="0,1", priority=500),
         pod("e", 2, namespace="a2", node="m", ids="0,1", priority=10),
         pod("f", 2, namespace="a2", node="m", ids="4,5", priority=500)],
    )  # fmt: skip
    views = {"n": m.view("n"), "m": m.view("m")}
    got = revise_candidates(
        pod_info(x(), RESOURCE), {"n": [], "m": []}, views, S, NOW, tenancy=tenancy(Rule.WITHIN_TENANT, 2)
    )
    assert dict(got.victims) == {"m": ("uid-e",)}
    assert set(got.refused) == {"n"} and "b/theirs is in tenant b" in got.refused["n"]
    anyone = revise_candidates(pod_info(x(), RESOURCE), {"n": [], "m": []}, views, S, NOW)
    assert dict(anyone.victims) == {"n": ("uid-theirs",), "m": ("uid-e",)} and not anyone.refused


# --- the throttle's decision -----------------------------------------------------------------------------


def meta(name: str, ns: str, priority: int = 10) -> PodMeta:
    return PodMeta(f"uid-{name}", ns, name, Workload(ns, name), priority)


INDEX = {m.uid: m for m in (meta("mine", "a2"), meta("theirs", "b"), meta("more", "b"))}
PREEMPTOR = meta("x", "a1", 100)
GPUS = {"uid-mine": 2, "uid-theirs": 2, "uid-more": 2}


@dataclass
class DecideRow:
    id: str
    candidates: list[Candidate]
    gate: TenantGate | None
    kept: tuple[str, ...]
    dropped: dict[str, Reason] = field(default_factory=dict)
    veto: Reason | None = None
    detail: str = ""
    preemptor: PodMeta = PREEMPTOR
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)


DECIDE_ROWS = [
    DecideRow("no-gate-any-victim", [Candidate("n", ("uid-theirs",))], None, ("n",)),
    DecideRow(
        "any-rule-passes", [Candidate("n", ("uid-theirs",))], TenantGate(tenancy(Rule.ANY, 2), GPUS), ("n",)
    ),
    DecideRow(
        "within-other-tenant-node-dropped-narrowed",
        [Candidate("n", ("uid-theirs",)), Candidate("m", ("uid-mine",))],
        TenantGate(tenancy(Rule.WITHIN_TENANT, 8), GPUS),
        ("m",),
        {"n": Reason.TENANT},
        detail="narrowed to 1 of 2 candidate nodes: tenant rule: b/theirs is in tenant b, not a "
        "(rule within-tenant) on n",
    ),
    DecideRow(
        "over-share-at-share-vetoed",
        [Candidate("n", ("uid-theirs",))],
        TenantGate(tenancy(Rule.OVER_SHARE, 4), GPUS),
        (),
        {"n": Reason.TENANT},
        Reason.TENANT,
        "preemption vetoed: tenant rule: b/theirs is in tenant b, which holds 4 GPUs of a 4-GPU share",
    ),
    DecideRow(
        "over-share-two-victims-beyond-excess-vetoed",
        [Candidate("n", ("uid-theirs", "uid-more"))],
        TenantGate(tenancy(Rule.OVER_SHARE, 7), GPUS),
        (),
        {"n": Reason.TENANT},
        Reason.TENANT,
    ),
    DecideRow(
        "over-share-within-excess-kept",
        [Candidate("n", ("uid-theirs", "uid-more"))],
        TenantGate(tenancy(Rule.OVER_SHARE, 8), GPUS),
        ("n",),
    ),
    DecideRow(
        "over-share-taken-this-pass-vetoed",
        [Candidate("n", ("uid-theirs",))],
        TenantGate(tenancy(Rule.OVER_SHARE, 6), GPUS, {"b": 1}),
        (),
        {"n": Reason.TENANT},
        Reason.TENANT,
    ),
    DecideRow(
        "unknown-victim-refused",
        [Candidate("n", ("uid-nobody",))],
        TenantGate(tenancy(Rule.OVER_SHARE, 9), GPUS),
        (),
        {"n": Reason.TENANT},
        Reason.TENANT,
        "preemption vetoed: tenant rule: victim uid-nobody unknown, so is its tenant on n",
    ),
    DecideRow(
        "refused-by-victim-choice-dropped",
        [Candidate("n", (), refused="b/theirs is in tenant b"), Candidate("m", ("uid-mine",))],
        TenantGate(tenancy(Rule.WITHIN_TENANT, 2), GPUS),
        ("m",),
        {"n": Reason.TENANT},
        detail="narrowed to 1 of 2 candidate nodes: tenant rule: b/theirs is in tenant b on n",
    ),
    DecideRow(
        "exempt-preemptor-not-judged",
        [Candidate("n", ("uid-theirs",))],
        TenantGate(tenancy(Rule.WITHIN_TENANT, 2), GPUS),
        ("n",),
        preemptor=meta("x", "a1", 2_000_000_000),
    ),
    DecideRow(
        "throttle-disabled-not-judged",
        [Candidate("n", ("uid-theirs",))],
        TenantGate(tenancy(Rule.WITHIN_TENANT, 2), GPUS),
        ("n",),
        policy=ThrottlePolicy(enabled=False),
    ),
]


@pytest.mark.parametrize("row", DECIDE_ROWS, ids=lambda r: r.id)
def test_decide_preemption_with_the_tenant_gate(row: DecideRow) -> None:
    graph = PreemptionGraph(horizon=900.0, chain_window=900.0)
    decision = decide_preemption(
        row.preemptor, row.candidates, INDEX.get, graph, row.policy, NOW, tenants=row.gate
    )
    assert decision.kept == row.kept
    assert {n: r for n, r in decision.dropped.items() if r is not Reason.NO_VICTIMS} == row.dropped
    assert decision.veto == row.veto
    assert row.detail in decision.detail


def test_a_victim_already_being_preempted_is_not_judged_again() -> None:
    graph = PreemptionGraph(horizon=900.0, chain_window=900.0)
    graph.reserve("uid-x", PREEMPTOR.workload, {"n": [("uid-theirs", "b/theirs")]}, NOW, 1)
    gate = TenantGate(tenancy(Rule.WITHIN_TENANT, 2), GPUS)
    decision = decide_preemption(
        PREEMPTOR, [Candidate("n", ("uid-theirs",))], INDEX.get, graph, ThrottlePolicy(), NOW, tenants=gate
    )
    assert decision.kept == ("n",)


# --- the preempt verb over HTTP --------------------------------------------------------------------------

VERB_PODS = [
    pod("mine", 2, namespace="a2", node="frag", ids="0,1", priority=50),
    pod("theirs", 2, namespace="b", node="frag", ids="4,5", priority=10),
    pod("other", 2, namespace="b", node="count", ids="0,1", priority=10),
]
NAMESPACES = [
    {"metadata": {"name": "a1", "labels": {"gpuwarden.io/tenant": "a"}}},
    {"metadata": {"name": "a2", "labels": {"gpuwarden.io/tenant": "a"}}},
    {"metadata": {"name": "b", "labels": {"gpuwarden.io/tenant": "b"}}},
]
QUOTAS = [{"metadata": {"namespace": "b", "name": "q"}, "spec": {"hard": {f"requests.{RESOURCE}": "4"}}}]


class Recorder:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []

    async def emit(self, regarding: Any, **kw: Any) -> None:
        self.notes.append((kw["reason"], kw["note"]))

    async def flush(self) -> None:
        return None


def verb_throttle(
    rule: str, registry: CollectorRegistry, recorder: Recorder | None = None
) -> PreemptionThrottle:
    config = Config.model_validate({"preemption": {"tenants": {"rule": rule}}})
    t = PreemptionThrottle(config, RecordSink(), registry=registry, clock=lambda: NOW, recorder=recorder)  # type: ignore[arg-type]
    for p in VERB_PODS:
        t.observer.on_pod(WatchEvent(ADDED, p))
    t.observer.pods.synced.set()
    t.observer.on_event(WatchEvent(SYNCED, {}))
    t.use_gpu_model(model([node("frag"), node("count")], VERB_PODS), lambda: S)
    if t.tenants.namespaces is not None and t.tenants.quotas is not None:
        t.tenants.namespaces.store = {o["metadata"]["name"]: o for o in NAMESPACES}
        t.tenants.quotas.store = {"b/q": QUOTAS[0]}
        t.tenants.namespaces.synced.set()
        t.tenants.quotas.synced.set()
    return t


ARGS = {
    "Pod": x(),
    "NodeNameToMetaVictims": {
        "frag": {"Pods": [], "NumPDBViolations": 0},  # PR #135486 semantics: the victim choice is ours
        "count": {"Pods": [{"UID": "uid-other"}], "NumPDBViolations": 0},  # the scheduler's own choice
    },
}


async def call_verb(t: PreemptionThrottle) -> tuple[int, Any]:
    app = web.Application()
    add_extender_routes(app, ExtenderService(model([]), S, extender_metrics(None), preempt_hook=t))
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/gpu-extender/preempt", json=ARGS)
        body = await resp.json() if resp.status == 200 else await resp.text()
        return resp.status, body


@pytest.mark.parametrize(
    ("rule", "expected", "throttled"),
    [
        pytest.param(
            "any",
            {"frag": [{"UID": "uid-theirs"}], "count": [{"UID": "uid-other"}]},
            0,
            id="any-takes-the-cheapest-from-every-tenant",
        ),
        pytest.param(
            "within-tenant",
            {"frag": [{"UID": "uid-mine"}]},
            1,
            id="within-own-tenant-victim-and-scheduler-choice-dropped",
        ),
        pytest.param(
            "over-share",
            {"frag": [{"UID": "uid-mine"}]},
            1,
            id="over-share-b-at-its-quota-share",
        ),
    ],
)
async def test_preempt_verb_answer_event_and_metric(
    rule: str, expected: dict[str, list[dict[str, str]]], throttled: int
) -> None:
    registry, recorder = CollectorRegistry(), Recorder()
    t = verb_throttle(rule, registry, recorder)
    status, body = await call_verb(t)
    assert status == 200
    got = {n: v["Pods"] for n, v in body["NodeNameToMetaVictims"].items()}
    assert got == expected
    count = registry.get_sample_value("gpuwarden_preemption_throttled_total", {"reason": "tenant"}) or 0.0
    assert count == throttled
    await t.events.drain()  # what the writer task does in the background
    if throttled:
        [(reason, note)] = recorder.notes
        assert reason == "PreemptionThrottled"
        assert note.startswith("narrowed to 1 of 2 candidate nodes: tenant rule: b/other is in tenant b"), (
            note
        )
    else:
        assert recorder.notes == []


async def test_exempt_preemptor_skips_the_rule_in_the_victim_choice_too() -> None:
    registry = CollectorRegistry()
    t = verb_throttle("within-tenant", registry)
    args = {**ARGS, "Pod": x(priority=2_000_000_000)}
    app = web.Application()
    add_extender_routes(app, ExtenderService(model([]), S, extender_metrics(None), preempt_hook=t))
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/gpu-extender/preempt", json=args)
        body = await resp.json()
    got = {n: v["Pods"] for n, v in body["NodeNameToMetaVictims"].items()}
    assert got == {"frag": [{"UID": "uid-theirs"}], "count": [{"UID": "uid-other"}]}


async def test_verb_waits_for_the_tenant_caches() -> None:
    registry = CollectorRegistry()
    t = verb_throttle("within-tenant", registry)
    assert t.tenants.quotas is not None
    t.tenants.quotas.synced = asyncio.Event()
    assert not t.ready()
    status, _ = await call_verb(t)
    assert status == 503


def test_any_rule_watches_nothing_more() -> None:
    t = PreemptionThrottle(Config.model_validate({}), RecordSink())  # type: ignore[arg-type]
    assert t.tenants.namespaces is None and t.tenants.quotas is None and t.tenants.synced
    assert t.tenancy() is None


# --- make-room ---------------------------------------------------------------------------------------------


def pending(name: str, ns: str, priority: int = 100) -> Pending:
    obj = pod(name, 4, namespace=ns, priority=priority)
    return Pending(pod_info(obj, RESOURCE), obj["spec"], 0.0)


def fleet() -> tuple[dict[str, Any], dict[str, NodeFacts]]:
    pods = []
    for n in ("n1", "n2"):
        pods += [
            pod(f"{n}-b", 2, namespace="b", node=n, ids="0,1", priority=10),
            pod(f"{n}-c", 2, namespace="b", node=n, ids="4,5", priority=10),
        ]
    m = model([node("n1"), node("n2")], pods)
    return {n: m.view(n) for n in ("n1", "n2")}, {n: NodeFacts() for n in ("n1", "n2")}


def test_plan_room_counts_what_one_preemptor_took_for_the_next() -> None:
    views, facts = fleet()
    first, second = pending("p", "a1", 200), pending("q", "a2", 100)
    anyone = plan_room([first, second], views, facts, S, NOW, tenancy=tenancy(Rule.ANY, 8))
    assert [d.plan is not None for d in anyone] == [True, True]
    # b holds 8 (two nodes x 2 pods x 2 GPUs), share 6: 2 GPUs preemptable - one preemptor's victim
    ruled = plan_room([first, second], views, facts, S, NOW, tenancy=tenancy(Rule.OVER_SHARE, 8, share_b=6))
    assert ruled[0].plan is not None and len(ruled[0].plan.victims) == 1
    assert ruled[1].plan is None and ruled[1].reason.startswith(TENANT_MARKER)
    assert "0 GPUs preemptable" in ruled[1].reason
    within = plan_room([first], views, facts, S, NOW, tenancy=tenancy(Rule.WITHIN_TENANT, 8))
    assert within[0].plan is None and TENANT_MARKER in within[0].reason


def test_plan_room_namespace_is_part_of_the_shape_under_a_rule() -> None:
    views, facts = fleet()
    own = pending("p", "b", 300)  # b's own pods are always allowed
    other = pending("q", "a1", 200)
    got = plan_room([own, other], views, facts, S, NOW, tenancy=tenancy(Rule.WITHIN_TENANT, 8))
    assert got[0].plan is not None
    assert got[1].plan is None and TENANT_MARKER in got[1].reason


ROOM_PODS = [
    pod("a", 2, namespace="b", node="n", ids="0,1", priority=10),
    pod("b", 2, namespace="b", node="n", ids="4,5", priority=10),
]


def room_loop(rule: str) -> tuple[RoomLoop, FakeApi, FakeRecorder, CollectorRegistry]:
    frag = "0/1 nodes are available: 1 fragmented: 4 free, largest NUMA node has 2 (...)"
    preemptor = pod("x", 4, namespace="a1", priority=1000)
    preemptor["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": frag,
         "lastTransitionTime": "2023-11-14T22:00:00Z"}
    ]  # fmt: skip
    pods = [*ROOM_PODS, preemptor]
    config = Config.model_validate(
        {"preemption": {"make_room": {"enabled": True}, "tenants": {"rule": rule}}}
    )
    registry, recorder, api = CollectorRegistry(), FakeRecorder(), FakeApi()
    throttle = PreemptionThrottle(config, RecordSink(), registry=registry, clock=lambda: NOW)  # type: ignore[arg-type]
    for p in pods:
        throttle.observer.on_pod(WatchEvent(ADDED, p))
    throttle.observer.pods.synced.set()
    throttle.observer.on_event(WatchEvent(SYNCED, {}))
    m = model([node("n")], pods)
    throttle.use_gpu_model(m, lambda: S)
    if throttle.tenants.namespaces is not None and throttle.tenants.quotas is not None:
        throttle.tenants.namespaces.store = {o["metadata"]["name"]: o for o in NAMESPACES}
        throttle.tenants.quotas.store = {"b/q": QUOTAS[0]}
        throttle.tenants.namespaces.synced.set()
        throttle.tenants.quotas.synced.set()
    loop = RoomLoop(
        config, api, throttle=throttle, model=m, settings=lambda: S,  # type: ignore[arg-type]
        nodes=FakeInformer([node("n")]), registry=registry, clock=lambda: NOW, recorder=recorder,  # type: ignore[arg-type]
    )  # fmt: skip
    loop.pods = FakeInformer(pods)  # type: ignore[assignment]
    return loop, api, recorder, registry


async def test_make_room_refused_by_the_rule_evicts_nothing_and_says_why() -> None:
    loop, api, recorder, registry = room_loop("over-share")  # b holds 4 GPUs, its quota share is 4
    assert loop.ready()
    done = await loop.run_once()
    assert api.writes == [] and done.evicted == []
    (event,) = recorder.emitted
    assert event["reason"] == "PreemptionThrottled"
    assert "GPU preemption refused" in event["note"] and "tenant rule:" in event["note"]
    assert "which holds 4 GPUs of a 4-GPU share" in event["note"]
    assert registry.get_sample_value("gpuwarden_preemption_throttled_total", {"reason": "tenant"}) == 1
    assert registry.get_sample_value("gpuwarden_gpu_preemptions_total", {"outcome": "throttled"}) == 1
    table = done.to_dict()["tenants"]
    assert {r["tenant"]: (r["guaranteed"], r["held"], r["preemptable"]) for r in table} == {"b": (4, 4, 0)}


async def test_make_room_any_rule_evicts_as_before() -> None:
    loop, _, recorder, _ = room_loop("any")
    done = await loop.run_once()
    assert done.evicted == ["b/a"]
    assert [e["reason"] for e in recorder.emitted] == ["Preempted", "GPUPreempting"]
    assert done.to_dict()["tenants"] == []


def test_tenant_gpus_are_collected_on_scrape() -> None:
    registry = CollectorRegistry()
    verb_throttle("over-share", registry)
    # tenant a holds 2 (a2/mine), b holds 4 (b/theirs, b/other) of a 4-GPU quota share
    samples = {
        (s.labels["tenant"], s.labels["kind"]): s.value
        for metric in registry.collect()
        if metric.name == "gpuwarden_tenant_gpus"
        for s in metric.samples
    }
    assert samples == {
        ("a", "guaranteed"): 0.0,
        ("a", "held"): 2.0,
        ("a", "preemptable"): 2.0,
        ("b", "guaranteed"): 4.0,
        ("b", "held"): 4.0,
        ("b", "preemptable"): 0.0,
    }
    quiet = CollectorRegistry()
    verb_throttle("any", quiet)
    assert not [m for m in quiet.collect() if m.name == "gpuwarden_tenant_gpus"]


def test_gpuwarden_plan_prints_the_tenant_table() -> None:
    from controller.app import ControllerPlan

    rows = [
        {
            "tenant": "b",
            "rule": "over-share",
            "guaranteed": 4,
            "held": 6,
            "preemptable": 2,
            "namespaces": ["b"],
        },
    ]
    room = {"preemptions": [], "tenants": rows}
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, {}, room).render_table()
    assert table.endswith(
        "TENANTS (rule over-share): guaranteed / held / preemptable by others GPUs\n  b: 4 / 6 / 2  (b)"
    )
    quiet = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, {}, {"preemptions": []})
    assert "TENANTS" not in quiet.render_table()


def test_tenancy_snapshot_is_reused_for_a_second_then_rebuilt() -> None:
    from controller.preemption.tenancy import MAX_AGE_SECONDS, TenantFeed

    config = Config.model_validate({"preemption": {"tenants": {"rule": "within-tenant"}}})
    feed = TenantFeed(config, object())  # type: ignore[arg-type]
    assert feed.namespaces is not None
    feed.namespaces.store = {"b": {"metadata": {"name": "b", "labels": {"gpuwarden.io/tenant": "b"}}}}
    first = feed.tenancy(None, NOW)
    assert first is not None and first.tenant("b") == "b"
    feed.namespaces.store["b"]["metadata"]["labels"]["gpuwarden.io/tenant"] = "c"
    assert feed.tenancy(None, NOW + MAX_AGE_SECONDS / 2) is first
    later = feed.tenancy(None, NOW + MAX_AGE_SECONDS)
    assert later is not None and later.tenant("b") == "c"
    assert feed.tenancy(None) is not later  # without a clock: always fresh
