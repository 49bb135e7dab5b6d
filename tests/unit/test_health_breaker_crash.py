"""The quarantine circuit breaker across a killed leader: its window keeps counting, its Events exist once.

The act sequence of a pass (act.py `Actuator.apply`): (1) the breaker's state - the window's quarantine
starts (this pass's included, before their taints), the transition, the Events it owes; (2) each owed
Event, named after the breaker object, its reason and the episode's `opened_at`; (3) the state without the
owed Events; then the admitted quarantines' own writes (taint + record, condition, Event, mark). Each row
kills the leader before write k+1 (the real `Actuator` against the in-memory API of test_health_crash);
a new leader with no memory then runs passes from what the API holds. What the next pass does with each
half-done state is in the row: a start stored without its taint counts (the safe side: fewer quarantines).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.health.act import BREAKER_CONFIGMAP, Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.observe import breaker_state, encode_breaker, node_state
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import BreakerEvent, BreakerState, FleetSnapshot
from gpuwarden.errors import KubeError
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, Resource
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import BREAKER_RESET, GPU_HEALTHY_CONDITION, QUARANTINE_RECORD
from tests.unit.test_health_crash import Api, Killed
from tests.unit.test_health_fixtures import NOW, node, record

NODES = ("n1", "n2", "n3")
POLICY = HealthPolicy(breaker_max_new_per_window=1)


def node_json(name: str, annotations: dict[str, str] | None = None) -> JsonObject:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "annotations": dict(annotations or {})},
        "spec": {"taints": []},
        "status": {
            "conditions": [{"type": GPU_HEALTHY_CONDITION, "status": "True", "reason": "x"}],
            "capacity": {"nvidia.com/gpu": "8"},
            "nodeInfo": {"bootID": "boot-1"},
        },
    }


def breaker_cm(state: BreakerState, *, reset: bool = False) -> JsonObject:
    meta: JsonObject = {"name": BREAKER_CONFIGMAP, "annotations": {BREAKER_RESET: "now"} if reset else {}}
    return {"metadata": meta, "data": {"state": encode_breaker(state)}}


def api_with(faulty: tuple[str, ...], breaker: JsonObject | None = None) -> Api:
    api = Api([node_json(n) for n in NODES])
    api.faulty = faulty  # type: ignore[attr-defined]
    if breaker is not None:
        api.configmaps[BREAKER_CONFIGMAP] = breaker
    return api


def snapshot(api: Api, now: float) -> FleetSnapshot:
    faulty = api.faulty  # type: ignore[attr-defined]
    nodes = tuple(
        replace(
            node_state(obj),
            gpus=node(name, per_gpu={0: {"xids": (79,)}} if name in faulty else {}).gpus,
        )
        for name, obj in sorted(api.nodes.items())
    )
    return FleetSnapshot(
        now, nodes, breaker=breaker_state(copy.deepcopy(api.configmaps.get(BREAKER_CONFIGMAP)))
    )


async def leader_pass(api: Api, now: float, policy: HealthPolicy = POLICY) -> HealthPlan:
    recorder = EventRecorder(api, component="health", instance="leader")  # type: ignore[arg-type]
    actuator = Actuator(api, recorder, HealthMetrics(CollectorRegistry()), namespace="gpuwarden")  # type: ignore[arg-type]
    plan = plan_quarantine(snapshot(api, now), policy, now)
    await actuator.apply(plan)
    return plan


def killed_at(api: Api, k: int, writes: int, policy: HealthPolicy = POLICY) -> None:
    """The first leader's pass, killed before write k+1 (of `writes`); then two passes of the next leader."""
    api.kill_before = k
    try:
        asyncio.run(leader_pass(api, NOW, policy))
        killed = False
    except Killed:
        killed = True
    assert killed == (k < writes) and api.writes == k
    api.kill_before = None
    asyncio.run(leader_pass(api, NOW + 15, policy))
    asyncio.run(leader_pass(api, NOW + 30, policy))


def stored(api: Api) -> BreakerState:
    return breaker_state(api.configmaps.get(BREAKER_CONFIGMAP))


