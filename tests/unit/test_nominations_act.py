"""Applying nomination plans (the exact writes, golden) and the loop around them: the guard re-checked at
write time, a nomination that changed meanwhile left alone, PDB-blocked eviction, dry-run, an API outage,
leader gating, and nomination age surviving a restart (read back from our record)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.app import run_loops
from controller.nominations.act import NominationActuator
from controller.nominations.loop import NominationLoop
from controller.nominations.metrics import NominationMetrics
from controller.nominations.plan import Clear, Evict, Forget, NominationPlan, Stale, Stamp
from controller.nominations.snapshot import NominationRecord, PendingPod
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError, KubeNotFound, KubeUnreachable
from gpuwarden.kube import PatchType, Resource
from gpuwarden.kube.resources import ObjectList
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION

GOLDEN = Path(__file__).parent / "golden" / "nominations"
NOW = 1_700_000_000.0


def golden(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text())


def k8s_pod(
    name: str, *, nominated: str = "n1", node: str = "", priority: int = 500, rv: str = "7"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": rv,
                     "ownerReferences": [{"kind": "Job", "name": "j", "uid": "j", "controller": True}]},
        "spec": {"nodeName": node or None, "priority": priority, "containers": [{"name": "main"}]},
        "status": {"phase": "Pending" if not node else "Running", "nominatedNodeName": nominated or None},
    }  # fmt: skip


class FakeApi:
    """The calls the actuator makes, over an in-memory pod store; `fail` makes a verb raise."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.writes: list[dict[str, Any]] = []
        self.lists: list[str | None] = []
        self.fail: dict[str, KubeError] = {}

    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, **_: Any
    ) -> dict[str, Any]:
        if "get" in self.fail:
            raise self.fail["get"]
        if name not in self.pods:
            raise KubeNotFound("gone", status=404)
        return copy.deepcopy(self.pods[name])

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: Any,
        *,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        if "patch" in self.fail:
            raise self.fail["patch"]
        self.writes.append({"name": name, "subresource": subresource, "type": patch_type.value, "body": body})
        pod = self.pods[name]
        if subresource == "status" and "nominatedNodeName" in body.get("status", {}):
            pod["status"]["nominatedNodeName"] = body["status"]["nominatedNodeName"]
        for key, value in (body.get("metadata", {}).get("annotations") or {}).items():
            annotations = pod["metadata"].setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        return copy.deepcopy(pod)

    async def list_objects(
        self, resource: Resource, *, field_selector: str | None = None, **_: Any
    ) -> ObjectList:
        self.lists.append(field_selector)
        if "list" in self.fail:
            raise self.fail["list"]
        node = (field_selector or "").removeprefix("spec.nodeName=")
        return ObjectList([p for p in self.pods.values() if p["spec"].get("nodeName") == node], "1")

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if "evict" in self.fail:
            raise self.fail["evict"]
        self.writes.append({"method": method, "path": path, "body": body})
        return {}


class FakeRecorder:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    async def emit(self, regarding: Any, **kw: Any) -> None:
        self.emitted.append({**kw, "regarding": regarding.name, "related": kw["related"].name})

    async def emit_once(self, regarding: Any, *, name: str, **kw: Any) -> bool:
        if all(e.get("name") != name for e in self.emitted):
            self.emitted.append({**kw, "name": name, "regarding": regarding.name, "related": "n1"})
        return True

    async def flush(self) -> None:
        return None


def pending(name: str = "p", node: str = "n1", priority: int = 500) -> PendingPod:
    return PendingPod("ml", name, f"uid-{name}", node, priority, None, True)


def actuator(api: FakeApi) -> tuple[NominationActuator, FakeRecorder, CollectorRegistry]:
    registry, recorder = CollectorRegistry(), FakeRecorder()
    return NominationActuator(api, recorder, NominationMetrics(registry)), recorder, registry  # type: ignore[arg-type]


def clear_plan(
    *pods: PendingPod, dry_run: bool = False, reason: Stale = Stale.NODE_CORDONED
) -> NominationPlan:
    return NominationPlan(
        NOW, dry_run, clears=tuple(Clear(p, reason, f"node {p.node} is cordoned", 60.0) for p in pods)
    )


