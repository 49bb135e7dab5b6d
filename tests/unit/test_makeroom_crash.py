"""A leader killed between any two writes of a GPU preemption: every replica keeps counting its victims, the
next leader finishes it, each victim is evicted once and each Event exists once.

The act sequence for a preemptor needing two victims (a, c) on one NUMA node: (1) the claim and the
preemption record (`state: evicting`) in one patch, (2) Eviction of the first victim, (3) its `Preempted`
Event, (4) Eviction of the second, (5) its `Preempted`, (6) `GPUPreempting`, (7) the record marked `done`.
Each row kills the leader before write k+1 (the real `RoomLoop` and throttle against an in-memory API that
raises `Killed` there); new leaders with nothing in memory - graph, pod cache and GPU model built from what
the API holds - then run two passes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.gpus.fit import Settings
from controller.gpus.objects import pod_info
from controller.makeroom.complete import VictimState, plan_completion
from controller.makeroom.loop import RoomLoop
from controller.makeroom.plan import Pending, candidate
from controller.preemption.hook import PreemptionThrottle
from controller.preemption.record import (
    BY_MAKE_ROOM,
    EVICTING,
    PreemptionRecord,
    VictimEntry,
    decode,
    record_of,
)
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeConflict
from gpuwarden.kube import ADDED, SYNCED, EventRecorder, PatchType, WatchEvent
from gpuwarden.kube.resources import ObjectList, Resource
from tests.unit.extender_support import RESOURCE, model, node, pod
from tests.unit.test_preemption_room_loop import FRAG, FakeInformer

NOW = 1_700_000_000.0
WRITES = ["claim+record", "evict", "Preempted", "evict", "Preempted", "GPUPreempting", "record-done"]


class Killed(Exception):
    """The leader's process died here (SIGKILL)."""


def preemptor() -> dict[str, Any]:
    obj = pod("x", 4, priority=1000)
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": FRAG,
         "lastTransitionTime": "2023-11-14T22:00:00Z"}
    ]  # fmt: skip
    return obj


