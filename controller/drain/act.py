"""Applying a drain plan: Evictions (policy/v1, so PodDisruptionBudgets hold), the rare delete, the state.

Why a module: the only place drain touches the cluster. An Eviction answered 429 is never turned into a
delete here — only the plan's `delete` verdict (a rule's `delete_after_seconds`) deletes, with the pod's uid
as precondition. Each outcome updates the per-pod history that the next pass's back-off is computed from,
and the node's `gpuwarden.io/drain` annotation is rewritten only when it changed. Each Eviction is entered
in the node's ledger (its drain state) before it is sent, and its GPUPodEvicted Event is named after the
pod's uid: the fleet's rate and the Events survive a leader killed between the two. Every other Event is
named too, after what it is about, so a new leader repeating a half-done step gets 409 instead of a
duplicate: GPUDrainStarted/Done/GateClosed after the quarantine's start, GPUDrainBlocked after the pod and the
drain's start, GPUDrainCancelled after the drain's start (cancel.py). Dry-run evicts, deletes and writes
nothing; it logs and events what it would do.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, Counter, Gauge

from controller.drain.cancel import EVENT_CANCELLED, CancelStep, after_cancel
from controller.drain.plan import (
    RATE_WINDOW_SECONDS,
    DrainPlan,
    DrainVerdict,
    Eviction,
    NodePlan,
    PodAction,
    PodHistory,
    prune_ledger,
)
from controller.drain.state import DrainState
from gpuwarden.errors import KubeError, KubeNotFound
from gpuwarden.kube import NODES, PODS, EventRecorder, EventType, KubeClient, ObjectRef
from gpuwarden.kube.eviction import evict
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION

log = logging.getLogger(__name__)
_WRITTEN_MAX = 50_000


class DrainMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.evictions = Counter(
            "gpuwarden_drain_evictions_total",
            "Drain evictions: evicted, blocked (429: a PDB), deleted (delete_after), failed, dry_run.",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("evicted", "blocked", "deleted", "failed", "dry_run"):
            self.evictions.labels(outcome)
        self.gate_closed = Counter(
            "gpuwarden_drain_gate_closed_total",
            "Passes in which the drain gate held something.",
            registry=registry,
        )
        self.nodes = Gauge(
            "gpuwarden_drain_nodes",
            "Quarantined nodes by drain state at the last pass.",
            ["state"],
            registry=registry,
        )
        self.blocked_pods = Gauge(
            "gpuwarden_drain_blocked_pods",
            "Pods whose eviction is refused (PDB) at the last pass.",
            registry=registry,
        )


@dataclass
class ActResult:
    evictions: int = 0
    blocked: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)


class DrainActuator:
    def __init__(
        self,
        kube: KubeClient,
        events: EventRecorder,
        metrics: DrainMetrics,
        clock: Callable[[], float],
        *,
        rate_window: float = RATE_WINDOW_SECONDS,
    ) -> None:
        self.kube = kube
        self.rate_window = (
            rate_window  # drain.gate.rate_window_seconds: how long the ledger keeps an eviction
        )
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self._still_go: Callable[[str], bool] | None = None
        self._written: set[str] = set()  # named Events known to exist (a gate held for hours: one create)

    async def apply(
        self, plan: DrainPlan, states: Mapping[str, DrainState], node_objs: Mapping[str, dict[str, object]],
        *, dry_run: bool, still_go: Callable[[str], bool] | None = None,
    ) -> ActResult:  # fmt: skip
        """Apply the plan. `still_go(node)` is asked before every eviction: a lost lease or a node released
        since the snapshot stops the pass there (what is left is retried by the next leader's pass)."""
        result = ActResult()
        self._still_go = still_go
        for node_plan in plan.nodes:
            if still_go is not None and not still_go(node_plan.node):
                continue
            state = states.get(node_plan.node)
            new_state = await self._node(node_plan, state, node_objs.get(node_plan.node), dry_run, result)
            if (
                not dry_run
                and new_state is not None
                and (state is None or new_state.encode() != state.encode())
            ):
                await self._write_state(node_plan.node, new_state)
        return result

    async def _node(
        self, plan: NodePlan, state: DrainState | None, node: dict[str, object] | None, dry_run: bool,
        result: ActResult,
    ) -> DrainState | None:  # fmt: skip
        now = self.clock()
        node_ref = ObjectRef.of(node) if node else ObjectRef(api_version="v1", kind="Node", name=plan.node)
        # A drain cancelled by an earlier release left its ledger: the new drain starts with it (the rate).
        carried = state.evictions if state is not None and state.cancelled is not None else ()
        if state is not None and state.cancelled is not None:
            state = None
        if plan.held and state is None:
            if plan.actions:
                note = f"drain held: {plan.held}"
                await self._emit(node_ref, "GPUDrainGateClosed", note, dry_run, once=plan.quarantined_at)
            return None
        if state is None:
            if plan.done:
                # Nothing to move: the drain is done at once (the remediation hand-off can follow).
                note = f"nothing to move ({plan.scope} scope)"
                await self._emit(node_ref, "GPUDrainDone", note, dry_run, once=plan.quarantined_at)
                return DrainState(started=now, scope=plan.scope, done=now, evictions=carried)
            state = DrainState(started=now, scope=plan.scope, evictions=carried)
            what = "pods on the faulty GPUs" if plan.scope == "gpu" else "GPU pods of the node"
            if plan.scope_note:
                what += f" ({plan.scope_note})"
            moving = (
                ", ".join(a.pod.key for a in plan.actions if a.verdict is not DrainVerdict.REPORT) or "none"
            )
            note = f"draining the {what}: {moving}"
            await self._emit(node_ref, "GPUDrainStarted", note, dry_run, once=plan.quarantined_at)
        history = dict(state.history)
        blocked: dict[str, str] = {}
        pending: list[str] = []
        ledger = {e.pod: e for e in state.evictions}
        if not dry_run:
            for owed in plan.events_owed:  # evicted by a leader that died before the Event
                if await self._evicted_event(owed, "evicted (Event written by a later pass)"):
                    ledger[owed.pod] = replace(owed, evented=True)
        for action in plan.actions:
            key = action.pod.key
            if action.verdict is DrainVerdict.REPORT:
                blocked[key] = action.reason
                continue
            pending.append(key)
            if action.verdict in (DrainVerdict.WAIT, DrainVerdict.BACKOFF):
                if key in state.blocked:
                    blocked[key] = state.blocked[key]
                continue
            if self._still_go is not None and not self._still_go(plan.node):
                continue  # lost the lease, or the node was released: no more evictions in this pass
            if not dry_run:
                # The ledger first: a leader killed after the Eviction still leaves it counted and evented.
                entry = Eviction(key, action.pod.uid, float(math.ceil(now)))
                ledger[key] = entry
                written = state.with_(evictions=prune_ledger(ledger.values(), (), now, self.rate_window))
                if not await self._write_state(plan.node, written):
                    ledger.pop(key)
                    continue
            outcome = await self._move(action, dry_run, result, state.started)
            if not dry_run:
                if outcome == "moved":
                    if await self._evicted_event(entry, self._note(action)):
                        ledger[key] = replace(entry, evented=True)
                else:
                    ledger.pop(key)  # refused, failed or already gone: not an eviction of ours
            h = history.get(key, PodHistory())
            if outcome == "blocked":
                history[key] = replace(
                    h, first_refused=h.first_refused or now, last_attempt=now, attempts=h.attempts + 1
                )
                blocked[key] = "PodDisruptionBudget (429)"
                result.blocked.append(key)
            elif outcome == "failed":
                history[key] = replace(h, last_attempt=now, attempts=h.attempts + 1)
        if plan.done and state.done is None:
            note = f"drain done ({plan.scope} scope)"
            await self._emit(node_ref, "GPUDrainDone", note, dry_run, once=plan.quarantined_at)
        return state.with_(
            scope=plan.scope,
            pending=tuple(pending),
            blocked=blocked,
            history={k: v for k, v in history.items() if k in pending},
            done=state.done if state.done is not None else (now if plan.done else None),
            evictions=prune_ledger(ledger.values(), [a.pod for a in plan.actions], now, self.rate_window),
        )

    @staticmethod
    def _note(action: PodAction) -> str:
        verb = "delete" if action.verdict is DrainVerdict.DELETE else "evict"
        return f"{verb}: {action.reason} (mode {action.mode}, rule {action.rule})"

    async def _evicted_event(self, e: Eviction, note: str) -> bool:
        """The pod's GPUPodEvicted Event, once: named after the pod's uid (409 = written before)."""
        namespace, _, name = e.pod.partition("/")
        ref = ObjectRef(api_version="v1", kind="Pod", name=name, namespace=namespace, uid=e.uid)
        return await self.events.emit_once(
            ref, name=f"{name[:180]}.gpupodevicted.{e.uid}", reason="GPUPodEvicted", note=note,
            action="Drain", type=EventType.WARNING,
        )  # fmt: skip

    async def _move(self, action: PodAction, dry_run: bool, result: ActResult, started: float) -> str:
        pod = action.pod
        verb = "delete" if action.verdict is DrainVerdict.DELETE else "evict"
        ref = ObjectRef(api_version="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid)
        note = self._note(action)
        if dry_run:
            self.metrics.evictions.labels("dry_run").inc()
            log.info(f"[dry-run] {note}", extra={"pod": pod.key})
            await self._emit(ref, "GPUPodEvicted", f"[dry-run] {note}", True)
            return "dry_run"
        try:
            if verb == "delete":
                await self.kube.request(
                    "DELETE", PODS.path(pod.namespace, pod.name), verb="delete", resource="pods",
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}},
                    content_type="application/json",
                )  # fmt: skip
            else:
                await evict(self.kube, pod.namespace, pod.name, pod.uid)
        except KubeNotFound:
            return "gone"
        except KubeError as exc:
            if exc.status == 429:
                self.metrics.evictions.labels("blocked").inc()
                # Once per pod and drain (the drain's start is stored before any Eviction is sent): a
                # later refusal, or the next leader's retry after a kill, answers 409. The metric counts each.
                name = f"{pod.name[:150]}.gpudrainblocked.{int(started):x}.{pod.uid}"
                await self._emit(ref, "GPUDrainBlocked", f"{note} refused: {exc.message}", False, name=name)
                return "blocked"
            self.metrics.evictions.labels("failed").inc()
            log.warning("drain eviction failed; retried", extra={"pod": pod.key, "error": str(exc)})
            return "failed"
        self.metrics.evictions.labels("deleted" if verb == "delete" else "evicted").inc()
        result.evictions += 1
        result.evicted.append(pod.key)
        log.info(note, extra={"pod": pod.key})
        return "moved"  # the caller writes its Event (once) and marks the ledger

    async def _write_state(self, node: str, state: DrainState | None) -> bool:
        value = None if state is None else state.encode()
        try:
            await self.kube.patch(NODES, node, {"metadata": {"annotations": {DRAIN_ANNOTATION: value}}})
        except KubeError as exc:
            log.warning("drain state not written", extra={"node": node, "error": str(exc)})
            return False
        return True

    async def cancel(self, step: CancelStep, node_obj: dict[str, object] | None, dry_run: bool) -> None:
        """The node was released: its drain ends, nothing more is evicted; its ledger is kept until pruned
        (cancel.py: the writes in their order, and what the next pass does with each half-done state)."""
        node = step.node
        ref = ObjectRef.of(node_obj) if node_obj else ObjectRef(api_version="v1", kind="Node", name=node)
        note = "node released; drain cancelled"
        if dry_run:
            if step.announce:
                await self._emit(ref, EVENT_CANCELLED, note, True)
            return
        if step.announce and not await self._emit(ref, EVENT_CANCELLED, note, False, name=step.announce):
            return  # not written (retryable): the state stays as it is, the next pass announces again
        evented = set()
        for owed in step.owed:  # evicted by a leader that died before the Event
            if await self._evicted_event(owed, "evicted (Event written by a later pass)"):
                evented.add(owed.uid)
        after = after_cancel(step, evented, self.clock())
        if after is None or after.encode() != step.state.encode():
            await self._write_state(node, after)

    async def _emit(
        self, ref: ObjectRef, reason: str, note: str, dry_run: bool, *, once: float | None = None,
        name: str = "",
    ) -> bool:  # fmt: skip
        """`once`: the drained quarantine's start - the Event is named after it and written at most once
        (a leader killed before the drain state was written repeats the step, not the Event). `name`: the
        Event's own name, written at most once. False when a named Event is still to be written."""
        warning = reason in ("GPUDrainBlocked", "GPUDrainGateClosed", "GPUPodEvicted")
        prefix = "[dry-run] " if dry_run and not note.startswith("[dry-run]") else ""
        if once is not None and not name:
            name = f"{ref.name}.{reason.lower()}.{int(once):x}"
        if name and not dry_run:
            if name in self._written:
                return True  # written (or found written) by this process: no create answered 409 each pass
            kind = EventType.WARNING if warning else EventType.NORMAL
            done = await self.events.emit_once(
                ref, name=name, reason=reason, note=note, action="Drain", type=kind
            )
            if done:
                if len(self._written) >= _WRITTEN_MAX:
                    self._written.clear()
                self._written.add(name)
            return done
        with contextlib.suppress(KubeError):
            await self.events.emit(
                ref, reason=reason, note=prefix + note, action="Drain",
                type=EventType.WARNING if warning else EventType.NORMAL,
            )  # fmt: skip
        return True
