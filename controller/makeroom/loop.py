"""The GPU preemption loop (leader-gated): observe pending pods and the GPU model, plan (plan.py), act.

Why it exists: the shell around `plan_room`. Per planned preemptor it asks the preemption throttle first
(budgets, chain depth, ping-pong, back-off: the same `decide_preemption` the scheduler's preemptions pass),
then, in this order (each write one step; a leader killed between any two leaves a record the next pass
finishes, complete.py):
1. reserves the freed GPUs for the preemptor - the extender's claim on the pod, with a deadline
   (`gpuwarden.io/gpu-reserved-until`), conditional on the pod's resourceVersion - and, in the same patch,
   writes its preemption record (`gpuwarden.io/preemption`, state `evicting`, the victims named): every
   replica's filter and bind keep other pods off those GPUs until the preemptor binds or the deadline
   passes, and every replica's throttle counts the victims from now on, whoever leads next;
2. per victim: evicts it through the Eviction API (PodDisruptionBudgets hold: a 429 is *blocked*), then
   writes `Preempted` on it in kube-scheduler's shape (`Preempted by pod <uid> on node <node>`, so every
   replica's observer links the chain exactly as for the scheduler's preemptions), named after preemptor
   and victim so it is written once across leaders;
3. `GPUPreempting` on the preemptor naming victims and GPUs (named after the record), then the record
   marked `done` with the victims actually evicted. When nothing could be evicted, claim and record are
   withdrawn instead. A pod for which no room can be made gets a Warning `GPUPreemptionNotPossible`.

Every pass first finishes the records left in `evicting` (`complete`): victims still live are evicted while
the preemptor waits within its deadline, owed Events are written (409 = already there), the record is
marked done. Dry-run computes, counts and events ("[dry-run]") but neither reserves nor evicts. A reserved
pod is never planned again before its deadline. PodDisruptionBudgets are listed each pass; when they cannot
be read nothing is done (unknown is never "no budget").
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
from controller.makeroom.complete import Completion, plan_completion, victim_state, waiting
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
from controller.preemption.record import (
    BY_MAKE_ROOM,
    DONE,
    EVICTING,
    PreemptionRecord,
    VictimEntry,
    preempted_event_name,
    preempting_event_name,
    record_of,
    record_patch,
)
from controller.preemption.signals import PodMeta, pod_meta
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
        await self.complete(leading)
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
        entries = []
        for v in plan.victims:
            known = self.throttle.observer.lookup(v.uid)
            entries.append(VictimEntry(v.uid, v.pod, known.workload.key if known else ""))
        record = PreemptionRecord(
            BY_MAKE_ROOM, now, until, verdict.depth, {plan.node: tuple(entries)}, EVICTING
        )
        # counted here at once, and by every replica and the next leader from the record written next
        self.throttle.graph.reserve(meta.uid, meta.workload, record.refs(), now, verdict.depth, until=until)
        if not await self._reserve(pod, plan, record, now):
            self.throttle.graph.unreserve(meta.uid, now)
            return
        ids = {v.uid: ",".join(v.ids) for v in plan.victims}
        stamp = time.strftime("%H:%M:%SZ", time.gmtime(until))
        note = f"{plan.describe()} to free {what}; reserved until {stamp}"
        evicted = await self._carry_out(obj, record, entries, (), result, ids=ids, note=note)
        if not evicted:
            return
        if tenancy is not None:
            gone = {v.uid for v in evicted}
            victims = [as_victim(v) for v in plan.victims if v.uid in gone]
            for tenant, n in taken_by(victims, tenancy).items():
                result.taken[tenant] = result.taken.get(tenant, 0) + n
        self.metrics.preemptions.labels("started").inc()
        result.started.append(pod.key)
        log.info(
            "GPU preemption started",
            extra={"pod": pod.key, "node": plan.node, "gpus": gpus, "victims": [v.pod for v in plan.victims]},
        )

    async def _reserve(self, pod: PodInfo, plan: VictimPlan, record: PreemptionRecord, now: float) -> bool:
        """Claim the freed GPUs for the preemptor and write its preemption record, in one patch before any
        eviction (guarded by its resourceVersion)."""
        ns, name = pod.key.split("/", 1)
        patch = claim_patch(plan.node, plan.choice, now, pod.resource_version, record.until)
        patch["metadata"]["annotations"].update(record_patch(record)["metadata"]["annotations"])
        try:
            await self.kube.patch(PODS, name, patch, namespace=ns, patch_type=PatchType.MERGE)
        except (KubeConflict, KubeNotFound):
            self.metrics.preemptions.labels("conflict").inc()
            return False  # the pod changed (bound, deleted, updated): next pass decides afresh
        except KubeError as exc:
            self.metrics.preemptions.labels("failed").inc()
            log.warning("GPU reservation failed", extra={"pod": pod.key, "error": str(exc)})
            return False
        return True

    async def _carry_out(
        self,
        obj: dict[str, Any],
        record: PreemptionRecord,
        evict: Iterable[VictimEntry],
        evicted: Iterable[VictimEntry],
        result: RoomPass,
        *,
        ids: dict[str, str] | None = None,
        note: str = "",
    ) -> list[VictimEntry]:
        """The writes after the record, shared by a new preemption and the completion of a half-done one:
        evict each of `evict` (its `Preempted` Event right after), write the Events `evicted` (gone before
        this pass) are owed, then `GPUPreempting`, then the record `done` - or, when no victim is evicted,
        withdraw claim and record. Returns the victims evicted (the earlier ones included). The record is
        marked done only once every Event was written: a pass that could not write one leaves it owed."""
        preemptor = pod_meta(obj)
        node = next(iter(record.victims), "")
        written = True
        gone: list[VictimEntry] = []
        for victim in evicted:
            gone.append(victim)
            written &= await self._preempted_event(
                obj, preemptor, node, victim, (ids or {}).get(victim.uid, "")
            )
        for victim in evict:
            if not await self._evict(victim, result):
                continue
            gone.append(victim)
            written &= await self._preempted_event(
                obj, preemptor, node, victim, (ids or {}).get(victim.uid, "")
            )
        if not gone:
            await self._withdraw(obj, record, release=waiting(obj))
            return gone
        written &= await self.recorder.emit_once(
            _ref(obj), name=preempting_event_name(preemptor.name, preemptor.uid, record.at),
            reason="GPUPreempting", action="MakeRoom",
            note=f"evicting {note or ', '.join(v.pod for v in gone)}",
        )  # fmt: skip
        done = record.with_(state=DONE, victims={node: tuple(gone)})
        self.throttle.graph.reserve(
            preemptor.uid, preemptor.workload, done.refs(), record.at, record.depth, until=record.until
        )
        if written:
            await self._patch_record(obj, done)
        return gone

    async def _evict(self, victim: VictimEntry, result: RoomPass) -> bool:
        """Evict one victim through the Eviction API (PodDisruptionBudgets hold); True when it is gone."""
        vns, vname = victim.pod.split("/", 1)
        try:
            await evict(self.kube, vns, vname, victim.uid)
        except KubeNotFound:
            return True  # already gone: its GPUs are free
        except KubeError as exc:
            outcome = "blocked" if exc.status == 429 else "failed"
            self.metrics.victims.labels(outcome).inc()
            result.blocked.append(victim.pod)
            log.info("GPU preemption eviction refused", extra={"victim": victim.pod, "status": exc.status})
            return False
        self.metrics.victims.labels("evicted").inc()
        result.evicted.append(victim.pod)
        return True

    async def _preempted_event(
        self, obj: dict[str, Any], preemptor: PodMeta, node: str, victim: VictimEntry, gpus: str
    ) -> bool:
        """`Preempted` on the victim in kube-scheduler's shape, named after preemptor and victim (once)."""
        vns, vname = victim.pod.split("/", 1)
        victim_obj = self.pods.get(victim.pod)
        same = victim_obj is not None and (victim_obj.get("metadata") or {}).get("uid") == victim.uid
        regarding = (
            _ref(victim_obj) if same and victim_obj else ObjectRef("v1", "Pod", vname, vns, victim.uid)
        )
        return await self.recorder.emit_once(
            regarding, name=preempted_event_name(vname, victim.uid, preemptor.uid),
            reason="Preempted", action="Preempting", related=_ref(obj),
            note=f"Preempted by pod {preemptor.uid} on node {node}: gpuwarden frees GPUs "
            f"{gpus or '?'} for {preemptor.key} (priority {preemptor.priority}), fragmented node",
        )  # fmt: skip

    async def _patch_record(
        self, obj: dict[str, Any], record: PreemptionRecord | None, *, release: bool = False
    ) -> bool:
        meta = obj.get("metadata") or {}
        patch = release_patch() if release else {"metadata": {"annotations": {}}}
        patch["metadata"]["annotations"].update(record_patch(record)["metadata"]["annotations"])
        try:
            await self.kube.patch(
                PODS, str(meta.get("name", "")), patch, namespace=str(meta.get("namespace", "")),
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        except KubeNotFound:
            return True  # the preemptor is gone, and its record with it
        except KubeError as exc:
            log.warning("GPU preemption record not written", extra={"pod": _key(obj), "error": str(exc)})
            return False
        return True

    async def _withdraw(self, obj: dict[str, Any], record: PreemptionRecord, *, release: bool) -> None:
        """No victim could be evicted: give the reserved GPUs back (when still unbound), drop the record
        and say why."""
        self.metrics.preemptions.labels("blocked").inc()
        preemptor = pod_meta(obj)
        self.throttle.graph.unreserve(preemptor.uid, record.at)
        await self._patch_record(obj, None, release=release)
        node, victims = next(iter(record.victims.items()), ("", ()))
        await self.recorder.emit(
            _ref(obj), reason="GPUPreemptionBlocked", action="MakeRoom", type=EventType.WARNING,
            note=f"no victim could be evicted on {node} (PodDisruptionBudget or error): "
            f"{', '.join(v.pod for v in victims)}",
        )  # fmt: skip

    async def complete(self, leading: asyncio.Event | None = None) -> list[Completion]:
        """Finish every GPU preemption an earlier pass (or leader) left half done (complete.py)."""
        now = self.clock()
        out: list[Completion] = []
        for obj in self.pods.objects():
            record = record_of(obj)
            if record is None or record.by != BY_MAKE_ROOM or record.state != EVICTING:
                continue
            if leading is not None and not leading.is_set():
                break
            states = {
                v.uid: victim_state(self.pods.get(v.pod), v.uid) for vs in record.victims.values() for v in vs
            }
            plan = plan_completion(obj, record, states, now)
            out.append(plan)
            log.info(
                "GPU preemption completed", extra={"pod": _key(obj), "node": plan.node, "why": plan.reason}
            )
            if plan.withdraw:  # nothing evicted and nothing to evict: give back what is held, nothing owed
                self.throttle.graph.unreserve(pod_meta(obj).uid, record.at)
                await self._patch_record(obj, None, release=plan.release)
                continue
            await self._carry_out(obj, record, plan.evict, plan.evicted, RoomPass())
        return out

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


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
