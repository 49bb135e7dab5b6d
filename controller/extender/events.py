"""Kubernetes Events for the bind verb: `GPUsAssigned` (Normal) and `GPUBindFailed` (Warning) on the pod.

Why it exists: operators run `kubectl describe pod` to learn why a pod got which GPUs, or why it did not
get any; the scheduler's own `Scheduled` event names only the node. What happened is decided here, purely
(`bind_event`, `policy_verdict`, table-tested); writing it is `BindEvents`' job.

What it must not do: slow or fail a bind. The verb only `offer()`s an event to a bounded queue (never
blocking); a background task (`run()`, started with the extender's feed) writes them through the shared
`EventRecorder`, whose series mechanism turns a pod's repeated identical failures into one Event with a
count. When the queue is full, or the writer has stopped (shutdown: `close()` lets it write what is queued
first), the event is dropped and counted (`gpuwarden_extender_events_dropped_total`), never lost silently.
Preemption verdicts are not evented here: the throttle already writes `PreemptionThrottled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from controller.extender.decide import Choice, Policy
from controller.extender.wire import ExtenderBindingArgs
from gpuwarden.kube import EventType, ObjectRef

log = logging.getLogger(__name__)

ASSIGNED = "GPUsAssigned"
FAILED = "GPUBindFailed"
ACTION = "Bind"
QUEUE_CAPACITY = 256
"""Events waiting to be written; a burst of binds beyond this (the API server slow or down) drops events."""
SILENT_CAUSES = frozenset({"pod_gone", "pod_replaced"})
"""Failures about a pod that no longer exists as the scheduler meant it: there is no pod to tell."""


@dataclass(frozen=True, slots=True)
class BindEvent:
    """One event to write about a pod's bind."""

    namespace: str
    name: str
    uid: str
    node: str
    reason: str
    type: EventType
    note: str

    def regarding(self) -> ObjectRef:
        return ObjectRef("v1", "Pod", self.name, self.namespace, self.uid or None)

    def related(self) -> ObjectRef:
        return ObjectRef("v1", "Node", self.node)


def policy_verdict(policy: str, choice: Choice) -> str:
    """How the topology policy was met by `choice`, in words for the event note."""
    numa = ",".join(str(n) for n in choice.numa_nodes) or "unknown"
    if policy in (Policy.SINGLE_NUMA, Policy.SINGLE_PCIE):
        if len(choice.numa_nodes) <= 1:
            return f"{policy} satisfied"
        # only reachable for single-numa: no NUMA node in the fleet holds the request (decide.py)
        return f"{policy} satisfied with the fewest whole NUMA nodes ({numa}); no NUMA node holds the request"
    if policy == Policy.PREFER_NUMA:
        if len(choice.numa_nodes) <= 1:
            return "prefer-numa satisfied"
        return f"prefer-numa not met: spans NUMA nodes {numa} (no single NUMA node had room)"
    return f"{policy or Policy.NONE} (no constraint)"


def bind_event(
    args: ExtenderBindingArgs,
    *,
    kind: str,
    error: str = "",
    cause: str = "",
    choice: Choice | None = None,
    policy: str = "",
    dry_run: bool = False,
    would_fail: str = "",
) -> BindEvent | None:
    """The event for one bind outcome, or None (a non-GPU pod, an idempotent repeat, a vanished pod).

    `would_fail` (dry-run): the pod was bound without a claim, but a real run would have failed it."""
    if error:
        if cause in SILENT_CAUSES:
            return None
        return BindEvent(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node, FAILED, EventType.WARNING,
            f"binding to node {args.node} failed: {error}",
        )  # fmt: skip
    if kind == "bound" and would_fail:
        return BindEvent(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node, FAILED, EventType.WARNING,
            f"[dry-run] would fail: {would_fail}",
        )  # fmt: skip
    if kind != "bound" or choice is None:
        return None
    numa = ",".join(str(n) for n in choice.numa_nodes) or "unknown"
    note = (
        f"GPUs {','.join(choice.ids)} on node {args.node}, NUMA node {numa}, alignment {choice.alignment}; "
        f"topology policy {policy_verdict(policy, choice)}"
    )
    if dry_run:
        note = f"[dry-run] claim not written; would assign {note}"
    return BindEvent(
        args.pod_namespace, args.pod_name, args.pod_uid, args.node, ASSIGNED, EventType.NORMAL, note
    )


class EventSink(Protocol):
    """`gpuwarden.kube.EventRecorder`'s surface used here."""

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


class BindEvents:
    """A bounded queue of bind events and the task that writes them (`offer` from the verb, `run` beside)."""

    def __init__(
        self,
        recorder: EventSink,
        *,
        capacity: int = QUEUE_CAPACITY,
        flush_interval: float = 30.0,
        on_drop: Callable[[], None] = lambda: None,
        dry_run: bool = False,
    ) -> None:
        self.recorder = recorder
        self.dry_run = dry_run
        """The binder runs dry: GPUsAssigned notes say the claim was not written."""
        self._queue: asyncio.Queue[BindEvent] = asyncio.Queue(maxsize=capacity)
        self._flush_interval = flush_interval
        self._on_drop = on_drop
        self.dropped = 0
        self._closed = False
        """No writer will take further events: `offer` counts them as dropped."""

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, event: BindEvent | None) -> bool:
        """Queue `event` without waiting; False (and counted) when the queue is full or the writer stopped."""
        if event is None:
            return False
        if self._closed:
            self._drop(event, "writer stopped")
            return False
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._drop(event, "queue full")
            return False
        return True

    def _drop(self, event: BindEvent, why: str) -> None:
        self.dropped += 1
        self._on_drop()
        log.debug("bind event dropped", extra={"why": why, "pod": f"{event.namespace}/{event.name}"})

    async def _write(self, event: BindEvent) -> None:
        try:
            await self.recorder.emit(
                event.regarding(),
                reason=event.reason,
                note=event.note,
                action=ACTION,
                type=event.type,
                related=event.related(),
            )
        except Exception:  # the recorder logs API errors itself; nothing may end the writer
            log.exception("bind event not recorded", extra={"pod": f"{event.namespace}/{event.name}"})

    async def _flush(self) -> None:
        try:
            await self.recorder.flush()
        except Exception:  # as for writes: a broken flush must not end the writer (and the controller)
            log.exception("bind event series counts not flushed")

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
        """Shutdown, once the verb no longer answers: take no more events and give the running writer up
        to `grace` seconds to write the queued ones (what is left is dropped, counted, when it stops)."""
        self._closed = True
        try:
            async with asyncio.timeout(grace):
                await self._queue.join()
        except TimeoutError:
            log.warning("bind events not all written before shutdown", extra={"queued": self.queued})

    async def run(self) -> None:
        """Write queued events as they come, flush deferred series counts periodically, until cancelled;
        on cancellation the events already queued get a short last chance, then count as dropped."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self._flush_interval
        try:
            while True:
                timeout = max(0.0, next_flush - loop.time())
                try:
                    event = await asyncio.wait_for(self._queue.get(), timeout)
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