async def test_clear_is_the_schedulers_own_patch_conditioned_on_a_fresh_read() -> None:
    api = FakeApi(k8s_pod("p"))
    act, recorder, registry = actuator(api)
    result = await act.apply(clear_plan(pending()))
    assert result.cleared == ["ml/p"]
    assert api.lists == ["spec.nodeName=n1"], "the guard is re-checked against the API"
    mark, clear, forget = api.writes  # the record marked (Event pending), the clear, the record removed
    assert clear == golden("clear_status_patch.json")
    assert "pending" in mark["body"]["metadata"]["annotations"][NOMINATION_ANNOTATION]
    assert forget["body"]["metadata"]["annotations"] == {NOMINATION_ANNOTATION: None}
    assert api.pods["p"]["status"]["nominatedNodeName"] is None
    [event] = recorder.emitted
    assert (event["reason"], event["regarding"], event["related"], event["action"]) == (
        "NominationCleared", "p", "n1", "ClearNomination")  # fmt: skip
    assert event["note"] == "cleared status.nominatedNodeName n1: node n1 is cordoned"
    labels = {"reason": "node-cordoned", "dry_run": "false"}
    assert registry.get_sample_value("gpuwarden_nominations_cleared_total", labels) == 1


@pytest.mark.parametrize(
    ("on_node", "fail", "guarded"),
    [
        pytest.param([golden("pod_victim_terminating.json")], None, True, id="victim-still-terminating"),
        pytest.param([], KubeUnreachable("down", status=503), True, id="cannot-tell-so-keep"),
        pytest.param([k8s_pod("peer", node="n1", priority=900)], None, False, id="running-pods-do-not-count"),
    ],
)
async def test_guard_is_rechecked_at_write_time(
    on_node: list[dict[str, Any]], fail: KubeError | None, guarded: bool
) -> None:
    victims = [copy.deepcopy(v) for v in on_node]
    for v in victims:
        v["spec"]["nodeName"] = "n1"
    api = FakeApi(k8s_pod("p"), *victims)
    if fail is not None:
        api.fail["list"] = fail
    act, recorder, registry = actuator(api)
    result = await act.apply(clear_plan(pending()))
    assert bool(result.guarded) is guarded and bool(result.cleared) is not guarded
    assert bool(api.writes) is not guarded and bool(recorder.emitted) is not guarded
    assert registry.get_sample_value("gpuwarden_nominations_guard_rechecks_total") == (1 if guarded else 0)


@pytest.mark.parametrize(
    "current",
    [
        pytest.param(k8s_pod("p", nominated="n2"), id="renominated-elsewhere"),
        pytest.param(k8s_pod("p", nominated="n1", node="n1"), id="bound-meanwhile"),
        pytest.param(
            {**k8s_pod("p"), "metadata": {**k8s_pod("p")["metadata"], "uid": "new"}}, id="recreated"
        ),
    ],
)
async def test_a_nomination_that_changed_since_the_plan_is_left_alone(current: dict[str, Any]) -> None:
    api = FakeApi(current)
    act, recorder, _ = actuator(api)
    result = await act.apply(clear_plan(pending()))
    assert not result.cleared and not api.writes and not recorder.emitted


async def test_dry_run_writes_nothing_but_events() -> None:
    api = FakeApi(k8s_pod("p"), k8s_pod("q"))
    act, recorder, registry = actuator(api)
    record = NominationRecord("n1", NOW)
    evict = Evict(pending("q"), "stuck", 4000.0)
    plan = NominationPlan(NOW, True, clears=clear_plan(pending()).clears, evictions=(evict,),
                stamps=(Stamp(pending("q"), record),), forgets=(Forget(pending("r", "")),))  # fmt: skip
    result = await act.apply(plan)
    assert api.writes == [] and api.lists == []
    assert [e["note"].startswith("[dry-run] ") for e in recorder.emitted] == [True, True]
    assert result.unrecorded == {"uid-q": record}, "the loop remembers what it could not write"
    assert registry.get_sample_value("gpuwarden_nominations_evictions_total", {"outcome": "dry_run"}) == 1


