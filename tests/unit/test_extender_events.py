"""Bind Events: which outcome becomes which Event (pure), the bounded queue and its writer, and the verb's
wiring (an Event per bind, never a bind waiting on one), with the real `EventRecorder` over a fake API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from controller.extender.bind import Binder
from controller.extender.events import (
    ASSIGNED,
    FAILED,
    BindEvent,
    BindEvents,
    bind_event,
    policy_verdict,
    summary_note,
)
from controller.extender.metrics import extender_metrics
from controller.extender.runtime import build_extender
from controller.extender.server import NOT_SYNCED, ExtenderService
from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.fit import Choice, Settings
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeForbidden
from gpuwarden.kube import EventRecorder, EventType, KubeClient, ObjectRef
from tests.unit.extender_support import FakePodApi, model, node, pod
from tests.unit.test_kube_events import FakeEvents

NOW = 1_700_000_000.0
ARGS = ExtenderBindingArgs(pod_name="p", pod_namespace="ml", pod_uid="uid-p", node="n")
ONE_NUMA = Choice(("0", "1", "2", "3"), (0,), "nvlink", 9)
TWO_NUMA = Choice(tuple(str(i) for i in range(8)), (0, 1), "whole-numa", 7)
SPREAD = Choice(("3", "4"), (0, 1), "cross-numa", 3)


@pytest.mark.parametrize(
    ("policy", "choice", "verdict"),
    [
        pytest.param("single-numa", ONE_NUMA, "single-numa satisfied", id="single-numa-one-node"),
        pytest.param(
            "single-numa",
            TWO_NUMA,
            "single-numa satisfied with the fewest whole NUMA nodes (0,1); no NUMA node holds the request",
            id="single-numa-spread-over-whole-nodes",
        ),
        pytest.param("single-pcie", ONE_NUMA, "single-pcie satisfied", id="single-pcie"),
        pytest.param("prefer-numa", ONE_NUMA, "prefer-numa satisfied", id="prefer-numa-met"),
        pytest.param(
            "prefer-numa",
            SPREAD,
            "prefer-numa not met: spans NUMA nodes 0,1 (no single NUMA node had room)",
            id="prefer-numa-not-met",
        ),
        pytest.param("none", SPREAD, "none (no constraint)", id="none"),
        pytest.param("", ONE_NUMA, "none (no constraint)", id="unknown-policy-text"),
    ],
)
def test_policy_verdict(policy: str, choice: Choice, verdict: str) -> None:
    assert policy_verdict(policy, choice) == verdict


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        pytest.param(
            {"kind": "bound", "choice": ONE_NUMA, "policy": "single-numa"},
            (
                ASSIGNED,
                EventType.NORMAL,
                "GPUs 0,1,2,3 on node n, NUMA node 0, alignment nvlink; "
                "topology policy single-numa satisfied",
            ),
            id="bound",
        ),
        pytest.param(
            {"kind": "bound", "choice": ONE_NUMA, "policy": "single-numa", "dry_run": True},
            (
                ASSIGNED,
                EventType.NORMAL,
                "[dry-run] claim not written; would assign GPUs 0,1,2,3 on node n, "
                "NUMA node 0, alignment nvlink; topology policy single-numa satisfied",
            ),
            id="dry-run",
        ),
        pytest.param(
            {
                "kind": "conflict",
                "error": "GPUs on n were claimed concurrently (GPU 0 by ml/q); retry",
                "cause": "gpu_claimed",
            },
            (
                FAILED,
                EventType.WARNING,
                "binding to node n failed: GPUs on n were claimed concurrently (GPU 0 by ml/q); retry",
            ),
            id="conflicting-claim",
        ),
        pytest.param(
            {
                "kind": "rejected",
                "error": "no GPU set for ml/p on n: GPUs quarantined by gpuwarden (xid-79)",
                "cause": "no_fit",
            },
            (
                FAILED,
                EventType.WARNING,
                "binding to node n failed: no GPU set for ml/p on n: GPUs quarantined by gpuwarden (xid-79)",
            ),
            id="quarantined",
        ),
        pytest.param(
            {
                "kind": "bound",
                "cause": "no_fit",
                "policy": "single-pcie",
                "dry_run": True,
                "would_fail": "no GPU set for ml/p on n: no PCIe switch holds 8 free GPUs",
            },
            (
                FAILED,
                EventType.WARNING,
                "[dry-run] would fail: no GPU set for ml/p on n: no PCIe switch holds 8 free GPUs",
            ),
            id="dry-run-would-fail",
        ),
        pytest.param(
            {"kind": "error", "error": "binding ml/p to n failed: forbidden", "cause": "api_error"},
            (FAILED, EventType.WARNING, "binding to node n failed: binding ml/p to n failed: forbidden"),
            id="api-error",
        ),
        pytest.param(
            {"kind": "error", "error": NOT_SYNCED, "cause": "not_synced"},
            (FAILED, EventType.WARNING, f"binding to node n failed: {NOT_SYNCED}"),
            id="not-synced",
        ),
        pytest.param(
            {"kind": "error", "error": "pod ml/p not found", "cause": "pod_gone"}, None, id="pod-gone"
        ),
        pytest.param(
            {"kind": "error", "error": "pod ml/p has UID x, not uid-p", "cause": "pod_replaced"},
            None,
            id="pod-replaced",
        ),
        pytest.param({"kind": "bound"}, None, id="pod-without-gpus"),
        pytest.param({"kind": "already_bound", "choice": ONE_NUMA}, None, id="idempotent-repeat"),
    ],
)
def test_bind_event(outcome: dict[str, Any], expected: tuple[str, EventType, str] | None) -> None:
    event = bind_event(ARGS, **outcome)
    if expected is None:
        assert event is None
        return
    assert event is not None
    assert (event.reason, event.type, event.note) == expected
    assert event.regarding() == ObjectRef("v1", "Pod", "p", "ml", "uid-p")
    assert event.related() == ObjectRef("v1", "Node", "n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime.fromtimestamp(NOW + self.t, UTC)


def recorder(sink: FakeEvents, clock: Clock | None = None) -> EventRecorder:
    clock = clock or Clock()
    return EventRecorder(sink, component="extender", instance="ctrl-0", monotonic=clock.mono, wall=clock.wall)


def failed(note: str = "binding to node n failed: x") -> BindEvent:
    return BindEvent("ml", "p", "uid-p", "n", FAILED, EventType.WARNING, note)


def assigned(name: str, target: str) -> BindEvent:
    return BindEvent(
        "ml", name, f"uid-{name}", target, ASSIGNED, EventType.NORMAL, f"GPUs 0 on node {target}"
    )


async def test_writer_creates_the_event_and_repeats_become_a_series() -> None:
    sink, clock = FakeEvents(), Clock()
    events = BindEvents(recorder(sink, clock))
    assert events.offer(failed())
    clock.t += 1
    assert events.offer(failed())
    assert await events.drain() == 2
    [body] = sink.created
    assert body["reason"] == FAILED and body["type"] == "Warning" and body["action"] == "Bind"
    assert body["reportingController"] == "gpuwarden.io/extender"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ml",
        "uid": "uid-p",
    }
    assert body["related"] == {"apiVersion": "v1", "kind": "Node", "name": "n"}
    assert body["metadata"]["namespace"] == "ml"
    assert [patch["series"]["count"] for _, patch in sink.patched] == [2]


async def test_a_full_queue_summarizes_per_node_instead_of_waiting_or_dropping() -> None:
    registry = CollectorRegistry()
    metrics = extender_metrics(registry)
    sink = FakeEvents()
    events = BindEvents(
        recorder(sink), capacity=2, on_drop=metrics.events_dropped.inc,
        on_summarized=metrics.events_summarized.inc,
    )  # fmt: skip
    offered = [assigned(f"p{i}", "n") for i in range(5)] + [assigned("q", "m"), failed("x")]
    assert [events.offer(e) for e in offered] == [True, True, False, False, False, False, False]
    assert events.offer(None) is False  # nothing to tell: not a drop
    assert events.dropped == 0 and events.queued == 2 and events.pending_summaries == 5
    assert registry.get_sample_value("gpuwarden_extender_events_summarized_total") == 5
    assert registry.get_sample_value("gpuwarden_extender_events_dropped_total") == 0
    assert await events.drain() == 2 and await events.write_summaries() == 3
    per_pod = [b for b in sink.created if b["regarding"]["kind"] == "Pod"]
    summaries = {
        (b["regarding"]["name"], b["reason"]): b for b in sink.created if b["regarding"]["kind"] == "Node"
    }
    assert [b["regarding"]["name"] for b in per_pod] == ["p0", "p1"]
    assert summaries[("n", ASSIGNED)]["note"] == (
        "GPUsAssigned for 3 pods on node n (summarized under load, no Event per pod): ml/p2, ml/p3, ml/p4"
    )
    assert summaries[("m", ASSIGNED)]["note"].startswith("GPUsAssigned for 1 pods on node m")
    assert (
        summaries[("n", FAILED)]["type"] == "Warning" and summaries[("n", FAILED)]["action"] == "BindSummary"
    )
    assert events.pending_summaries == 0 and await events.write_summaries() == 0


@pytest.mark.parametrize(
    ("count", "pods", "note"),
    [
        (1, ["ml/a"], "X for 1 pods on node n (summarized under load, no Event per pod): ml/a"),
        (3, ["ml/a"], "X for 3 pods on node n (summarized under load, no Event per pod): ml/a and 2 more"),
        (
            500,
            [f"namespace-{i:03d}/pod-with-a-long-name-{i:05d}" for i in range(64)],
            "X for 500 pods on node n (summarized under load, no Event per pod): "
            + ", ".join(f"namespace-{i:03d}/pod-with-a-long-name-{i:05d}" for i in range(22))
            + " and 478 more",
        ),
    ],
    ids=["one", "names-kept-fewer-than-count", "note-within-1-KiB"],
)
def test_summary_note(count: int, pods: list[str], note: str) -> None:
    assert summary_note("X", "n", count, pods) == note
    assert len(note.encode()) <= 1024


async def written(sink: FakeEvents, count: int) -> None:
    for _ in range(2000):
        if len(sink.created) >= count:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{len(sink.created)} Events written, not {count}")


async def test_the_writer_writes_summaries_every_interval() -> None:
    sink = FakeEvents()
    events = BindEvents(recorder(sink), capacity=1, flush_interval=3600, summary_interval=0.001)
    for i in range(3):
        events.offer(assigned(f"p{i}", "n"))
    task = asyncio.create_task(events.run())
    await written(sink, 2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [(b["regarding"]["kind"], b["note"][:32]) for b in sink.created] == [
        ("Pod", "GPUs 0 on node n"),
        ("Node", "GPUsAssigned for 2 pods on node "),
    ]


async def test_a_round_writes_at_most_its_batch_and_the_rest_keep_counting() -> None:
    sink = FakeEvents()
    events = BindEvents(recorder(sink), capacity=1)
    for i in range(5):
        events.offer(assigned(f"p{i}", f"n{i}"))  # p0 queued, four nodes summarized
    assert await events.write_summaries(limit=2) == 2
    events.offer(assigned("q", "n4"))
    assert events.pending_summaries == 3
    assert await events.write_summaries() == 2
    notes = sorted(b["note"][:34] for b in sink.created)
    assert notes == [
        "GPUsAssigned for 1 pods on node n1",
        "GPUsAssigned for 1 pods on node n2",
        "GPUsAssigned for 1 pods on node n3",
        "GPUsAssigned for 2 pods on node n4",
    ]


async def test_summaries_left_at_shutdown_are_written_on_the_way_out() -> None:
    sink = FakeEvents()
    events = BindEvents(recorder(sink), capacity=1, flush_interval=3600, summary_interval=3600)
    for i in range(3):
        events.offer(assigned(f"p{i}", "m"))
    task = asyncio.create_task(events.run())
    await written(sink, 1)  # the queued one; the queue is empty again
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [b["note"][:32] for b in sink.created] == ["GPUs 0 on node m", "GPUsAssigned for 2 pods on node "]
    assert events.dropped == 0 and events.pending_summaries == 0


class Flaky:
    """A recorder whose first emit raises (as a broken recorder might) and that signals every write."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.written = asyncio.Event()
        self.flushed = 0

    async def emit(self, regarding: ObjectRef, **kw: Any) -> None:
        self.notes.append(kw["note"])
        if len(self.notes) == 1:
            raise RuntimeError("boom")
        self.written.set()

    async def flush(self) -> None:
        self.flushed += 1


