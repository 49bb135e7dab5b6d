"""A leader killed between any two writes of a drain pass: the fleet's eviction rate still holds, every pod
on the failed node is evicted once, and each eviction has exactly one GPUPodEvicted Event.

A pass with `max_evictions_per_minute: 2` over three pods writes: (1) GPUDrainStarted, then per pod
(2) the ledger entry in the node's drain state, (3) the Eviction, (4) the GPUPodEvicted Event (named after
the pod's uid), twice, and (8) the final drain state. Each row kills the leader before write k+1 (the real
`DrainActuator` against an in-memory API that raises `Killed` there); new leaders with no memory then run
passes from what the API holds, 8 s later and every 30 s after, until the drain is done.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.drain.act import DrainActuator, DrainMetrics
from controller.drain.observe import build_snapshot
from controller.drain.plan import (
    DrainPod,
    Eviction,
    events_owed,
    evictions_in_window,
    plan_drains,
    prune_ledger,
)
from controller.drain.state import DrainState, decode
from gpuwarden.config.drain import DrainConfig
from gpuwarden.errors import KubeConflict
from gpuwarden.kube import EventRecorder
from gpuwarden.kube.resources import JsonObject, ObjectList, Resource
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN, QUARANTINE_RECORD, QUARANTINE_TAINT

NOW = 1_700_000_000.0
GPU = "nvidia.com/gpu"
POLICY = DrainConfig.model_validate({"gate": {"max_evictions_per_minute": 2}})
# the e2e tests' shorter window (drain.gate.rate_window_seconds): 2 evictions per 15 s
SHORT = DrainConfig.model_validate({"gate": {"max_evictions_per_minute": 2, "rate_window_seconds": 15}})


class Killed(Exception):
    """The leader's process died here (SIGKILL)."""


class Api:
    def __init__(self, kill_before: int | None) -> None:
        rec = QuarantineRecord(
            "quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),), quarantined_at=NOW
        )
        bad = node("n1", {QUARANTINE_RECORD: rec.encode()}, [{"key": QUARANTINE_TAINT, "value": "gpu-missing",
                                                             "effect": "NoSchedule"}])  # fmt: skip
        self.nodes = {"n1": bad, **{f"ok{i}": node(f"ok{i}", {}, []) for i in range(3)}}
        self.pods = {name: pod(name) for name in ("a", "b", "c")}
        self.events: list[JsonObject] = []
        self.evicted: list[tuple[str, float]] = []
        self.writes = 0
        self.kill_before = kill_before
        self.now = NOW

    async def list_objects(self, resource: Resource, **_: Any) -> ObjectList:
        """Reads are not writes (no kill point): DeviceClasses, none here (a cluster without DRA)."""
        return ObjectList(items=[], resource_version="1")

    def _write(self) -> None:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1

    async def patch(self, resource: Resource, name: str, body: Any, **_: Any) -> JsonObject:
        self._write()
        ann = self.nodes[name]["metadata"]["annotations"]
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                ann.pop(key, None)
            else:
                ann[key] = value
        return self.nodes[name]

    async def request(self, method: str, path: str, **_: Any) -> JsonObject:
        name = path.split("/")[-2]  # .../pods/<name>/eviction
        self._write()
        self.pods[name]["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:20Z"
        self.evicted.append((name, self.now))
        return {}

    async def create(self, resource: Resource, body: JsonObject, **_: Any) -> JsonObject:
        if any(e["metadata"]["name"] == body["metadata"]["name"] for e in self.events):
            raise KubeConflict("already exists", status=409, reason="AlreadyExists")
        self._write()
        self.events.append(copy.deepcopy(body))
        return body


def node(name: str, annotations: dict[str, str], taints: list[JsonObject]) -> JsonObject:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"taints": taints}, "status": {"allocatable": {GPU: "8"}}}  # fmt: skip


def pod(name: str) -> JsonObject:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


async def leader_pass(api: Api, policy: DrainConfig = POLICY) -> None:
    """One drain pass of a leader with no memory (what DrainLoop.run_once does, over the API's objects)."""
    nodes = list(api.nodes.values())
    snap = build_snapshot(nodes, list(api.pods.values()), resource=GPU)
    now, window = api.now, policy.gate.rate_window_seconds
    plan = plan_drains(
        snap.nodes, snap.pods_by_node, policy, now,
        evictions_last_minute=evictions_in_window((n.evictions for n in snap.nodes), now, window),
        gpu_nodes=snap.gpu_nodes, schedulable_gpu_nodes=snap.schedulable_gpu_nodes,
    )  # fmt: skip
    events = EventRecorder(api, component="drain", instance="leader")  # type: ignore[arg-type]
    actuator = DrainActuator(
        api,
        events,
        DrainMetrics(CollectorRegistry()),
        lambda: now,
        rate_window=window,  # type: ignore[arg-type]
    )
    objs = {n["metadata"]["name"]: n for n in nodes}
    await actuator.apply(plan, snap.states, objs, dry_run=False)