async def test_eviction_goes_through_the_eviction_api() -> None:
    api = FakeApi(k8s_pod("q"))
    act, recorder, registry = actuator(api)
    result = await act.apply(
        NominationPlan(NOW, evictions=(Evict(pending("q"), "nominated to n1 for 4000s", 4000.0),))
    )
    assert result.evicted == ["ml/q"]
    assert api.writes == [golden("eviction_request.json")]
    assert recorder.emitted[0]["reason"] == "NominatedPodEvicted"
    assert registry.get_sample_value("gpuwarden_nominations_evictions_total", {"outcome": "evicted"}) == 1


@pytest.mark.parametrize(
    ("error", "outcome", "event"),
    [
        pytest.param(
            KubeUnreachable("Cannot evict pod as it would violate the pod's disruption budget.", status=429),
            "blocked",
            "NominatedPodEvictionBlocked",
            id="pdb-429",
        ),
        pytest.param(KubeUnreachable("boom", status=500), "failed", None, id="server-error"),
    ],
)
async def test_eviction_refused(error: KubeError, outcome: str, event: str | None) -> None:
    api = FakeApi(k8s_pod("q"))
    api.fail["evict"] = error
    act, recorder, registry = actuator(api)
    result = await act.apply(NominationPlan(NOW, evictions=(Evict(pending("q"), "stuck", 4000.0),)))
    assert not result.evicted
    assert registry.get_sample_value("gpuwarden_nominations_evictions_total", {"outcome": outcome}) == 1
    assert [e["reason"] for e in recorder.emitted] == ([event] if event else [])
    if event:
        assert "disruption budget" in recorder.emitted[0]["note"]


async def test_record_writes_carry_the_uid_precondition() -> None:
    api = FakeApi(k8s_pod("p"), k8s_pod("r", nominated=""))
    act, _, _ = actuator(api)
    record = NominationRecord("gpu-node-3", NOW)
    await act.apply(
        NominationPlan(NOW, stamps=(Stamp(pending("p"), record),), forgets=(Forget(pending("r", "")),))
    )
    assert api.writes == golden("record_patches.json")


async def test_api_outage_changes_nothing_and_raises_nothing() -> None:
    api = FakeApi(k8s_pod("p"), k8s_pod("q"))
    for verb in ("get", "list", "patch", "evict"):
        api.fail[verb] = KubeUnreachable("API server unreachable", status=None)
    act, recorder, _ = actuator(api)
    plan = NominationPlan(NOW, clears=clear_plan(pending()).clears,
                          evictions=(Evict(pending("q"), "stuck", 4000.0),),
                          stamps=(Stamp(pending("q"), NominationRecord("n1", NOW)),))  # fmt: skip
    result = await act.apply(plan)
    assert not (result.cleared or result.evicted or api.writes or recorder.emitted)
    assert result.failures == 2 and result.unrecorded, "eviction and record failed; the clear was guarded"
    assert api.pods["p"]["status"]["nominatedNodeName"] == "n1"


# ------------------------------------------------------------------------------------------------- loop
class FakeInformer:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.items = objects
        self.synced = asyncio.Event()
        self.synced.set()

    def objects(self) -> list[dict[str, Any]]:
        return list(self.items)


