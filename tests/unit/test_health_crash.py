"""A leader killed between any two writes of a health action loses nothing: the next leader's pass finishes
it, and its Event exists exactly once.

The act sequences:
- quarantine: (1) taint + record (Event pending), (2) GPUHealthy=False, (3) the Event, named after the
  record, (4) the record's pending mark cleared;
- release: (1) untaint + released record (Event pending), (2) GPUHealthy=True, (3) the Event, (4) the mark
  cleared (or the record removed);
- degrade / clear-degraded: (1) the `gpuwarden.io/degradation` mark, (2) GPUDegraded, (3) the Event, named
  after the mark, (4) the mark removed;
- start-validation: (1) the Job, (2) the record naming it (its Event owed), (3) GPUValidationStarted, named
  after the quarantine and the attempt, (4) the record's validation mark cleared;
- a failed validation: (1) the record (failure appended, its Event owed), (2) GPUValidationFailed (or
  Exhausted), (3) the mark cleared.
Each row kills the leader before write k+1: the real `Actuator` runs against an in-memory API that raises
`Killed` there; then a new leader (fresh Actuator and EventRecorder, no memory) plans from what the API holds
and applies. The API must end in the finished state with one Event, and a further pass must write no Event.
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
from controller.health.degrade import REASON_DEGRADED
from controller.health.metrics import HealthMetrics
from controller.health.observe import breaker_state, node_state
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot, JobState
from controller.health.validation import job_name, validation_event_name
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.config.health_validation import ValidationConfig
from gpuwarden.errors import KubeConflict, KubeForbidden, KubeNotFound
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, PatchType, Resource
from gpuwarden.quarantine import QuarantineRecord, decode
from gpuwarden.wellknown import (
    DEGRADATION,
    GPU_DEGRADED_CONDITION,
    GPU_HEALTHY_CONDITION,
    QUARANTINE_RECORD,
    QUARANTINE_TAINT,
    RELEASE,
)
from tests.unit.test_health_fixtures import NOW, node, record


class Killed(Exception):
    """The leader's process died here (SIGKILL): nothing after this write happens."""