class Api:
    def __init__(self, kill_before: int | None) -> None:
        pods = [
            pod("a", 2, node="n", ids="0,1", priority=10),
            pod("c", 1, node="n", ids="2", priority=10),
            pod("b", 4, node="n", ids="4,5,6,7", priority=5000),
            preemptor(),
        ]
        self.pods = {f"ml/{p['metadata']['name']}": p for p in pods}
        self.events: dict[str, dict[str, Any]] = {}
        self.evictions: list[str] = []
        self.writes = 0
        self.kill_before = kill_before

    def _write(self) -> None:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1

    async def list_objects(self, resource: Resource, **_: Any) -> ObjectList:
        return ObjectList([], "1")

    async def patch(
        self, resource: Resource, name: str, body: Any, *, namespace: str, patch_type: PatchType, **_: Any
    ) -> dict[str, Any]:
        target = self.pods[f"{namespace}/{name}"]
        meta = target["metadata"]
        wanted = body["metadata"].get("resourceVersion")
        if wanted is not None and wanted != meta["resourceVersion"]:
            raise KubeConflict("the object has been modified", status=409)
        self._write()
        for field in ("labels", "annotations"):
            for key, value in (body["metadata"].get(field) or {}).items():
                if value is None:
                    meta[field].pop(key, None)
                else:
                    meta[field][key] = value
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return target

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        parts = path.split("/")  # /api/v1/namespaces/<ns>/pods/<name>/eviction
        key = f"{parts[4]}/{parts[6]}"
        self._write()
        self.evictions.append(key)
        self.pods[key]["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:20Z"
        return {}

    async def create(self, resource: Resource, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.events:
            raise KubeConflict("already exists", status=409, reason="AlreadyExists")
        self._write()
        self.events[name] = copy.deepcopy(body)
        return body


def leader(api: Api, now: float) -> RoomLoop:
    """A leader (or any replica) with nothing in memory: caches, model and graph are what the API holds."""
    config = Config.model_validate({"preemption": {"make_room": {"enabled": True}}})
    pods = [copy.deepcopy(p) for p in api.pods.values()]
    throttle = PreemptionThrottle(config, api, clock=lambda: now)  # type: ignore[arg-type]
    for p in pods:
        throttle.observer.on_pod(WatchEvent(ADDED, p))
    throttle.observer.pods.synced.set()
    for event in api.events.values():
        throttle.observer.on_event(WatchEvent(ADDED, copy.deepcopy(event)))
    throttle.observer.on_event(WatchEvent(SYNCED, {}))
    settings = Settings(fleet_max_numa_gpus=4, resource=RESOURCE)
    loop = RoomLoop(
        config, api, throttle=throttle, model=model([node("n")], pods), settings=lambda: settings,  # type: ignore[arg-type]
        nodes=FakeInformer([node("n")]), registry=CollectorRegistry(), clock=lambda: now,  # type: ignore[arg-type]
        recorder=EventRecorder(api, component="gpu-preemption", instance="leader"),  # type: ignore[arg-type]
    )  # fmt: skip
    loop.pods = FakeInformer(pods)  # type: ignore[assignment]
    return loop


@pytest.mark.parametrize("k", range(len(WRITES) + 1), ids=lambda k: f"killed-after-{k}-writes")
async def test_preemption_killed_between_writes_is_counted_and_finished_once(k: int) -> None:
    api = Api(kill_before=k)
    try:
        await leader(api, NOW).run_once()
        killed = False
    except Killed:
        killed = True
    assert killed == (k < len(WRITES))
    api.kill_before = None

    # what any replica counts right after the kill: the victims named by the record, never a fresh budget
    counted = leader(api, NOW + 1).throttle.graph.victims(NOW + 1, 300)
    assert counted == (0 if k == 0 else 2)

    for later in (NOW + 10, NOW + 20):
        await leader(api, later).run_once()

    assert sorted(api.evictions) == ["ml/a", "ml/c"], "each victim evicted exactly once"
    reasons = sorted(e["reason"] for e in api.events.values())
    assert reasons == ["GPUPreempting", "Preempted", "Preempted"]
    record = record_of(api.pods["ml/x"])
    assert record is not None and (record.by, record.state) == (BY_MAKE_ROOM, "done")
    assert {v.pod for vs in record.victims.values() for v in vs} == {"ml/a", "ml/c"}
    assert leader(api, NOW + 21).throttle.graph.victims(NOW + 21, 300) == 2, "counted once, not twice"
    notes = [e["note"] for e in api.events.values() if e["reason"] == "Preempted"]
    assert all(n.startswith("Preempted by pod uid-x on node n") for n in notes)


A, C = VictimEntry("uid-a", "ml/a", "ml/a"), VictimEntry("uid-c", "ml/c", "ml/c")
RECORD = PreemptionRecord(BY_MAKE_ROOM, NOW, NOW + 180, 1, {"n": (A, C)}, EVICTING)
LIVE, GOING, GONE = VictimState.LIVE, VictimState.GOING, VictimState.GONE


def waiting_pod() -> dict[str, Any]:
    return pod("x", 4)


def bound_pod() -> dict[str, Any]:
    return pod("x", 4, node="n")


@pytest.mark.parametrize(
    ("preemptor", "states", "now", "evict", "evicted", "withdraw"),
    [
        (waiting_pod(), {"uid-a": LIVE, "uid-c": LIVE}, NOW + 10, (A, C), (), False),
        (waiting_pod(), {"uid-a": GOING, "uid-c": LIVE}, NOW + 10, (C,), (A,), False),
        (waiting_pod(), {"uid-a": GONE, "uid-c": GOING}, NOW + 10, (), (A, C), False),
        (waiting_pod(), {"uid-a": GOING}, NOW + 10, (), (A, C), False),
        (waiting_pod(), {"uid-a": GOING, "uid-c": LIVE}, NOW + 200, (), (A,), False),
        (waiting_pod(), {"uid-a": LIVE, "uid-c": LIVE}, NOW + 200, (), (), True),
        (bound_pod(), {"uid-a": LIVE, "uid-c": LIVE}, NOW + 10, (), (), True),
        (bound_pod(), {"uid-a": GOING, "uid-c": LIVE}, NOW + 10, (), (A,), False),
    ],
    ids=[
        "killed-after-the-record: evict both",
        "killed-after-the-first-eviction: evict the second, the first's Event owed",
        "killed-after-both-evictions: Events owed",
        "a victim absent from the cache is gone",
        "past the deadline: the live victim is left alone",
        "past the deadline, nothing evicted: withdraw",
        "preemptor bound elsewhere, nothing evicted: withdraw",
        "preemptor bound: the live victim is left alone",
    ],
)
def test_plan_completion(
    preemptor: dict[str, Any],
    states: dict[str, VictimState],
    now: float,
    evict: tuple[VictimEntry, ...],
    evicted: tuple[VictimEntry, ...],
    withdraw: bool,
) -> None:
    done = plan_completion(preemptor, RECORD, states, now)
    assert (done.evict, done.evicted, done.withdraw) == (evict, evicted, withdraw)
    assert done.node == "n" and done.release == (not preemptor["spec"].get("nodeName"))


def test_a_pod_the_verb_just_let_the_scheduler_preempt_for_is_not_planned() -> None:
    obj = preemptor()
    allowed = PreemptionRecord("verb", NOW - 5, NOW + 25, 1, {"n": (A,)})
    obj["metadata"]["annotations"]["gpuwarden.io/preemption"] = allowed.encode()
    info = pod_info(obj, RESOURCE)
    assert candidate(obj, info, NOW, 5, 60, []) == "the scheduler's preemption for it was allowed moments ago"
    assert isinstance(candidate(obj, info, NOW + 26, 5, 60, []), Pending), "past its until: planned again"


@pytest.mark.parametrize("raw", ["", "{", '{"by": "verb"}', '{"by": "verb", "at": "x", "until": 1}', "[]"])
def test_an_unreadable_record_counts_nothing(raw: str) -> None:
    assert decode(raw) is None


def test_a_record_reads_back_as_written() -> None:
    assert decode(RECORD.encode()) == RECORD
    assert decode(RECORD.with_(state="", victims={}).encode()) == RECORD.with_(state="", victims={})
