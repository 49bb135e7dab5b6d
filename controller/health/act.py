"""Act: apply a quarantine `HealthPlan` to the cluster — our taint, our annotations, our condition, Events.

Why it exists: the plan says *what*; this module is the only place that writes Nodes for the health loop, so
the rules of docs/architecture.md safety rule 2 live here once. Each node write re-reads the Node and
recomputes the change from what it read (conflicts retried by `gpuwarden.kube.patch_with_retry`), so an
operator's concurrent taint is never overwritten: we filter and append only taints with our key. The
`GPUHealthy` condition goes through the status subresource (strategic merge by condition type). The breaker's
state lives in a ConfigMap so a new leader resumes it; deleting the ConfigMap, or annotating it
`gpuwarden.io/reset=now`, resets it. It is written first in a pass: it holds the window's quarantine starts
(this pass's before their taints) and the transition Events it owes, written next under fixed names.

What it must not do: decide. It never touches a taint with another key, never cordons, never writes a
DeviceTaintRule it does not own (devicerules.py), and in dry-run writes nothing but Events (prefixed
"[dry-run]") and the effect-`None` DeviceTaintRules that preview a DRA-backed quarantine (no effect on
scheduling), which is how the plan is "evented" without changing state.
A failed write is logged and counted; the next pass recomputes and retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from controller.health import breaker, devicerules
from controller.health.metrics import HealthMetrics
from controller.health.observe import BREAKER_DATA_KEY, DEVICE_TAINT_RULES, JOBS, encode_breaker
from controller.health.plan import (
    Action,
    ConditionUpdate,
    DomainPublication,
    EventSpec,
    HealthPlan,
    RuleSpec,
    RuleSync,
)
from controller.health.snapshot import BreakerState
from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube import (
    CONFIG_MAPS,
    NODES,
    EventRecorder,
    EventType,
    JsonObject,
    KubeClient,
    ObjectRef,
    PatchType,
    patch_with_retry,
)
from gpuwarden.quarantine import QuarantineRecord, decode
from gpuwarden.wellknown import BREAKER_RESET as BREAKER_RESET_ANNOTATION
from gpuwarden.wellknown import DEGRADATION as DEGRADATION_ANNOTATION
from gpuwarden.wellknown import DISRUPTION_HOLD as DISRUPTION_HOLD_ANNOTATION
from gpuwarden.wellknown import EXCLUDE as EXCLUDE_LABEL
from gpuwarden.wellknown import KARPENTER_DO_NOT_DISRUPT as DO_NOT_DISRUPT_ANNOTATION
from gpuwarden.wellknown import NVLINK_DOMAIN_HEALTH, NVLINK_DOMAIN_TAINT
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from gpuwarden.wellknown import RELEASE as RELEASE_ANNOTATION

log = logging.getLogger(__name__)

BREAKER_CONFIGMAP = "gpuwarden-quarantine-breaker"
HOLD_REASON = "quarantine"
"""The value of our `gpuwarden.io/disruption-hold` mark."""


@dataclass
class ActResult:
    """What one application of a plan did: writes made, writes failed, events emitted."""

    writes: int = 0
    failures: int = 0
    events: int = 0


def node_patch(current: JsonObject, action: Action, *, hold_disruption: bool = False) -> JsonObject | None:
    """The merge patch for `action` computed from the Node as just read; None when nothing changes.

    `hold_disruption` (`health.hold_autoscaler_disruption`): while our taint stays on the node, Karpenter's
    `do-not-disrupt` is set with our mark (`disruption_changes`); a hold we marked is lifted with the taint,
    or once the switch is off."""
    meta = current.get("metadata") or {}
    if (meta.get("labels") or {}).get(EXCLUDE_LABEL, "").lower() == "true":
        return None  # excluded since the plan was made
    patch: JsonObject = {}
    taints: list[JsonObject] = list((current.get("spec") or {}).get("taints") or [])
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    others = [t for t in taints if t.get("key") != TAINT_KEY]
    if action.add_taint is not None:
        want = {"key": TAINT_KEY, "value": action.add_taint.value, "effect": action.add_taint.effect}
        if not any(t.get("value") == want["value"] and t.get("effect") == want["effect"] for t in ours):
            replaced = action.remove_taint.effect if action.remove_taint is not None else None
            kept = (t for t in ours if t.get("effect") not in (want["effect"], replaced))
            patch["spec"] = {"taints": [*others, *kept, want]}
    elif action.remove_taint is not None and ours:
        patch["spec"] = {"taints": others or None}
    annotations = meta.get("annotations") or {}
    changes: dict[str, str | None] = {}
    if action.record is not None:
        encoded = action.record.encode()
        if annotations.get(RECORD_ANNOTATION) != encoded:
            changes[RECORD_ANNOTATION] = encoded
    elif action.remove_record and RECORD_ANNOTATION in annotations:
        changes[RECORD_ANNOTATION] = None
    if action.remove_release_request and RELEASE_ANNOTATION in annotations:
        changes[RELEASE_ANNOTATION] = None
    if action.degradation is not None and annotations.get(DEGRADATION_ANNOTATION) != action.degradation:
        changes[DEGRADATION_ANNOTATION] = action.degradation  # before the condition: the Event is owed
    if action.add_taint is not None:
        tainted = True
    elif action.remove_taint is not None:
        tainted = False
    else:
        tainted = bool(ours)
    changes.update(disruption_changes(annotations, quarantined=tainted, hold=hold_disruption))
    if changes:
        patch["metadata"] = {"annotations": changes}
    if action.domain is not None:
        _domain_patch(patch, meta, taints, action.domain)
    return patch or None


def disruption_changes(annotations: JsonObject, *, quarantined: bool, hold: bool) -> dict[str, str | None]:
    """Karpenter's `do-not-disrupt` for a node under quarantine (its evidence, its validation Job): set
    with our mark while `quarantined` and `hold`; lifted, mark and all, when either ends - only where our
    mark says we set it. An operator's own `do-not-disrupt` (no mark) is never set over or removed."""
    ours = annotations.get(DISRUPTION_HOLD_ANNOTATION) is not None
    if quarantined and hold:
        if annotations.get(DO_NOT_DISRUPT_ANNOTATION) is None:
            return {DO_NOT_DISRUPT_ANNOTATION: "true", DISRUPTION_HOLD_ANNOTATION: HOLD_REASON}
        return {}
    if not ours:
        return {}
    changes: dict[str, str | None] = {DISRUPTION_HOLD_ANNOTATION: None}
    if annotations.get(DO_NOT_DISRUPT_ANNOTATION) == "true":
        changes[DO_NOT_DISRUPT_ANNOTATION] = None
    return changes


