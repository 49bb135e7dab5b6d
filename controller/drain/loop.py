"""The drain loop (leader-gated, beside the quarantine loop): observe the caches, plan, act.

Why it exists: it is the scheduling shell around `plan_drains`; the PassScheduler of the controller runs its
passes only while this replica leads. The fleet-wide eviction rate is counted from the eviction ledgers
the drain keeps on the Nodes (each eviction entered before it is sent; a cancelled drain keeps its ledger
until pruned), so a new leader inherits the last minute's count; this process's own count covers a watch
cache that has not caught up with its writes yet. Released nodes get their drain cancelled before anything
else (cancel.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from controller.drain.act import DrainActuator, DrainMetrics
from controller.drain.cancel import plan_cancel
from controller.drain.handoff import Handoff, inputs
from controller.drain.observe import QUARANTINE_TAINT, DrainSnapshot, build_snapshot, device_scoped
from controller.drain.plan import DrainPlan, DrainVerdict, evictions_in_window, plan_drains
from controller.drain.remediation import decide
from controller.gpus.dra import extended_resource_classes
from controller.gpus.feed import DEVICE_CLASSES
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError, KubeNotFound
from gpuwarden.kube import LIVE_PODS, NODES, PODS, EventRecorder, Informer, JsonObject, KubeClient
from gpuwarden.kube.resources import Resource

log = logging.getLogger(__name__)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True)
"""Read only in the namespaces of pods on a device-scoped quarantine's node (`read_claims`)."""
LOOP_INTERVAL_SECONDS = 5.0


class DrainLoop:
    def __init__(
        self,
        config: Config,
        kube: KubeClient,
        *,
        registry: CollectorRegistry | None = None,
        dry_run: bool | None = None,
        instance: str = "",
        clock: Callable[[], float] = time.time,
        pods: Informer | None = None,
        nodes: Informer | None = None,
        interval_seconds: float = LOOP_INTERVAL_SECONDS,
    ) -> None:
        self.config = config
        self.policy = config.drain
        self.dry_run = self.policy.dry_run if dry_run is None else dry_run
        self.clock = clock
        self.resource = config.kubernetes.gpu_resource_name
        self.kube, self.page_size = kube, config.kubernetes.list_page_size
        self._interval = interval_seconds
        self._owned: list[Informer] = []
        if pods is None:
            pods = Informer(kube, PODS, field_selector=LIVE_PODS)
            self._owned.append(pods)
        if nodes is None:
            nodes = Informer(kube, NODES)
            self._owned.append(nodes)
        self.pods, self.nodes = pods, nodes
        self.metrics = DrainMetrics(registry)
        events = EventRecorder(kube, component="drain", instance=instance or socket.gethostname())
        self.actuator = DrainActuator(
            kube, events, self.metrics, clock, rate_window=self.policy.gate.rate_window_seconds
        )
        self.handoff = Handoff(kube, events)
        self._evicted_at: deque[float] = deque()
        self.last_plan: DrainPlan | None = None

    def snapshot(
        self,
        claims: Mapping[tuple[str, str], JsonObject] | None = None,
        dra_classes: Mapping[str, str] | None = None,
    ) -> DrainSnapshot:
        return build_snapshot(
            self.nodes.objects(), self.pods.objects(), resource=self.resource, claims=claims,
            dra_classes=dra_classes,
        )  # fmt: skip

    async def dra_classes(self) -> dict[str, str] | None:
        """Which extended resources DRA serves (DeviceClasses): DRA-backed GPU nodes count in the gate's
        floor. An API without resource.k8s.io/v1 has none; a failed list is None (not read this pass)."""
        try:
            listed = await self.kube.list_objects(DEVICE_CLASSES, limit=self.page_size)
        except KubeNotFound:
            return {}
        except KubeError as exc:
            log.debug("DeviceClasses not listed", extra={"error": str(exc)})
            return None
        return extended_resource_classes(listed.items)

    async def run_once(self, leading: asyncio.Event | None = None) -> DrainPlan:
        now = self.clock()
        window = self.policy.gate.rate_window_seconds
        while self._evicted_at and now - self._evicted_at[0] > window:
            self._evicted_at.popleft()
        claims = await read_claims(self.kube, self.nodes.objects(), self.pods.objects(), self.page_size)
        snap = self.snapshot(claims, await self.dra_classes())
        plan = plan_drains(
            snap.nodes,
            snap.pods_by_node,
            self.policy,
            now,
            evictions_last_minute=max(
                len(self._evicted_at), evictions_in_window(snap.ledgers(), now, window)
            ),
            gpu_nodes=snap.gpu_nodes,
            schedulable_gpu_nodes=snap.schedulable_gpu_nodes,
        )
        self.last_plan = plan
        self._observe(plan)
        if leading is not None and not leading.is_set():
            return plan
        node_objs = {str(n["metadata"]["name"]): n for n in self.nodes.objects()}
        for name, state in snap.released_states.items():
            step = plan_cancel(name, state, snap.pods_by_node.get(name, ()))
            await self.actuator.cancel(step, node_objs.get(name), self.dry_run)
        if plan.gate_closed:
            self.metrics.gate_closed.inc()
            log.warning("drain gate closed", extra={"why": list(plan.gate_closed)})

        def still_go(node: str) -> bool:
            if leading is not None and not leading.is_set():
                return False
            current = self.nodes.get(node) or {}
            taints = (current.get("spec") or {}).get("taints") or []
            return any(t.get("key") == QUARANTINE_TAINT for t in taints)

        result = await self.actuator.apply(
            plan, snap.states, node_objs, dry_run=self.dry_run, still_go=still_go
        )
        self._evicted_at.extend([now] * result.evictions)
        await self._remediate(snap, node_objs, now)
        if result.evicted or result.blocked:
            log.info(
                "drain pass",
                extra={"evicted": result.evicted, "blocked": result.blocked, "dry_run": self.dry_run},
            )
        return plan

    async def _remediate(self, snap: DrainSnapshot, node_objs: dict[str, Any], now: float) -> None:
        policy = self.policy.remediation
        if not policy.enabled:
            return
        quarantined = {n.name: n for n in snap.nodes}
        for obj in node_objs.values():
            view = inputs(obj, snap, quarantined)
            if view is None:
                continue
            if view.state is not None and not view.state.final and not view.state.owes:
                view = replace(view, condition=await self.handoff.condition(view, policy))
            decision = decide(view, policy, now)
            if decision is not None:
                await self.handoff.apply(decision, obj, dry_run=self.dry_run)

    def _observe(self, plan: DrainPlan) -> None:
        states = {"draining": 0, "held": 0, "done": 0}
        blocked = 0
        for node in plan.nodes:
            key = "held" if node.held else "done" if node.done else "draining"
            states[key] += 1
            blocked += sum(1 for a in node.actions if a.verdict is DrainVerdict.BACKOFF)
        for state, count in states.items():
            self.metrics.nodes.labels(state).set(count)
        self.metrics.blocked_pods.set(blocked)

    # --- scheduling (controller.app.PassScheduler) --------------------------------------------------------
    def interval(self) -> float | None:
        return self._interval if self.policy.enabled else None

    def ready(self) -> bool:
        return self.pods.synced.is_set() and self.nodes.synced.is_set()

    async def wait_ready(self) -> None:
        await self.pods.synced.wait()
        await self.nodes.synced.wait()

    def caches(self) -> list[Informer]:
        return list(self._owned)


