"""Kubernetes Events (events.k8s.io/v1) with client-go's series semantics for repeats.

Why it exists: events are how operators see what gpuwarden did and why (`kubectl describe node` shows
`GPUQuarantined ... XID 79 on GPU-…`), and a quarantine loop that re-evaluates every 15 s must not write
one Event per pass. As in client-go's events broadcaster, an event isomorphic to one recorded within
`window` (same regarding, related, reason, action, type and note) becomes a *series*: the first repeat
patches `series.count` at once, later ones are batched and written at most every `flush_interval` (and by
`flush()`). The pure decision, `correlate()`, is table-tested.

Events are best-effort, as in client-go: a failure to write one is logged and counted, never raised — a
loop must not fail because its audit trail could not be written. This module must not decide *whether*
something is event-worthy; callers pass finished reasons and notes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube.resources import EVENTS, JsonObject, PatchType, Resource
from gpuwarden.wellknown import reporting_controller

log = logging.getLogger(__name__)

_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}\Z")
NOTE_MAX_BYTES = 1024


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class ObjectRef:
    """What an event is about (`regarding`) or what else it involves (`related`)."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def of(cls, obj: JsonObject) -> ObjectRef:
        """The reference to an object read from the API (needs apiVersion and kind, as raw JSON has)."""
        meta = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion", "")),
            kind=str(obj.get("kind", "")),
            name=str(meta.get("name", "")),
            namespace=meta.get("namespace") or None,
            uid=meta.get("uid") or None,
        )

    def to_json(self) -> JsonObject:
        ref: JsonObject = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


@dataclass(frozen=True)
class EventKey:
    """Events with equal keys are the same happening repeated (client-go's key plus type and note)."""

    regarding: ObjectRef
    related: ObjectRef | None
    reason: str
    action: str
    type: EventType
    note: str


@dataclass(frozen=True)
class SeriesState:
    """What the recorder remembers about one isomorphic event (monotonic seconds)."""

    name: str
    namespace: str
    count: int
    last_seen: float
    written_count: int
    written_at: float


class Step(StrEnum):
    CREATE = "create"  # a new Event object
    PATCH_SERIES = "patch_series"  # write series.count now
    DEFER = "defer"  # counted in memory; written by a later repeat or flush()


def correlate(
    state: SeriesState | None, now: float, *, window: float, flush_interval: float
) -> tuple[Step, int]:
    """Decide how to record one more occurrence; returns the step and the new occurrence count."""
    if state is None or now - state.last_seen > window:
        return Step.CREATE, 1
    count = state.count + 1
    if state.written_count == 1 or now - state.written_at >= flush_interval:
        return Step.PATCH_SERIES, count
    return Step.DEFER, count


