"""Kubernetes Events for the bind verb: `GPUsAssigned` (Normal) and `GPUBindFailed` (Warning) on the pod.

Why it exists: operators run `kubectl describe pod` to learn why a pod got which GPUs, or why it did not
get any; the scheduler's own `Scheduled` event names only the node. What happened is decided here, purely
(`bind_event`, `policy_verdict`, table-tested); writing it is `BindEvents`' job.

What it must not do: slow or fail a bind. The verb only `offer()`s an event to a bounded queue (never
blocking); a background task (`run()`, started with the extender's feed) writes them through the shared
`EventRecorder`, whose series mechanism turns a pod's repeated identical failures into one Event with a
count. When the queue is full the event is dropped and counted (`gpuwarden_extender_events_dropped_total`).
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
) -> BindEvent | None:
    """The event for one bind outcome, or None (a non-GPU pod, an idempotent repeat, a vanished pod)."""
    if error:
        if cause in SILENT_CAUSES:
            return None
        return BindEvent(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node, FAILED, EventType.WARNING,
            f"binding to node {args.node} failed: {error}",
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

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def offer(self, event: BindEvent | None) -> bool:
        """Queue `event` without waiting; False (and counted) when the queue is full."""
        if event is None:
            return False
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            self._on_drop()
            log.debug("bind event dropped: queue full", extra={"pod": f"{event.namespace}/{event.name}"})
            return False
        return True

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

    async def drain(self) -> int:
        """Write every queued event now; returns how many (tests, shutdown)."""
        written = 0
        while not self._queue.empty():
            await self._write(self._queue.get_nowait())
            written += 1
        return written

    async def run(self) -> None:
        """Write queued events as they come, flush deferred series counts periodically, until cancelled;
        on cancellation the events already queued get a short last chance."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self._flush_interval
        try:
            while True:
                timeout = max(0.0, next_flush - loop.time())
                try:
                    event = await asyncio.wait_for(self._queue.get(), timeout)
                except TimeoutError:
                    await self.recorder.flush()
                    next_flush = loop.time() + self._flush_interval
                    continue
                await self._write(event)
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(2.0):
                    await self.drain()
                    await self.recorder.flush()