async def read_claims(
    kube: KubeClient, nodes: Iterable[JsonObject], pods: Iterable[JsonObject], page_size: int
) -> dict[tuple[str, str], JsonObject] | None:
    """The ResourceClaims of the namespaces whose pods sit on a device-scoped quarantine's node (a DRA-backed
    node: which pods hold the faulty device is in the claims' allocations); None when there is no such node
    or a list failed (the drain there is then node-wide: unknown never narrows it)."""
    scoped = device_scoped(nodes)
    if not scoped:
        return None
    namespaces = sorted(
        {
            str((p.get("metadata") or {}).get("namespace", ""))
            for p in pods
            if (p.get("spec") or {}).get("nodeName") in scoped
        }
    )
    out: dict[tuple[str, str], JsonObject] = {}
    try:
        for ns in namespaces:
            for claim in (await kube.list_objects(RESOURCE_CLAIMS, namespace=ns, limit=page_size)).items:
                out[(ns, str((claim.get("metadata") or {}).get("name", "")))] = claim
    except KubeError as exc:
        log.warning("ResourceClaims not listed; drains on DRA-backed nodes are node-wide this pass",
                    extra={"error": str(exc)})  # fmt: skip
        return None
    return out


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> DrainPlan:
    """`gpuwarden plan` for drains: list nodes and live pods once, decide; changes nothing, no Events."""
    k = config.kubernetes
    async with KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig, context=k.context, request_timeout=k.request_timeout_seconds
    ) as kube:
        pods = await kube.list_objects(PODS, field_selector=LIVE_PODS, limit=k.list_page_size)
        nodes = await kube.list_objects(NODES, limit=k.list_page_size)
        claims = await read_claims(kube, nodes.items, pods.items, k.list_page_size)
    return plan_from(config, nodes.items, pods.items, now=time.time(), claims=claims)


def plan_from(
    config: Config,
    nodes: list[JsonObject],
    pods: list[JsonObject],
    *,
    now: float,
    claims: Mapping[tuple[str, str], JsonObject] | None = None,
) -> DrainPlan:
    """The drain plan from listed nodes and live pods (the rate from the nodes' eviction ledgers)."""
    snap = build_snapshot(nodes, pods, resource=config.kubernetes.gpu_resource_name, claims=claims)
    return plan_drains(
        snap.nodes,
        snap.pods_by_node,
        config.drain,
        now,
        evictions_last_minute=evictions_in_window(snap.ledgers(), now, config.drain.gate.rate_window_seconds),
        gpu_nodes=snap.gpu_nodes,
        schedulable_gpu_nodes=snap.schedulable_gpu_nodes,
    )
