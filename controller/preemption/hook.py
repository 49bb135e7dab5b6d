"""`PreemptionThrottle`: the extender's preempt verb with budgets, chain and ping-pong limits and back-off.

Why it exists: wiring. It owns the preemption graph, the observer that feeds it, the Event recorder and the
self-metrics, and is itself the extender's `PreemptHook`::

    throttle = PreemptionThrottle(config, kube, registry=registry)
    extender = build_extender(config, kube, registry=registry, preempt_hook=throttle)
    await asyncio.gather(extender.run(), throttle.run())

It runs on every replica (no leader: the scheduler may call any of them, and each answers from a graph
rebuilt from the same API objects). Until its watches have listed once it answers like the rest of the
extender — "not synced" (HTTP 503 -> the scheduler's PostFilter fails and the pod is retried, nominations
untouched) — because passing candidates through blind could let a storm through right after a restart.

What it must not do: block the verb on the API. `PreemptionThrottled` Events are written in the background
(the shared `EventQueue`), at most one per preemptor and verdict per `preemption.event_interval_seconds`,
and dropped (logged) when too many are queued. In dry-run the decision is computed, counted and evented
("[dry-run]") but the candidates go back unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from controller.extenderv1 import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel, NotSynced
from controller.gpus.objects import pod_info
from controller.gpus.tenants import Tenancy
from controller.gpus.victims import revise_candidates
from controller.preemption.graph import PreemptionGraph
from controller.preemption.metrics import PreemptionMetrics
from controller.preemption.observer import PreemptionObserver
from controller.preemption.record import BY_VERB, PreemptionRecord, VictimEntry, making_room, record_patch
from controller.preemption.signals import PodMeta, pod_meta
from controller.preemption.tenancy import TenantFeed
from controller.preemption.throttle import (
    Candidate,
    TenantGate,
    ThrottleDecision,
    ThrottlePolicy,
    decide_preemption,
    policy_from_config,
)
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError
from gpuwarden.kube import PODS, EventRecorder, EventType, Informer, KubeClient, ObjectRef, PatchType
from gpuwarden.kube.event_queue import EventQueue, PendingEvent
from gpuwarden.selfmetrics import SnapshotCollector

log = logging.getLogger(__name__)

EVENT_REASON = "PreemptionThrottled"
MAX_PENDING_EVENTS = 64


class PreemptionThrottle:
    """The preempt verb (`await throttle(args)`) plus the observer loop (`await throttle.run()`)."""

    def __init__(
        self,
        config: Config,
        kube: KubeClient,
        *,
        registry: CollectorRegistry | None = None,
        dry_run: bool | None = None,
        instance: str = "",
        clock: Callable[[], float] = time.time,
        recorder: EventRecorder | None = None,
        event_interval: float | None = None,
        flush_interval: float = 30.0,
        pods: Informer | None = None,
    ) -> None:
        self.policy: ThrottlePolicy = policy_from_config(config.preemption, dry_run=dry_run)
        self.clock = clock
        self.kube = kube
        self.graph = PreemptionGraph(
            horizon=self.policy.horizon, chain_window=self.policy.chain_window, backoff=self.policy.backoff
        )
        self.metrics = PreemptionMetrics(registry, self.graph)
        self.observer = PreemptionObserver(
            kube,
            self.graph,
            self.metrics,
            page_size=config.kubernetes.list_page_size,
            watch_timeout=int(config.kubernetes.watch_timeout_seconds),
            clock=clock,
            pods=pods,
        )
        self.recorder = recorder or EventRecorder(
            kube, component="preemption", instance=instance or socket.gethostname()
        )
        self._event_interval = (
            config.preemption.event_interval_seconds if event_interval is None else event_interval
        )
        self._last_event: dict[str, tuple[str, float]] = {}
        self._model: ClusterModel | None = None
        self._gpu_settings: Callable[[], Settings] | None = None
        self.tenants = TenantFeed(config, kube)
        """Namespaces and ResourceQuotas for the cross-tenant rule (watched only when it is not `any`)."""
        if registry is not None and self.tenants.active:
            registry.register(
                SnapshotCollector(
                    "gpuwarden_tenant_gpus",
                    "GPUs per tenant (tenants holding GPUs or with a share) under the cross-tenant rule: "
                    "kind=guaranteed (its share), held (bound, not terminating), preemptable (what other "
                    "tenants' preemptions may take now).",
                    ["tenant", "kind"],
                    self._tenant_gpus,
                )
            )
        self.events = EventQueue(
            self.recorder,
            capacity=MAX_PENDING_EVENTS,
            flush_interval=flush_interval,
            on_drop=lambda event, why: log.warning(
                "PreemptionThrottled event dropped",
                extra={"pod": f"{event.regarding.namespace}/{event.regarding.name}", "why": why},
            ),
            name="preemption",
        )
        """Where `PreemptionThrottled` Events wait for the writer `run()` starts (never blocks the verb)."""

    @property
    def pods(self) -> Informer:
        """The live-pod informer this throttle runs; other loops may read its cache (`objects()`)."""
        return self.observer.pods

    def ready(self) -> bool:
        return self.observer.synced and self.tenants.synced

    def _tenant_gpus(self) -> dict[tuple[str, ...], float]:
        tenancy = self.tenancy() if self.tenants.synced else None
        out: dict[tuple[str, ...], float] = {}
        if tenancy is None:
            return out
        for t in tenancy.tenants():
            share, held = tenancy.share.get(t, 0), tenancy.held.get(t, 0)
            if share or held:
                out[(t, "guaranteed")] = float(share)
                out[(t, "held")] = float(held)
                out[(t, "preemptable")] = float(tenancy.preemptable(t))
        return out

    def tenancy(self) -> Tenancy | None:
        """The cross-tenant rule's snapshot now (None: rule `any`); make-room decides with it too."""
        return self.tenants.tenancy(self._model, self.clock())

    # --- the verb ----------------------------------------------------------------------------------------

    def _lookup(self, args: ExtenderPreemptionArgs) -> Callable[[str], PodMeta | None]:
        """Victim UID -> pod: from the request when it carries full pods, else from the observer's index."""
        if not args.node_name_to_victims:
            return self.observer.lookup
        sent = {m.uid: m for v in args.node_name_to_victims.values() for m in map(pod_meta, v.pods)}
        return lambda uid: sent.get(uid) or self.observer.lookup(uid)

    def use_gpu_model(self, model: ClusterModel, settings: Callable[[], Settings]) -> None:
        """Choose victims with the extender's GPU model (victims.revise_candidates) before throttling:
        GPU holders are added where the scheduler's victims (chosen by count) free no set the pod's
        policy accepts, and nodes where no preemption can are dropped."""
        self._model, self._gpu_settings = model, settings

    def _revise(
        self, args: ExtenderPreemptionArgs, candidates: dict[str, MetaVictims], tenancy: Tenancy | None
    ) -> tuple[dict[str, MetaVictims], dict[str, str]]:
        """The candidates with GPU victims chosen by the model, and the nodes the cross-tenant rule left
        without allowed victims (node -> why)."""
        model = self._model
        if model is None or self._gpu_settings is None or not model.synced:
            return candidates, {}
        pod = pod_info(args.pod, model.resource)
        if pod.gpus <= 0:
            return candidates, {}
        sent = {node: [p.uid for p in mv.pods] for node, mv in candidates.items()}
        views = {node: model.view(node) for node in sent}
        revised = revise_candidates(pod, sent, views, self._gpu_settings(), self.clock(), tenancy=tenancy)
        out: dict[str, MetaVictims] = {}
        for node, uids in revised.victims.items():
            given = candidates[node]
            if list(uids) == sent[node]:
                out[node] = given
            else:
                pods = [MetaPod(uid=u) for u in uids]
                out[node] = MetaVictims(pods=pods, num_pdb_violations=given.num_pdb_violations)
        return out, dict(revised.refused)

    def _victim_gpus(self, candidates: dict[str, MetaVictims]) -> dict[str, int]:
        """Victim UID -> GPUs it holds, from the GPU model (victims it does not know hold none)."""
        model = self._model
        if model is None:
            return {}
        out: dict[str, int] = {}
        for node in candidates:
            view = model.view(node)
            for h in view.holders if view is not None else ():
                if h.uid:
                    out[h.uid] = len(h.ids) + h.unknown
        return out

    def decide(
        self, args: ExtenderPreemptionArgs
    ) -> tuple[PodMeta, ThrottleDecision, dict[str, MetaVictims]]:
        """The decision for one request, without side effects (what `__call__` and the bench run)."""
        now = self.clock()
        preemptor = pod_meta(args.pod)
        floor = self.policy.exempt_min_priority
        exempt = floor is not None and preemptor.priority >= floor
        tenancy = None if exempt else self.tenancy()  # exempt preemptors skip every throttle rule
        candidates, refused = self._revise(args, args.meta_victims(), tenancy)
        lookup = self._lookup(args)
        gate = TenantGate(tenancy, self._victim_gpus(candidates)) if tenancy is not None else None
        decision = decide_preemption(
            preemptor,
            [
                *(Candidate(node, tuple(p.uid for p in mv.pods)) for node, mv in candidates.items()),
                *(Candidate(node, (), refused=why) for node, why in refused.items()),
            ],
            lookup,
            self.graph,
            self.policy,
            now,
            tenants=gate,
        )
        return preemptor, decision, candidates

    async def __call__(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        if not self.ready():
            raise NotSynced
        started = time.perf_counter()
        preemptor, decision, candidates = self.decide(args)
        self.metrics.decision_latency.observe(time.perf_counter() - started)
        dry = self.policy.dry_run
        self.metrics.decisions.labels(decision.outcome, str(dry).lower()).inc()
        for reason in decision.reasons():
            self.metrics.throttled.labels(reason.value).inc()
        if dry:
            kept = {n: v for n, v in args.meta_victims().items() if v.pods}
        else:
            kept = {n: candidates[n] for n in decision.kept}
            if kept and not await self._reserve(preemptor, kept, decision.depth, self._lookup(args)):
                kept = {}
        if decision.throttled:
            log.info(
                f"{'[dry-run] ' if dry else ''}preemption {decision.outcome}",
                extra={"pod": preemptor.key, "workload": preemptor.workload.key, "depth": decision.depth,
                       "reasons": [r.value for r in decision.reasons()], "kept": list(decision.kept),
                       "detail": decision.detail},
            )  # fmt: skip
            self._notify(preemptor, decision, args.pod)
        return ExtenderPreemptionResult(node_name_to_meta_victims=kept)

    async def _reserve(
        self,
        preemptor: PodMeta,
        kept: dict[str, MetaVictims],
        depth: int,
        lookup: Callable[[str], PodMeta | None],
    ) -> bool:
        """Until its signals arrive, count the least the scheduler may now take: in this replica's graph at
        once, and for the fleet as the preemptor's preemption record (record.py), written before the answer.
        False when the record could not be written: the answer is then a veto (the scheduler retries the
        pod), because a preemption other replicas and the next leader cannot count could overspend. Also
        False while GPU preemption is making room for the pod (its unfinished record is not overwritten:
        the next leader finishes it from there)."""
        now = self.clock()
        if making_room(self.pods.get(preemptor.key), now):
            self.metrics.records.labels("gpu-preemption").inc()
            log.info(
                "preemption vetoed: GPU preemption is making room for this pod", extra={"pod": preemptor.key}
            )
            return False
        victims = {
            node: tuple(
                VictimEntry(p.uid, m.key if m else "", m.workload.key if m else "")
                for p in v.pods
                for m in (lookup(p.uid),)
            )
            for node, v in kept.items()
        }
        until = now + self.graph.reservation_ttl
        record = PreemptionRecord(BY_VERB, now, until, depth, victims)
        self.graph.reserve(preemptor.uid, preemptor.workload, record.refs(), now, depth, until=until)
        try:
            await self.kube.patch(
                PODS, preemptor.name, record_patch(record), namespace=preemptor.namespace,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        except KubeError as exc:
            self.graph.unreserve(preemptor.uid, now)
            self.metrics.records.labels("failed").inc()
            log.warning(
                "preemption vetoed: its record could not be written",
                extra={"pod": preemptor.key, "error": str(exc)},
            )
            return False
        self.metrics.records.labels("written").inc()
        return True

    def _notify(self, preemptor: PodMeta, decision: ThrottleDecision, pod: dict[str, Any]) -> None:
        now = self.clock()
        verdict = f"{decision.outcome}:{','.join(r.value for r in decision.reasons())}"
        last = self._last_event.get(preemptor.uid)
        if last is not None and last[0] == verdict and now - last[1] < self._event_interval:
            return
        self._last_event[preemptor.uid] = (verdict, now)
        if len(self._last_event) > 10_000:  # forget the oldest half; a repeat then just writes again
            for uid, _ in sorted(self._last_event.items(), key=lambda kv: kv[1][1])[:5_000]:
                del self._last_event[uid]
        ref = ObjectRef("v1", "Pod", preemptor.name, preemptor.namespace, preemptor.uid or None)
        note = f"{'[dry-run] ' if self.policy.dry_run else ''}{decision.detail}"
        event = PendingEvent(ref, EVENT_REASON, note, "ThrottlePreemption", EventType.WARNING)
        if not self.events.offer(event):
            self._last_event.pop(preemptor.uid, None)  # not written: a repeat may try again

    # --- the observer --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the graph current and write Events (flushing batched series) until cancelled; on the way
        out, queued Events get a short last chance (`EventQueue.run`)."""
        writer = asyncio.create_task(self.events.run(), name="preemption-events")
        tenants = asyncio.create_task(self.tenants.run(), name="preemption-tenants")
        try:
            await self.observer.run()
        finally:
            for task in (writer, tenants):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
