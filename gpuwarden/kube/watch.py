"""List+watch with resourceVersion bookkeeping: an informer keeping a `namespace/name` → object cache.

Why it exists: every loop that reacts to cluster state (quarantine, nominations, the extender's view of GPU
nodes) needs the reflector contract of client-go, and getting it subtly wrong loses events forever:
list (all pages, consistent read) → watch from the list's resourceVersion with bookmarks → on a 410 Gone
(HTTP status or ERROR event) relist at once and emit the difference as ADDED/MODIFIED/DELETED events → on
other errors back off and re-watch from the last resourceVersion seen. An outage is one warning when it
starts and one info line when the (re)list or the first event of a resumed watch ends it (a watch resumed
with nothing to say ends it at its first event). `Informer.events()` is the same
loop as an async iterator of `(type, object)` events; `Informer.run()` feeds a handler instead.

The pure parts — `diff_relist`, `apply_event`, `Backoff.delay` — are table-tested; the loop is tested
against a fake source (relist on 410, back-off on errors) and against the real API server.
It must not filter or interpret objects (that is the caller's business) and it never writes to the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from gpuwarden.errors import KubeError, KubeGone
from gpuwarden.kube.metrics import KubeMetrics, kube_metrics
from gpuwarden.kube.resources import JsonObject, ObjectList, Resource, object_key, resource_version
from gpuwarden.kube.status import error_from_status_object
from gpuwarden.transient import Episodes

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
SYNCED = "SYNCED"
"""Emitted (with an empty object) after each complete (re)list, when the cache matches the server."""


class WatchEvent(NamedTuple):
    """One change: `type` is ADDED, MODIFIED, DELETED or SYNCED; unpacks as `(type, object)`."""

    type: str
    object: JsonObject


class EventStream(Protocol):
    """What `KubeClient.watch()` returns: raw `{"type", "object"}` dicts, closed with `aclose()`."""

    def __aiter__(self) -> EventStream: ...
    async def __anext__(self) -> JsonObject: ...
    async def aclose(self) -> None: ...


class WatchSource(Protocol):
    """The two calls an informer needs; `KubeClient` provides them, tests provide fakes."""

    async def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ObjectList: ...

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
    ) -> EventStream: ...


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter: `initial * factor**attempt`, capped, ±`jitter` fraction."""

    initial: float = 0.8
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2

    def delay(self, attempt: int, rand: float = 0.5) -> float:
        """Seconds to wait before retry number `attempt` (0-based); `rand` in [0, 1) picks the jitter."""
        base = min(self.cap, self.initial * self.factor ** max(0, attempt))
        return base * (1.0 + self.jitter * (2.0 * rand - 1.0))


def diff_relist(store: Mapping[str, JsonObject], items: list[JsonObject]) -> list[WatchEvent]:
    """The events that turn `store` into exactly `items`: new → ADDED, changed resourceVersion → MODIFIED,
    gone → DELETED (carrying the last known object). Unchanged objects produce nothing."""
    events: list[WatchEvent] = []
    seen: set[str] = set()
    for item in items:
        key = object_key(item)
        seen.add(key)
        old = store.get(key)
        if old is None:
            events.append(WatchEvent(ADDED, item))
        elif resource_version(old) != resource_version(item):
            events.append(WatchEvent(MODIFIED, item))
    for key in sorted(set(store) - seen):
        events.append(WatchEvent(DELETED, store[key]))
    return events


def apply_event(store: dict[str, JsonObject], event: WatchEvent) -> None:
    """Apply one ADDED/MODIFIED/DELETED event to a `namespace/name` keyed cache (SYNCED is a no-op)."""
    if event.type in (ADDED, MODIFIED):
        store[object_key(event.object)] = event.object
    elif event.type == DELETED:
        store.pop(object_key(event.object), None)


Handler = Callable[[WatchEvent], Awaitable[None] | None]


