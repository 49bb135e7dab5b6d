"""List+watch: pure relist diff, cache updates, back-off, and the informer loop against a fake source.

A real API server cannot be made to fail on demand (a 410 in the middle of a watch, a refused list), so the
loop's relist/back-off behaviour is tested here with a scripted source; tests/e2e/test_kube_access.py runs
the same informer against the real control plane.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuwarden.errors import KubeError, KubeGone, KubeUnreachable
from gpuwarden.kube.resources import NODES, ObjectList, Resource
from gpuwarden.kube.stream import _lines, _next_event
from gpuwarden.kube.watch import (
    ADDED,
    DELETED,
    MODIFIED,
    SYNCED,
    Backoff,
    Informer,
    WatchEvent,
    apply_event,
    diff_relist,
)


def node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels}}


# ------------------------------------------------------------------------------------------------ pure parts
@pytest.mark.parametrize(
    ("store", "items", "expected"),
    [
        pytest.param({}, [], [], id="empty-to-empty"),
        pytest.param({}, [node("a", "1")], [(ADDED, "a")], id="first-list-adds"),
        pytest.param({"a": node("a", "1")}, [node("a", "1")], [], id="unchanged-is-silent"),
        pytest.param({"a": node("a", "1")}, [node("a", "5")], [(MODIFIED, "a")], id="changed-rv-modifies"),
        pytest.param(
            {"a": node("a", "1"), "b": node("b", "2")},
            [node("b", "2")],
            [(DELETED, "a")],
            id="vanished-deletes",
        ),
        pytest.param(
            {"b": node("b", "2"), "c": node("c", "3")},
            [node("a", "9"), node("c", "4")],
            [(ADDED, "a"), (MODIFIED, "c"), (DELETED, "b")],
            id="mixed-adds-first-deletes-last",
        ),
    ],
)
def test_diff_relist(
    store: dict[str, Any], items: list[dict[str, Any]], expected: list[tuple[str, str]]
) -> None:
    events = diff_relist(store, items)
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == expected
    for event in events:
        apply_event(store, event)
    assert sorted(store) == sorted(i["metadata"]["name"] for i in items)


def test_deleted_on_relist_carries_last_known_object() -> None:
    last = node("a", "7", pool="h100")
    (event,) = diff_relist({"a": last}, [])
    assert event == WatchEvent(DELETED, last)


@pytest.mark.parametrize(
    ("event", "before", "after"),
    [
        pytest.param(WatchEvent(ADDED, node("a", "1")), {}, {"a": "1"}, id="added"),
        pytest.param(WatchEvent(MODIFIED, node("a", "2")), {"a": node("a", "1")}, {"a": "2"}, id="modified"),
        pytest.param(WatchEvent(DELETED, node("a", "3")), {"a": node("a", "2")}, {}, id="deleted"),
        pytest.param(
            WatchEvent(DELETED, node("x", "3")), {"a": node("a", "2")}, {"a": "2"}, id="delete-unknown"
        ),
        pytest.param(WatchEvent(SYNCED, {}), {"a": node("a", "2")}, {"a": "2"}, id="synced-noop"),
        pytest.param(
            WatchEvent(ADDED, {"metadata": {"name": "p", "namespace": "ml", "resourceVersion": "4"}}),
            {},
            {"ml/p": "4"},
            id="namespaced-key",
        ),
    ],
)
def test_apply_event(event: WatchEvent, before: dict[str, Any], after: dict[str, str]) -> None:
    apply_event(before, event)
    assert {k: v["metadata"]["resourceVersion"] for k, v in before.items()} == after


@pytest.mark.parametrize(
    ("backoff", "attempt", "rand", "delay"),
    [
        pytest.param(Backoff(), 0, 0.5, 0.8, id="first-no-jitter"),
        pytest.param(Backoff(), 3, 0.5, 6.4, id="exponential"),
        pytest.param(Backoff(), 10, 0.5, 30.0, id="capped"),
        pytest.param(Backoff(), 0, 0.0, 0.64, id="jitter-low"),
        pytest.param(Backoff(), 0, 1.0, 0.96, id="jitter-high"),
        pytest.param(Backoff(initial=1, factor=1, jitter=0), 5, 0.9, 1.0, id="constant"),
        pytest.param(Backoff(), -1, 0.5, 0.8, id="negative-attempt-clamped"),
    ],
)
def test_backoff_delay(backoff: Backoff, attempt: int, rand: float, delay: float) -> None:
    assert backoff.delay(attempt, rand) == pytest.approx(delay)


# ----------------------------------------------------------------------------------------- stream parsing
class ChunkedResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Any:
        yield from self.chunks


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        pytest.param([b'{"a":1}\n{"b":2}\n'], [b'{"a":1}', b'{"b":2}'], id="two-lines-one-chunk"),
        pytest.param([b'{"a"', b":1}\n{", b'"b":2}\n'], [b'{"a":1}', b'{"b":2}'], id="split-across-chunks"),
        pytest.param([b'{"a":1}\n\n', b"\n"], [b'{"a":1}'], id="blank-lines-skipped"),
        pytest.param([b'{"a":1}\n{"b":2}'], [b'{"a":1}', b'{"b":2}'], id="unterminated-last-line"),
        pytest.param([], [], id="empty-stream"),
    ],
)
def test_lines(chunks: list[bytes], lines: list[bytes]) -> None:
    assert list(_lines(ChunkedResponse(chunks))) == lines


def test_next_event_parses_and_ends() -> None:
    lines = iter([b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}'])
    assert _next_event(lines) == {"type": "ADDED", "object": {"metadata": {"name": "a"}}}
    assert _next_event(lines) is None


@pytest.mark.parametrize(
    ("line", "error"),
    [
        pytest.param(b"{not json", KubeError, id="invalid-json"),
        pytest.param(b'{"object": {}}', KubeError, id="no-type"),
    ],
)
def test_next_event_rejects(line: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        _next_event(iter([line]))


def test_next_event_maps_broken_connection() -> None:
    import urllib3

    def broken() -> Any:
        raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead")
        yield b""

    with pytest.raises(KubeUnreachable):
        _next_event(broken())


# --------------------------------------------------------------------------------- the loop, fake source
class FakeStream:
    def __init__(self, script: list[dict[str, Any] | Exception]) -> None:
        self.script = list(script)
        self.closed = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self.script:
            raise StopAsyncIteration
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed = True


class Hang(FakeStream):
    """A watch that stays open with nothing to say (the test ends it by closing the iterator)."""

    async def __anext__(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class FakeSource:
    def __init__(self, lists: list[ObjectList | Exception], watches: list[FakeStream | Exception]) -> None:
        self.lists, self.watches = list(lists), list(watches)
        self.calls: list[tuple[str, str]] = []
        self.streams: list[FakeStream] = []

    async def list_objects(self, resource: Resource, **_: Any) -> ObjectList:
        self.calls.append(("list", ""))
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def watch(self, resource: Resource, *, resource_version: str, **_: Any) -> FakeStream:
        self.calls.append(("watch", resource_version))
        item = self.watches.pop(0) if self.watches else Hang([])
        if isinstance(item, Exception):
            return FakeStream([item])
        self.streams.append(item)
        return item


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


GONE = ev(
    "ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
)


async def take(events: AsyncIterator[WatchEvent], n: int) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    async for event in events:
        got.append((event.type, event.object.get("metadata", {}).get("name", "")))
        if len(got) == n:
            break
    await events.aclose()  # type: ignore[attr-defined]
    return got


def informer(source: FakeSource, sleeps: list[float]) -> Informer:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    return Informer(source, NODES, sleep=sleep, rand=lambda: 0.5)


async def test_list_then_watch_from_list_resource_version() -> None:
    source = FakeSource(
        [ObjectList([node("a", "10")], "10")],
        [FakeStream([ev("ADDED", node("b", "11")), ev("MODIFIED", node("a", "12"))])],
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    got = await take(inf.events(), 4)
    assert got == [(ADDED, "a"), (SYNCED, ""), (ADDED, "b"), (MODIFIED, "a")]
    assert source.calls[:2] == [("list", ""), ("watch", "10")]
    assert inf.synced.is_set()
    assert inf.resource_version == "12"
    assert inf.get("a") == node("a", "12")
    assert sleeps == []


async def test_410_error_event_relists_and_emits_the_difference() -> None:
    source = FakeSource(
        [
            ObjectList([node("a", "1"), node("b", "1")], "5"),
            ObjectList([node("b", "9"), node("c", "8")], "20"),
        ],
        [FakeStream([ev("MODIFIED", node("a", "6")), GONE])],
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    got = await take(inf.events(), 8)
    assert got == [
        (ADDED, "a"),
        (ADDED, "b"),
        (SYNCED, ""),
        (MODIFIED, "a"),
        (MODIFIED, "b"),
        (ADDED, "c"),
        (DELETED, "a"),
        (SYNCED, ""),
    ]
    assert source.calls == [("list", ""), ("watch", "5"), ("list", "")]
    assert sorted(inf.store) == ["b", "c"]
    assert inf.lists == 2
    assert sleeps == []  # progress was made before the 410: relist at once
    assert source.streams[0].closed


async def test_410_at_watch_start_relists_after_a_backoff() -> None:
    source = FakeSource(
        [ObjectList([node("a", "1")], "1"), ObjectList([node("a", "1")], "30")],
        [KubeGone("410 too old resource version", status=410)],
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    got = await take(inf.events(), 3)
    assert got == [(ADDED, "a"), (SYNCED, ""), (SYNCED, "")]
    assert source.calls == [("list", ""), ("watch", "1"), ("list", "")]
    assert sleeps == [pytest.approx(0.8)]


async def test_other_watch_errors_back_off_and_rewatch_from_last_rv() -> None:
    boom = KubeUnreachable("connection reset")
    source = FakeSource(
        [ObjectList([], "3")],
        [
            FakeStream([ev("ADDED", node("a", "4")), boom]),
            boom,
            boom,
            FakeStream([ev("BOOKMARK", {"metadata": {"resourceVersion": "50"}})]),
            FakeStream([ev("ADDED", node("b", "51"))]),
        ],
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    got = await take(inf.events(), 3)
    assert got == [(SYNCED, ""), (ADDED, "a"), (ADDED, "b")]
    assert [c for c in source.calls if c[0] == "watch"] == [
        ("watch", "3"),
        ("watch", "4"),
        ("watch", "4"),
        ("watch", "4"),
        ("watch", "50"),
    ]
    assert sleeps == [pytest.approx(0.8), pytest.approx(1.6), pytest.approx(3.2)]
    assert source.calls.count(("list", "")) == 1  # errors other than 410 never relist


async def test_watch_error_event_other_than_410_backs_off_without_relist() -> None:
    err = ev("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd hiccup"})
    source = FakeSource([ObjectList([], "3")], [FakeStream([err]), FakeStream([ev("ADDED", node("a", "4"))])])
    sleeps: list[float] = []
    got = await take(informer(source, sleeps).events(), 2)
    assert got == [(SYNCED, ""), (ADDED, "a")]
    assert source.calls == [("list", ""), ("watch", "3"), ("watch", "3")]
    assert len(sleeps) == 1


async def test_failed_list_backs_off_and_synced_waits_for_success() -> None:
    source = FakeSource(
        [KubeUnreachable("refused"), KubeUnreachable("refused"), ObjectList([node("a", "1")], "2")], []
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    events = inf.events()
    first = await anext(events)
    assert first.type == ADDED and inf.synced.is_set() is False
    assert (await anext(events)).type == SYNCED and inf.synced.is_set()
    await events.aclose()  # type: ignore[attr-defined]
    assert sleeps == [pytest.approx(0.8), pytest.approx(1.6)]


async def test_idle_watch_end_without_events_backs_off() -> None:
    source = FakeSource(
        [ObjectList([], "3")],
        [
            FakeStream([]),
            FakeStream([ev("BOOKMARK", {"metadata": {"resourceVersion": "9"}})]),
            FakeStream([]),
        ],
    )
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    events = inf.events()
    assert (await anext(events)).type == SYNCED
    # drive the loop until it opens the 4th watch (which hangs)
    task = asyncio.ensure_future(anext(events))
    for _ in range(50):
        await asyncio.sleep(0)
    task.cancel()
    assert [c for c in source.calls if c[0] == "watch"][:4] == [
        ("watch", "3"),
        ("watch", "3"),
        ("watch", "9"),
        ("watch", "9"),
    ]
    assert len(sleeps) == 2  # after each empty watch; not after the one with a bookmark


async def test_run_passes_events_to_async_handler_and_refuses_second_consumer() -> None:
    source = FakeSource([ObjectList([node("a", "1")], "1")], [])
    inf = informer(source, [])
    seen: list[WatchEvent] = []

    async def handler(event: WatchEvent) -> None:
        seen.append(event)

    task = asyncio.create_task(inf.run(handler))
    await asyncio.wait_for(inf.synced.wait(), 1)
    with pytest.raises(RuntimeError):
        inf.events()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.type for e in seen] == [ADDED, SYNCED]
    assert inf.objects() == [node("a", "1")]


async def test_an_api_outage_is_one_warning_and_a_count_per_failure(caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import CollectorRegistry

    from gpuwarden.kube.metrics import kube_metrics

    registry = CollectorRegistry()
    source = FakeSource([KubeUnreachable("refused")] * 4 + [ObjectList([node("a", "1")], "2")], [])
    source.metrics = kube_metrics(registry)  # type: ignore[attr-defined]  # as KubeClient carries them
    sleeps: list[float] = []
    inf = informer(source, sleeps)
    with caplog.at_level(logging.INFO, logger="gpuwarden"):
        assert await take(inf.events(), 2) == [(ADDED, "a"), (SYNCED, "")]
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "watch nodes: api-unreachable; retried, logged again when it ends or its cause changes"),
        ("INFO", "watch nodes: recovered from api-unreachable"),
    ]
    labels = {"component": "watch nodes", "cause": "api-unreachable"}
    assert registry.get_sample_value("gpuwarden_transient_failures_total", labels) == 4
    assert len(sleeps) == 4, "the back-off is unchanged"


async def test_a_watch_resumed_without_relist_ends_the_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Two outages each healed by a resumed watch (no 410, no relist): two warnings, two recoveries - the
    second outage is not hidden by the first one's episode (found by the API-server restart e2e)."""
    boom = KubeUnreachable("connection refused")
    source = FakeSource(
        [ObjectList([], "3")],
        [
            boom,
            FakeStream([ev("ADDED", node("a", "4")), boom]),
            boom,
            FakeStream([ev("ADDED", node("b", "5"))]),
        ],
    )
    inf = informer(source, [])
    with caplog.at_level(logging.INFO, logger="gpuwarden"):
        assert await take(inf.events(), 3) == [(SYNCED, ""), (ADDED, "a"), (ADDED, "b")]
    warning = "watch nodes: api-unreachable; retried, logged again when it ends or its cause changes"
    recovered = "watch nodes: recovered from api-unreachable"
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if "api-unreachable" in r.getMessage()]
    assert messages == [("WARNING", warning), ("INFO", recovered)] * 2
    assert source.calls.count(("list", "")) == 1
