"""Act: apply an idle `IdlePlan` — write or remove `gpuwarden.io/idle-since`, emit Events, count.

Why it exists: the only place the idle loop writes. A mark writes the annotation (and, under a
prefer-as-victim rule, `gpuwarden.io/idle-reclaimable`) with the pod's UID as a precondition (a re-created pod
of the same name is not touched), then Events `GPUIdle` on the pod and on its controlling owner (the
ReplicaSet, StatefulSet, Job … that `ownerReferences` names), so `kubectl describe` of either shows it. An
unmark removes our annotation and Events `GPUIdleEnded` on the pod. An eviction goes through the Eviction API
with the pod's UID as precondition (PodDisruptionBudgets hold: a 429 is reported as `GPUIdleEvictionBlocked`
and retried on a later pass, never forced); `GPUIdlePodEvicted` goes to the pod and its owner. In dry-run
nothing is written but Events prefixed "[dry-run]" (docs/architecture.md, safety rule 4).

What it must not do: decide, or touch anything but our annotation and the evictions it was given.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from controller.idle.decide import Evict, IdlePlan, Mark, Reclaim, Unmark
from controller.idle.metrics import IdleMetrics
from controller.idle.observe import SCALED
from controller.idle.scale import ScaleDown, ScaleHeld, ScalePlan
from controller.idle.snapshot import IdlePod
from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube import PODS, EventRecorder, EventType, ObjectRef
from gpuwarden.kube.eviction import RequestClient
from gpuwarden.kube.eviction import evict as evict_pod
from gpuwarden.kube.patch import ObjectClient
from gpuwarden.wellknown import IDLE_RECLAIMABLE, IDLE_SINCE, POD_DELETION_COST

log = logging.getLogger(__name__)


def format_since(since: float) -> str:
    """The `idle-since` value: RFC 3339 UTC to the second (`2026-12-02T07:00:00Z`)."""
    return datetime.fromtimestamp(int(since), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class IdleApi(ObjectClient, RequestClient, Protocol):
    """The calls the actuator makes (a patch, an eviction); `KubeClient` provides them."""


@dataclass
class ActResult:
    marked: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    reclaimable: list[str] = field(default_factory=list)
    """Pods whose `idle-reclaimable` mark was set or removed."""
    evicted: list[str] = field(default_factory=list)
    """Evictions done (or, in dry-run, that would have been): what the hourly budget counts."""
    blocked: list[str] = field(default_factory=list)
    scaled: list[str] = field(default_factory=list)
    """Owners scaled down (or, in dry-run, that would have been): what the hourly budget counts."""
    failures: int = 0


def _ref(pod: IdlePod) -> ObjectRef:
    return ObjectRef("v1", "Pod", pod.name, pod.namespace, pod.uid or None)


class IdleActuator:
    """Applies plans through one client, at most `concurrency` writes at a time; never raises a KubeError."""

    def __init__(
        self, client: IdleApi, events: EventRecorder, metrics: IdleMetrics, *, concurrency: int = 8
    ) -> None:
        self.client, self.events, self.metrics = client, events, metrics
        self._sem = asyncio.Semaphore(concurrency)

    async def apply(self, plan: IdlePlan) -> ActResult:
        result = ActResult()
        await asyncio.gather(
            *(self._mark(m, plan.dry_run, result) for m in plan.marks),
            *(self._unmark(u, plan.dry_run, result) for u in plan.unmarks),
            *(self._reclaim(r, plan.dry_run, result) for r in plan.reclaims),
            *(self._evict(e, plan.dry_run, result) for e in plan.evictions),
        )
        return result

    async def _write(self, pod: IdlePod, annotations: dict[str, str | None], result: ActResult) -> bool:
        patch = {"metadata": {"uid": pod.uid, "annotations": annotations}}
        async with self._sem:
            try:
                await self.client.patch(PODS, pod.name, patch, namespace=pod.namespace)
            except KubeNotFound:
                return False
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.inc()
                log.warning(
                    "idle-since not written; retried next pass", extra={"pod": pod.key, "error": str(exc)}
                )
                return False
        return True

    async def _mark(self, mark: Mark, dry_run: bool, result: ActResult) -> None:
        pod = mark.pod
        note = f"{mark.message} (idle since {format_since(mark.since)}, rule {mark.rule})"
        annotations: dict[str, str | None] = {IDLE_SINCE: format_since(mark.since)}
        if mark.reclaimable:
            note += "; GPU preemption may reclaim its GPUs"
            annotations[IDLE_RECLAIMABLE] = "true"
        if not dry_run and not await self._write(pod, annotations, result):
            return
        result.marked.append(pod.key)
        self.metrics.marked.labels(str(dry_run).lower()).inc()
        log.info(f"[dry-run] {note}" if dry_run else note, extra={"pod": pod.key})
        await self._emit_both(pod, "GPUIdle", note, "Report", dry_run)

    async def _unmark(self, unmark: Unmark, dry_run: bool, result: ActResult) -> None:
        pod = unmark.pod
        gone: dict[str, str | None] = {IDLE_SINCE: None}
        if pod.reclaimable:
            gone[IDLE_RECLAIMABLE] = None
        if not dry_run and not await self._write(pod, gone, result):
            return
        result.unmarked.append(pod.key)
        self.metrics.unmarked.labels(str(dry_run).lower()).inc()
        note = f"[dry-run] {unmark.message}" if dry_run else unmark.message
        log.info(note, extra={"pod": pod.key})
        await self.events.emit(_ref(pod), reason="GPUIdleEnded", note=note, action="Report")

    async def _reclaim(self, reclaim: Reclaim, dry_run: bool, result: ActResult) -> None:
        """Set or remove `idle-reclaimable`; an Event on the pod when it becomes reclaimable (its owner saw
        `GPUIdle` already)."""
        pod = reclaim.pod
        value = "true" if reclaim.reclaimable else None
        if not dry_run and not await self._write(pod, {IDLE_RECLAIMABLE: value}, result):
            return
        result.reclaimable.append(pod.key)
        note = f"[dry-run] {reclaim.message}" if dry_run else reclaim.message
        log.info(note, extra={"pod": pod.key})
        if reclaim.reclaimable:
            await self.events.emit(
                _ref(pod), reason="GPUIdleReclaimable", note=note, action="Report", type=EventType.WARNING
            )

    async def _emit_both(self, pod: IdlePod, reason: str, note: str, action: str, dry_run: bool) -> None:
        """A Warning Event on the pod and, when it has one, on its controlling owner."""
        prefix = "[dry-run] " if dry_run else ""
        await self.events.emit(
            _ref(pod), reason=reason, note=prefix + note, action=action, type=EventType.WARNING
        )
        if pod.owner is not None:
            owner = ObjectRef(
                pod.owner.api_version, pod.owner.kind, pod.owner.name, pod.namespace, pod.owner.uid
            )
            await self.events.emit(
                owner, reason=reason, note=f"{prefix}pod {pod.name}: {note}", action=action,
                type=EventType.WARNING, related=_ref(pod),
            )  # fmt: skip

    async def _evict(self, evict: Evict, dry_run: bool, result: ActResult) -> None:
        pod = evict.pod
        note = f"evicted: {evict.message}"
        if dry_run:
            result.evicted.append(pod.key)
            self.metrics.evictions.labels("dry_run").inc()
            log.info(f"[dry-run] {note}", extra={"pod": pod.key})
            await self._emit_both(pod, "GPUIdlePodEvicted", note, "Evict", True)
            return
        async with self._sem:
            try:
                await evict_pod(self.client, pod.namespace, pod.name, pod.uid)
            except KubeNotFound:
                return
            except KubeError as exc:
                if exc.status == 429:  # a PodDisruptionBudget does not allow it now
                    result.blocked.append(pod.key)
                    self.metrics.evictions.labels("blocked").inc()
                    await self.events.emit(
                        _ref(pod), reason="GPUIdleEvictionBlocked", note=f"{note} blocked: {exc.message}",
                        action="Evict", type=EventType.WARNING,
                    )  # fmt: skip
                    return
                result.failures += 1
                self.metrics.evictions.labels("failed").inc()
                log.warning(
                    "idle eviction failed; retried next pass", extra={"pod": pod.key, "error": str(exc)}
                )
                return
        result.evicted.append(pod.key)
        self.metrics.evictions.labels("evicted").inc()
        log.info(note, extra={"pod": pod.key})
        await self._emit_both(pod, "GPUIdlePodEvicted", note, "Evict", False)

    async def apply_scale(self, plan: ScalePlan, dry_run: bool, result: ActResult) -> None:
        """Scale owners down (one at a time: a few per hour at most) and Event the held ones."""
        for down in plan.downs:
            await self._scale(down, dry_run, result)
        for held in plan.held:
            await self._held(held, dry_run)

    async def _scale(self, down: ScaleDown, dry_run: bool, result: ActResult) -> None:
        target = down.target
        note = f"scaled down: {down.message}"
        resource = SCALED[target.kind]
        if not dry_run:
            try:
                if target.kind != "StatefulSet" and down.replicas > 0:
                    # the ReplicaSet removes its lowest-cost pods first: make that the idle one
                    for pod in down.pods:
                        await self.client.patch(
                            PODS,
                            pod.name,
                            {"metadata": {"uid": pod.uid, "annotations": {POD_DELETION_COST: "-1000"}}},
                            namespace=pod.namespace,
                        )
                body = {
                    "metadata": {"resourceVersion": target.resource_version},
                    "spec": {"replicas": down.replicas},
                }
                await self.client.patch(
                    resource, target.name, body, namespace=target.namespace, subresource="scale"
                )
            except KubeConflict:
                log.info(
                    "owner changed since it was read; scale-down decided again next pass",
                    extra={"owner": target.key},
                )
                return
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.inc()
                log.warning(
                    "idle scale-down failed; retried next pass",
                    extra={"owner": target.key, "error": str(exc)},
                )
                return
        result.scaled.append(target.key)
        prefix = "[dry-run] " if dry_run else ""
        log.info(prefix + note, extra={"owner": target.key})
        owner = ObjectRef(resource.api_version, target.kind, target.name, target.namespace)
        await self.events.emit(
            owner, reason="GPUIdleScaledDown", note=prefix + note, action="Scale", type=EventType.WARNING
        )
        for pod in down.pods:
            await self.events.emit(
                _ref(pod),
                reason="GPUIdleScaledDown",
                note=prefix + note,
                action="Scale",
                type=EventType.WARNING,
            )

    async def _held(self, held: ScaleHeld, dry_run: bool) -> None:
        prefix = "[dry-run] " if dry_run else ""
        note = f"{prefix}idle scale-down held: {held.reason}"
        target = held.target
        if target is not None and target.kind in SCALED:
            regarding = ObjectRef(SCALED[target.kind].api_version, target.kind, target.name, target.namespace)
        else:
            regarding = _ref(held.pods[0])
        await self.events.emit(regarding, reason="GPUIdleScaleDownHeld", note=note, action="Scale")