def max_in_any_window(times: list[float], window: float = 60) -> int:
    return max((sum(1 for u in times if t <= u < t + window) for t in times), default=0)


# The same run with the window a quarter as long (the lease and every pass step scaled with it): what the
# e2e SIGKILL test relies on when it shortens drain.gate.rate_window_seconds to keep its wait short.
@pytest.mark.parametrize(
    ("policy", "scale"), [(POLICY, 1.0), (SHORT, 0.25)], ids=["60s-window", "15s-window"]
)
@pytest.mark.parametrize("k", range(9), ids=lambda k: f"killed-after-{k}-writes")
def test_drain_killed_between_writes(k: int, policy: DrainConfig, scale: float) -> None:
    api = Api(kill_before=k)
    try:
        asyncio.run(leader_pass(api, policy))
        killed = False
    except Killed:
        killed = True
    assert killed == (k < 8)
    api.kill_before = None
    api.now = NOW + 8 * scale  # the next leader, one lease later
    for _ in range(12):
        asyncio.run(leader_pass(api, policy))
        api.now += 30 * scale

    names = [name for name, _ in api.evicted]
    assert sorted(names) == ["a", "b", "c"], "every pod on the failed node evicted exactly once"
    window = policy.gate.rate_window_seconds
    assert max_in_any_window([t for _, t in api.evicted], window) <= 2, api.evicted
    # the limit binds: the third eviction waited for the first to leave the window
    times = sorted(t for _, t in api.evicted)
    assert times[2] - times[0] >= window, api.evicted
    evicted_events = sorted(e["regarding"]["name"] for e in api.events if e["reason"] == "GPUPodEvicted")
    assert evicted_events == ["a", "b", "c"], "one GPUPodEvicted Event per evicted pod"
    assert [e["reason"] for e in api.events].count("GPUDrainStarted") == 1
    state, _ = decode(api.nodes["n1"]["metadata"]["annotations"][DRAIN])
    assert state is not None and all(e.evented for e in state.evictions)


def test_ledger_round_trip_and_window() -> None:
    ledger = (Eviction("ml/a", "uid-a", NOW - 59), Eviction("ml/b", "uid-b", NOW - 60, evented=True))
    state = DrainState(started=NOW - 100, evictions=ledger)
    back, why = decode(state.encode())
    assert why == "" and back is not None and back.evictions == ledger
    assert evictions_in_window([ledger], NOW) == 1  # 60 s ago is outside the last minute
    assert evictions_in_window([ledger, ledger], NOW - 1) == 4
    assert evictions_in_window([ledger], NOW, window=58.5) == 0  # drain.gate.rate_window_seconds
    assert evictions_in_window([ledger], NOW - 45, window=15) == 1  # 14 s and 15 s ago: half-open
    assert evictions_in_window([ledger], NOW - 45, window=15.5) == 2


def test_old_drain_state_without_ledger_still_decodes() -> None:
    back, why = decode('{"started":"2023-11-14T22:13:20Z","scope":"gpu","version":1}')
    assert why == "" and back is not None and back.evictions == ()


def dpod(uid: str, *, terminating: bool = False) -> DrainPod:
    return DrainPod("ml", "a", uid, ("0",), 1, terminating=terminating)


@pytest.mark.parametrize(
    ("entry", "pods", "owed", "kept_at_now_plus_90"),
    [
        pytest.param(Eviction("ml/a", "u1", NOW), [dpod("u1")], False, False, id="pod-running-never-evicted"),
        pytest.param(
            Eviction("ml/a", "u1", NOW), [dpod("u1", terminating=True)], True, True, id="terminating"
        ),
        pytest.param(Eviction("ml/a", "u1", NOW), [], True, True, id="pod-gone"),
        pytest.param(Eviction("ml/a", "u1", NOW), [dpod("u2")], True, True, id="recreated-under-new-uid"),
        pytest.param(Eviction("ml/a", "u1", NOW, evented=True), [], False, False, id="evented-and-old"),
    ],
)
def test_events_owed_and_prune(
    entry: Eviction, pods: list[DrainPod], owed: bool, kept_at_now_plus_90: bool
) -> None:
    assert events_owed([entry], pods) == ((entry,) if owed else ())
    assert prune_ledger([entry], pods, NOW + 90) == ((entry,) if kept_at_now_plus_90 else ())
    assert prune_ledger([entry], pods, NOW + 30) == (entry,)  # within the minute: always counted
    # a 15 s window (drain.gate.rate_window_seconds) keeps only what a 15 s rate counts, and what is owed
    assert prune_ledger([entry], pods, NOW + 20, window=15) == ((entry,) if kept_at_now_plus_90 else ())
    assert prune_ledger([entry], pods, NOW + 10, window=15) == (entry,)