def _domain_patch(
    patch: JsonObject, meta: JsonObject, taints: list[JsonObject], pub: DomainPublication
) -> None:
    """An NVLink domain's publication on a member (added to `patch`): our label set or removed, our domain
    taint added or removed (only our domain taint's key; the quarantine taint is never touched here)."""
    if (meta.get("labels") or {}).get(NVLINK_DOMAIN_HEALTH) != pub.label:
        patch.setdefault("metadata", {})["labels"] = {NVLINK_DOMAIN_HEALTH: pub.label}
    current = (patch.get("spec") or {}).get("taints", taints) or []
    has = any(t.get("key") == NVLINK_DOMAIN_TAINT for t in current)
    if pub.taint and not has:
        want = {"key": NVLINK_DOMAIN_TAINT, "value": pub.label or "degraded", "effect": "NoSchedule"}
        patch["spec"] = {"taints": [*current, want]}
    elif not pub.taint and has:
        patch["spec"] = {"taints": [t for t in current if t.get("key") != NVLINK_DOMAIN_TAINT] or None}


def after_event_patch(current: JsonObject, action: Action) -> JsonObject | None:
    """Settle the mark that owed `action.event`, now that the Event exists - only the mark this action owed:
    the record's over the same record (same start, same release; for a validation mark the same attempt and
    Event), the degradation mark while it holds the same change. A record rewritten since (a new quarantine)
    or a newer degradation mark is never overwritten."""
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    changes: dict[str, str | None] = {}
    if action.degradation is not None and annotations.get(DEGRADATION_ANNOTATION) == action.degradation:
        changes[DEGRADATION_ANNOTATION] = None
    record, _ = decode(annotations.get(RECORD_ANNOTATION))
    done = action.after_event
    if record is not None and done is not None and _same_record(record, done):
        # From the record as read now: evidence added since the plan (a concurrent update-record) is kept.
        if action.settles == "validation":
            owed = action.event.reason if action.event is not None else ""
            if record.validation_event == owed and record.validation_attempts == done.validation_attempts:
                changes[RECORD_ANNOTATION] = record.with_(validation_event="").encode()
        elif record.event_pending:
            changes[RECORD_ANNOTATION] = (
                None if action.remove_record_after_event else record.with_(event_pending=False).encode()
            )
    return {"metadata": {"annotations": changes}} if changes else None


