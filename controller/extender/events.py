"""Kubernetes Events for the bind verb: `GPUsAssigned` (Normal) and `GPUBindFailed` (Warning) on the pod.

Why it exists: operators run `kubectl describe pod` to learn why a pod got which GPUs, or why it did not
get any; the scheduler's own `Scheduled` event names only the node. What happened is decided here, purely
(`bind_event`, `policy_verdict`, table-tested); writing it is `BindEvents`' job.

What it must not do: slow or fail a bind. The verb only `offer()`s an event to `BindEvents`, the shared
bounded `gpuwarden.kube.event_queue.EventQueue` (never blocking); its writer task (`run()`, started with the
extender's feed) writes them through the `EventRecorder`, whose series mechanism turns a pod's repeated
identical failures into one Event with a count. When the queue is full, or the writer has stopped
(shutdown: `close()` lets it write what is queued first), the event is dropped and counted
(`gpuwarden_extender_events_dropped_total`), never lost silently.
Preemption verdicts are not evented here: the throttle already writes `PreemptionThrottled`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from controller.extenderv1 import ExtenderBindingArgs
from controller.gpus.dra import passthrough_note
from controller.gpus.fit import Choice, Policy
from gpuwarden.kube import EventType, ObjectRef
from gpuwarden.kube.event_queue import EventQueue, EventSink, PendingEvent

log = logging.getLogger(__name__)

ASSIGNED = "GPUsAssigned"
DRA = "GPUsAllocatedByDRA"
SHARED = "GPUsShared"
"""A pod bound to a node that shares its GPUs: the device plugin picks its replicas or MIG instances."""
FAILED = "GPUBindFailed"
ACTION = "Bind"
QUEUE_CAPACITY = 256
"""Events waiting to be written; a burst of binds beyond this (the API server slow or down) drops events."""
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


class BindEvents(EventQueue):
    """The bind verb's `EventQueue` (`offer` from the verb, `run` beside); also takes `BindEvent`s."""

    def __init__(
        self,
        recorder: EventSink,
        *,
        capacity: int = QUEUE_CAPACITY,
        flush_interval: float = 30.0,
        on_drop: Callable[[], None] = lambda: None,
        dry_run: bool = False,
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

    def offer(self, event: PendingEvent | BindEvent | None) -> bool:
        """Queue `event` without waiting; None (nothing to tell) is not a drop."""
        if event is None:
            return False
        return super().offer(event.pending() if isinstance(event, BindEvent) else event)
