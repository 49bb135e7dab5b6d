"""Act: apply a `NominationPlan` — clear `status.nominatedNodeName`, evict, write our record, emit Events.

Why it exists: the plan says *what*; this is the only place the nomination loop writes, so the write-side
safety lives here once:

* a clear re-checks the terminating-victim guard against the API (a fresh LIST of the pods on that node)
  right before writing, because the informer cache may lag the scheduler's DisruptionTarget patch by a
  moment; a failed LIST means "unknown" and nothing is cleared;
* the clear is a strategic-merge patch of `pods/<name>/status` setting `nominatedNodeName: null` (what
  kube-scheduler's own `clearNominatedNode` sends), conditioned on the resourceVersion of a fresh read that
  still shows the *same* nomination and no binding — a concurrent scheduler write wins;
* eviction goes through the Eviction API (policy/v1), so PodDisruptionBudgets are respected: a 429 means
  the budget blocks it, which is reported and retried on a later pass, never forced;
* record writes carry the pod's UID as a precondition, so a re-created pod of the same name is not touched;
* a clear is written between two record writes: the record marked (Event pending) before, removed after the
  `NominationCleared` Event (named after the record) exists; a leader killed in between leaves the mark and
  the next pass's `Forget` writes the Event once.

In dry-run nothing is written but Events, prefixed "[dry-run]". Events: `NominationCleared` (Normal),
`NominatedPodEvicted` and `NominatedPodEvictionBlocked` (Warning), regarding the pod, related the node.
What it must not do: decide, or touch any field but `status.nominatedNodeName` and our annotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from controller.nominations.metrics import NominationMetrics
from controller.nominations.plan import Clear, Evict, Forget, NominationPlan, Stamp, cleared_event_name
from controller.nominations.snapshot import NominationRecord, PendingPod
from controller.preemption.signals import terminating_by_preemption
from gpuwarden.errors import KubeError, KubeNotFound
from gpuwarden.kube import PODS, EventRecorder, EventType, JsonObject, ObjectRef, PatchType, patch_with_retry
from gpuwarden.kube.eviction import evict as evict_pod
from gpuwarden.kube.patch import ObjectClient
from gpuwarden.kube.resources import ObjectList, Resource
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION

log = logging.getLogger(__name__)


class PodApi(ObjectClient, Protocol):
    """The calls the actuator makes; `KubeClient` provides them."""

    async def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = 500,
    ) -> ObjectList: ...

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> JsonObject: ...


@dataclass
class ActResult:
    """What one application of a plan did."""

    cleared: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    guarded: list[str] = field(default_factory=list)
    """Clears skipped because the fresh LIST showed a victim still terminating (or could not be read)."""
    failures: int = 0
    unrecorded: dict[str, NominationRecord] = field(default_factory=dict)
    """Pod UID -> record we could not write (the loop remembers these in memory)."""


def _pod_ref(pod: PendingPod) -> ObjectRef:
    return ObjectRef("v1", "Pod", pod.name, pod.namespace, pod.uid or None)


def _still_nominated(current: JsonObject, pod: PendingPod) -> bool:
    """The same pod (uid), unbound, still nominated to the node the plan saw."""
    meta, spec, status = (current.get(k) or {} for k in ("metadata", "spec", "status"))
    same = meta.get("uid") == pod.uid and not spec.get("nodeName")
    return bool(same and status.get("nominatedNodeName") == pod.node)


def _priority(obj: JsonObject) -> int:
    value = (obj.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class NominationActuator:
    """Applies plans through one client, at most `concurrency` writes at a time; never raises a KubeError."""

    def __init__(
        self, client: PodApi, events: EventRecorder, metrics: NominationMetrics, *, concurrency: int = 8
    ) -> None:
        self.client, self.events, self.metrics = client, events, metrics
        self._sem = asyncio.Semaphore(concurrency)

    async def apply(self, plan: NominationPlan) -> ActResult:
        result = ActResult()
        jobs: list[Awaitable[None]] = [self._clear(c, plan.dry_run, result) for c in plan.clears]
        jobs += [self._evict(e, plan.dry_run, result) for e in plan.evictions]
        if plan.dry_run:
            result.unrecorded.update({s.pod.uid: s.record for s in plan.stamps})
        else:
            jobs += [self._stamp(s, result) for s in plan.stamps]
            jobs += [self._forget(f, result) for f in plan.forgets]
        await asyncio.gather(*jobs)
        return result

    async def _emit(
        self, pod: PendingPod, reason: str, note: str, dry_run: bool, warning: bool = False
    ) -> None:
        await self.events.emit(
            _pod_ref(pod),
            reason=reason,
            note=f"[dry-run] {note}" if dry_run else note,
            action="ClearNomination" if reason == "NominationCleared" else "Evict",
            type=EventType.WARNING if warning else EventType.NORMAL,
            related=ObjectRef("v1", "Node", pod.node),
        )

    async def _guarded(self, clear: Clear) -> bool:
        """True when a victim is still terminating on the node (or we cannot tell)."""
        try:
            on_node = await self.client.list_objects(PODS, field_selector=f"spec.nodeName={clear.pod.node}")
        except KubeError as exc:
            log.warning(
                "cannot re-check victims; nomination kept", extra={"pod": clear.pod.key, "error": str(exc)}
            )
            return True
        return any(terminating_by_preemption(p) and _priority(p) < clear.pod.priority for p in on_node.items)

    async def _clear(self, clear: Clear, dry_run: bool, result: ActResult) -> None:
        pod = clear.pod
        note = f"cleared status.nominatedNodeName {pod.node}: {clear.message}"
        extra = {"pod": pod.key, "node": pod.node, "reason": clear.reason.value}
        async with self._sem:
            if dry_run:
                log.info(f"[dry-run] {note}", extra=extra)
                self.metrics.cleared.labels(clear.reason.value, "true").inc()
                await self._emit(pod, "NominationCleared", note, dry_run)
                return
            if await self._guarded(clear):
                result.guarded.append(pod.key)
                self.metrics.guarded.inc()
                return
            try:
                if not _still_nominated(await self.client.get(PODS, pod.name, namespace=pod.namespace), pod):
                    return  # changed since the plan: nothing to clear, no record to mark
            except KubeError:
                return  # gone or unreadable: the next pass decides afresh
            mark = replace(clear.record or NominationRecord(pod.node, 0.0), clearing=True)
            if not await self._write_record_unlocked(pod, mark.encode(), result):
                return  # without the mark a killed leader could lose the Event: not cleared this pass
            wrote = False

            def compute(current: JsonObject) -> JsonObject | None:
                nonlocal wrote
                wrote = _still_nominated(current, pod)
                return {"status": {"nominatedNodeName": None}} if wrote else None

            try:
                await patch_with_retry(
                    self.client, PODS, pod.name, compute,
                    namespace=pod.namespace, subresource="status", patch_type=PatchType.STRATEGIC,
                )  # fmt: skip
            except KubeNotFound:
                return
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.labels("clear").inc()
                log.warning(
                    "clearing the nomination failed; retried next pass", extra={**extra, "error": str(exc)}
                )
                return
            if not wrote:  # the nomination changed under us: nothing cleared, no Event owed
                await self._write_record_unlocked(pod, replace(mark, clearing=False).encode(), result)
                return
            result.cleared.append(pod.key)
            self.metrics.cleared.labels(clear.reason.value, "false").inc()
            log.info(note, extra=extra)
        if await self._emit_once(pod, mark, note):
            await self._write_record(pod, None, result)

    async def _emit_once(self, pod: PendingPod, record: NominationRecord, note: str) -> bool:
        return await self.events.emit_once(
            _pod_ref(pod), name=cleared_event_name(pod, record), reason="NominationCleared", note=note,
            action="ClearNomination",
        )  # fmt: skip

    async def _evict(self, evict: Evict, dry_run: bool, result: ActResult) -> None:
        pod = evict.pod
        note = f"evicted: {evict.message}"
        async with self._sem:
            if dry_run:
                self.metrics.evictions.labels("dry_run").inc()
                log.info(f"[dry-run] {note}", extra={"pod": pod.key})
                await self._emit(pod, "NominatedPodEvicted", note, True, warning=True)
                return
            try:
                await evict_pod(self.client, pod.namespace, pod.name, pod.uid)
            except KubeNotFound:
                return
            except KubeError as exc:
                if exc.status == 429:  # a PodDisruptionBudget does not allow it now
                    result.blocked.append(pod.key)
                    self.metrics.evictions.labels("blocked").inc()
                    await self._emit(
                        pod,
                        "NominatedPodEvictionBlocked",
                        f"{note} blocked: {exc.message}",
                        False,
                        warning=True,
                    )
                    return
                result.failures += 1
                self.metrics.evictions.labels("failed").inc()
                log.warning("eviction failed; retried next pass", extra={"pod": pod.key, "error": str(exc)})
                return
            result.evicted.append(pod.key)
            self.metrics.evictions.labels("evicted").inc()
            log.info(note, extra={"pod": pod.key})
        await self._emit(pod, "NominatedPodEvicted", note, False, warning=True)

    async def _write_record(self, pod: PendingPod, value: str | None, result: ActResult) -> bool:
        async with self._sem:
            return await self._write_record_unlocked(pod, value, result)

    async def _write_record_unlocked(self, pod: PendingPod, value: str | None, result: ActResult) -> bool:
        patch = {"metadata": {"uid": pod.uid, "annotations": {NOMINATION_ANNOTATION: value}}}
        try:
            await self.client.patch(PODS, pod.name, patch, namespace=pod.namespace)
        except KubeNotFound:
            return True
        except KubeError as exc:
            result.failures += 1
            self.metrics.write_failures.labels("record").inc()
            log.warning("nomination record not written", extra={"pod": pod.key, "error": str(exc)})
            return False
        return True

    async def _stamp(self, stamp: Stamp, result: ActResult) -> None:
        if not await self._write_record(stamp.pod, stamp.record.encode(), result):
            result.unrecorded[stamp.pod.uid] = stamp.record

    async def _forget(self, forget: Forget, result: ActResult) -> None:
        if forget.owed is not None:  # cleared by a leader that died before its Event
            note = f"cleared status.nominatedNodeName {forget.owed.node} (Event written by a later pass)"
            if not await self._emit_once(forget.pod, forget.owed, note):
                return  # the record stays: the next pass tries again under the same name
        await self._write_record(forget.pod, None, result)