def k8s_node(name: str = "n1", *, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def loop(
    api: FakeApi, nodes: list[dict[str, Any]], clock: list[float], dry_run: bool = False
) -> NominationLoop:
    return NominationLoop(
        Config(), api, registry=CollectorRegistry(), dry_run=dry_run, clock=lambda: clock[0],  # type: ignore[arg-type]
        pods=FakeInformer(list(api.pods.values())), nodes=FakeInformer(nodes), recorder=FakeRecorder(),  # type: ignore[arg-type]
    )  # fmt: skip


async def test_age_survives_a_restart_through_the_record() -> None:
    api, clock = FakeApi(k8s_pod("p")), [NOW]
    first = loop(api, [k8s_node()], clock)
    await first.run_once()
    stamped = api.pods["p"]["metadata"]["annotations"][NOMINATION_ANNOTATION]
    assert NominationRecord.decode(stamped) == NominationRecord("n1", NOW)
    clock[0] = NOW + 301
    restarted = loop(api, [k8s_node()], clock)  # a new process: nothing in memory
    plan = await restarted.run_once()
    assert [(c.pod.name, c.reason.value) for c in plan.clears] == [("p", "ttl-expired")]
    assert api.pods["p"]["status"]["nominatedNodeName"] is None
    # The record goes with the clear's Event (written once); the next pass has nothing left to forget.
    assert NOMINATION_ANNOTATION not in api.pods["p"]["metadata"]["annotations"]


async def test_dry_run_keeps_the_age_in_memory() -> None:
    api, clock = FakeApi(k8s_pod("p")), [NOW]
    dry = loop(api, [k8s_node()], clock, dry_run=True)
    await dry.run_once()
    clock[0] = NOW + 301
    plan = await dry.run_once()
    assert plan.dry_run and [c.reason.value for c in plan.clears] == ["ttl-expired"]
    assert api.writes == [] and api.pods["p"]["status"]["nominatedNodeName"] == "n1"


async def test_no_writes_without_leadership() -> None:
    api, clock = FakeApi(k8s_pod("p")), [NOW]
    follower = loop(api, [k8s_node(cordoned=True)], clock)
    plan = await follower.run_once(asyncio.Event())
    assert [c.reason.value for c in plan.clears] == ["node-cordoned"]
    assert api.writes == [] and api.lists == []
    registry = follower.metrics
    assert registry.oldest.collect()[0].samples[0].value == 0.0


class WatchedEvent(asyncio.Event):
    """An Event that tells when someone asked whether it is set (the scheduler's leadership gate)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    def is_set(self) -> bool:
        self.asked.set()
        return super().is_set()


def passes_signalled(running: NominationLoop) -> asyncio.Event:
    done = asyncio.Event()
    run_once = running.run_once

    async def signalled(leading: asyncio.Event | None = None) -> object:
        try:
            return await run_once(leading)
        finally:
            done.set()

    running.run_once = signalled  # type: ignore[method-assign]
    return done


async def test_pass_scheduler_runs_passes_while_leading() -> None:
    api, clock = FakeApi(k8s_pod("p")), [NOW]
    running = loop(api, [k8s_node(cordoned=True)], clock)
    done = passes_signalled(running)
    leading, stop = asyncio.Event(), asyncio.Event()
    leading.set()
    task = asyncio.create_task(run_loops(leading, stop, nominations=running))
    await asyncio.wait_for(done.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert running.last_plan is not None and api.pods["p"]["status"]["nominatedNodeName"] is None


async def test_pass_scheduler_skips_passes_while_not_leading() -> None:
    api, clock = FakeApi(k8s_pod("p")), [NOW]
    running = loop(api, [k8s_node(cordoned=True)], clock)
    done = passes_signalled(running)
    leading, stop = WatchedEvent(), asyncio.Event()
    task = asyncio.create_task(run_loops(leading, stop, nominations=running))
    await asyncio.wait_for(leading.asked.wait(), 10)  # the first (immediate) pass was due and gated
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not done.is_set() and running.last_plan is None and api.writes == []


async def test_run_loops_returns_at_once_for_a_disabled_loop() -> None:
    api = FakeApi(k8s_pod("p"))
    disabled = NominationLoop(
        Config.model_validate({"nominations": {"enabled": False}}), api, registry=CollectorRegistry(),  # type: ignore[arg-type]
        pods=FakeInformer([]), nodes=FakeInformer([]), recorder=FakeRecorder(),  # type: ignore[arg-type]
    )  # fmt: skip
    leading = asyncio.Event()
    leading.set()
    await asyncio.wait_for(run_loops(leading, asyncio.Event(), nominations=disabled), 5)
    assert disabled.interval() is None and disabled.last_plan is None
