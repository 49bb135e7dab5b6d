"""A leader killed between any two writes of a device-scoped quarantine (or its release) on a DRA-backed node
loses nothing: the next leader finishes it, the DeviceTaintRule exists exactly while the quarantine does,
and the Event exists once.

The act sequences (docs/health.md "DRA-backed nodes"):
- quarantine: (1) breaker start, (2) marker taint (PreferNoSchedule) + record naming the devices (Event
  pending), (3) GPUHealthy=False, (4) the DeviceTaintRule (named after node and device: 409 = there), (5) the
  Event, (6) the mark cleared;
- release: (1) untaint + released record (Event pending), (2) GPUHealthy=True, (3) the rule deleted (404 =
  gone), (4) the Event, (5) the mark cleared.
The in-memory API of test_health_crash, plus DeviceTaintRules.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.health import devicerules
from controller.health.act import BREAKER_CONFIGMAP, Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.observe import breaker_state, node_state
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot
from gpuwarden.errors import KubeConflict, KubeNotFound
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, Resource
from gpuwarden.quarantine import DeviceRef, decode
from gpuwarden.wellknown import QUARANTINE_RECORD, QUARANTINE_TAINT, RELEASE
from tests.unit.test_health_crash import Api, Killed, node_json
from tests.unit.test_health_fixtures import NOW, node, record

DEVICES = {f"GPU-n1-{i}": DeviceRef("gpu.nvidia.com", "n1", f"gpu-{i}", f"GPU-n1-{i}") for i in range(8)}
RULE = devicerules.rule_name("n1", DEVICES["GPU-n1-0"])
XID_79: dict[int, dict[str, Any]] = {0: {"xids": (79,)}}


class DraApi(Api):
    """The crash test's API with cluster-scoped DeviceTaintRules (create 409 by name, merge patch, delete)."""

    def __init__(self, nodes: list[JsonObject], kill_before: int | None = None) -> None:
        super().__init__(nodes, kill_before)
        self.rules: dict[str, JsonObject] = {}
        self.rules_at_event: dict[str, list[str]] = {}  # Event reason -> our rules when it was written

    async def create(
        self, resource: Resource, body: JsonObject, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject:
        if resource.kind != "DeviceTaintRule":
            made = await super().create(resource, body, namespace=namespace, dry_run=dry_run)
            if "reason" in body:
                self.rules_at_event[body["reason"]] = sorted(self.rules)
            return made
        name = body["metadata"]["name"]
        if name in self.rules:
            raise KubeConflict(f"devicetaintrules {name} already exists", status=409, reason="AlreadyExists")
        self._write()
        self.rules[name] = copy.deepcopy(body)
        return body

    async def patch(self, resource: Resource, name: str, body: Any, **kw: Any) -> JsonObject:
        if resource.kind != "DeviceTaintRule":
            return await super().patch(resource, name, body, **kw)
        if name not in self.rules:
            raise KubeNotFound(name, status=404)
        self._write()
        self.rules[name]["spec"]["taint"].update(body["spec"]["taint"])
        return self.rules[name]

    async def delete(self, resource: Resource, name: str, **kw: Any) -> JsonObject:
        assert resource.kind == "DeviceTaintRule"
        if name not in self.rules:
            raise KubeNotFound(name, status=404)
        self._write()
        return self.rules.pop(name)


def dra_node_json(**kw: Any) -> JsonObject:
    obj = node_json(**kw)
    obj["status"].pop("capacity")  # DRA serves the GPUs: no nvidia.com/gpu capacity
    if kw.get("tainted"):
        obj["spec"]["taints"][0]["effect"] = "PreferNoSchedule"
    return obj


def snapshot(api: DraApi, per_gpu: dict[int, dict[str, Any]]) -> FleetSnapshot:
    """What observe would build: node_state of the Node, telemetry as given, the node's devices, our rules."""
    gpus = node("n1", per_gpu=copy.deepcopy(per_gpu)).gpus
    n1 = replace(node_state(api.nodes["n1"]), gpus=gpus, dra_devices=DEVICES)
    owned = tuple(r for o in api.rules.values() if (r := devicerules.owned_rule(o)) is not None)
    breaker = breaker_state(api.configmaps.get(BREAKER_CONFIGMAP))
    return FleetSnapshot(NOW, (n1,), breaker=breaker, device_rules="served", owned_rules=owned)


async def leader_pass(api: DraApi, now: float, per_gpu: dict[int, dict[str, Any]]) -> HealthPlan:
    recorder = EventRecorder(api, component="health", instance="leader")  # type: ignore[arg-type]
    actuator = Actuator(api, recorder, HealthMetrics(CollectorRegistry()), namespace="gpuwarden")  # type: ignore[arg-type]
    plan = plan_quarantine(snapshot(api, per_gpu), HealthPolicy(), now)
    await actuator.apply(plan)
    return plan


def killed_then_next(api: DraApi, k: int, writes: int, per_gpu: dict[int, dict[str, Any]]) -> HealthPlan:
    api.kill_before = k
    try:
        asyncio.run(leader_pass(api, NOW, per_gpu))
        killed = False
    except Killed:
        killed = True
    assert killed == (k < writes) and api.writes == k
    api.kill_before = None
    return asyncio.run(leader_pass(api, NOW + 15, per_gpu))


QUARANTINE_WRITES = ["breaker-start", "marker+record", "condition", "rule", "event", "clear-mark"]


@pytest.mark.parametrize("k", range(len(QUARANTINE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_device_quarantine_killed_between_writes_is_finished_once(k: int) -> None:
    api = DraApi([dra_node_json(tainted=False, annotations={}, healthy="True")])
    second = killed_then_next(api, k, len(QUARANTINE_WRITES), XID_79)

    obj = api.nodes["n1"]
    assert obj["spec"]["taints"] == [
        {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "PreferNoSchedule"}
    ]
    rec, _ = decode(obj["metadata"]["annotations"][QUARANTINE_RECORD])
    assert rec is not None and rec.state == "quarantined" and not rec.event_pending
    assert rec.devices == (DEVICES["GPU-n1-0"],)
    assert list(api.rules) == [RULE]
    rule = api.rules[RULE]["spec"]
    assert rule["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}
    assert rule["taint"] == {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
    assert api.reasons() == ["GPUQuarantined"]
    assert api.rules_at_event["GPUQuarantined"] == [RULE], "the Event reports a rule that exists"
    kinds = {a.kind for a in second.actions}
    if k <= 1:
        assert kinds == {"quarantine"}
    elif k < len(QUARANTINE_WRITES):
        assert kinds == {"finish-event"}  # the rule (409 or created) and the Event, not a second quarantine
    else:
        assert kinds == set()
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30, XID_79))
    assert api.writes == writes, "a finished quarantine must need no further writes"


RELEASE_WRITES = ["untaint+record", "condition", "rule-deleted", "event", "clear-mark"]


@pytest.mark.parametrize("k", range(len(RELEASE_WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
def test_device_release_killed_between_writes_is_finished_once(k: int) -> None:
    rec = replace(record(at=NOW - 3600), effect="PreferNoSchedule", devices=(DEVICES["GPU-n1-0"],))
    annotations = {QUARANTINE_RECORD: rec.encode(), RELEASE: "now"}
    api = DraApi([dra_node_json(tainted=True, annotations=annotations, healthy="False")])
    rule = devicerules.rules_for("n1", rec, "NoSchedule")[0]
    api.rules[RULE] = devicerules.manifest(rule)
    killed_then_next(api, k, len(RELEASE_WRITES), XID_79)  # dismissed by the operator: no re-taint

    obj = api.nodes["n1"]
    assert obj["spec"]["taints"] == []
    after, _ = decode(obj["metadata"]["annotations"].get(QUARANTINE_RECORD))
    assert after is not None and after.state == "released" and not after.event_pending
    assert api.rules == {}, "the release removes our rule"
    assert api.reasons() == ["GPUQuarantineReleased"]
    assert api.rules_at_event["GPUQuarantineReleased"] == [], "the Event reports a rule already gone"
    writes = api.writes
    asyncio.run(leader_pass(api, NOW + 30, XID_79))
    assert api.writes == writes


def test_a_driver_rule_is_never_touched() -> None:
    """A DeviceTaintRule someone else owns (no managed-by label) on the same device survives a release."""
    rec = replace(record(at=NOW - 3600), effect="PreferNoSchedule", devices=(DEVICES["GPU-n1-0"],))
    annotations = {QUARANTINE_RECORD: rec.encode(), RELEASE: "now"}
    api = DraApi([dra_node_json(tainted=True, annotations=annotations, healthy="False")])
    theirs = {
        "metadata": {"name": "nvidia-xid-gpu-0", "labels": {}},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
            "taint": {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
        },
    }
    api.rules["nvidia-xid-gpu-0"] = theirs
    asyncio.run(leader_pass(api, NOW, {}))
    assert api.rules == {"nvidia-xid-gpu-0": theirs}
