"""events.k8s.io/v1 Events: series correlation (pure) and the recorder against a fake API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuwarden.errors import KubeConflict, KubeError, KubeForbidden, KubeNotFound, KubeUnreachable
from gpuwarden.kube.events import (
    EventRecorder,
    EventType,
    ObjectRef,
    SeriesState,
    Step,
    correlate,
    micro_time,
    truncate_note,
)
from gpuwarden.kube.resources import PatchType, Resource

W, F = 360.0, 30.0


def state(count: int, last_seen: float, written_count: int, written_at: float) -> SeriesState:
    return SeriesState("n.1", "default", count, last_seen, written_count, written_at)


@pytest.mark.parametrize(
    ("prior", "now", "step", "count"),
    [
        pytest.param(None, 0.0, Step.CREATE, 1, id="first-occurrence-creates"),
        pytest.param(state(1, 0, 1, 0), 5.0, Step.PATCH_SERIES, 2, id="first-repeat-patches-at-once"),
        pytest.param(state(2, 5, 2, 5), 10.0, Step.DEFER, 3, id="later-repeat-within-flush-defers"),
        pytest.param(state(3, 10, 2, 5), 35.0, Step.PATCH_SERIES, 4, id="flush-interval-passed-patches"),
        pytest.param(state(5, 10, 5, 10), 10.0 + W + 1, Step.CREATE, 1, id="outside-window-new-event"),
        pytest.param(state(5, 10, 5, 10), 10.0 + W, Step.PATCH_SERIES, 6, id="window-edge-still-series"),
    ],
)
def test_correlate(prior: SeriesState | None, now: float, step: Step, count: int) -> None:
    assert correlate(prior, now, window=W, flush_interval=F) == (step, count)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        pytest.param(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "2026-01-02T03:04:05.000006Z", id="utc"),
        pytest.param(
            datetime(2026, 1, 2, 5, 4, 5, tzinfo=UTC).astimezone(tz=UTC) + timedelta(0),
            "2026-01-02T05:04:05.000000Z",
            id="zero-micros",
        ),
    ],
)
def test_micro_time(moment: datetime, text: str) -> None:
    assert micro_time(moment) == text


@pytest.mark.parametrize(
    ("note", "length"),
    [
        pytest.param("XID 79 on GPU-1", 15, id="short-kept"),
        pytest.param("x" * 1024, 1024, id="exactly-1k-kept"),
        pytest.param("x" * 5000, 1024, id="long-cut"),
        pytest.param("é" * 600, 1023, id="multibyte-cut-on-boundary"),
    ],
)
def test_truncate_note(note: str, length: int) -> None:
    assert len(truncate_note(note).encode()) == length


def test_object_ref_of_raw_object() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "uid": "u1"}}
    assert ObjectRef.of(pod).to_json() == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ml",
        "uid": "u1",
    }


class FakeEvents:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail_patch: Exception | None = None
        self.fail_create: Exception | None = None

    async def create(
        self, resource: Resource, body: dict[str, Any], *, namespace: str | None = None, dry_run: bool = False
    ) -> dict[str, Any]:
        if self.fail_create:
            raise self.fail_create
        assert body["metadata"]["namespace"] == namespace
        self.created.append(body)
        return body

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: Any,
        *,
        patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        if self.fail_patch:
            raise self.fail_patch
        self.patched.append((name, body))
        return {"metadata": {"name": name}, **body}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=self.t)


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0", "uid": "u-0"}}


def recorder(api: FakeEvents, clock: Clock) -> EventRecorder:
    return EventRecorder(
        api, component="controller", instance="controller-7f9", monotonic=clock.mono, wall=clock.wall
    )


async def test_first_event_body() -> None:
    api, clock = FakeEvents(), Clock()
    written = await recorder(api, clock).emit(
        NODE,
        reason="GPUQuarantined",
        note="XID 79 on GPU-abc",
        action="Quarantine",
        type=EventType.WARNING,
        related={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0", "namespace": "ml"}},
    )
    assert written is not None
    body = api.created[0]
    assert body["metadata"]["namespace"] == "default"  # cluster-scoped regarding → default namespace
    assert body["metadata"]["name"].startswith("gpu-0.")
    assert body["reportingController"] == "gpuwarden.io/controller"
    assert body["reportingInstance"] == "controller-7f9"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "u-0"}
    assert body["related"] == {"apiVersion": "v1", "kind": "Pod", "name": "train-0", "namespace": "ml"}
    assert (body["reason"], body["action"], body["type"], body["note"]) == (
        "GPUQuarantined",
        "Quarantine",
        "Warning",
        "XID 79 on GPU-abc",
    )
    assert body["eventTime"].endswith("Z") and "series" not in body


async def test_repeats_become_a_series_and_flush_writes_deferred_counts() -> None:
    api, clock = FakeEvents(), Clock()
    rec = recorder(api, clock)

    async def emit() -> Any:
        return await rec.emit(NODE, reason="GPUQuarantined", note="XID 79", action="Quarantine")

    await emit()
    clock.t += 15
    assert await emit() is not None  # count 2 written at once
    clock.t += 15
    assert await emit() is None  # count 3 deferred
    clock.t += 5
    assert await emit() is None  # count 4 deferred
    assert len(api.created) == 1
    assert [p[1]["series"]["count"] for p in api.patched] == [2]
    await rec.flush()
    assert [p[1]["series"]["count"] for p in api.patched] == [2, 4]
    await rec.flush()  # nothing pending: no write
    assert len(api.patched) == 2
    clock.t += 31
    await emit()  # flush interval passed: written
    assert [p[1]["series"]["count"] for p in api.patched] == [2, 4, 5]
    assert {p[0] for p in api.patched} == {api.created[0]["metadata"]["name"]}


async def test_different_note_or_regarding_is_a_different_event() -> None:
    api, clock = FakeEvents(), Clock()
    rec = recorder(api, clock)
    await rec.emit(NODE, reason="GPUQuarantined", note="XID 79", action="Quarantine")
    await rec.emit(NODE, reason="GPUQuarantined", note="XID 48", action="Quarantine")
    other = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}
    await rec.emit(other, reason="GPUQuarantined", note="XID 79", action="Quarantine")
    assert len(api.created) == 3 and api.patched == []


async def test_after_the_window_a_new_event_is_created() -> None:
    api, clock = FakeEvents(), Clock()
    rec = recorder(api, clock)
    await rec.emit(NODE, reason="NominationCleared", note="n", action="Clear")
    clock.t += 361
    await rec.emit(NODE, reason="NominationCleared", note="n", action="Clear")
    assert len(api.created) == 2 and api.patched == []


async def test_series_on_an_expired_event_recreates_it_with_the_count() -> None:
    api, clock = FakeEvents(), Clock()
    rec = recorder(api, clock)
    await rec.emit(NODE, reason="GPUQuarantined", note="n", action="Quarantine")
    api.fail_patch = KubeNotFound("404 events not found", status=404)
    clock.t += 1
    await rec.emit(NODE, reason="GPUQuarantined", note="n", action="Quarantine")
    assert len(api.created) == 2
    assert api.created[1]["series"]["count"] == 2


async def test_write_failures_are_swallowed() -> None:
    api, clock = FakeEvents(), Clock()
    api.fail_create = KubeForbidden("403 cannot create events", status=403)
    assert (
        await recorder(api, clock).emit(NODE, reason="GPUQuarantined", note="n", action="Quarantine") is None
    )


@pytest.mark.parametrize(
    ("error", "done"),
    [
        pytest.param(None, True, id="written"),
        pytest.param(KubeConflict("events x already exists", status=409), True, id="exists-already"),
        pytest.param(KubeUnreachable("503", status=503), False, id="unavailable-retried"),
        pytest.param(KubeUnreachable("connection refused"), False, id="unreachable-retried"),
        pytest.param(KubeForbidden("403 cannot create events", status=403), True, id="forbidden-given-up"),
        pytest.param(KubeError("422 name too long", status=422), True, id="invalid-given-up"),
    ],
)
async def test_emit_once_says_whether_anything_is_left_to_do(error: Exception | None, done: bool) -> None:
    api, clock = FakeEvents(), Clock()
    api.fail_create = error
    ref = ObjectRef("v1", "Node", "gpu-0")
    written = await recorder(api, clock).emit_once(
        ref, name="gpu-0.gpuquarantined.1", reason="GPUQuarantined", note="n", action="Taint"
    )
    assert written is done
    assert [e["metadata"]["name"] for e in api.created] == ([] if error else ["gpu-0.gpuquarantined.1"])


@pytest.mark.parametrize(
    ("reason", "action"),
    [
        pytest.param("gpu quarantined", "Quarantine", id="reason-not-camelcase"),
        pytest.param("gpuQuarantined", "Quarantine", id="reason-lower-first"),
        pytest.param("", "Quarantine", id="reason-empty"),
        pytest.param("GPUQuarantined", "", id="action-empty"),
        pytest.param("GPUQuarantined", "x" * 129, id="action-too-long"),
    ],
)
async def test_invalid_reason_or_action_is_a_programming_error(reason: str, action: str) -> None:
    with pytest.raises(ValueError):
        await recorder(FakeEvents(), Clock()).emit(NODE, reason=reason, note="n", action=action)


async def test_series_past_the_window_with_nothing_to_write_are_forgotten() -> None:
    api, clock = FakeEvents(), Clock()
    rec = recorder(api, clock)
    for i in range(50):  # distinct Events (a bind per pod): one series each
        await rec.emit(NODE, reason="GPUsAssigned", note=f"pod {i}", action="Bind")
        clock.t += 1
    assert len(rec._series) == 50
    clock.t += W  # every series is now past the window, with nothing left to write
    await rec.emit(NODE, reason="GPUsAssigned", note="pod 50", action="Bind")
    assert len(rec._series) == 1  # swept
    clock.t += 1
    await rec.emit(NODE, reason="GPUsAssigned", note="pod 51", action="Bind")
    await rec.emit(NODE, reason="GPUsAssigned", note="pod 50", action="Bind")  # within the window: a series
    assert len(rec._series) == 2 and len(api.patched) == 1