async def test_run_survives_a_failing_write_and_flushes_on_stop() -> None:
    sink = Flaky()
    events = BindEvents(sink, flush_interval=3600)
    events.offer(failed("first"))
    events.offer(failed("second"))
    task = asyncio.create_task(events.run())
    await sink.written.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [n.rsplit(": ", 1)[-1] for n in sink.notes] == ["first", "second"]
    assert sink.flushed == 1  # deferred series counts written on the way out


class Gated:
    """A recorder whose writes wait for `gate` and whose first flush raises (a non-KubeError bug)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.notes: list[str] = []
        self.flushes = 0
        self.flushed_again = asyncio.Event()

    async def emit(self, regarding: ObjectRef, **kw: Any) -> None:
        await self.gate.wait()
        self.notes.append(kw["note"])

    async def flush(self) -> None:
        self.flushes += 1
        if self.flushes == 1:
            raise RuntimeError("flush bug")
        self.flushed_again.set()


async def test_a_failing_flush_does_not_end_the_writer() -> None:
    sink = Gated()
    sink.gate.set()
    events = BindEvents(sink, flush_interval=0.001)
    task = asyncio.create_task(events.run())
    await sink.flushed_again.wait()  # the first flush raised; the writer went on
    assert not task.done()
    events.offer(failed("after"))
    await events.close(grace=30)
    assert sink.notes == ["after"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_close_lets_the_writer_finish_then_offers_count_as_drops() -> None:
    """Shutdown: the verb has stopped answering; queued events are written, later offers are counted."""
    registry = CollectorRegistry()
    metrics = extender_metrics(registry)
    sink = Gated()
    events = BindEvents(sink, flush_interval=3600, on_drop=metrics.events_dropped.inc)
    events.offer(failed("one"))
    events.offer(failed("two"))
    task = asyncio.create_task(events.run())
    closing = asyncio.create_task(events.close(grace=30))
    await asyncio.sleep(0)
    assert not closing.done() and events.closed  # waiting for the writer, which waits for the API
    sink.gate.set()
    await closing
    assert [n.rsplit(": ", 1)[-1] for n in sink.notes] == ["one", "two"]
    assert events.offer(failed("late")) is False
    assert registry.get_sample_value("gpuwarden_extender_events_dropped_total") == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_offer_after_the_writer_ended_is_counted_not_lost() -> None:
    registry = CollectorRegistry()
    metrics = extender_metrics(registry)
    events = BindEvents(Flaky(), flush_interval=3600, on_drop=metrics.events_dropped.inc)
    task = asyncio.create_task(events.run())
    await asyncio.sleep(0)
    task.cancel()  # e.g. the extender's job ended
    await asyncio.gather(task, return_exceptions=True)
    assert events.offer(failed()) is False and events.queued == 0
    assert registry.get_sample_value("gpuwarden_extender_events_dropped_total") == 1


def service(
    api: FakePodApi, events: BindEvents, *, synced: bool = True, dry_run: bool = False
) -> ExtenderService:
    m = model([node("n")], api.pods.values())
    m.nodes_synced = m.pods_synced = synced
    api.on_write.append(m.upsert_pod)
    settings = Settings(fleet_max_numa_gpus=4)
    binder = Binder(api, m, lambda: settings, clock=lambda: NOW, dry_run=dry_run)
    return ExtenderService(
        m, settings, extender_metrics(None), binder=binder, clock=lambda: NOW, events=events
    )


async def test_bind_verb_queues_gpus_assigned_with_the_placement() -> None:
    sink = FakeEvents()
    events = BindEvents(recorder(sink))
    result = await service(FakePodApi([pod("p", 4)]), events).bind(ARGS)
    assert result.error == "" and events.queued == 1  # queued by the verb, written later
    await events.drain()
    [body] = sink.created
    assert body["reason"] == ASSIGNED and body["type"] == "Normal"
    assert body["note"] == (
        "GPUs 0,1,2,3 on node n, NUMA node 0, alignment numa; topology policy single-numa satisfied"
    )


async def test_bind_verb_reports_refusals_and_answers_even_when_events_cannot_be_written() -> None:
    sink = FakeEvents()
    sink.fail_create = KubeForbidden("events is forbidden", status=403)
    events = BindEvents(recorder(sink))
    api = FakePodApi([pod("p", 8, policy="single-pcie")])
    result = await service(api, events).bind(ARGS)
    assert "no GPU set for ml/p on n" in result.error
    await events.drain()  # the recorder logs the 403; nothing raises
    assert sink.created == []
    sink.fail_create = None
    unsynced = await service(FakePodApi([pod("p", 1)]), events, synced=False).bind(ARGS)
    assert unsynced.error == NOT_SYNCED
    await events.drain()
    assert [(b["reason"], b["note"]) for b in sink.created] == [
        (FAILED, f"binding to node n failed: {NOT_SYNCED}")
    ]


async def test_dry_run_bind_events_what_a_real_run_would_refuse() -> None:
    """Safety rule 4 (docs/architecture.md): dry-run actions are computed and evented. The pod is bound (no
    claim written), and the refusal a real run would have answered becomes a Warning Event."""
    sink = FakeEvents()
    events = BindEvents(recorder(sink), dry_run=True)
    api = FakePodApi([pod("p", 8, policy="single-pcie")])
    result = await service(api, events, dry_run=True).bind(ARGS)
    assert result.error == ""
    assert api.pods["ml/p"]["spec"].get("nodeName") == "n"
    assert "gpuwarden.io/gpu-ids" not in (api.pods["ml/p"]["metadata"].get("annotations") or {})
    await events.drain()
    [body] = sink.created
    assert (body["reason"], body["type"]) == (FAILED, "Warning")
    assert body["note"].startswith("[dry-run] would fail: no GPU set for ml/p on n: ")


@pytest.mark.parametrize("enabled", [True, False])
async def test_build_extender_wires_events_by_config(enabled: bool) -> None:
    cfg = Config.model_validate({"extender": {"events": enabled}})
    sink = FakeEvents()
    ext = build_extender(cfg, cast(KubeClient, object()), recorder=recorder(sink))
    assert (ext.events is not None) is enabled
    assert ext.service.events is ext.events
