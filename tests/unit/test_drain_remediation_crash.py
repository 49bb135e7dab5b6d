"""A leader killed between any two writes of a remediation transition: the next leader finishes it, and
its Event exists exactly once.

The act sequence of a transition: (1) the new step's object (object steps only), (2) markers + the state,
owing the Event (and the finished step object's deletion), (3) the deletion (when one is owed), (4) the
Event, named after the state, (5) the debt cleared. Each row kills the leader before write k+1 (the real
`inputs`, `decide` and `Handoff` against an in-memory API that raises `Killed` there); new leaders with no
memory then run passes from what the API holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from dataclasses import replace
from typing import Any

import pytest

from controller.drain.handoff import Handoff, inputs, settle_patch
from controller.drain.observe import build_snapshot
from controller.drain.remediation import RemediationState, decide, decode
from controller.drain.state import DrainState
from gpuwarden.config.remediation import RemediationConfig
from gpuwarden.errors import KubeConflict, KubeNotFound
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, Resource
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN, QUARANTINE_RECORD, QUARANTINE_TAINT, REMEDIATION
from tests.unit.test_drain_remediation import POLICY

NOW = 1_700_000_000.0
GPU = "nvidia.com/gpu"
REBOOT = "remediation.example.com/reboot"
REPLACE = "remediation.example.com/replace"
OBJECTS = "/apis/e2e.gpuwarden.io/v1/gpuresets"


class Killed(Exception):
    """The leader's process died here (SIGKILL)."""


class Api:
    """The Node, the step objects (by path) and Events (created by name: 409 when one exists)."""

    def __init__(self, *, state: RemediationState | None, quarantined: bool = True) -> None:
        rec = QuarantineRecord(
            "quarantined", "xid-79", evidence=(Evidence("xid-79", "GPU-0"),), quarantined_at=NOW
        )
        annotations = {DRAIN: DrainState(started=NOW - 600, done=NOW - 500).encode()}
        if quarantined:
            annotations[QUARANTINE_RECORD] = rec.encode()
        if state is not None:
            annotations[REMEDIATION] = state.encode()
        taints = [{"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}] if quarantined else []
        self.node: JsonObject = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "1", "annotations": annotations, "labels": {}},
            "spec": {"taints": taints}, "status": {"allocatable": {GPU: "8"}},
        }  # fmt: skip
        self.objects: dict[str, JsonObject] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.events: dict[str, JsonObject] = {}
        self.writes = 0
        self.kill_before: int | None = None

    def _write(self) -> None:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1

    async def get(self, resource: Resource, name: str, **_: Any) -> JsonObject:
        return copy.deepcopy(self.node)

    async def patch(self, resource: Resource, name: str, body: Any, **_: Any) -> JsonObject:
        self._write()
        meta = self.node["metadata"]
        for part in ("annotations", "labels"):
            for key, value in (body["metadata"].get(part) or {}).items():
                if value is None:
                    meta[part].pop(key, None)
                else:
                    meta[part][key] = value
        return self.node

    async def request(self, method: str, path: str, **kw: Any) -> JsonObject:
        if method == "GET":
            if path not in self.objects:
                raise KubeNotFound(path, status=404)
            return self.objects[path]
        if method == "DELETE":
            if path not in self.objects:
                raise KubeNotFound(path, status=404)
            self._write()
            self.deleted.append(path)
            return self.objects.pop(path)
        path = f"{path}/{kw['body']['metadata']['name']}"  # POST to the collection
        if path in self.objects:
            raise KubeConflict("already exists", status=409, reason="AlreadyExists")
        self._write()
        self.objects[path] = kw["body"]
        self.created.append(path)
        return kw["body"]

    async def create(self, resource: Resource, body: JsonObject, **_: Any) -> JsonObject:
        if body["metadata"]["name"] in self.events:
            raise KubeConflict("already exists", status=409, reason="AlreadyExists")
        self._write()
        self.events[body["metadata"]["name"]] = body
        return body

    def state(self) -> RemediationState | None:
        return decode(self.node["metadata"]["annotations"].get(REMEDIATION))

    def reasons(self) -> list[str]:
        return sorted(e["reason"] for e in self.events.values())


async def leader_pass(api: Api, now: float, policy: RemediationConfig = POLICY) -> None:
    """One hand-off pass of a leader with no memory (what DrainLoop._remediate does for the node)."""
    snap = build_snapshot([api.node], [], resource=GPU)
    view = inputs(api.node, snap, {n.name: n for n in snap.nodes})
    if view is None:
        return
    handoff = Handoff(api, EventRecorder(api, component="drain", instance="leader"))  # type: ignore[arg-type]
    if view.state is not None and not view.state.final and not view.state.owes:
        view = replace(view, condition=await handoff.condition(view, policy))
    decision = decide(view, policy, now)
    if decision is not None:
        await handoff.apply(decision, api.node, dry_run=False)