class Api:
    """Nodes, Events and Jobs as the API server keeps them; Events and Jobs are created by name (409 when
    one exists). `job_state` says how every Job is doing (observe reads it from the Job's conditions)."""

    def __init__(self, nodes: list[JsonObject], kill_before: int | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.configmaps: dict[str, JsonObject] = {}  # the breaker's state
        self.events: dict[str, JsonObject] = {}
        self.jobs: dict[str, JsonObject] = {}
        self.job_state = JobState("", "running")
        self.refuse_events = False  # RBAC without events create: every Event answered 403
        self.writes = 0
        self.kill_before = kill_before

    def _write(self) -> None:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> JsonObject:
        if resource.kind == "ConfigMap" and name in self.configmaps:
            return copy.deepcopy(self.configmaps[name])
        if resource.kind != "Node" or name not in self.nodes:
            raise KubeNotFound(f"{resource.kind} {name}", status=404)
        return copy.deepcopy(self.nodes[name])

    async def patch(
        self, resource: Resource, name: str, body: Any, *, patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None, subresource: str | None = None, dry_run: bool = False,
    ) -> JsonObject:  # fmt: skip
        if resource.kind == "ConfigMap":
            if name not in self.configmaps:
                raise KubeNotFound(f"configmaps {name}", status=404)
            self._write()
            cm = self.configmaps[name]
            cm["data"].update(body.get("data") or {})
            for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
                if value is None:
                    cm["metadata"].setdefault("annotations", {}).pop(key, None)
                else:
                    cm["metadata"].setdefault("annotations", {})[key] = value
            return cm
        self._write()
        obj = self.nodes[name]
        if subresource == "status":  # strategic merge of conditions by type
            new = {c["type"]: c for c in body["status"]["conditions"]}
            kept = [c for c in obj["status"]["conditions"] if c["type"] not in new]
            obj["status"]["conditions"] = kept + list(new.values())
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
        store = {"Job": self.jobs, "ConfigMap": self.configmaps}.get(resource.kind, self.events)
        if store is self.events and self.refuse_events:
            raise KubeForbidden("events is forbidden", status=403)
        name = body["metadata"]["name"]
        if name in store:
            raise KubeConflict(f"{resource.plural} {name} already exists", status=409, reason="AlreadyExists")
        self._write()
        store[name] = body
        return body

    def reasons(self) -> list[str]:
        return sorted(e["reason"] for e in self.events.values())

    def condition(self, kind: str) -> JsonObject | None:
        return next((c for c in self.nodes["n1"]["status"]["conditions"] if c["type"] == kind), None)

    def record(self) -> QuarantineRecord | None:
        return decode(self.nodes["n1"]["metadata"]["annotations"].get(QUARANTINE_RECORD))[0]


def node_json(
    *,
    tainted: bool,
    annotations: dict[str, str],
    healthy: str,
    degraded: str | None = None,
    boot: str = "boot-1",
) -> JsonObject:
    taints = [{"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}] if tainted else []
    conditions = [{"type": GPU_HEALTHY_CONDITION, "status": healthy, "reason": "x"}]
    if degraded is not None:
        conditions.append({"type": GPU_DEGRADED_CONDITION, "status": "True", "reason": REASON_DEGRADED,
                           "message": degraded})  # fmt: skip
    return {
        "metadata": {"name": "n1", "resourceVersion": "1", "annotations": dict(annotations)},
        "spec": {"taints": taints},
        "status": {
            "conditions": conditions,
            "capacity": {"nvidia.com/gpu": "8"},
            "nodeInfo": {"bootID": boot},
        },
    }


XID_79: dict[int, dict[str, Any]] = {0: {"xids": (79,)}}
QUIET: dict[int, dict[str, Any]] = {}
DEFAULT = HealthPolicy()


def snapshot(api: Api, per_gpu: dict[int, dict[str, Any]] = XID_79) -> FleetSnapshot:
    """What observe would build: the node as the API has it (observe's own `node_state`), its GPUs' telemetry
    as given, and our validation Jobs."""
    jobs = {name: replace(api.job_state, name=name) for name in api.jobs}
    gpus = node("n1", per_gpu=copy.deepcopy(per_gpu)).gpus
    breaker = breaker_state(api.configmaps.get(BREAKER_CONFIGMAP))
    node_n1 = replace(node_state(api.nodes["n1"]), gpus=gpus, validation_jobs=jobs)
    return FleetSnapshot(NOW, (node_n1,), breaker=breaker)


async def leader_pass(
    api: Api, now: float, policy: HealthPolicy = DEFAULT, per_gpu: dict[int, dict[str, Any]] = XID_79
) -> HealthPlan:
    """One pass of a leader with no memory of the last one (no debounce streaks): plan from the API, apply."""
    recorder = EventRecorder(api, component="health", instance="leader")  # type: ignore[arg-type]
    actuator = Actuator(api, recorder, HealthMetrics(CollectorRegistry()), namespace="gpuwarden")  # type: ignore[arg-type]
    plan = plan_quarantine(snapshot(api, per_gpu), policy, now)
    await actuator.apply(plan)
    return plan


def killed_then_next(
    api: Api, k: int, writes: int, policy: HealthPolicy, per_gpu: dict[int, dict[str, Any]]
) -> HealthPlan:
    """A leader killed before write k+1 of a pass of `writes` writes; then the next leader's pass, 15 s on."""
    api.kill_before = k
    assert run_with_kill(api, NOW, policy, per_gpu) == (k < writes)
    assert api.writes == k
    api.kill_before = None
    return asyncio.run(leader_pass(api, NOW + 15, policy, per_gpu))


def run_with_kill(
    api: Api, now: float, policy: HealthPolicy = DEFAULT, per_gpu: dict[int, dict[str, Any]] = XID_79
) -> bool:
    try:
        asyncio.run(leader_pass(api, now, policy, per_gpu))
    except Killed:
        return True
    return False


QUARANTINE_WRITES = ["breaker-start", "taint+record", "condition", "event", "clear-mark"]


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
    if k <= 1:
        assert kinds == {"quarantine"}  # nothing on the node yet: quarantined afresh (start counted twice)
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


# --- degrade: mark → GPUDegraded → Event → mark removed -----------------------------------------------------

HOT: dict[int, dict[str, Any]] = {0: {"clock_event_reasons": 0x40}}  # hw_thermal, graded `degrade`
DEGRADE_AT_ONCE = HealthPolicy(signals=SignalsConfig.model_validate({"hw_thermal": {"consecutive": 1}}))
DEGRADED_MESSAGE = "degraded by gpuwarden: hw-thermal on GPU-n1-0"
DEGRADE_WRITES = ["mark", "condition", "event", "unmark"]


@pytest.mark.parametrize(
    ("start", "telemetry", "status", "event", "kind"),
    [
        pytest.param(None, HOT, "True", "GPUDegraded", "degrade", id="degrade"),
        pytest.param(DEGRADED_MESSAGE, QUIET, "False", "GPUDegradationCleared", "clear-degraded", id="clear"),
    ],
)
@pytest.mark.parametrize("k", range(len(DEGRADE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_degradation_killed_between_writes_is_finished_once(
    k: int, start: str | None, telemetry: dict[int, dict[str, Any]], status: str, event: str, kind: str
) -> None:
    api = Api([node_json(tainted=False, annotations={}, healthy="True", degraded=start)])
    second = killed_then_next(api, k, len(DEGRADE_WRITES), DEGRADE_AT_ONCE, telemetry)

    cond = api.condition(GPU_DEGRADED_CONDITION)
    assert cond is not None and cond["status"] == status
    assert DEGRADATION not in api.nodes["n1"]["metadata"]["annotations"]
    assert api.reasons() == [event]
    kinds = {a.kind for a in second.actions}
    assert kinds == ({kind} if k == 0 else {"finish-event"} if k < len(DEGRADE_WRITES) else set())
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30, DEGRADE_AT_ONCE, telemetry))
    assert api.writes == writes, "a finished change must need no further writes"


def test_degradation_decided_then_gone_is_finished_then_cleared() -> None:
    """Killed after the mark; by the next pass the signal is gone: the change is finished as decided (the
    Event never without its condition), and the pass after clears it with an Event of its own."""
    api = Api([node_json(tainted=False, annotations={}, healthy="True")], kill_before=1)
    assert run_with_kill(api, NOW, DEGRADE_AT_ONCE, HOT)
    api.kill_before = None
    first = asyncio.run(leader_pass(api, NOW + 15, DEGRADE_AT_ONCE, QUIET))
    assert [a.kind for a in first.actions] == ["finish-event"]
    assert api.reasons() == ["GPUDegraded"]
    second = asyncio.run(leader_pass(api, NOW + 30, DEGRADE_AT_ONCE, QUIET))
    assert [a.kind for a in second.actions] == ["clear-degraded"]
    assert api.reasons() == ["GPUDegradationCleared", "GPUDegraded"]
    cond = api.condition(GPU_DEGRADED_CONDITION)
    assert cond is not None and cond["status"] == "False"


def test_degradation_mark_is_finished_while_telemetry_is_unknown() -> None:
    api = Api([node_json(tainted=False, annotations={}, healthy="True")], kill_before=1)
    assert run_with_kill(api, NOW, DEGRADE_AT_ONCE, HOT)
    api.kill_before = None
    snap = replace(snapshot(api, HOT), prometheus_ok=False, prometheus_error="down")
    plan = plan_quarantine(snap, DEGRADE_AT_ONCE, NOW + 15)
    assert [a.kind for a in plan.actions] == ["finish-event"]


# --- validation: Job → record (Event owed) → Event → mark cleared -------------------------------------------

TEMPLATE = """
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      containers: [{name: diag, image: dcgm, resources: {limits: {nvidia.com/gpu: 8}}}]
"""
VALIDATE = HealthPolicy(
    validation=ValidationConfig(enabled=True, job_template=TEMPLATE, timeout_seconds=600, max_attempts=2),
    healthy_period=1800,
)
START_WRITES = ["job", "record", "event", "clear-mark"]


def ready_to_validate(**changes: Any) -> Api:
    """Quarantined for XID 79, evidence gone for the healthy period, rebooted since: validation is due."""
    rec = record(at=NOW - 7200, healthy_since=NOW - 3600).with_(**changes)
    annotations = {QUARANTINE_RECORD: rec.encode()}
    return Api([node_json(tainted=True, annotations=annotations, healthy="False", boot="boot-2")])


@pytest.mark.parametrize("k", range(len(START_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_validation_start_killed_between_writes_is_finished_once(k: int) -> None:
    api = ready_to_validate()
    second = killed_then_next(api, k, len(START_WRITES), VALIDATE, QUIET)

    rec = api.record()
    assert (
        rec is not None
        and rec.validation_job == job_name("n1", 1, NOW - 7200)
        and rec.validation_attempts == 1
    )
    assert rec.validation_event == ""
    assert list(api.jobs) == [job_name("n1", 1, NOW - 7200)]
    assert api.reasons() == ["GPUValidationStarted"]
    kinds = {a.kind for a in second.actions}
    assert kinds == ({"start-validation"} if k < 2 else {"finish-event"} if k < len(START_WRITES) else set())
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30, VALIDATE, QUIET))  # the Job runs: skip validation-running
    assert api.writes == writes


FAIL_WRITES = ["record", "event", "clear-mark"]


@pytest.mark.parametrize(
    ("attempt", "event"),
    [
        pytest.param(1, "GPUValidationFailed", id="failed"),
        pytest.param(2, "GPUValidationExhausted", id="exhausted"),
    ],
)
@pytest.mark.parametrize("k", range(len(FAIL_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_validation_failure_killed_between_writes_is_finished_once(k: int, attempt: int, event: str) -> None:
    job = job_name("n1", attempt)
    earlier = ("attempt 1 failed",) * (attempt - 1)
    api = ready_to_validate(validation_job=job, validation_started=NOW - 60, validation_attempts=attempt,
                            validation_failures=earlier)  # fmt: skip
    api.jobs[job] = {}
    api.job_state = JobState("", "failed", "BackoffLimitExceeded")
    second = killed_then_next(api, k, len(FAIL_WRITES), VALIDATE, QUIET)

    rec = api.record()
    assert rec is not None and rec.validation_job == "" and rec.validation_event == ""
    assert rec.validation_failures == (*earlier, f"Job {job} failed: BackoffLimitExceeded")
    assert api.reasons() == [event]
    kinds = [a.kind for a in second.actions]
    if k == 0:
        assert kinds == ["update-record"]  # nothing written: the failure is recorded afresh
    elif k < len(FAIL_WRITES):
        assert kinds == ["finish-event"]  # the Event first; the healthy period starts one pass later
    for later in (30, 45):
        asyncio.run(leader_pass(api, NOW + later, VALIDATE, QUIET))
    assert api.reasons() == [event], "no Event repeated by the passes that follow"


def test_release_requested_while_a_validation_event_is_owed_waits_one_pass() -> None:
    """Killed after the record named the Job; an operator asks for a release before the next pass: the
    validation's Event first (nothing else that pass), then the release - each Event once."""
    api = ready_to_validate()
    api.kill_before = 2
    assert run_with_kill(api, NOW, VALIDATE, QUIET)
    api.nodes["n1"]["metadata"]["annotations"][RELEASE] = "now"
    api.kill_before = None
    first = asyncio.run(leader_pass(api, NOW + 15, VALIDATE, QUIET))
    assert [a.kind for a in first.actions] == ["finish-event"]
    second = asyncio.run(leader_pass(api, NOW + 30, VALIDATE, QUIET))
    assert [a.kind for a in second.actions] == ["release"]
    assert api.reasons() == ["GPUQuarantineReleased", "GPUValidationStarted"]
    assert api.nodes["n1"]["spec"]["taints"] == []


def test_validation_event_names_are_one_per_quarantine_attempt_and_step() -> None:
    rec = record(at=NOW - 7200).with_(validation_attempts=2, validation_event="GPUValidationFailed")
    assert validation_event_name("n1", rec) == f"n1.gpuvalidationfailed.{int(NOW - 7200):x}.2"
    back, _ = decode(rec.encode())
    assert back is not None and validation_event_name("n1", back) == validation_event_name("n1", rec)
    assert validation_event_name("n1", rec.with_(validation_event="GPUValidationStarted")) != (
        validation_event_name("n1", rec)
    )


def test_an_event_the_api_refuses_does_not_hold_up_the_node() -> None:
    """Events forbidden (RBAC): the validation is recorded, its mark given up at once (logged), and the next
    pass follows the Job as usual instead of retrying the Event forever."""
    api = ready_to_validate()
    api.refuse_events = True
    asyncio.run(leader_pass(api, NOW, VALIDATE, QUIET))
    rec = api.record()
    assert (
        rec is not None and rec.validation_job == job_name("n1", 1, NOW - 7200) and rec.validation_event == ""
    )
    plan = asyncio.run(leader_pass(api, NOW + 15, VALIDATE, QUIET))
    assert [a.kind for a in plan.actions] == [] and plan.skips_of("validation-running")
