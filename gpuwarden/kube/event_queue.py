"""Writing Events off the caller's path: a bounded queue and one writer task per component.

Why it exists: the scheduler-extender verbs (bind, preempt) must answer in milliseconds, so their Events
cannot be written inline; before this module each component had its own mechanism (a queue + writer for
bind, a set of fire-and-forget tasks + a flush loop for preemption) with different drop and shutdown
behaviour. Here one shape serves both: `offer()` never waits (False, reported to `on_drop` with the reason,
when the queue is full or the writer has stopped), `run()` writes queued events through an `EventRecorder` and
flushes its deferred series counts every `flush_interval`, `close(grace)` stops intake and lets the writer
finish what is queued, and on cancellation what is still queued gets a short last chance, then counts as
dropped — never lost silently.

It must not decide what is event-worthy (callers pass finished `PendingEvent`s) and must never raise into
the writer loop: a failed write is logged and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuwarden.kube.events import EventType, ObjectRef

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 256


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """One Event to write: the arguments of `EventRecorder.emit`."""

    regarding: ObjectRef
    reason: str
    note: str
    action: str
    type: EventType = EventType.NORMAL
    related: ObjectRef | None = None


class EventSink(Protocol):
    """`EventRecorder`'s surface used here."""

    async def emit(
        self,
        regarding: ObjectRef,
        *,
        reason: str,
        note: str,
        action: str,
        type: EventType = EventType.NORMAL,
        related: ObjectRef | None = None,
    ) -> object: ...

    async def flush(self) -> None: ...


class EventQueue:
    """A bounded queue of events and the task that writes them (`offer` from the hot path, `run` beside)."""

    def __init__(
        self,
        recorder: EventSink,
        *,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = 30.0,
        on_drop: Callable[[PendingEvent, str], None] = lambda event, why: None,
        name: str = "events",
    ) -> None:
        self.recorder = recorder
        self._queue: asyncio.Queue[PendingEvent] = asyncio.Queue(maxsize=capacity)
        self._flush_interval = flush_interval
        self._on_drop = on_drop
        self._name = name
        self.dropped = 0
        self._closed = False
        """No writer will take further events: `offer` counts them as dropped."""

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, event: PendingEvent) -> bool:
        """Queue `event` without waiting; False (and counted) when the queue is full or the writer stopped."""
        if self._closed:
            self._drop(event, "writer stopped")
            return False
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._drop(event, "queue full")
            return False
        return True

    def _drop(self, event: PendingEvent, why: str) -> None:
        self.dropped += 1
        self._on_drop(event, why)
        log.debug(
            "event dropped",
            extra={
                "queue": self._name,
                "why": why,
                "reason": event.reason,
                "regarding": event.regarding.name,
            },
        )

    async def _write(self, event: PendingEvent) -> None:
        try:
            await self.recorder.emit(
                event.regarding, reason=event.reason, note=event.note, action=event.action,
                type=event.type, related=event.related,
            )  # fmt: skip
        except Exception:  # the recorder logs API errors itself; nothing may end the writer
            log.exception(
                "event not recorded", extra={"queue": self._name, "regarding": event.regarding.name}
            )

    async def _flush(self) -> None:
        try:
            await self.recorder.flush()
        except Exception:  # as for writes: a broken flush must not end the writer (and the controller)
            log.exception("event series counts not flushed", extra={"queue": self._name})

    async def drain(self) -> int:
        """Write every queued event now; returns how many (tests, shutdown)."""
        written = 0
        while not self._queue.empty():
            event = self._queue.get_nowait()
            try:
                await self._write(event)
            finally:
                self._queue.task_done()
            written += 1
        return written

    async def close(self, grace: float) -> None:
        """Shutdown, once the hot path no longer offers: take no more events and give the running writer up
        to `grace` seconds to write the queued ones (what is left is dropped, counted, when it stops)."""
        self._closed = True
        try:
            async with asyncio.timeout(grace):
                await self._queue.join()
        except TimeoutError:
            log.warning(
                "events not all written before shutdown", extra={"queue": self._name, "queued": self.queued}
            )

    async def run(self) -> None:
        """Write queued events as they come, flush deferred series counts periodically, until cancelled;
        on cancellation the events already queued get a short last chance, then count as dropped."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self._flush_interval
        try:
            while True:
                timeout = max(0.0, next_flush - loop.time())
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can return a got item and swallow a
                    # cancellation that arrives at the same moment, and the writer would keep running
                    async with asyncio.timeout(timeout):
                        event = await self._queue.get()
                except TimeoutError:
                    await self._flush()
                    next_flush = loop.time() + self._flush_interval
                    continue
                try:
                    await self._write(event)
                finally:
                    self._queue.task_done()
        finally:
            self._closed = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(2.0):
                    await self.drain()
                    await self._flush()
            while not self._queue.empty():
                self._drop(self._queue.get_nowait(), "writer stopped")
                self._queue.task_done()
