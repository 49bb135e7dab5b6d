"""The nomination cleanup loop: snapshot -> `plan_nominations` -> act, every `loop_interval_seconds`, while
leading.

Why it exists: wiring. It owns (or borrows) the pod and node informer caches, the clock, the in-memory
stand-in for records it could not write, leader gating and self-metrics; everything interesting happens in
`snapshot`, `decide` and `act`. `NominationLoop.run_once()` is one pass (tests call it instead of sleeping);
`plan()` is the same without acting (what `gpuwarden plan` prints); `plan_once()` lists once for the CLI.
Periodic passes are run by `controller.app.PassScheduler` (the controller process, or
`controller.app.run_loops` for loops on their own), gated on leadership and on `ready()`.

Sharing: pass `pods=throttle.pods` (the preemption throttle's live-pod informer, which it runs) and the
extender's `model` and `settings` so one watch of every pod serves all three, and "can never fit" is the
extender's own verdict. Without a model, the never-fits rule is simply not applied (unknown, not stale).

What it must not do: write while not leading. It never imports `adapter`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.nominations.act import ActResult, NominationActuator
from controller.nominations.decide import plan_nominations
from controller.nominations.metrics import NominationMetrics
from controller.nominations.plan import NominationPlan, NominationPolicy, policy_from_config
from controller.nominations.snapshot import NominationRecord, NominationSnapshot, build_snapshot
from gpuwarden.config.root import Config
from gpuwarden.kube import LIVE_PODS, NODES, PODS, EventRecorder, Informer, JsonObject, KubeClient

log = logging.getLogger(__name__)


class NominationLoop:
    """One nomination loop over an injected client; `leading` gates every pass that may write."""

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
        model: ClusterModel | None = None,
        settings: Callable[[], Settings] | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.config = config
        self.policy: NominationPolicy = policy_from_config(config.nominations, dry_run=dry_run)
        self.clock = clock
        self.resource = config.kubernetes.gpu_resource_name
        page, timeout = config.kubernetes.list_page_size, int(config.kubernetes.watch_timeout_seconds)
        self._owned: list[Informer] = []
        if pods is None:
            pods = Informer(kube, PODS, field_selector=LIVE_PODS, page_size=page, watch_timeout=timeout)
            self._owned.append(pods)
        if nodes is None:
            nodes = Informer(kube, NODES, page_size=page, watch_timeout=timeout)
            self._owned.append(nodes)
        self.pods, self.nodes = pods, nodes
        self.model, self.settings = model, settings
        self.metrics = NominationMetrics(registry)
        recorder = recorder or EventRecorder(
            kube, component="nominations", instance=instance or socket.gethostname()
        )
        self.actuator = NominationActuator(kube, recorder, self.metrics)
        self.memory: dict[str, NominationRecord] = {}
        self.last_plan: NominationPlan | None = None
        self.last_result: ActResult | None = None

    def snapshot(self) -> NominationSnapshot:
        """The current picture from the caches (and the extender's model when it is synced)."""
        use_model = self.model is not None and self.model.synced and self.settings is not None
        return build_snapshot(
            self.pods.objects(),
            self.nodes.objects(),
            resource=self.resource,
            view_of=self.model.view if use_model and self.model is not None else None,
            fit_settings=self.settings() if use_model and self.settings is not None else None,
            remembered=self.memory,
        )

    def plan(self) -> NominationPlan:
        """Snapshot and decide at `clock()`; changes nothing."""
        started = time.perf_counter()
        snapshot = self.snapshot()
        plan = plan_nominations(snapshot, self.policy, self.clock())
        self.metrics.loop_duration.labels("decide").observe(time.perf_counter() - started)
        self.metrics.observe_plan(plan)
        return plan

    async def run_once(self, leading: asyncio.Event | None = None) -> NominationPlan:
        """One pass: plan, then act (act honours dry-run) — only if still `leading`."""
        plan = self.plan()
        if leading is not None and not leading.is_set():
            log.info("lost leadership during the pass; nomination plan not applied")
            return plan
        started = time.perf_counter()
        result = await self.actuator.apply(plan)
        self.metrics.loop_duration.labels("act").observe(time.perf_counter() - started)
        live = {h.pod.uid for h in plan.holds} | {c.pod.uid for c in plan.clears}
        self.memory = {uid: r for uid, r in {**self.memory, **result.unrecorded}.items() if uid in live}
        if plan.clears or plan.evictions or result.failures:
            log.info(
                "nomination pass",
                extra={"counts": plan.counts, "cleared": len(result.cleared), "evicted": len(result.evicted),
                       "guarded": len(result.guarded), "failures": result.failures, "dry_run": plan.dry_run},
            )  # fmt: skip
        self.last_plan, self.last_result = plan, result
        self.metrics.last_pass.set(plan.now)
        return plan

    # --- scheduling (controller.app.PassScheduler runs the passes; see `run_loops`) --------------------

    def interval(self) -> float | None:
        """Seconds between passes; None when `nominations.enabled` is false."""
        return self.config.nominations.loop_interval_seconds if self.config.nominations.enabled else None

    def ready(self) -> bool:
        """A pass needs both caches listed once."""
        return self.pods.synced.is_set() and self.nodes.synced.is_set()

    async def wait_ready(self) -> None:
        await self.pods.synced.wait()
        await self.nodes.synced.wait()

    def caches(self) -> list[Informer]:
        """The informers this loop created itself and whoever runs it must run (none when injected)."""
        return list(self._owned)


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> NominationPlan:
    """`gpuwarden plan` for nominations: list pods and nodes once, decide; changes nothing, no Events.

    Without the extender's model the never-fits rule is not applied; nomination age comes from our records.
    """
    k = config.kubernetes
    async with KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig, context=k.context, request_timeout=k.request_timeout_seconds
    ) as kube:
        pods = await kube.list_objects(PODS, field_selector=LIVE_PODS, limit=k.list_page_size)
        nodes = await kube.list_objects(NODES, limit=k.list_page_size)
    return plan_from(config, pods.items, nodes.items, now=time.time())


def plan_from(
    config: Config,
    pods: list[JsonObject],
    nodes: list[JsonObject],
    *,
    model: ClusterModel | None = None,
    settings: Settings | None = None,
    now: float,
) -> NominationPlan:
    """The nomination plan from listed pods and nodes (with the GPU model: the never-fits rule too)."""
    snapshot = build_snapshot(
        pods,
        nodes,
        resource=config.kubernetes.gpu_resource_name,
        view_of=model.view if model is not None else None,
        fit_settings=settings,
    )
    return plan_nominations(snapshot, policy_from_config(config.nominations, dry_run=True), now)
