"""The quarantine loop: observe → decide → act every `health.loop_interval_seconds`, only while leading.

Why it exists: wiring. It owns the node informer (a list+watch cache, so a pass costs no LIST of 5,000 nodes),
the clock, leader gating and self-metrics; everything interesting happens in `observe`, `decide` and `act`.
`HealthLoop.run_once()` is one pass (tests call it directly instead of sleeping); `plan_once()` is what
`gpuwarden plan` runs; `run_health_controller()` is a complete leader-elected controller for this loop.

What it must not do: mutate anything while not leading, or swallow a pass's failure silently (it is logged
and the next pass starts on schedule). It never imports `adapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.health.act import Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.observe import Observer
from controller.health.plan import Plan
from controller.health.policy import HealthPolicy, policy_from_config
from controller.health.telemetry import Querier
from gpuwarden.config.root import Config
from gpuwarden.kube import (
    NODES,
    EventRecorder,
    Informer,
    JsonObject,
    KubeClient,
    LeaderElector,
    LeaseDurations,
)
from gpuwarden.promclient import PrometheusClient

log = logging.getLogger(__name__)
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def controller_namespace(config: Config) -> str:
    """`kubernetes.namespace`, else the pod's service-account namespace, else `default`."""
    if config.kubernetes.namespace:
        return config.kubernetes.namespace
    with contextlib.suppress(OSError):
        return SA_NAMESPACE.read_text().strip() or "default"
    return "default"


class HealthLoop:
    """One quarantine loop over injected clients; `leading` gates every pass that may write."""

    def __init__(
        self,
        config: Config,
        prom: Querier,
        kube: KubeClient,
        *,
        registry: CollectorRegistry,
        dry_run: bool | None = None,
        instance: str = "",
        clock: Callable[[], float] = time.time,
        informer: Informer | None = None,
    ) -> None:
        self.config = config
        self.policy: HealthPolicy = policy_from_config(config.health, dry_run=dry_run)
        self.prom, self.kube, self.clock = prom, kube, clock
        self.namespace = controller_namespace(config)
        self.metrics = HealthMetrics(registry)
        self.observer = Observer(config.health, gpu_resource=config.kubernetes.gpu_resource_name)
        self.informer = informer or Informer(
            kube,
            NODES,
            page_size=config.kubernetes.list_page_size,
            watch_timeout=int(config.kubernetes.watch_timeout_seconds),
        )
        recorder = EventRecorder(kube, component="health", instance=instance or socket.gethostname())
        self.actuator = Actuator(
            kube,
            recorder,
            self.metrics,
            namespace=self.namespace,
            breaker_configmap=config.health.breaker.configmap_name,
        )
        self.last_plan: Plan | None = None

    async def plan(self, nodes: list[JsonObject] | None = None) -> Plan:
        """Observe and decide at `clock()` — no writes (what `gpuwarden plan` prints).

        `nodes` defaults to the informer's cache.
        """
        started = time.perf_counter()
        now = self.clock()
        breaker = await self.actuator.read_breaker()
        objects = self.informer.objects() if nodes is None else nodes
        snapshot = await self.observer.observe(self.prom, objects, breaker, now)
        observed = time.perf_counter()
        plan = plan_quarantine(snapshot, self.policy, now)
        self.metrics.loop_duration.labels("observe").observe(observed - started)
        self.metrics.loop_duration.labels("decide").observe(time.perf_counter() - observed)
        self.metrics.observe_pass(snapshot, plan)
        return plan

    async def run_once(self, leading: asyncio.Event | None = None) -> Plan:
        """One full pass: observe, decide, act (act honours dry-run). Acts only if still `leading`."""
        plan = await self.plan()
        if leading is not None and not leading.is_set():
            log.info("lost leadership during the pass; plan not applied")
            return plan
        started = time.perf_counter()
        result = await self.actuator.apply(plan)
        self.metrics.loop_duration.labels("act").observe(time.perf_counter() - started)
        if plan.actions or plan.breaker.changed:
            log.info(
                "quarantine pass",
                extra={"actions": len(plan.actions), "writes": result.writes, "failures": result.failures,
                       "breaker_open": plan.breaker.after.open, "dry_run": plan.dry_run},
            )  # fmt: skip
        self.last_plan = plan
        return plan

    async def run(self, leading: asyncio.Event, stop: asyncio.Event) -> None:
        """Keep the node cache current; run a pass every interval while `leading` is set, until `stop`."""
        watcher = asyncio.create_task(self.informer.run(), name="health-node-informer")
        interval = self.config.health.loop_interval_seconds
        try:
            await self.informer.synced.wait()
            while not stop.is_set():
                if not leading.is_set():
                    await _first(leading.wait(), stop.wait())
                    continue
                started = time.monotonic()
                try:
                    await self.run_once(leading)
                except Exception:  # one bad pass must not end the loop; the next one starts on time
                    log.exception("quarantine pass failed")
                delay = max(0.0, interval - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _first(*aws: object) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def _kube(config: Config, kubeconfig: Path | None, registry: CollectorRegistry | None) -> KubeClient:
    k = config.kubernetes
    return KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig,
        context=k.context,
        request_timeout=k.request_timeout_seconds,
        field_manager=k.field_manager,
        registry=registry,
    )


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> Plan:
    """`gpuwarden plan`: list nodes once, observe, decide; changes nothing (not even Events)."""
    registry = CollectorRegistry()
    async with PrometheusClient(config.prometheus) as prom, _kube(config, kubeconfig, None) as kube:
        loop = HealthLoop(config, prom, kube, registry=registry)
        nodes = await kube.list_objects(NODES, limit=config.kubernetes.list_page_size)
        return await loop.plan(nodes.items)


async def run_health_controller(
    config: Config,
    *,
    kubeconfig: Path | None = None,
    dry_run: bool | None = None,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """`gpuwarden controller` for the health loop: leader election (unless disabled) + `HealthLoop.run`."""
    registry = registry if registry is not None else CollectorRegistry()
    stop = stop or asyncio.Event()
    le = config.kubernetes.leader_election
    identity = le.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    async with (
        PrometheusClient(config.prometheus, registry=registry) as prom,
        _kube(config, kubeconfig, registry) as kube,
    ):
        loop = HealthLoop(config, prom, kube, registry=registry, dry_run=dry_run, instance=identity)
        if not le.enabled:
            leading = asyncio.Event()
            leading.set()
            await loop.run(leading, stop)
            return
        elector = LeaderElector(
            kube,
            name=le.lease_name,
            namespace=le.lease_namespace or loop.namespace,
            identity=identity,
            durations=LeaseDurations(
                le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds
            ),
            registry=registry,
        )
        election = asyncio.create_task(elector.run(), name="health-leader-election")
        try:
            await loop.run(elector.is_leader, stop)
        finally:
            elector.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await election
