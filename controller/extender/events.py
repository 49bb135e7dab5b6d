"""Kubernetes Events for the bind verb: `GPUsAssigned` (Normal) and `GPUBindFailed` (Warning) on the pod.

Why it exists: operators run `kubectl describe pod` to learn why a pod got which GPUs, or why it did not
get any; the scheduler's own `Scheduled` event names only the node. What happened is decided here, purely
(`bind_event`, `policy_verdict`, table-tested); writing it is `BindEvents`' job.

What it must not do: slow or fail a bind. The verb only `offer()`s an event to `BindEvents`, the shared
bounded `gpuwarden.kube.event_queue.EventQueue` (never blocking); its writer task (`run()`, started with the
extender's feed) writes them through the `EventRecorder`, whose series mechanism turns a pod's repeated
identical failures into one Event with a count.

Under load the Events summarize instead of being dropped: an event offered while the queue is full is
counted into one summary per node, reason and type, written every `summary_interval` as one Event on the
Node (`summary_note`: "GPUsAssigned for 37 pods on node n: ml/a, ml/b, ... and 30 more"). So the Events a
user reads account for every bind - each pod's own, or its count in its node's summary - and the API
server's writes stay bounded: one writer for the per-pod Events, at most `SUMMARY_BATCH` summaries every
`summary_interval` (a node waiting for its turn keeps counting into its summary).
Only once the writer has stopped (shutdown: `close()` writes what is queued and summarized first) is an
event dropped, and then counted (`gpuwarden_extender_events_dropped_total`), never lost silently.
Preemption verdicts are not evented here: the throttle already writes `PreemptionThrottled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.dra import passthrough_note
from controller.gpus.fit import Choice, Policy
from gpuwarden.kube import EventType, ObjectRef
from gpuwarden.kube.event_queue import EventQueue, EventSink, PendingEvent
from gpuwarden.kube.events import NOTE_MAX_BYTES

log = logging.getLogger(__name__)

ASSIGNED = "GPUsAssigned"
DRA = "GPUsAllocatedByDRA"
SHARED = "GPUsShared"
"""A pod bound to a node that shares its GPUs: the device plugin picks its replicas or MIG instances."""
FAILED = "GPUBindFailed"
ACTION = "Bind"
QUEUE_CAPACITY = 128
"""Per-pod Events waiting to be written; beyond it (a burst, the API server slow) they are summarized."""
SUMMARY_INTERVAL = 5.0
"""Seconds between two rounds of summary Events."""
SUMMARY_BATCH = 32
"""Summary Events written per round at most (the nodes summarized first go first; the others keep counting
and go in the next rounds): with `SUMMARY_INTERVAL`, the bound on summary writes under load."""
SUMMARY_ACTION = "BindSummary"
SILENT_CAUSES = frozenset({"pod_gone", "pod_replaced", "deadline", "shed"})
"""Failures about a pod that no longer exists as the scheduler meant it (there is no pod to tell), and
binds cut to the scheduler's patience under load (deadline, shed: the scheduler retries the pod and
records its own FailedScheduling Event; they are counted in gpuwarden_extender_bind_overload_total) -
a Warning per pod there would add API writes exactly when the API server is the bottleneck."""


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

    def pending(self) -> PendingEvent:
        """As the shared writer's `PendingEvent`."""
        return PendingEvent(self.regarding(), self.reason, self.note, ACTION, self.type, self.related())


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
    dra_class: str = "",
    passthrough: str = "",
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
    if kind == "bound" and dra_class:
        return BindEvent(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node, DRA, EventType.NORMAL,
            passthrough_note(args.node, dra_class),
        )  # fmt: skip
    if kind == "bound" and passthrough:
        return BindEvent(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node, SHARED, EventType.NORMAL, passthrough
        )
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


@dataclass(slots=True)
class Summary:
    """Per-pod events of one node, reason and type not written one by one: how many, and which pods."""

    count: int = 0
    pods: list[str] = field(default_factory=list)


SAMPLE_PODS = 64
"""Pod names kept per summary (the note holds what fits in 1 KiB; the count is always exact)."""