def quarantined(api: Api) -> list[str]:
    return sorted(n for n, obj in api.nodes.items() if obj["spec"]["taints"])


def reasons(api: Api) -> list[str]:
    return api.reasons()


OPEN_WRITES = ["state", "open-event", "state-settled", "taint+record", "condition", "event", "clear-mark"]


@pytest.mark.parametrize(
    ("k", "n1_quarantined"),
    [
        pytest.param(0, True, id="killed-before-anything: the next leader trips and admits n1"),
        pytest.param(1, False, id="after-state: n1's start counts, the open breaker admits none"),
        pytest.param(2, False, id="after-open-event: the same, the Event not repeated"),
        pytest.param(3, False, id="after-state-settled: the same"),
        pytest.param(4, True, id="after-taint: n1's quarantine is finished"),
        pytest.param(5, True, id="after-condition"),
        pytest.param(6, True, id="after-quarantine-event"),
        pytest.param(7, True, id="not-killed"),
    ],
)
def test_breaker_open_killed_between_writes(k: int, n1_quarantined: bool) -> None:
    """Three faulty nodes, one new quarantine per window: the breaker opens and admits n1 only."""
    api = api_with(NODES)
    killed_at(api, k, len(OPEN_WRITES))
    after = stored(api)
    assert after.open and after.owed == ()
    assert quarantined(api) == (["n1"] if n1_quarantined else [])
    assert reasons(api) == ["GPUQuarantined"] * n1_quarantined + ["QuarantineBreakerOpen"]
    assert {n for n, _ in after.starts} == {"n1"}, "n1's start is counted whether or not its taint landed"
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 45))
    assert api.writes == writes, "nothing left half-done"


CLOSE_WRITES = ["state", "close-event", "state-settled", "taint+record", "condition", "event", "clear-mark"]