def killed_then_led(api: Api, k: int, now: float) -> bool:
    """The first leader's pass, killed before write k+1; then new leaders' passes until nothing changes."""
    api.kill_before = k
    try:
        asyncio.run(leader_pass(api, now))
        killed = False
    except Killed:
        killed = True
    api.kill_before = None
    for i in range(1, 4):
        asyncio.run(leader_pass(api, now + 15 * i))
    return killed


RESET = f"{OBJECTS}/n1-reset"


@pytest.mark.parametrize("k", range(5), ids=lambda k: f"killed-after-{k}-writes")
def test_start_killed_between_writes(k: int) -> None:
    """Start with an object step: object → state (Event owed) → Event → debt cleared."""
    api = Api(state=None)
    assert killed_then_led(api, k, NOW) == (k < 4)
    assert api.created == [RESET], "the step object created once"
    st = api.state()
    assert st is not None and (st.step, st.object_path, st.owes) == (0, RESET, False)
    assert api.reasons() == ["GPURemediationStarted"]


@pytest.mark.parametrize("k", range(5), ids=lambda k: f"killed-after-{k}-writes")
def test_escalation_killed_between_writes(k: int) -> None:
    """The object step times out: label + state (Event and deletion owed) → delete → Event → cleared."""
    api = Api(state=RemediationState(0, NOW - 601, object_path=RESET))
    api.objects[RESET] = {}
    assert killed_then_led(api, k, NOW) == (k < 4)
    st = api.state()
    assert st is not None and (st.step, st.owes) == (1, False)
    assert [h.outcome for h in st.history] == ["timed-out"]
    assert api.node["metadata"]["labels"] == {REBOOT: "true"}
    assert api.deleted == [RESET] and api.objects == {}
    assert api.reasons() == ["GPURemediationEscalated"]


@pytest.mark.parametrize("k", range(5), ids=lambda k: f"killed-after-{k}-writes")
def test_release_mid_step_killed_between_writes(k: int) -> None:
    """Released while the object step runs: state succeeded (Event and deletion owed) → delete → Event →
    cleared; a later pass forgets the finished hand-off (no Event)."""
    api = Api(state=RemediationState(0, NOW - 60, object_path=RESET), quarantined=False)
    api.objects[RESET] = {}
    assert killed_then_led(api, k, NOW) == (k < 4)
    assert api.deleted == [RESET]
    assert api.reasons() == ["GPURemediationSucceeded"]
    assert REMEDIATION not in api.node["metadata"]["annotations"]  # forgotten once settled


@pytest.mark.parametrize("k", range(4), ids=lambda k: f"killed-after-{k}-writes")
def test_exhausted_killed_between_writes(k: int) -> None:
    """The last (annotation) step times out: markers removed + state exhausted (Event owed) → Event →
    cleared."""
    api = Api(state=RemediationState(2, NOW - 901))
    api.node["metadata"]["annotations"][REPLACE] = "true"
    assert killed_then_led(api, k, NOW) == (k < 3)
    st = api.state()
    assert st is not None and (st.final, st.owes) == ("exhausted", False)
    assert REPLACE not in api.node["metadata"]["annotations"]
    assert api.reasons() == ["GPURemediationExhausted"]


def test_a_settled_state_is_not_overwritten_by_a_late_clear() -> None:
    """The debt is cleared only over the state that owed it: a newer state on the Node is left alone."""
    owed = RemediationState(0, NOW, event=("GPURemediationStarted", "step gpu-reset (object)"))
    newer = RemediationState(1, NOW + 600, event=("GPURemediationEscalated", "x"))
    assert settle_patch({"metadata": {"annotations": {REMEDIATION: newer.encode()}}}, owed) is None
    patch = settle_patch({"metadata": {"annotations": {REMEDIATION: owed.encode()}}}, owed)
    assert patch == {"metadata": {"annotations": {REMEDIATION: owed.settled().encode()}}}
    assert decode(owed.encode()) == owed and not owed.settled().owes


@pytest.mark.parametrize("k", range(5), ids=lambda k: f"killed-after-{k}-writes")
def test_escalation_to_a_step_with_the_same_object(k: int) -> None:
    """Two object steps whose templates name one object: the finished one is deleted before the next is
    created (not after, which would delete the new step's object)."""
    twice = RemediationConfig.model_validate(
        {
            "enabled": True,
            "steps": [POLICY.steps[0].model_dump(), {**POLICY.steps[0].model_dump(), "name": "again"}],
        }
    )
    api = Api(state=RemediationState(0, NOW - 601, object_path=RESET))
    api.objects[RESET] = {"status": {"conditions": [{"type": "Complete", "status": "False"}]}}
    api.kill_before = k
    with contextlib.suppress(Killed):
        asyncio.run(leader_pass(api, NOW, twice))
    api.kill_before = None
    for i in range(1, 4):
        asyncio.run(leader_pass(api, NOW + 15 * i, twice))
    st = api.state()
    assert st is not None and (st.step, st.object_path, st.owes) == (1, RESET, False)
    assert api.objects == {RESET: api.objects[RESET]} and "status" not in api.objects[RESET], "a new object"
    assert api.reasons() == ["GPURemediationEscalated"]
