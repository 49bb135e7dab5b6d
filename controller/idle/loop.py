"""The idle-GPU loop: observe (one query) -> `plan_idle` -> act, every `loop_interval_seconds`, while leading.

Why it exists: wiring. It reads the controller's shared live-pod informer (no watch of its own when one is
given) and, when given, its node informer (how each node shares its GPUs, its published MIG devices),
queries Prometheus once per pass, keeps the clock, and remembers in memory what a dry-run pass
reported (nothing was written, so the next pass would report it again). `run_once()` is one pass (tests
call it instead of sleeping); `plan_from()` is the same without acting, for `gpuwarden plan`. Passes are
run by `controller.app.PassScheduler`, gated on leadership and on `ready()`.

What it must not do: write while not leading; import another capability.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry

from controller.idle.act import ActResult, IdleActuator, format_since
from controller.idle.decide import IdlePlan, IdlePolicy, plan_idle, policy_from_config
from controller.idle.metrics import IdleMetrics
from controller.idle.observe import Querier, observe_targets, observe_usage, our_events
from controller.idle.query import GpuUsage
from controller.idle.scale import ScalePlan, due, plan_scale_downs
from controller.idle.snapshot import IdleSnapshot, build_snapshot, recent_actions
from gpuwarden.config.root import Config
from gpuwarden.kube import LIVE_PODS, PODS, EventRecorder, Informer, JsonObject, KubeClient

log = logging.getLogger(__name__)


def _remembered(snapshot: IdleSnapshot, memory: dict[str, str]) -> IdleSnapshot:
    """Pods a dry-run pass reported carry the idle-since it would have written."""
    if not memory:
        return snapshot
    pods = tuple(
        dataclasses.replace(p, idle_since_text=memory[p.uid])
        if p.idle_since_text is None and p.uid in memory
        else p
        for p in snapshot.pods
    )
    return dataclasses.replace(snapshot, pods=pods)


class IdleLoop:
    """One idle loop over an injected Prometheus and Kubernetes client."""

    def __init__(
        self,
        config: Config,
        prom: Querier,
        kube: KubeClient,
        *,
        registry: CollectorRegistry | None = None,
        dry_run: bool | None = None,
        instance: str = "",
        clock: Callable[[], float] = time.time,
        pods: Informer | None = None,
        recorder: EventRecorder | None = None,
        nodes: Informer | None = None,
    ) -> None:
        self.config = config
        self.policy: IdlePolicy = policy_from_config(config.idle, dry_run=dry_run)
        self.prom, self.clock = prom, clock
        self._owned: list[Informer] = []
        if pods is None:
            k = config.kubernetes
            pods = Informer(
                kube, PODS, field_selector=LIVE_PODS, page_size=k.list_page_size,
                watch_timeout=int(k.watch_timeout_seconds),
            )  # fmt: skip
            self._owned.append(pods)
        self.pods = pods
        self.nodes = nodes
        """Nodes (sharing, MIG devices); None: every node is taken as whole GPUs (recorded ids as today)."""
        self.metrics = IdleMetrics(registry, stale_after=3 * config.idle.loop_interval_seconds)
        recorder = recorder or EventRecorder(
            kube, component="idle", instance=instance or socket.gethostname()
        )
        self.actuator = IdleActuator(kube, recorder, self.metrics)
        self.memory: dict[str, str] = {}
        """Pod UID -> the idle-since a dry-run pass reported (never written)."""
        self.evicted_at: list[float] = []
        """When this replica evicted idle pods: with our Events (what every leader reads alike) the hourly
        budget's count - the larger of the two, so a leader change grants no fresh budget and an Event not
        yet listed is still counted."""
        self.scaled_at: list[float] = []
        """When this replica scaled owners down (the hourly budget, as `evicted_at`)."""
        self.kube = kube
        self.last_scale: ScalePlan = ScalePlan()
        self.last_plan: IdlePlan | None = None
        self.last_result: ActResult | None = None

    async def plan(self) -> IdlePlan:
        """Observe and decide at `clock()`; changes nothing."""
        now = self.clock()
        started = time.perf_counter()
        usage = await observe_usage(self.prom, self.config.idle, now)
        self.metrics.loop_duration.labels("observe").observe(time.perf_counter() - started)
        started = time.perf_counter()
        snapshot = build_snapshot(
            self.pods.objects(),
            usage,
            resource=self.config.kubernetes.gpu_resource_name,
            nodes=self.nodes.objects() if self.nodes is not None else None,
        )
        self.evicted_at = [t for t in self.evicted_at if now - t < 3600]
        recent = len(self.evicted_at)
        if self._acts("evict"):  # the fleet's count: what any leader wrote in the last hour
            recent = max(recent, await self._fleet_count("GPUIdlePodEvicted", now, on_pods=True))
        snapshot = dataclasses.replace(snapshot, recent_evictions=recent)
        plan = plan_idle(_remembered(snapshot, self.memory), self.policy, now)
        self.metrics.loop_duration.labels("decide").observe(time.perf_counter() - started)
        self.metrics.observe_plan(plan)
        return plan

    def _acts(self, action: str) -> bool:
        idle = self.config.idle
        return idle.default_action == action or any(r.action == action for r in idle.rules)

    async def _fleet_count(self, reason: str, now: float, *, on_pods: bool) -> int:
        """Actions of the last hour by any leader, from our Events. When they cannot be read the budget
        counts as spent (unknown is not a fresh budget): nothing is evicted or scaled this pass."""
        events = await our_events(self.kube, reason)
        if events is None:
            return max(self.config.idle.max_evictions_per_hour, self.config.idle.max_scale_downs_per_hour)
        return recent_actions(events, now, 3600, on_pods=on_pods)

    async def scale_plan(self, plan: IdlePlan) -> ScalePlan:
        """The pass's scale-downs: owners of the pods due read now (only when a pod is due)."""
        pods = due(plan.judgements, self.config.idle, plan.now)
        if not pods:
            return ScalePlan()
        targets = await observe_targets(self.kube, pods)
        self.scaled_at = [t for t in self.scaled_at if plan.now - t < 3600]
        recent = len(self.scaled_at)
        recent = max(recent, await self._fleet_count("GPUIdleScaledDown", plan.now, on_pods=False))
        budget = max(0, self.config.idle.max_scale_downs_per_hour - recent)
        downs, held = plan_scale_downs(pods, targets, self.config.idle, budget)
        return ScalePlan(tuple(downs), tuple(held))

    async def run_once(self, leading: asyncio.Event | None = None) -> IdlePlan:
        """One pass: plan, then act (act honours dry-run) — only if still `leading`."""
        plan = await self.plan()
        scale = await self.scale_plan(plan)
        if leading is not None and not leading.is_set():
            log.info("lost leadership during the pass; idle plan not applied")
            return plan
        started = time.perf_counter()
        result = await self.actuator.apply(plan)
        await self.actuator.apply_scale(scale, plan.dry_run, result)
        self.metrics.loop_duration.labels("act").observe(time.perf_counter() - started)
        self.evicted_at += [plan.now] * len(result.evicted)
        self.scaled_at += [plan.now] * len(result.scaled)
        self.last_scale = scale
        if plan.dry_run:
            live = {j.pod.uid for j in plan.judgements}
            self.memory = {uid: v for uid, v in self.memory.items() if uid in live}
            self.memory.update({m.pod.uid: format_since(m.since) for m in plan.marks})
            for u in plan.unmarks:
                self.memory.pop(u.pod.uid, None)
        if plan.marks or plan.unmarks or plan.evictions or plan.problems or result.failures or scale.downs:
            log.info(
                "idle pass",
                extra={"counts": plan.counts, "marked": len(result.marked), "unmarked": len(result.unmarked),
                       "evicted": len(result.evicted), "blocked": len(result.blocked),
                       "scaled": len(result.scaled), "scale_held": len(scale.held),
                       "deferred": len(plan.deferred), "failures": result.failures, "dry_run": plan.dry_run,
                       "problems": list(plan.problems)[:10]},
            )  # fmt: skip
        self.last_plan, self.last_result = plan, result
        self.metrics.last_pass.set(plan.now)
        return plan

    # --- scheduling (controller.app.PassScheduler runs the passes) -------------------------------------

    def interval(self) -> float | None:
        """Seconds between passes; None when `idle.enabled` is false."""
        return self.config.idle.loop_interval_seconds if self.config.idle.enabled else None

    def ready(self) -> bool:
        return self.pods.synced.is_set() and (self.nodes is None or self.nodes.synced.is_set())

    async def wait_ready(self) -> None:
        await self.pods.synced.wait()
        if self.nodes is not None:
            await self.nodes.synced.wait()

    def caches(self) -> list[Informer]:
        """The informers this loop created itself (none when the controller's shared one is injected)."""
        return list(self._owned)


async def usage_now(prom: Querier, config: Config, now: float) -> tuple[GpuUsage, ...] | None:
    """`gpuwarden plan`'s one query (the same as a pass's)."""
    return await observe_usage(prom, config.idle, now)


def plan_from(
    config: Config,
    pods: Iterable[JsonObject],
    usage: Iterable[GpuUsage] | None,
    *,
    now: float,
    nodes: Iterable[JsonObject] | None = None,
) -> IdlePlan:
    """The idle plan from listed pods (and nodes) and a usage answer, always dry-run (`gpuwarden plan`)."""
    snapshot = build_snapshot(pods, usage, resource=config.kubernetes.gpu_resource_name, nodes=nodes)
    return plan_idle(snapshot, policy_from_config(config.idle, dry_run=True), now)