def micro_time(moment: datetime) -> str:
    """The `MicroTime` format the API requires: RFC 3339 with exactly six fractional digits, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def truncate_note(note: str) -> str:
    """At most 1 kB of UTF-8 (the API rejects longer notes), cut on a character boundary."""
    raw = note.encode()
    if len(raw) <= NOTE_MAX_BYTES:
        return note
    return raw[: NOTE_MAX_BYTES - 3].decode(errors="ignore") + "..."


class EventWriter(Protocol):
    async def create(
        self, resource: Resource, body: JsonObject, *, namespace: str | None = None, dry_run: bool = False
    ) -> JsonObject: ...

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: JsonObject | list[JsonObject],
        *,
        patch_type: PatchType = PatchType.MERGE,
        namespace: str | None = None,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObject: ...


EXPIRY_SWEEPS = 12
"""How often per window the recorder forgets expired series (a series is kept up to 1/12 longer)."""


class EventRecorder:
    """Records events as `reportingController: gpuwarden.io/<component>`, `reportingInstance: <instance>`."""

    def __init__(
        self,
        client: EventWriter,
        *,
        component: str,
        instance: str,
        window: float = 360.0,
        flush_interval: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._client = client
        self.reporting_controller = reporting_controller(component)
        self.reporting_instance = instance[:128]
        self._window = window
        self._flush_interval = flush_interval
        self._monotonic = monotonic
        self._wall = wall
        self._series: dict[EventKey, SeriesState] = {}
        self._expired_at = float("-inf")
        """When `_series` was last swept of series past the window (at most every `window / EXPIRY_SWEEPS`:
        a sweep is a pass over every series of the last window, one per Event written would make a burst of
        distinct Events - a bind per pod - quadratic)."""

    def _body(self, key: EventKey, now: datetime, name: str, namespace: str) -> JsonObject:
        body: JsonObject = {
            "apiVersion": EVENTS.api_version,
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": micro_time(now),
            "reportingController": self.reporting_controller,
            "reportingInstance": self.reporting_instance,
            "action": key.action,
            "reason": key.reason,
            "regarding": key.regarding.to_json(),
            "note": key.note,
            "type": key.type.value,
        }
        if key.related is not None:
            body["related"] = key.related.to_json()
        return body

    async def emit(
        self,
        regarding: ObjectRef | JsonObject,
        *,
        reason: str,
        note: str,
        action: str,
        type: EventType = EventType.NORMAL,
        related: ObjectRef | JsonObject | None = None,
    ) -> JsonObject | None:
        """Record one occurrence; returns the Event as written, or None when deferred or on failure."""
        if not _REASON.match(reason):
            raise ValueError(f"event reason must be CamelCase (e.g. GPUQuarantined), got {reason!r}")
        if not action or len(action) > 128:
            raise ValueError("event action must be 1-128 characters")
        key = EventKey(
            regarding=regarding if isinstance(regarding, ObjectRef) else ObjectRef.of(regarding),
            related=related if related is None or isinstance(related, ObjectRef) else ObjectRef.of(related),
            reason=reason,
            action=action,
            type=type,
            note=truncate_note(note),
        )
        mono, wall = self._monotonic(), self._wall()
        self._expire(mono)
        state = self._series.get(key)
        step, count = correlate(state, mono, window=self._window, flush_interval=self._flush_interval)
        try:
            if step is Step.CREATE:
                if state is not None and state.count != state.written_count:
                    await self._write_series(key, state, wall)  # the old series' deferred repeats
                # client-go's naming: <regarding name>.<hex nanoseconds>; cluster-scoped objects → "default".
                name = f"{key.regarding.name}.{int(wall.timestamp() * 1e9):x}"
                namespace = key.regarding.namespace or "default"
                written = await self._client.create(
                    EVENTS, self._body(key, wall, name, namespace), namespace=namespace
                )
                self._series[key] = SeriesState(name, namespace, 1, mono, 1, mono)
                return written
            assert state is not None
            state = replace(state, count=count, last_seen=mono)
            self._series[key] = state
            if step is Step.DEFER:
                return None
            return await self._write_series(key, state, wall)
        except KubeError as exc:
            log.warning(
                "event not recorded",
                extra={"reason": reason, "regarding": key.regarding.name, "error": str(exc)},
            )
            return None

    async def emit_once(
        self,
        regarding: ObjectRef,
        *,
        name: str,
        reason: str,
        note: str,
        action: str,
        type: EventType = EventType.NORMAL,
        related: ObjectRef | None = None,
    ) -> bool:
        """Write the Event named `name` unless it exists. True when nothing is left to do: it exists now
        (written by us or earlier), or the API refused it for good (403, 422, ...: logged, never retried).
        False when a retry may write it (API unreachable, 429, 5xx): the caller keeps what owes it.

        For happenings that must be recorded exactly once across leaders: the caller derives `name` from
        the state it keeps on the API (e.g. the quarantine's start), so a new leader completing a half-done
        action gets 409 AlreadyExists instead of a duplicate. No series: each name is one Event. An Event
        that can never be written must not hold up the state that owes it (a mark that blocks a node's
        next step until its Event exists), so a refusal counts as done.
        """
        key = EventKey(regarding, related, reason, action, type, truncate_note(note))
        namespace = regarding.namespace or "default"
        try:
            await self._client.create(
                EVENTS, self._body(key, self._wall(), name, namespace), namespace=namespace
            )
        except KubeConflict:
            return True  # AlreadyExists: the earlier writer got this far
        except KubeError as exc:
            what = "event not recorded; retried" if exc.retryable else "event refused; not retried"
            log.warning(what, extra={"reason": reason, "regarding": regarding.name, "error": str(exc)})
            return not exc.retryable
        return True

    async def _write_series(self, key: EventKey, state: SeriesState, wall: datetime) -> JsonObject:
        patch = {"series": {"count": state.count, "lastObservedTime": micro_time(wall)}}
        try:
            written = await self._client.patch(EVENTS, state.name, patch, namespace=state.namespace)
        except KubeNotFound:  # the Event expired (1 h TTL) or was deleted: start a new one
            self._series.pop(key, None)
            name = f"{key.regarding.name}.{int(wall.timestamp() * 1e9):x}"
            body = self._body(key, wall, name, state.namespace) | {"series": patch["series"]}
            written = await self._client.create(EVENTS, body, namespace=state.namespace)
            state = replace(state, name=name)
        mono = self._monotonic()
        self._series[key] = replace(state, written_count=state.count, written_at=mono)
        return written

    async def flush(self) -> None:
        """Write every deferred series count (call periodically and before shutdown)."""
        wall = self._wall()
        for key, state in list(self._series.items()):
            if state.count != state.written_count:
                try:
                    await self._write_series(key, state, wall)
                except KubeError as exc:
                    log.warning("event series not recorded", extra={"reason": key.reason, "error": str(exc)})

    def _expire(self, now: float) -> None:
        """Forget the series past the window with nothing left to write (`correlate` starts a new Event for
        them anyway: this only bounds memory, so it need not run on every Event)."""
        if now - self._expired_at < self._window / EXPIRY_SWEEPS:
            return
        self._expired_at = now
        for key, state in list(self._series.items()):
            if now - state.last_seen > self._window and state.count == state.written_count:
                del self._series[key]
