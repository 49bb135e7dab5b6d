"""A leader killed between any two writes of a quarantine (or release) loses nothing: the next leader's pass
finishes it, and its Event exists exactly once.

The act sequence of a quarantine is: (1) taint + record (Event pending), (2) GPUHealthy=False, (3) the Event,
named after the record, (4) the record's pending mark cleared. A release: (1) untaint + released record
(Event pending), (2) GPUHealthy=True, (3) the Event, (4) the mark cleared (or the record removed). Each row
kills the leader before write k+1: the real `Actuator` runs against an in-memory API that raises `Killed`
there; then a new leader (fresh Actuator and EventRecorder, no memory) plans from what the API holds and
applies. The API must end in the finished state with one Event, and a third pass must write nothing.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.health.act import Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import ConditionState, FleetSnapshot, NodeState, Taint
from gpuwarden.errors import KubeConflict, KubeNotFound
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, PatchType, Resource
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import GPU_HEALTHY_CONDITION, QUARANTINE_RECORD, QUARANTINE_TAINT, RELEASE
from tests.unit.test_health_fixtures import NOW, node, record


class Killed(Exception):
    """The leader's process died here (SIGKILL): nothing after this write happens."""


class Api:
    """Nodes and Events as the API server keeps them; Events are created by name (409 when it exists)."""

    def __init__(self, nodes: list[JsonObject], kill_before: int | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.events: dict[str, JsonObject] = {}
        self.writes = 0
        self.kill_before = kill_before

    def _write(self) -> None:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> JsonObject:
        if resource.kind != "Node" or name not in self.nodes:
            raise KubeNotFound(f"{resource.kind} {name}", status=404)
        return copy.deepcopy(self.nodes[name])

    async def patch(
        self, resource: Resource, name: str, body: Any, *, patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None, subresource: str | None = None, dry_run: bool = False,
    ) -> JsonObject:  # fmt: skip
        self._write()
        obj = self.nodes[name]
        if subresource == "status":
            conds = [c for c in obj["status"]["conditions"] if c["type"] != GPU_HEALTHY_CONDITION]
            obj["status"]["conditions"] = conds + body["status"]["conditions"]
            return obj
        if "spec" in body:
            obj["spec"]["taints"] = body["spec"]["taints"] or []
        for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
            if value is None:
                obj["metadata"]["annotations"].pop(key, None)
            else:
                obj["metadata"]["annotations"][key] = value
        return obj

    async def create(
        self, resource: Resource, body: JsonObject, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject:
        name = body["metadata"]["name"]
        if name in self.events:
            raise KubeConflict(f"events {name} already exists", status=409, reason="AlreadyExists")
        self._write()
        self.events[name] = body
        return body

    def reasons(self) -> list[str]:
        return sorted(e["reason"] for e in self.events.values())


def node_json(*, tainted: bool, annotations: dict[str, str], healthy: str) -> JsonObject:
    taints = [{"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}] if tainted else []
    return {
        "metadata": {"name": "n1", "resourceVersion": "1", "annotations": dict(annotations)},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": GPU_HEALTHY_CONDITION, "status": healthy, "reason": "x"}]},
    }


def snapshot(api: Api) -> FleetSnapshot:
    """What observe would build: the node as the API has it, GPU 0 still reporting XID 79."""
    obj = api.nodes["n1"]
    cond = next(c for c in obj["status"]["conditions"] if c["type"] == GPU_HEALTHY_CONDITION)
    state: NodeState = node(
        "n1",
        per_gpu={0: {"xids": (79,)}},
        taints=tuple(Taint(t["key"], t["value"], t["effect"]) for t in obj["spec"]["taints"]),
        annotations=obj["metadata"]["annotations"],
        condition=ConditionState(cond["status"], cond["reason"]),
    )
    return FleetSnapshot(NOW, (state,))


async def leader_pass(api: Api, now: float) -> HealthPlan:
    """One pass of a leader with no memory of the last one: plan from the API, apply."""
    recorder = EventRecorder(api, component="health", instance="leader")  # type: ignore[arg-type]
    actuator = Actuator(api, recorder, HealthMetrics(CollectorRegistry()), namespace="gpuwarden")  # type: ignore[arg-type]
    plan = plan_quarantine(snapshot(api), HealthPolicy(), now)
    await actuator.apply(plan)
    return plan


def run_with_kill(api: Api, now: float) -> bool:
    try:
        asyncio.run(leader_pass(api, now))
    except Killed:
        return True
    return False


QUARANTINE_WRITES = ["taint+record", "condition", "event", "clear-mark"]


@pytest.mark.parametrize("k", range(len(QUARANTINE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_quarantine_killed_between_writes_is_finished_once(k: int) -> None:
    api = Api([node_json(tainted=False, annotations={}, healthy="True")], kill_before=k)
    killed = run_with_kill(api, NOW)
    assert killed == (k < len(QUARANTINE_WRITES))
    assert api.writes == k
    api.kill_before = None
    second = asyncio.run(leader_pass(api, NOW + 15))  # the next leader

    obj = api.nodes["n1"]
    assert [t["key"] for t in obj["spec"]["taints"]] == [QUARANTINE_TAINT]
    rec, _ = decode(obj["metadata"]["annotations"][QUARANTINE_RECORD])
    assert rec is not None and rec.state == "quarantined" and not rec.event_pending
    assert obj["status"]["conditions"][0]["status"] == "False"
    assert api.reasons() == ["GPUQuarantined"]
    kinds = {a.kind for a in second.actions}
    if k == 0:
        assert kinds == {"quarantine"}  # nothing was written: quarantined afresh
    elif k < len(QUARANTINE_WRITES):
        assert kinds == {"finish-event"}  # the half-done quarantine is finished, not repeated
    else:
        assert kinds == set()
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30))
    assert api.writes == writes, "a finished quarantine must need no further writes"


RELEASE_WRITES = ["untaint+record", "condition", "event", "clear-mark"]


@pytest.mark.parametrize("k", range(len(RELEASE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_release_killed_between_writes_is_finished_once(k: int) -> None:
    rec = record(at=NOW - 3600)
    annotations = {QUARANTINE_RECORD: rec.encode(), RELEASE: "now"}
    api = Api([node_json(tainted=True, annotations=annotations, healthy="False")], kill_before=k)
    run_with_kill(api, NOW)
    assert api.writes == k
    api.kill_before = None
    asyncio.run(leader_pass(api, NOW + 15))

    obj = api.nodes["n1"]
    assert obj["spec"]["taints"] == []
    assert RELEASE not in obj["metadata"]["annotations"]
    after, _ = decode(obj["metadata"]["annotations"].get(QUARANTINE_RECORD))
    # The operator's release dismisses the evidence: the released record keeps it; no Event pending.
    assert after is not None and after.state == "released" and not after.event_pending
    assert obj["status"]["conditions"][0]["status"] == "True"
    assert api.reasons() == ["GPUQuarantineReleased"]
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30))
    assert api.writes == writes


def test_legacy_record_without_mark_is_not_evented_again() -> None:
    """A record written before the mark existed counts as evented: an upgrade writes no duplicate."""
    rec = record(at=NOW - 3600)
    api = Api([node_json(tainted=True, annotations={QUARANTINE_RECORD: rec.encode()}, healthy="False")])
    asyncio.run(leader_pass(api, NOW))
    assert api.events == {}


def test_event_name_survives_the_record_round_trip() -> None:
    """The first leader names the Event from `now`; the next from the record it reads back."""
    api = Api([node_json(tainted=False, annotations={}, healthy="True")], kill_before=1)
    plan = plan_quarantine(snapshot(api), HealthPolicy(), NOW + 0.75)
    (action,) = plan.actions
    assert action.record is not None and action.event is not None
    back, _ = decode(action.record.encode())
    assert back is not None
    from controller.health.decide import quarantine_event_name

    assert quarantine_event_name("n1", back) == action.event.name


def test_release_requested_before_the_next_leader_still_gets_the_quarantine_event() -> None:
    """Killed after the taint, then an operator asks for a release before the next pass: both Events."""
    api = Api([node_json(tainted=False, annotations={}, healthy="True")], kill_before=2)
    assert run_with_kill(api, NOW)
    api.nodes["n1"]["metadata"]["annotations"][RELEASE] = "now"
    api.kill_before = None
    asyncio.run(leader_pass(api, NOW + 15))
    assert api.reasons() == ["GPUQuarantineReleased", "GPUQuarantined"]
    assert api.nodes["n1"]["spec"]["taints"] == []
