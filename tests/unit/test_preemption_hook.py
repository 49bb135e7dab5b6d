"""`PreemptionThrottle` as the extender's preempt verb (over HTTP, golden payloads) and its observer's
handlers: not synced -> 503, narrowed / vetoed / dry-run answers, victim order, Events deduplicated, metrics,
and the graph fed from real Events and DisruptionTarget conditions."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService, add_extender_routes
from controller.extenderv1 import ExtenderPreemptionArgs
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.preemption.graph import Preemption
from controller.preemption.hook import PreemptionThrottle
from controller.preemption.signals import Workload, parse_time
from gpuwarden.config.root import Config
from gpuwarden.kube import ADDED, DELETED, MODIFIED, SYNCED, ObjectRef, WatchEvent
from gpuwarden.kube.event_queue import PendingEvent
from tests.unit.preemption_support import RecordSink

GOLDEN = Path(__file__).parent / "golden" / "preemption"
NOW = 1_700_000_000.0
TRAINER, SERVE, BATCH = Workload("ml", "trainer"), Workload("ml", "serve"), Workload("ml", "batch")


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes().strip()


class FakeRecorder:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    async def emit(self, regarding: Any, **kw: Any) -> None:
        self.emitted.append({"regarding": regarding, **kw})

    async def flush(self) -> None:
        return None


def pod(
    uid: str, workload: Workload, *, node: str = "n1", created: str = "2023-11-14T00:00:00Z"
) -> dict[str, Any]:
    owners = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": workload.name, "uid": "o", "controller": True}
    ]
    return {
        "metadata": {"uid": uid, "name": f"{workload.name}-{uid}", "namespace": workload.namespace,
                     "ownerReferences": owners, "creationTimestamp": created},
        "spec": {"nodeName": node, "priority": 10},
        "status": {"phase": "Running"},
    }  # fmt: skip


def throttle(
    preemption: dict[str, Any] | None = None, *, synced: bool = True
) -> tuple[PreemptionThrottle, FakeRecorder, CollectorRegistry]:
    config = Config.model_validate({"preemption": preemption or {}})
    registry, recorder = CollectorRegistry(), FakeRecorder()
    t = PreemptionThrottle(config, RecordSink(), registry=registry, recorder=recorder, clock=lambda: NOW)  # type: ignore[arg-type]
    for uid, wl in (
        ("v3", BATCH),
        ("v4", BATCH),
        ("v5", BATCH),
        ("v-high", BATCH),
        ("v-low", BATCH),
        ("v-serve", SERVE),
    ):
        t.observer.on_pod(WatchEvent(ADDED, pod(uid, wl)))
    if synced:
        t.observer.pods.synced.set()
        t.observer.on_event(WatchEvent(SYNCED, {}))
    return t, recorder, registry


NARROWING = {
    "global_budget": None,
    "workload_budget": None,
    "namespace_budget": {"max_victims": 4, "window_seconds": 300},
}


def narrowing_history(t: PreemptionThrottle) -> None:
    t.graph.observe(Preemption("t-old", TRAINER, "n9", NOW - 60, preemptor_uid="s-pod", preemptor=SERVE))
    t.graph.observe(
        Preemption("b-old", BATCH, "n8", NOW - 30, preemptor_uid="x-pod", preemptor=Workload("ml", "x"))
    )


@pytest.fixture
async def http() -> AsyncIterator[
    tuple[TestClient[web.Request, web.Application], PreemptionThrottle, FakeRecorder, CollectorRegistry]
]:
    t, recorder, registry = throttle(NARROWING)
    service = ExtenderService(ClusterModel(), Settings(), extender_metrics(None), preempt_hook=t)
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as client:
        yield client, t, recorder, registry


async def post(client: TestClient[web.Request, web.Application], body: bytes) -> tuple[int, bytes]:
    response = await client.post("/gpu-extender/preempt", data=body)
    return response.status, await response.read()


async def test_no_history_passes_every_candidate_with_victims(http: Any) -> None:
    client, _, recorder, registry = http
    status, body = await post(client, golden("preempt_args_cache.json"))
    assert (status, body) == (200, golden("preempt_result_passed.json")), "n4 (no victims) is never returned"
    assert (
        registry.get_sample_value(
            "gpuwarden_preemption_decisions_total", {"outcome": "passed", "dry_run": "false"}
        )
        == 1
    )
    assert recorder.emitted == []


async def test_narrowed_keeps_the_victims_and_their_order(http: Any) -> None:
    client, t, recorder, registry = http
    narrowing_history(t)
    status, body = await post(client, golden("preempt_args_cache.json"))
    assert (status, body) == (200, golden("preempt_result_narrowed.json"))
    for reason in ("ping-pong", "budget-namespace"):
        assert registry.get_sample_value("gpuwarden_preemption_throttled_total", {"reason": reason}) == 1
    await t.events.drain()  # what the writer task does in the background
    [event] = recorder.emitted
    assert event["reason"] == "PreemptionThrottled" and event["regarding"].name == "trainer-5d4f8b9c7-x2x7k"
    assert "narrowed to 1 of 3" in event["note"] and "ml/serve recently preempted" in event["note"]
    assert t.graph.victims(NOW, 300, namespace="ml") == 4, "the 2 victims of n1 are reserved"


async def test_veto_answers_an_empty_map_and_events_once(http: Any) -> None:
    client, t, recorder, registry = http
    narrowing_history(t)
    t.graph.observe(
        Preemption("b-2", BATCH, "n7", NOW - 20, preemptor_uid="x-pod", preemptor=Workload("ml", "x"))
    )
    t.graph.observe(
        Preemption("b-3", BATCH, "n7", NOW - 10, preemptor_uid="x-pod", preemptor=Workload("ml", "x"))
    )
    for _ in range(3):
        assert await post(client, golden("preempt_args_cache.json")) == (
            200,
            golden("preempt_result_vetoed.json"),
        )
    await t.events.drain()  # what the writer task does in the background
    assert len(recorder.emitted) == 1, "the same verdict for the same preemptor is evented once"
    assert recorder.emitted[0]["note"].startswith(
        "preemption vetoed: budget spent: 4 per 300s in namespace ml"
    )
    assert (
        registry.get_sample_value(
            "gpuwarden_preemption_decisions_total", {"outcome": "vetoed", "dry_run": "false"}
        )
        == 3
    )


@pytest.mark.parametrize(("interval", "events"), [(None, 1), (5, 2)], ids=["default-60s", "configured-5s"])
async def test_event_interval_comes_from_the_config(interval: int | None, events: int) -> None:
    config = NARROWING | ({} if interval is None else {"event_interval_seconds": interval})
    t, recorder, _ = throttle(config)
    narrowing_history(t)
    for uid in ("b-2", "b-3"):
        t.graph.observe(
            Preemption(uid, BATCH, "n7", NOW - 20, preemptor_uid="x-pod", preemptor=Workload("ml", "x"))
        )
    args = ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_cache.json"))
    now = NOW
    t.clock = lambda: now
    for step in (0, 6):  # the same verdict twice, 6 s apart
        now = NOW + step
        assert (await t(args)).node_name_to_meta_victims == {}
    await t.events.drain()  # what the writer task does in the background
    assert len(recorder.emitted) == events


async def test_not_synced_is_503_so_the_scheduler_retries() -> None:
    t, _, _ = throttle(synced=False)
    service = ExtenderService(ClusterModel(), Settings(), extender_metrics(None), preempt_hook=t)
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as client:
        status, _ = await post(client, golden("preempt_args_cache.json"))
    assert status == 503


async def test_dry_run_passes_through_but_counts_and_events() -> None:
    t, recorder, registry = throttle({**NARROWING, "dry_run": True})
    narrowing_history(t)
    result = await t(ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_cache.json")))
    assert result.to_json() == golden("preempt_result_passed.json")
    assert (
        registry.get_sample_value(
            "gpuwarden_preemption_decisions_total", {"outcome": "narrowed", "dry_run": "true"}
        )
        == 1
    )
    await t.events.drain()  # what the writer task does in the background
    assert recorder.emitted[0]["note"].startswith("[dry-run] narrowed")
    assert t.graph.victims(NOW, 300, namespace="ml") == 2, "dry-run reserves nothing"


async def test_full_victim_pods_need_no_cache() -> None:
    t, _, _ = throttle(NARROWING)
    t.observer.index.clear()
    narrowing_history(t)
    args = json.loads(golden("preempt_args_cache.json"))
    args["NodeNameToMetaVictims"] = None
    args["NodeNameToVictims"] = {"n2": {"Pods": [pod("v-serve", SERVE, node="n2")], "NumPDBViolations": 0}}
    result = await t(ExtenderPreemptionArgs.model_validate(args))
    assert result.node_name_to_meta_victims == {}, "v-serve's workload is known from the request: ping-pong"


def preempted_condition(at: str) -> dict[str, str]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "lastTransitionTime": at,
    }


def test_observer_builds_the_graph_from_real_signals() -> None:
    t, _, registry = throttle()
    event = json.loads((GOLDEN / "event_preempted_events_v1.json").read_text())
    victim_uid, preemptor_uid = event["regarding"]["uid"], event["related"]["uid"]
    ns = event["regarding"]["namespace"]
    victim = pod(victim_uid, Workload(ns, "low"), node="pre-94931-0e71-a")
    victim["metadata"]["deletionTimestamp"] = "2026-11-29T13:52:19Z"
    victim["status"]["conditions"] = [preempted_condition("2026-11-29T13:52:19Z")]
    t.observer.on_pod(WatchEvent(ADDED, pod(preemptor_uid, Workload(ns, "high"), node="")))
    t.observer.on_pod(WatchEvent(MODIFIED, victim))
    t.observer.on_pod(WatchEvent(DELETED, victim))
    record = t.graph.get(victim_uid)
    assert record is not None and record.preemptor is None and record.victim == Workload(ns, "low")
    assert t.observer.lookup(victim_uid) is not None, "a deleted pod stays resolvable (tombstone)"
    t.observer.on_event(WatchEvent(ADDED, event))
    t.observer.on_event(WatchEvent(MODIFIED, event))  # a series update: nothing new
    record = t.graph.get(victim_uid)
    assert (
        record is not None and record.preemptor == Workload(ns, "high") and record.node == "pre-94931-0e71-a"
    )
    assert record.at == parse_time("2026-11-29T13:52:19Z")
    assert registry.get_sample_value("gpuwarden_preemptions_observed_total") == 1
    assert registry.get_sample_value("gpuwarden_preemption_chain_depth_count") == 1
    assert registry.get_sample_value("gpuwarden_preemption_window_records", {"depth": "1"}) == 1


def test_event_for_pods_never_seen_uses_their_names() -> None:
    t, _, _ = throttle()
    event = copy.deepcopy(json.loads((GOLDEN / "event_preempted_core_v1.json").read_text()))
    event["involvedObject"]["name"] = "web-5d4f8b9c7-x2x7k"
    event["related"]["name"] = "train-q8zrw"
    t.observer.on_event(WatchEvent(ADDED, event))
    record = t.graph.get(event["involvedObject"]["uid"])
    ns = event["involvedObject"]["namespace"]
    assert (
        record is not None
        and record.victim == Workload(ns, "web")
        and record.preemptor == Workload(ns, "train")
    )


def test_condition_of_a_victim_this_replica_allowed_is_linked_at_once() -> None:
    t, _, _ = throttle()
    t.graph.reserve("p-uid", TRAINER, {"n1": [("v-low", BATCH.key)]}, NOW)
    marked = pod("v-low", BATCH)
    marked["status"]["conditions"] = [preempted_condition("2023-11-14T22:13:20Z")]
    t.observer.on_pod(WatchEvent(MODIFIED, marked))
    record = t.graph.get("v-low")
    assert record is not None and record.preemptor == TRAINER and record.preemptor_uid == "p-uid"


def test_replicas_fed_the_same_api_objects_decide_the_same() -> None:
    """Budget and chain state is rebuilt from the API: a restarted replica listing the Events in another
    order answers exactly like the one that watched them arrive."""
    ns = "ml"
    events = []
    for i, (victim, preemptor) in enumerate([("a", "x"), ("b", "a"), ("trainer", "b"), ("y", "z")]):
        base = json.loads((GOLDEN / "event_preempted_events_v1.json").read_text())
        base["metadata"]["uid"] = f"ev{i}"
        base["regarding"] |= {"uid": f"{victim}-{i}", "name": f"{victim}-q8zrw", "namespace": ns}
        base["related"] |= {"uid": f"{preemptor}-p{i}", "name": f"{preemptor}-b2c4d", "namespace": ns}
        base["note"] = f"Preempted by pod {preemptor}-p{i} on node n{i}"
        base["eventTime"] = f"2023-11-14T22:1{i}:00.000000Z"
        events.append(base)
    answers = []
    for order in (events, events[::-1]):
        t, _, _ = throttle({"max_chain_depth": 3})
        for e in order:
            t.observer.on_event(WatchEvent(ADDED, e))
        args = ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_cache.json"))
        _, decision, _ = t.decide(args)
        answers.append((decision, t.graph.depth_histogram(), t.graph.victims(NOW, 3600, workload=TRAINER)))
    assert answers[0] == answers[1]
    assert answers[0][0].veto is not None and answers[0][0].depth == 4


async def test_events_are_written_by_the_background_writer_and_dropped_once_it_stopped() -> None:
    t, recorder, _ = throttle(NARROWING)
    narrowing_history(t)
    args = ExtenderPreemptionArgs.model_validate_json(golden("preempt_args_cache.json"))
    assert (await t(args)).node_name_to_meta_victims  # narrowed: one Event queued, none written yet
    assert recorder.emitted == [] and t.events.queued == 1
    writer = asyncio.create_task(t.events.run())
    for _ in range(50):
        if recorder.emitted:
            break
        await asyncio.sleep(0.01)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    assert len(recorder.emitted) == 1 and t.events.queued == 0
    assert t.events.closed  # a stopped writer takes nothing more: later events count as dropped
    late = PendingEvent(ObjectRef("v1", "Pod", "x", "ml"), "PreemptionThrottled", "late", "Throttle")
    assert t.events.offer(late) is False and t.events.dropped == 1