class Informer:
    """A cache of one resource kind kept current by list+watch; `synced` is set after the first list."""

    def __init__(
        self,
        source: WatchSource,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._source = source
        self.resource = resource
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff or Backoff()
        metrics = getattr(source, "metrics", None)
        counter = (metrics if isinstance(metrics, KubeMetrics) else kube_metrics(None)).transient_failures
        self._episodes = Episodes(counter, log)
        """An API outage is one warning per episode (not one per retry) and a count per failure."""
        self._sleep = sleep
        self._rand = rand
        self.store: dict[str, JsonObject] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0
        """Completed (re)lists so far; more than 1 means a relist happened (410 Gone)."""
        self._running = False
        self._subscribers: list[Handler] = []

    def subscribe(self, handler: Handler) -> None:
        """Also pass every event to `handler` (sync or async), in subscription order, before `run`'s own
        handler: one list+watch stream and one cache serve every part of a process that needs the kind."""
        self._subscribers.append(handler)

    def get(self, key: str) -> JsonObject | None:
        """The cached object at `namespace/name` (or `name` for cluster-scoped kinds)."""
        return self.store.get(key)

    def objects(self) -> list[JsonObject]:
        """A snapshot of every cached object."""
        return list(self.store.values())

    async def run(self, handler: Handler | None = None) -> None:
        """Keep the cache current until cancelled, passing every event to the subscribers, then to `handler`
        (sync or async)."""
        own = (handler,) if handler is not None else ()
        async for event in self.events():
            for each in (*self._subscribers, *own):
                result = each(event)
                if inspect.isawaitable(result):
                    await result

    def events(self) -> AsyncIterator[WatchEvent]:
        """The list+watch loop as an async iterator; only one consumer at a time."""
        if self._running:
            raise RuntimeError("this informer is already running")
        return self._loop()

    async def _wait(self, attempt: int, why: KubeError | str) -> None:
        delay = self._backoff.delay(attempt, self._rand())
        extra = {"resource": self.resource.plural, "error": str(why), "delay_s": round(delay, 2)}
        if isinstance(why, KubeError) and self._episodes.failed(f"watch {self.resource.plural}", why):
            log.debug("watch retry", extra=extra)  # the episode's warning is already out
        else:
            log.warning("watch retry", extra=extra)
        await self._sleep(delay)

    async def _relist(self) -> list[WatchEvent]:
        listed = await self._source.list_objects(
            self.resource,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            limit=self._page_size,
        )
        events = diff_relist(self.store, listed.items)
        self.resource_version = listed.resource_version
        self.lists += 1
        return events

    def _on_raw(self, raw: JsonObject) -> WatchEvent | None:
        """Interpret one raw watch event; raise the mapped error for ERROR events (410 → `KubeGone`)."""
        kind, obj = str(raw.get("type", "")), raw.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            raise error_from_status_object(int(code) if isinstance(code, int) else 500, obj)
        rv = resource_version(obj)
        if rv:
            self.resource_version = rv
        if kind in (ADDED, MODIFIED, DELETED):
            return WatchEvent(kind, obj)
        if kind != "BOOKMARK":
            log.warning("unknown watch event type", extra={"resource": self.resource.plural, "type": kind})
        return None

    async def _loop(self) -> AsyncIterator[WatchEvent]:
        self._running = True
        failures = 0
        need_list = True
        try:
            while True:
                if need_list:
                    try:
                        changes = await self._relist()
                    except KubeError as exc:
                        await self._wait(failures, exc)
                        failures += 1
                        continue
                    need_list, failures = False, 0
                    self._episodes.succeeded(f"watch {self.resource.plural}")
                    for change in changes:
                        apply_event(self.store, change)
                        yield change
                    changes.clear()  # not held while watching: one event per object after a full list
                    self.synced.set()
                    yield WatchEvent(SYNCED, {})
                progressed = False
                # Spread watch restarts like client-go does (timeout in [T, 2T)).
                timeout = int(self._watch_timeout * (1.0 + self._rand()))
                stream = self._source.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    namespace=self._namespace,
                    label_selector=self._label_selector,
                    field_selector=self._field_selector,
                    timeout_seconds=timeout,
                )
                try:
                    async for raw in stream:
                        event = self._on_raw(raw)
                        if not progressed:  # a watch resumed without a relist ends an outage too
                            self._episodes.succeeded(f"watch {self.resource.plural}")
                        progressed = True
                        if event is not None:
                            apply_event(self.store, event)
                            yield event
                except KubeGone as exc:
                    self._episodes.count(f"watch {self.resource.plural}", "watch-expired")
                    log.info(
                        "watch expired, relisting",
                        extra={"resource": self.resource.plural, "error": str(exc)},
                    )
                    need_list = True
                    if not progressed:  # a relist that is at once too old again: do not spin
                        await self._wait(failures, exc)
                        failures += 1
                    continue
                except KubeError as exc:
                    await self._wait(failures, exc)
                    failures += 1
                    continue
                finally:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
                if progressed:
                    failures = 0
                else:  # the server closed an idle watch at once: do not spin
                    await self._wait(failures, "watch ended without any event")
                    failures += 1
        finally:
            self._running = False