def summary_note(reason: str, node: str, count: int, pods: list[str]) -> str:
    """The note of a summary Event: the count first (exact), then as many pod names as fit the note's
    1 KiB limit, and how many more there were."""
    head = f"{reason} for {count} pods on node {node} (summarized under load, no Event per pod): "
    names: list[str] = []
    size = len(head.encode())
    for i, key in enumerate(pods):
        more = count - i - 1
        tail = f" and {more} more" if more else ""
        piece = (", " if names else "") + key
        if size + len((piece + tail).encode()) > NOTE_MAX_BYTES - 16:
            break
        names.append(key)
        size += len(piece.encode())
    rest = count - len(names)
    return head + ", ".join(names) + (f" and {rest} more" if rest else "")


class BindEvents(EventQueue):
    """The bind verb's `EventQueue` (`offer` from the verb, `run` beside); also takes `BindEvent`s."""

    def __init__(
        self,
        recorder: EventSink,
        *,
        capacity: int = QUEUE_CAPACITY,
        flush_interval: float = 30.0,
        on_drop: Callable[[], None] = lambda: None,
        on_summarized: Callable[[], None] = lambda: None,
        dry_run: bool = False,
        summary_interval: float = SUMMARY_INTERVAL,
    ) -> None:
        super().__init__(
            recorder,
            capacity=capacity,
            flush_interval=flush_interval,
            on_drop=lambda event, why: on_drop(),
            name="bind",
        )
        self.dry_run = dry_run
        """The binder runs dry: GPUsAssigned notes say the claim was not written."""
        self._summaries: dict[tuple[str, str, EventType], Summary] = {}
        self._summary_interval = summary_interval
        self._on_summarized = on_summarized
        self.summarized = 0
        """Events counted into a summary instead of written on their own (all time)."""

    def offer(self, event: PendingEvent | BindEvent | None) -> bool:
        """Queue `event` without waiting; when the queue is full, count it into its node's summary. None
        (nothing to tell) is not a drop. False when it was not queued (summarized, or dropped: writer
        stopped)."""
        if event is None:
            return False
        pending = event.pending() if isinstance(event, BindEvent) else event
        if not self.closed and self._queue.full() and pending.related is not None:
            self._summarize(pending)
            return False
        return super().offer(pending)

    def _summarize(self, event: PendingEvent) -> None:
        assert event.related is not None
        key = (event.related.name, event.reason, event.type)
        summary = self._summaries.setdefault(key, Summary())
        summary.count += 1
        if len(summary.pods) < SAMPLE_PODS:
            summary.pods.append(f"{event.regarding.namespace}/{event.regarding.name}")
        self.summarized += 1
        self._on_summarized()

    @property
    def pending_summaries(self) -> int:
        """Events counted into summaries not written yet."""
        return sum(s.count for s in self._summaries.values())

    async def write_summaries(self, limit: int | None = None) -> int:
        """Write one Event per node, reason and type for the events summarized since the last call, at most
        `limit` of them (the oldest first); how many Events that was. Cancelled mid-way, the summary being
        written is kept for the next call."""
        written = 0
        while self._summaries and (limit is None or written < limit):
            key = next(iter(self._summaries))
            summary = self._summaries.pop(key)
            node, reason, kind = key
            note = summary_note(reason, node, summary.count, summary.pods)
            try:
                await self._write(
                    PendingEvent(ObjectRef("v1", "Node", node), reason, note, SUMMARY_ACTION, kind)
                )
            except BaseException:
                again = self._summaries.setdefault(key, Summary())
                again.count += summary.count
                again.pods[:0] = summary.pods[: SAMPLE_PODS - len(again.pods)]
                raise
            written += 1
        return written

    async def _summarizer(self) -> None:
        while True:
            await asyncio.sleep(self._summary_interval)
            await self.write_summaries(SUMMARY_BATCH)

    async def close(self, grace: float) -> None:
        """Shutdown: the queued Events are written (`EventQueue.close`), then the summaries."""
        await super().close(grace)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.write_summaries()

    async def run(self) -> None:
        """The per-pod writer (`EventQueue.run`) and, beside it, the summaries every `summary_interval`;
        on the way out what is summarized gets the same short last chance, then counts as dropped."""
        summaries = asyncio.ensure_future(self._summarizer())
        try:
            await super().run()
        finally:
            summaries.cancel()
            await asyncio.gather(summaries, return_exceptions=True)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(2.0):
                    await self.write_summaries()
            for (node, reason, kind), summary in self._summaries.items():
                event = PendingEvent(ObjectRef("v1", "Node", node), reason, "", SUMMARY_ACTION, kind)
                for _ in range(summary.count):
                    self._drop(event, "writer stopped")
            self._summaries = {}
