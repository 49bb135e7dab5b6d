"""The GPU preemption loop's act step (controller/makeroom/loop.py) over an in-memory API: reserve
first, then evict through the Eviction API; every refusal withdraws the reservation; a changed pod or
unreadable PodDisruptionBudgets change nothing; no writes without leadership."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.gpus.fit import Settings
from controller.makeroom.loop import RoomLoop
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeConflict, KubeError
from gpuwarden.kube import ADDED, SYNCED, PatchType, WatchEvent
from gpuwarden.kube.resources import ObjectList, Resource
from tests.unit.extender_support import RESOURCE, model, node, pod

NOW = 1_700_000_000.0
FRAG = "0/1 nodes are available: 1 fragmented: 4 free, largest NUMA node has 2 (...)"


def preemptor() -> dict[str, Any]:
    obj = pod("x", 4, priority=1000)
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": FRAG,
         "lastTransitionTime": "2023-11-14T22:00:00Z"}
    ]  # fmt: skip
    return obj


PODS = [
    pod("a", 2, node="n", ids="0,1", priority=10),
    pod("b", 2, node="n", ids="4,5", priority=10),
    preemptor(),
]


class FakeApi:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.fail: dict[str, KubeError] = {}

    async def list_objects(self, resource: Resource, **_: Any) -> ObjectList:
        if "list" in self.fail:
            raise self.fail["list"]
        return ObjectList([], "1")

    async def patch(
        self, resource: Resource, name: str, body: Any, *, patch_type: PatchType, **_: Any
    ) -> dict[str, Any]:
        if "patch" in self.fail:
            raise self.fail["patch"]
        self.writes.append(("PATCH", name, copy.deepcopy(body)))
        return {}

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if "evict" in self.fail:
            raise self.fail["evict"]
        self.writes.append((method, path, body))
        return {}


class FakeInformer:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.items = {
            f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}".lstrip("/"): o for o in objects
        }
        self.synced = asyncio.Event()
        self.synced.set()

    def objects(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)


class FakeRecorder:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    async def emit(self, regarding: Any, **kw: Any) -> None:
        self.emitted.append({"regarding": regarding.name, **kw})

    async def emit_once(self, regarding: Any, **kw: Any) -> bool:
        self.emitted.append({"regarding": regarding.name, **kw})
        return True


def room(api: FakeApi, *, dry_run: bool = False) -> tuple[RoomLoop, FakeRecorder, CollectorRegistry]:
    config = Config.model_validate({"preemption": {"make_room": {"enabled": True, "dry_run": dry_run}}})
    registry, recorder = CollectorRegistry(), FakeRecorder()
    throttle = PreemptionThrottle(config, object(), clock=lambda: NOW)  # type: ignore[arg-type]
    for p in PODS:
        throttle.observer.on_pod(WatchEvent(ADDED, p))
    throttle.observer.pods.synced.set()
    throttle.observer.on_event(WatchEvent(SYNCED, {}))
    m = model([node("n")], PODS)
    settings = Settings(fleet_max_numa_gpus=4, resource=RESOURCE)
    loop = RoomLoop(
        config, api, throttle=throttle, model=m, settings=lambda: settings,  # type: ignore[arg-type]
        nodes=FakeInformer([node("n")]), registry=registry, clock=lambda: NOW, recorder=recorder,  # type: ignore[arg-type]
    )  # fmt: skip
    loop.pods = FakeInformer(PODS)  # type: ignore[assignment]
    return loop, recorder, registry


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_reserve_first_then_evict_with_the_uid_precondition_and_events() -> None:
    api = FakeApi()
    loop, recorder, registry = room(api)
    done = await loop.run_once()
    assert done.evicted == ["ml/a"]
    (reserve, evict, done) = api.writes
    annotations = reserve[2]["metadata"]["annotations"]
    assert reserve[:2] == ("PATCH", "x") and annotations["gpuwarden.io/gpu-ids"] == "0,1,2,3"
    record = json.loads(annotations["gpuwarden.io/preemption"])
    assert (record["state"], record["victims"]) == ("evicting", {"n": [{"uid": "uid-a", "pod": "ml/a",
                                                                      "workload": "ml/a"}]})  # fmt: skip
    assert done[:2] == ("PATCH", "x")
    assert json.loads(done[2]["metadata"]["annotations"]["gpuwarden.io/preemption"])["state"] == "done"
    assert float(annotations["gpuwarden.io/gpu-reserved-until"]) == NOW + 180
    assert reserve[2]["metadata"]["resourceVersion"] == "100"
    assert evict[:2] == ("POST", "/api/v1/namespaces/ml/pods/a/eviction")
    assert evict[2]["deleteOptions"]["preconditions"] == {"uid": "uid-a"}
    reasons = [(e["regarding"], e["reason"]) for e in recorder.emitted]
    assert reasons == [("a", "Preempted"), ("x", "GPUPreempting")]
    assert recorder.emitted[0]["note"].startswith(
        "Preempted by pod uid-x on node n: gpuwarden frees GPUs 0,1"
    )
    assert loop.throttle.graph.is_victim("uid-a", "uid-x")
    assert metric(registry, "gpuwarden_gpu_preemptions_total", outcome="started") == 1


async def test_every_eviction_refused_withdraws_the_reservation() -> None:
    api = FakeApi()
    api.fail["evict"] = KubeError(
        "Cannot evict pod as it would violate the pod's disruption budget.", status=429
    )
    loop, recorder, registry = room(api)
    done = await loop.run_once()
    assert done.evicted == [] and done.blocked == ["ml/a"]
    reserve, release = api.writes
    assert (
        reserve[:2] == ("PATCH", "x")
        and "gpuwarden.io/gpu-reserved-until" in reserve[2]["metadata"]["annotations"]
    )
    assert release[:2] == ("PATCH", "x")
    assert release[2]["metadata"]["annotations"]["gpuwarden.io/gpu-reserved-until"] is None
    assert release[2]["metadata"]["labels"] == {"gpuwarden.io/gpu-node": None}
    assert [e["reason"] for e in recorder.emitted] == ["GPUPreemptionBlocked"]
    assert metric(registry, "gpuwarden_gpu_preemptions_total", outcome="blocked") == 1
    assert metric(registry, "gpuwarden_gpu_preemption_victims_total", outcome="blocked") == 1
    assert not loop.throttle.graph.is_victim("uid-a", "uid-x")


@pytest.mark.parametrize(
    ("fail", "outcome"),
    [
        pytest.param({"patch": KubeConflict("changed", status=409)}, "conflict", id="pod-changed"),
        pytest.param({"list": KubeError("forbidden", status=403)}, "", id="pdbs-unreadable"),
    ],
)
async def test_nothing_is_evicted_when_the_pod_changed_or_budgets_are_unknown(
    fail: dict[str, KubeError], outcome: str
) -> None:
    api = FakeApi()
    api.fail.update(fail)
    loop, recorder, registry = room(api)
    done = await loop.run_once()
    assert api.writes == [] and done.evicted == [] and recorder.emitted == []
    if outcome:
        assert metric(registry, "gpuwarden_gpu_preemptions_total", outcome=outcome) == 1


async def test_dry_run_and_lost_leadership_write_nothing() -> None:
    api = FakeApi()
    loop, recorder, _ = room(api, dry_run=True)
    await loop.run_once()
    assert api.writes == []
    assert [e["note"][:22] for e in recorder.emitted] == ["[dry-run] would evict "]
    api2 = FakeApi()
    loop2, recorder2, _ = room(api2)
    await loop2.run_once(leading=asyncio.Event())  # never set: not the leader
    assert api2.writes == [] and recorder2.emitted == []