@pytest.mark.parametrize("k", range(len(CLOSE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_breaker_close_killed_between_writes(k: int) -> None:
    """Open, clear for the hold time, one faulty node: it closes and admits n1. Killed after the state, the
    next leader finds it closed with n1's start counted; one new per window still fits (the start it
    stored plus the new one is the safe side's over-count, not a second quarantine)."""
    was = BreakerState(True, NOW - 5000, NOW - 1000, "trip")
    api = api_with(("n1",), breaker_cm(was))
    killed_at(api, k, len(CLOSE_WRITES), replace(POLICY, breaker_max_new_per_window=3))
    after = stored(api)
    assert not after.open and after.owed == ()
    assert quarantined(api) == ["n1"]
    assert reasons(api) == ["GPUQuarantined", "QuarantineBreakerClosed"]
    closed = next(e for e in api.events.values() if e["reason"] == "QuarantineBreakerClosed")
    assert closed["metadata"]["name"] == f"{BREAKER_CONFIGMAP}.quarantinebreakerclosed.{int(NOW - 5000):x}"
    rec, _ = decode(api.nodes["n1"]["metadata"]["annotations"][QUARANTINE_RECORD])
    assert rec is not None and not rec.event_pending


RESET_WRITES = ["state (reset annotation removed)", "close-event", "state-settled"]


@pytest.mark.parametrize("k", range(len(RESET_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_breaker_reset_killed_between_writes(k: int) -> None:
    """An operator resets an open breaker: closed, the reset annotation removed, one Closed Event."""
    api = api_with((), breaker_cm(BreakerState(True, NOW - 600, None, "trip"), reset=True))
    killed_at(api, k, len(RESET_WRITES))
    after = stored(api)
    assert not after.open and after.owed == () and not after.reset_requested
    assert BREAKER_RESET not in api.configmaps[BREAKER_CONFIGMAP]["metadata"]["annotations"]
    assert reasons(api) == ["QuarantineBreakerClosed"]


def churn_snapshot(starts: tuple[tuple[str, float], ...], **n1: Any) -> FleetSnapshot:
    """n1 healthy (its quarantine released, or never), n2 newly faulty; the breaker state as given."""
    nodes = (node("n1", **n1), node("n2", per_gpu={0: {"xids": (79,)}}), node("n3"))
    return FleetSnapshot(NOW, nodes, breaker=BreakerState(starts=starts))


@pytest.mark.parametrize(
    ("snap", "n2_admitted", "new_in_window"),
    [
        pytest.param(churn_snapshot(()), True, 0, id="no-quarantine-in-the-window"),
        pytest.param(
            churn_snapshot((("n1", NOW - 600),)), False, 1, id="released-record-gone-start-remembered"
        ),
        pytest.param(
            churn_snapshot((), rec=record(at=NOW - 600).with_(state="released", released_at=NOW - 60)),
            False,
            1,
            id="start-only-in-the-record(older-version)",
        ),
        pytest.param(
            churn_snapshot(
                (("n1", NOW - 600),), rec=record(at=NOW - 600).with_(state="released", released_at=NOW - 60)
            ),
            False,
            1,
            id="start-in-both-counts-once",
        ),
        pytest.param(churn_snapshot((("n1", NOW - 3601),)), True, 0, id="start-older-than-the-window"),
    ],
)
def test_window_counts_released_quarantines(
    snap: FleetSnapshot, n2_admitted: bool, new_in_window: int
) -> None:
    """Quarantine/release churn grants no fresh budget: a released quarantine still counts in the window."""
    plan = plan_quarantine(snap, POLICY, NOW)
    assert plan.breaker.new_in_window == new_in_window
    assert bool(plan.actions_of("quarantine")) is n2_admitted
    assert plan.breaker.after.open is not n2_admitted
    kept = {s for s in plan.breaker.after.starts if s[0] == "n1"}
    assert kept == {s for s in snap.breaker.starts if s[1] >= NOW - 3600}, "the state prunes only old starts"


def test_breaker_state_round_trip() -> None:
    state = BreakerState(
        True, NOW - 60, None, "trip", starts=(("n1", NOW - 60), ("n2", NOW)),
        owed=(BreakerEvent("QuarantineBreakerOpen", NOW - 60, "circuit breaker open: x"),),
    )  # fmt: skip
    assert breaker_state(breaker_cm(state)) == state
    old = {"metadata": {"name": BREAKER_CONFIGMAP}, "data": {"state": '{"open": false}'}}
    assert breaker_state(old) == BreakerState(), "a state stored by an older version reads as before"
    cleared = {**old, "metadata": {"name": BREAKER_CONFIGMAP, "annotations": {BREAKER_RESET: None}}}
    assert breaker_state(cleared) == BreakerState(), (
        "a reset annotation cleared by a patch (null) is no reset"
    )


class NoConfigMapWrites(Api):
    """The API refuses every write of the breaker's ConfigMap (e.g. a 500) while `refuse` holds."""

    refuse = True

    async def patch(self, resource: Resource, name: str, body: Any, **kw: Any) -> JsonObject:
        if resource.kind == "ConfigMap" and self.refuse:
            raise KubeError("internal error", status=500)
        return await super().patch(resource, name, body, **kw)

    async def create(self, resource: Resource, body: JsonObject, **kw: Any) -> JsonObject:
        if resource.kind == "ConfigMap" and self.refuse:
            raise KubeError("internal error", status=500)
        return await super().create(resource, body, **kw)


def test_no_taint_while_its_start_cannot_be_stored() -> None:
    """A quarantine whose start the breaker state cannot record waits: an uncounted taint could exceed the
    window's budget after its release. Other actions are not held up."""
    api = NoConfigMapWrites([node_json(n) for n in NODES])
    api.faulty = ("n1",)  # type: ignore[attr-defined]
    plan = asyncio.run(leader_pass(api, NOW))
    assert plan.actions_of("quarantine") and quarantined(api) == [] and api.events == {}
    api.refuse = False
    asyncio.run(leader_pass(api, NOW + 15))
    assert quarantined(api) == ["n1"] and {n for n, _ in stored(api).starts} == {"n1"}