def _same_record(a: QuarantineRecord, b: QuarantineRecord) -> bool:
    """The same quarantine (and release): a record rewritten for a new one is not."""
    return (a.state, a.quarantined_at, a.released_at) == (b.state, b.quarantined_at, b.released_at)


def condition_patch(current: JsonObject, update: ConditionUpdate, wall: datetime) -> JsonObject | None:
    """Strategic-merge status patch setting our condition (`GPUHealthy`, or `update.type`: `GPUDegraded`);
    lastTransitionTime moves only on a status change."""
    conditions = (current.get("status") or {}).get("conditions") or []
    old = next((c for c in conditions if c.get("type") == update.type), None)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
        update.status,
        update.reason,
        update.message,
    ):
        return None
    stamp = wall.isoformat(timespec="seconds").replace("+00:00", "Z")
    changed = old is None or old.get("status") != update.status
    cond = {
        "type": update.type,
        "status": update.status,
        "reason": update.reason,
        "message": update.message[:1024],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp if changed else old.get("lastTransitionTime", stamp),  # type: ignore[union-attr]
    }
    return {"status": {"conditions": [cond]}}


class Actuator:
    """Applies plans through one `KubeClient`; `namespace` holds the breaker ConfigMap and its Events."""

    def __init__(
        self,
        client: KubeClient,
        events: EventRecorder,
        metrics: HealthMetrics,
        *,
        namespace: str,
        concurrency: int = 8,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        breaker_configmap: str = BREAKER_CONFIGMAP,
        job_namespace: str = "",
        hold_disruption: bool = False,
    ) -> None:
        self.client, self.events, self.metrics = client, events, metrics
        self.hold_disruption = hold_disruption
        self.namespace = namespace
        self.job_namespace = job_namespace or namespace
        self.breaker_configmap = breaker_configmap
        self._sem = asyncio.Semaphore(concurrency)
        self._wall = wall

    async def apply(self, plan: HealthPlan) -> ActResult:
        """Apply the breaker state, its owed Events, then every action (bounded concurrency); never raises on
        a KubeError. The state comes first: it holds the starts of this pass's quarantines, so a leader
        killed after a taint leaves it counted in the window. Not stored: no quarantine in this pass."""
        result = ActResult()
        actions = plan.actions
        stored = await self._apply_breaker(plan, result)
        if not stored:
            actions = tuple(a for a in actions if a.kind != "quarantine")
        await asyncio.gather(*(self._apply_one(a, plan.dry_run, result) for a in actions))
        if stored and plan.rule_sync:
            await self._sync_rules(plan.rule_sync, result)
        return result

    async def _event(self, regarding: ObjectRef, spec: EventSpec, dry_run: bool, result: ActResult) -> None:
        note = f"[dry-run] {spec.note}" if dry_run else spec.note
        kind = EventType.WARNING if spec.type == "Warning" else EventType.NORMAL
        if await self.events.emit(regarding, reason=spec.reason, note=note, action=spec.action, type=kind):
            result.events += 1

    async def _apply_one(self, action: Action, dry_run: bool, result: ActResult) -> None:
        async with self._sem:
            extra: dict[str, Any] = {"node": action.node, "kind": action.kind, "reason": action.reason}
            log.info(
                f"{'[dry-run] ' if dry_run else ''}{action.kind} {action.node}: {action.message}", extra=extra
            )
            if not dry_run:
                try:
                    if action.create_job is not None:
                        await self._create_job(action.create_job, result)
                    await self._write_node(action, result)
                    await self._write_rules(action.rules, action.drop_rules, result)
                except KubeNotFound:
                    log.info("node gone before the write; nothing to do", extra=extra)
                    return
                except KubeError as exc:
                    result.failures += 1
                    self.metrics.write_failures.labels(action.kind).inc()
                    log.warning("write failed; retried next pass", extra={**extra, "error": str(exc)})
                    return
                if action.kind == "quarantine" and action.first_seen is not None:
                    self.metrics.detection_latency.observe(
                        max(0.0, self._wall().timestamp() - action.first_seen)
                    )
            if action.event is None:
                return
            ref = ObjectRef("v1", "Node", action.node)
            if dry_run or not action.event.name:
                await self._event(ref, action.event, dry_run, result)
                return
            await self._event_once(ref, action, result)

    async def _event_once(self, ref: ObjectRef, action: Action, result: ActResult) -> None:
        """Write the named Event (once across leaders), then clear the record's pending mark."""
        spec = action.event
        assert spec is not None
        kind = EventType.WARNING if spec.type == "Warning" else EventType.NORMAL
        if not await self.events.emit_once(
            ref, name=spec.name, reason=spec.reason, note=spec.note, action=spec.action, type=kind
        ):
            return  # the record still says pending: the next pass tries again under the same name
        result.events += 1
        if action.after_event is None and action.degradation is None:
            return
        try:
            await patch_with_retry(
                self.client, NODES, action.node, lambda cur: after_event_patch(cur, action),
                patch_type=PatchType.MERGE,
            )  # fmt: skip
            result.writes += 1
        except KubeError as exc:
            result.failures += 1
            self.metrics.write_failures.labels("finish-event").inc()
            log.warning("event mark not written; the next pass finds the Event written",
                        extra={"node": action.node, "error": str(exc)})  # fmt: skip

    async def _write_rules(
        self, rules: tuple[RuleSpec, ...], drop: tuple[str, ...], result: ActResult
    ) -> None:
        """An action's DeviceTaintRules, after its node write and before its Event: each created (409: it is
        there, named after the node and device - brought in step), each dropped one deleted (404: gone).
        A failure raises: the Event stays owed and the next pass's `finish-event` writes the rules again."""
        for rule in rules:
            await self._put_rule(rule)
            result.writes += 1
        for name in drop:
            await self._delete_rule(name, result)

    async def _put_rule(self, rule: RuleSpec) -> None:
        """Create the rule; one already there (409: named after the node and device) is brought in step."""
        try:
            await self.client.create(DEVICE_TAINT_RULES, devicerules.manifest(rule))
        except KubeConflict:
            await self.client.patch(DEVICE_TAINT_RULES, rule.name, devicerules.taint_patch(rule))

    async def _delete_rule(self, name: str, result: ActResult) -> None:
        """Delete the rule; one already gone (404) is no write."""
        try:
            await self.client.delete(DEVICE_TAINT_RULES, name)
            result.writes += 1
        except KubeNotFound:
            pass

    async def _sync_rules(self, sync: RuleSync, result: ActResult) -> None:
        """The pass's rule sync (devicerules.plan_rule_sync); dry-run's `None` rules included. A failure is
        logged and counted: the next pass plans the same change again."""
        for rule in sync.create + sync.update:
            try:
                await self._put_rule(rule)
                result.writes += 1
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.labels("device-rule").inc()
                log.warning("device taint rule not written", extra={"rule": rule.name, "error": str(exc)})
        for name in sync.delete:
            try:
                await self._delete_rule(name, result)
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.labels("device-rule").inc()
                log.warning("device taint rule not deleted", extra={"rule": name, "error": str(exc)})

    async def _create_job(self, job: JsonObject, result: ActResult) -> None:
        """Create a validation Job (before the record names it); one that already exists is ours: fine."""
        try:
            await self.client.create(JOBS, job, namespace=self.job_namespace)
            result.writes += 1
        except KubeConflict:
            log.info("validation Job exists already", extra={"job": job.get("metadata", {}).get("name")})

    async def _write_node(self, action: Action, result: ActResult) -> None:
        wrote = False

        def compute(current: JsonObject) -> JsonObject | None:
            nonlocal wrote
            body = node_patch(current, action, hold_disruption=self.hold_disruption)
            wrote = body is not None
            return body

        await patch_with_retry(self.client, NODES, action.node, compute, patch_type=PatchType.MERGE)
        result.writes += int(wrote)
        if action.condition is not None:
            update = action.condition
            wall = self._wall()
            cond_wrote = False

            def compute_status(current: JsonObject) -> JsonObject | None:
                nonlocal cond_wrote
                body = condition_patch(current, update, wall)
                cond_wrote = body is not None
                return body

            await patch_with_retry(
                self.client,
                NODES,
                action.node,
                compute_status,
                patch_type=PatchType.STRATEGIC,
                subresource="status",
            )
            result.writes += int(cond_wrote)

    async def _apply_breaker(self, plan: HealthPlan, result: ActResult) -> bool:
        """(1) the state, owed Events included; (2) each owed Event, named after its episode (409: written
        before); (3) the state without the written ones. False when (1) failed."""
        decision = plan.breaker
        ref = ObjectRef("v1", "ConfigMap", self.breaker_configmap, self.namespace)
        if plan.dry_run:
            if decision.event is not None:
                await self._event(ref, decision.event, True, result)
            return True
        if decision.changed:
            try:
                await self._store_breaker(decision.after)
                result.writes += 1
            except KubeError as exc:
                result.failures += 1
                self.metrics.write_failures.labels("breaker").inc()
                log.warning("breaker state not stored; no quarantine this pass, retried next pass",
                            extra={"error": str(exc)})  # fmt: skip
                return False
        written = []
        for owed in decision.after.owed:
            spec = breaker.event_spec(owed, self.breaker_configmap)
            kind = EventType.WARNING if spec.type == "Warning" else EventType.NORMAL
            if await self.events.emit_once(
                ref, name=spec.name, reason=spec.reason, note=spec.note, action=spec.action, type=kind
            ):
                written.append(owed)
                result.events += 1
        if written:
            rest = tuple(e for e in decision.after.owed if e not in written)
            try:
                await self._store_breaker(replace(decision.after, owed=rest))
                result.writes += 1
            except KubeError as exc:
                self.metrics.write_failures.labels("breaker").inc()
                log.warning("breaker Event mark not cleared; the next pass finds the Event written",
                            extra={"error": str(exc)})  # fmt: skip
        return True

    async def _store_breaker(self, state: BreakerState) -> None:
        data = {BREAKER_DATA_KEY: encode_breaker(state)}
        patch: JsonObject = {"data": data, "metadata": {"annotations": {BREAKER_RESET_ANNOTATION: None}}}
        try:
            await self.client.patch(CONFIG_MAPS, self.breaker_configmap, patch, namespace=self.namespace)
        except KubeNotFound:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.breaker_configmap},
                "data": data,
            }
            await self.client.create(CONFIG_MAPS, body, namespace=self.namespace)

    async def read_breaker(self) -> JsonObject | None:
        """The breaker ConfigMap, or None when it does not exist (closed)."""
        try:
            return await self.client.get(CONFIG_MAPS, self.breaker_configmap, namespace=self.namespace)
        except KubeNotFound:
            return None
