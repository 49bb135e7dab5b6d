"""The GPU preemption loop (leader-gated): observe pending pods and the GPU model, plan (plan.py), act.

Why it exists: the shell around `plan_room`. Per planned preemptor it asks the preemption throttle first
(budgets, chain depth, ping-pong, back-off: the same `decide_preemption` the scheduler's preemptions pass),
then, in this order:
1. reserves the freed GPUs for the preemptor - the extender's claim on the pod, with a deadline
   (`gpuwarden.io/gpu-reserved-until`), conditional on the pod's resourceVersion; every replica's filter
   and bind then keep other pods off those GPUs until the preemptor binds or the deadline passes;
2. evicts the victims through the Eviction API (PodDisruptionBudgets hold: a 429 is *blocked*); when
   nothing could be evicted the reservation is withdrawn;
3. records the preemption in the throttle's graph and writes Events: `Preempted` on each victim in
   kube-scheduler's shape (`Preempted by pod <uid> on node <node>`, so every replica's observer links the
   chain exactly as for the scheduler's preemptions) and `GPUPreempting` on the preemptor naming victims and
   GPUs. A pod for which no room can be made gets a Warning `GPUPreemptionNotPossible` saying why.

Dry-run computes, counts and events ("[dry-run]") but neither reserves nor evicts. Restart-safe: the
reservation is on the pod (a reserved pod is never planned again before its deadline) and evicted victims
are gone from the API. PodDisruptionBudgets are listed each pass; when they cannot be read nothing is done
(unknown is never "no budget").
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.gpus.claims import claim_patch, release_patch
from controller.gpus.feed import GpuModel, model_from_lists
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.gpus.objects import PodInfo, pod_info
from controller.gpus.tenants import Tenancy, taken_by
from controller.gpus.victims import TENANT_MARKER, VictimPlan, as_victim
from controller.makeroom.plan import (
    NodeFacts,
    Pending,
    RoomDecision,
    budgets_from,
    candidate,
    node_facts,
    plan_room,
)
from controller.preemption.hook import PreemptionThrottle
from controller.preemption.signals import pod_meta
from controller.preemption.tenancy import tenancy_from_lists
from controller.preemption.throttle import Candidate, Reason, TenantGate, decide_preemption
from gpuwarden.config.preemption import MakeRoomConfig
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube import (
    LIVE_PODS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    RESOURCE_QUOTAS,
    EventRecorder,
    EventType,
    Informer,
    KubeClient,
    ObjectRef,
    PatchType,
)
from gpuwarden.kube.eviction import evict

log = logging.getLogger(__name__)

NOT_POSSIBLE_INTERVAL = 300.0
"""At most one `GPUPreemptionNotPossible` per pod and reason per this many seconds."""


class RoomMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        self.preemptions = Counter(
            "gpuwarden_gpu_preemptions_total",
            "GPU preemptions by the controller per preemptor: started, throttled, blocked (every eviction "
            "refused), failed, dry_run, conflict (the pod changed), not_possible.",
            ["outcome"],
            **kw,
        )
        self.victims = Counter(
            "gpuwarden_gpu_preemption_victims_total",
            "Victims of GPU preemption: evicted, blocked (429: a PodDisruptionBudget), failed, dry_run.",
            ["outcome"],
            **kw,
        )
        self.candidates = Gauge(
            "gpuwarden_gpu_preemption_candidates",
            "Pending pods rejected for fragmentation at the last pass.",
            **kw,
        )
        self.duration = Histogram(
            "gpuwarden_gpu_preemption_plan_seconds",
            "Time to plan one pass (observe + decide, no writes).",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0),
            **kw,
        )


@dataclass
class RoomPass:
    """One pass: the decisions and what was done (for logs, `gpuwarden plan` and the tests)."""

    decisions: list[RoomDecision] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """pod key -> why it is not a preemptor (only pods with GPUs that are pending)."""
    started: list[str] = field(default_factory=list)
    throttled: dict[str, str] = field(default_factory=dict)
    evicted: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    tenancy: Tenancy | None = None
    """The cross-tenant rule's snapshot the pass decided with (None: rule `any`)."""
    taken: dict[str, int] = field(default_factory=dict)
    """GPUs per tenant taken by the preemptions started this pass (the throttle's gate counts them)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "preemptions": [
                {
                    "pod": d.pod.key,
                    "priority": d.pod.priority,
                    "node": d.plan.node if d.plan else None,
                    "victims": [v.pod for v in d.plan.victims] if d.plan else [],
                    "gpus": list(d.plan.choice.ids) if d.plan else [],
                    "reason": d.reason,
                    "throttled": self.throttled.get(d.pod.key, ""),
                }
                for d in self.decisions
            ],
            "skipped": dict(self.skipped),
            "tenants": tenants_table(self.tenancy),
        }


def tenants_table(tenancy: Tenancy | None) -> list[dict[str, Any]]:
    """Per tenant holding GPUs or with a share: guaranteed GPUs, GPUs held, and how many of them other
    tenants may preempt now (empty with the rule `any`)."""
    if tenancy is None:
        return []
    return [
        {
            "tenant": t,
            "rule": tenancy.rule.value,
            "guaranteed": tenancy.share.get(t, 0),
            "held": tenancy.held.get(t, 0),
            "preemptable": tenancy.preemptable(t),
            "namespaces": sorted(ns for ns, owner in tenancy.namespaces.items() if owner == t),
        }
        for t in tenancy.tenants()
        if tenancy.share.get(t, 0) or tenancy.held.get(t, 0)
    ]


class RoomLoop:
    """Passes run by `controller.app.PassScheduler` while this replica leads."""

    def __init__(
        self,
        config: Config,
        kube: KubeClient,
        *,
        throttle: PreemptionThrottle,
        model: ClusterModel,
        settings: Callable[[], Settings],
        nodes: Informer,
        registry: CollectorRegistry | None = None,
        dry_run: bool | None = None,
        instance: str = "",
        clock: Callable[[], float] = time.time,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.policy = config.preemption.make_room
        self.dry_run = (self.policy.dry_run or bool(dry_run)) if dry_run is not None else self.policy.dry_run
        self.page_size = config.kubernetes.list_page_size
        self.kube, self.throttle, self.model, self.settings = kube, throttle, model, settings
        self.nodes, self.pods = nodes, throttle.pods
        self.clock = clock
        self.metrics = RoomMetrics(registry)
        self.recorder = recorder or EventRecorder(
            kube, component="preemption", instance=instance or socket.gethostname()
        )
        self._said: dict[tuple[str, str], float] = {}
        self.last: RoomPass | None = None

    # --- observe + decide ----------------------------------------------------------------------------------
    def plan(self, pdbs: list[dict[str, Any]]) -> tuple[RoomPass, dict[str, dict[str, Any]]]:
        """Decide from the caches and these PodDisruptionBudgets; no writes."""
        started = time.perf_counter()
        result, objs = plan_pass(
            self.pods.objects(),
            self.nodes.objects(),
            self.model,
            pdbs,
            self.settings(),
            self.policy,
            self.clock(),
            tenancy=self.throttle.tenancy(),
        )
        self.metrics.candidates.set(len(result.decisions))
        self.metrics.duration.observe(time.perf_counter() - started)
        return result, objs

    # --- act -----------------------------------------------------------------------------------------------
    async def run_once(self, leading: asyncio.Event | None = None) -> RoomPass:
        try:
            pdbs = (await self.kube.list_objects(PDBS, limit=self.page_size)).items
        except KubeError as exc:
            log.warning(
                "GPU preemption pass skipped: PodDisruptionBudgets unreadable", extra={"error": str(exc)}
            )
            return RoomPass()
        result, objs = self.plan(pdbs)
        self.last = result
        for decision in result.decisions:
            if leading is not None and not leading.is_set():
                break
            obj = objs.get(decision.pod.key)
            if obj is None:
                continue
            if decision.plan is None:
                await self._not_possible(obj, decision)
                continue
            await self._preempt(obj, decision.plan, result)
        return result

    async def _not_possible(self, obj: dict[str, Any], decision: RoomDecision) -> None:
        if decision.reason.startswith(("fits on", "limit of", "every node")):
            return
        tenants = TENANT_MARKER in decision.reason
        if tenants:  # victims exist but the cross-tenant rule refuses them: the throttle's verdict
            self.metrics.preemptions.labels("throttled").inc()
            self.throttle.metrics.throttled.labels(Reason.TENANT.value).inc()
        else:
            self.metrics.preemptions.labels("not_possible").inc()
        now = self.clock()
        key = (decision.pod.uid, decision.reason)
        if now - self._said.get(key, float("-inf")) < NOT_POSSIBLE_INTERVAL:
            return
        self._said[key] = now
        if len(self._said) > 10_000:
            self._said.clear()
        if tenants:
            await self.recorder.emit(
                _ref(obj), reason="PreemptionThrottled", action="MakeRoom", type=EventType.WARNING,
                note=f"{self._prefix()}GPU preemption refused: {decision.reason}",
            )  # fmt: skip
            return
        await self.recorder.emit(
            _ref(obj), reason="GPUPreemptionNotPossible", action="MakeRoom", type=EventType.WARNING,
            note=f"{self._prefix()}gpuwarden cannot make room for this pod: {decision.reason}",
        )  # fmt: skip

    def _prefix(self) -> str:
        return "[dry-run] " if self.dry_run else ""

    async def _preempt(self, obj: dict[str, Any], plan: VictimPlan, result: RoomPass) -> None:
        pod = pod_info(obj, self.model.resource)
        meta = pod_meta(obj)
        now = self.clock()
        uids = tuple(v.uid for v in plan.victims)
        tenancy = result.tenancy
        gate = None
        if tenancy is not None:
            held = {v.uid: as_victim(v).gpus for v in plan.victims}
            gate = TenantGate(tenancy, held, dict(result.taken))
        verdict = decide_preemption(
            meta, [Candidate(plan.node, uids)], self.throttle.observer.lookup, self.throttle.graph,
            self.throttle.policy, now, tenants=gate,
        )  # fmt: skip
        gpus = ",".join(plan.choice.ids)
        numa = ",".join(str(n) for n in plan.choice.numa_nodes) or "?"
        if plan.node not in verdict.kept:
            self.metrics.preemptions.labels("throttled").inc()
            for reason in verdict.reasons():
                self.throttle.metrics.throttled.labels(reason.value).inc()
            result.throttled[pod.key] = verdict.detail or "throttled"
            await self.recorder.emit(
                _ref(obj), reason="PreemptionThrottled", action="MakeRoom", type=EventType.WARNING,
                note=f"{self._prefix()}GPU preemption on {plan.node} refused: {verdict.detail}",
            )  # fmt: skip
            return
        policy = pod.policy or "default"
        what = f"GPUs {gpus} (NUMA {numa}) on {plan.node} for this pod (policy {policy})"
        if self.dry_run:
            self.metrics.preemptions.labels("dry_run").inc()
            self.metrics.victims.labels("dry_run").inc(len(plan.victims))
            await self.recorder.emit(
                _ref(obj), reason="GPUPreempting", action="MakeRoom",
                note=f"[dry-run] would evict {plan.describe()} to free {what}",
            )  # fmt: skip
            return
        until = now + self.policy.reservation_seconds
        if not await self._reserve(pod, plan, now, until):
            return
        evicted = await self._evict_victims(obj, pod, plan, result)
        if not evicted:
            await self._withdraw(obj, pod, plan)
            return
        self.throttle.graph.reserve(meta.uid, meta.workload, {plan.node: tuple(evicted)}, now, verdict.depth)
        if tenancy is not None:
            gone = {uid for uid, _ in evicted}
            victims = [as_victim(v) for v in plan.victims if v.uid in gone]
            for tenant, n in taken_by(victims, tenancy).items():
                result.taken[tenant] = result.taken.get(tenant, 0) + n
        self.metrics.preemptions.labels("started").inc()
        result.started.append(pod.key)
        log.info(
            "GPU preemption started",
            extra={"pod": pod.key, "node": plan.node, "gpus": gpus, "victims": [v.pod for v in plan.victims]},
        )
        await self.recorder.emit(
            _ref(obj), reason="GPUPreempting", action="MakeRoom",
            note=f"evicting {plan.describe()} to free {what}; "
            f"reserved until {time.strftime('%H:%M:%SZ', time.gmtime(until))}",
        )  # fmt: skip

    async def _reserve(self, pod: PodInfo, plan: VictimPlan, now: float, until: float) -> bool:
        """Claim the freed GPUs for the preemptor before any eviction (guarded by its resourceVersion)."""
        ns, name = pod.key.split("/", 1)
        try:
            await self.kube.patch(
                PODS, name, claim_patch(plan.node, plan.choice, now, pod.resource_version, until),
                namespace=ns, patch_type=PatchType.MERGE,
            )  # fmt: skip
        except (KubeConflict, KubeNotFound):
            self.metrics.preemptions.labels("conflict").inc()
            return False  # the pod changed (bound, deleted, updated): next pass decides afresh
        except KubeError as exc:
            self.metrics.preemptions.labels("failed").inc()
            log.warning("GPU reservation failed", extra={"pod": pod.key, "error": str(exc)})
            return False
        return True

    async def _evict_victims(
        self, obj: dict[str, Any], pod: PodInfo, plan: VictimPlan, result: RoomPass
    ) -> list[tuple[str, str]]:
        """Evict each victim through the Eviction API (PDBs hold); (uid, workload) of those gone."""
        evicted: list[tuple[str, str]] = []
        for victim in plan.victims:
            vns, vname = victim.pod.split("/", 1)
            try:
                await evict(self.kube, vns, vname, victim.uid)
            except KubeNotFound:
                evicted.append((victim.uid, ""))  # already gone: its GPUs are free
                continue
            except KubeError as exc:
                outcome = "blocked" if exc.status == 429 else "failed"
                self.metrics.victims.labels(outcome).inc()
                result.blocked.append(victim.pod)
                log.info(
                    "GPU preemption eviction refused", extra={"victim": victim.pod, "status": exc.status}
                )
                continue
            self.metrics.victims.labels("evicted").inc()
            result.evicted.append(victim.pod)
            victim_obj = self.pods.get(victim.pod) or {}
            lookup = self.throttle.observer.lookup(victim.uid)
            evicted.append((victim.uid, lookup.workload.key if lookup else ""))
            await self.recorder.emit(
                _ref(victim_obj) if victim_obj else ObjectRef("v1", "Pod", vname, vns, victim.uid),
                reason="Preempted", action="Preempting", related=_ref(obj),
                note=f"Preempted by pod {pod.uid} on node {plan.node}: gpuwarden frees GPUs "
                f"{','.join(victim.ids) or '?'} for {pod.key} (priority {pod.priority}), fragmented node",
            )  # fmt: skip
        return evicted

    async def _withdraw(self, obj: dict[str, Any], pod: PodInfo, plan: VictimPlan) -> None:
        """No victim could be evicted: give the reserved GPUs back and say why."""
        self.metrics.preemptions.labels("blocked").inc()
        ns, name = pod.key.split("/", 1)
        try:
            await self.kube.patch(PODS, name, release_patch(), namespace=ns, patch_type=PatchType.MERGE)
        except KubeError as exc:
            log.warning("GPU reservation not withdrawn", extra={"pod": pod.key, "error": str(exc)})
        await self.recorder.emit(
            _ref(obj), reason="GPUPreemptionBlocked", action="MakeRoom", type=EventType.WARNING,
            note=f"no victim could be evicted on {plan.node} (PodDisruptionBudget or error): "
            f"{plan.describe()}",
        )  # fmt: skip

    # --- scheduling (controller.app.PassScheduler) --------------------------------------------------------
    def interval(self) -> float | None:
        return self.policy.interval_seconds if self.policy.enabled else None

    def ready(self) -> bool:
        caches = self.pods.synced.is_set() and self.nodes.synced.is_set() and self.throttle.tenants.synced
        return caches and self.model.synced

    async def wait_ready(self) -> None:
        await self.pods.synced.wait()
        await self.nodes.synced.wait()
        await self.throttle.tenants.wait_synced()
        while not self.model.synced:  # noqa: ASYNC110 - the extender's feed sets plain flags, no Event
            await asyncio.sleep(0.2)

    def caches(self) -> list[Informer]:
        return []


def plan_pass(
    pods: Iterable[dict[str, Any]],
    nodes: Iterable[dict[str, Any]],
    model: ClusterModel,
    pdbs: list[dict[str, Any]],
    settings: Settings,
    policy: MakeRoomConfig,
    now: float,
    *,
    tenancy: Tenancy | None = None,
) -> tuple[RoomPass, dict[str, dict[str, Any]]]:
    """Pending pods -> preemptors (`room.candidate`), then `plan_room` over every node's view (victims the
    cross-tenant rule of `tenancy` allows)."""
    resource, ttl = model.resource, settings.claim_ttl_seconds
    objs = {f"{(o.get('metadata') or {}).get('namespace')}/{(o.get('metadata') or {}).get('name')}": o
            for o in pods}  # fmt: skip
    out = RoomPass()
    pending: list[Pending] = []
    for key, obj in objs.items():
        if (obj.get("spec") or {}).get("nodeName"):
            continue  # bound: never a preemptor (skipped before parsing: most pods of a fleet are bound)
        pod = pod_info(obj, resource)
        if pod.gpus <= 0 or pod.node_name or pod.terminated:
            continue
        got = candidate(obj, pod, now, policy.min_pending_seconds, ttl, policy.namespaces, resource)
        if isinstance(got, str):
            out.skipped[key] = got
        else:
            pending.append(got)
    if pending:
        facts: dict[str, NodeFacts] = {}
        views = {}
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name", ""))
            facts[name] = node_facts(node)
            views[name] = model.view(name)
        out.decisions = plan_room(
            pending, views, facts, settings, now, budgets=budgets_from(pdbs, objs.values()),
            max_victims=policy.max_victims_per_pod, limit=policy.max_preemptors_per_pass, tenancy=tenancy,
        )  # fmt: skip
    out.tenancy = tenancy
    return out, objs


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> RoomPass:
    """`gpuwarden plan` for GPU preemption: one LIST of nodes, pods and PodDisruptionBudgets, decide;
    changes nothing, no Events (the throttle's history is not read: a planned preemption may still be
    throttled). Topology from the node annotation (NodeResourceTopology objects are not listed here)."""
    k = config.kubernetes
    async with KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig, context=k.context, request_timeout=k.request_timeout_seconds
    ) as kube:
        nodes = (await kube.list_objects(NODES, limit=k.list_page_size)).items
        pods = (await kube.list_objects(PODS, field_selector=LIVE_PODS, limit=k.list_page_size)).items
        pdbs = (await kube.list_objects(PDBS, limit=k.list_page_size)).items
        namespaces, quotas = await list_tenancy(config, kube)
    return plan_from(config, nodes, pods, pdbs, now=time.time(), namespaces=namespaces, quotas=quotas)


async def list_tenancy(config: Config, kube: KubeClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Namespaces and ResourceQuotas for the cross-tenant rule (none listed with the rule `any`)."""
    if config.preemption.tenants.rule == "any":
        return [], []
    page = config.kubernetes.list_page_size
    namespaces = (await kube.list_objects(NAMESPACES, limit=page)).items
    quotas = (await kube.list_objects(RESOURCE_QUOTAS, limit=page)).items
    return namespaces, quotas


def plan_from(
    config: Config,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    pdbs: list[dict[str, Any]],
    *,
    gpus: GpuModel | None = None,
    now: float,
    namespaces: list[dict[str, Any]] | None = None,
    quotas: list[dict[str, Any]] | None = None,
) -> RoomPass:
    """The GPU preemption plan from listed nodes, live pods and PodDisruptionBudgets (`gpus`: the model
    built from the same lists, else built here)."""
    gpus = gpus if gpus is not None else model_from_lists(config, nodes, pods)
    policy = config.preemption.make_room
    tenancy = tenancy_from_lists(config, namespaces or [], quotas or [], gpus.model)
    return plan_pass(pods, nodes, gpus.model, pdbs, gpus.settings(), policy, now, tenancy=tenancy)[0]


def _ref(obj: dict[str, Any]) -> ObjectRef:
    meta = obj.get("metadata") or {}
    return ObjectRef("v1", "Pod", str(meta.get("name", "")), str(meta.get("namespace", "")), meta.get("uid"))
