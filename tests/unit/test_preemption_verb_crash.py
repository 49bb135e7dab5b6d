"""The preempt verb's budgets hold for the fleet: a replica killed between its writes, or another replica
answering next, never grants a fresh budget.

The verb's one write is the preemption record on the preemptor (`gpuwarden.io/preemption`), before it
answers; the scheduler then writes the victims' DisruptionTarget, deletes them and writes `Preempted`
Events (not ours). Each row kills replica A before write k+1 (k=0: before the record, so the scheduler got
no answer and preempted nothing; k=1: after it), then replica B - nothing in memory, its graph built from
what the API holds - is asked for a second preemption in the same namespace with a budget of 3 victims.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.extenderv1 import ExtenderPreemptionArgs
from controller.preemption.hook import PreemptionThrottle
from controller.preemption.record import BY_MAKE_ROOM, PreemptionRecord, VictimEntry, record_of
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError
from gpuwarden.kube import ADDED, SYNCED, WatchEvent
from gpuwarden.kube.resources import Resource
from tests.unit.test_preemption_hook import BATCH, SERVE, TRAINER, FakeRecorder, pod

NOW = 1_700_000_000.0
BUDGET = {
    "global_budget": None,
    "workload_budget": None,
    "namespace_budget": {"max_victims": 3, "window_seconds": 300},
}


class Killed(Exception):
    """The replica's process died here (SIGKILL)."""


class Api:
    """The pods as the API server holds them; `patch` applies annotation merge patches."""

    def __init__(self, kill_before: int | None) -> None:
        self.pods = {p["metadata"]["uid"]: p for p in victims()}
        self.pods.update({uid: preemptor(uid, wl) for uid, wl in (("p1", TRAINER), ("p2", SERVE))})
        self.kill_before = kill_before
        self.writes = 0

    async def patch(self, resource: Resource, name: str, body: Any, **_: Any) -> dict[str, Any]:
        if self.kill_before is not None and self.writes >= self.kill_before:
            raise Killed
        self.writes += 1
        target = next(p for p in self.pods.values() if p["metadata"]["name"] == name)
        for key, value in body["metadata"]["annotations"].items():
            target["metadata"].setdefault("annotations", {})[key] = value
        return target


def victims() -> list[dict[str, Any]]:
    return [pod("v3", BATCH), pod("v4", BATCH), pod("v5", BATCH), pod("v6", BATCH, node="n3")]


def preemptor(uid: str, workload: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"{workload.name}-{uid}", "namespace": workload.namespace,
                     "creationTimestamp": "2023-11-14T00:00:00Z", "annotations": {}},
        "spec": {"priority": 1000, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def replica(api: Api, now: float) -> PreemptionThrottle:
    """A replica with nothing in memory: its graph is what its watches list from the API."""
    config = Config.model_validate({"preemption": BUDGET})
    t = PreemptionThrottle(config, api, registry=CollectorRegistry(), recorder=FakeRecorder(),  # type: ignore[arg-type]
                           clock=lambda: now)  # fmt: skip
    for obj in api.pods.values():
        cached = copy.deepcopy(obj)
        t.observer.pods.store[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = cached
        t.observer.on_pod(WatchEvent(ADDED, cached))
    t.observer.pods.synced.set()
    t.observer.on_event(WatchEvent(SYNCED, {}))
    return t


def request(api: Api, uid: str, victims_by_node: dict[str, list[str]]) -> ExtenderPreemptionArgs:
    return ExtenderPreemptionArgs.model_validate(
        {
            "Pod": api.pods[uid],
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": v} for v in uids], "NumPDBViolations": 0}
                for node, uids in victims_by_node.items()
            },
        }
    )


@pytest.mark.parametrize(
    ("k", "second_allowed"),
    [(0, True), (1, False), (None, False)],
    ids=["killed-before-the-record", "killed-after-the-record", "answered"],
)
async def test_a_second_replica_counts_what_the_first_allowed(k: int | None, second_allowed: bool) -> None:
    api = Api(kill_before=k)
    a = replica(api, NOW)
    try:
        answer = await a(request(api, "p1", {"n1": ["v3", "v4"]}))
        assert set(answer.node_name_to_meta_victims) == {"n1"}
    except Killed:
        pass
    record = record_of(api.pods["p1"])
    assert (record is not None) == (k != 0)
    api.kill_before = None

    b = replica(api, NOW + 5)  # another replica behind the Service, or A's successor after a restart
    assert b.graph.victims(NOW + 5, 300, namespace="ml") == (0 if k == 0 else 2)
    second = await b(request(api, "p2", {"n3": ["v5", "v6"]}))
    assert bool(second.node_name_to_meta_victims) == second_allowed


async def test_a_record_past_its_deadline_counts_nothing_and_the_signals_take_over() -> None:
    api = Api(kill_before=None)
    await replica(api, NOW)(request(api, "p1", {"n1": ["v3", "v4"]}))
    assert replica(api, NOW + 29).graph.victims(NOW + 29, 300, namespace="ml") == 2
    later = replica(api, NOW + 31)  # the 30 s bridge is over: the victims' own signals count from here
    assert later.graph.victims(NOW + 31, 300, namespace="ml") == 0


async def test_a_failed_record_vetoes_and_reserves_nothing() -> None:
    api = Api(kill_before=None)
    a = replica(api, NOW)

    async def refuse(*_: Any, **__: Any) -> dict[str, Any]:
        raise KubeError("etcdserver: request timed out", status=504)

    api.patch = refuse  # type: ignore[method-assign]
    answer = await a(request(api, "p1", {"n1": ["v3", "v4"]}))
    assert answer.node_name_to_meta_victims == {}
    assert a.graph.victims(NOW, 300, namespace="ml") == 0


@pytest.mark.parametrize(
    ("state", "until", "allowed"),
    [("evicting", NOW + 100, False), ("done", NOW + 100, True), ("evicting", NOW - 1, True)],
    ids=["gpu-preemption-under-way: vetoed, its record kept", "gpu-preemption-done", "past-its-deadline"],
)
async def test_the_verb_never_overwrites_an_unfinished_gpu_preemption(
    state: str, until: float, allowed: bool
) -> None:
    api = Api(kill_before=None)
    mine = PreemptionRecord(BY_MAKE_ROOM, NOW - 5, until, 1, {"n9": (VictimEntry("v9", "ml/v9"),)}, state)
    api.pods["p1"]["metadata"]["annotations"]["gpuwarden.io/preemption"] = mine.encode()
    answer = await replica(api, NOW)(request(api, "p1", {"n1": ["v3", "v4"]}))
    assert bool(answer.node_name_to_meta_victims) == allowed
    assert (record_of(api.pods["p1"]) == mine) == (not allowed)
