"""The quarantine loop: observe → decide → act every `health.loop_interval_seconds`, only while leading.

Why it exists: wiring. It owns the node informer (a list+watch cache, so a pass costs no LIST of 5,000 nodes),
the clock, leader gating and self-metrics; everything interesting happens in `observe`, `decide` and `act`.
`HealthLoop.run_once()` is one pass (tests call it directly instead of sleeping); `plan_once()` is what
`gpuwarden plan` runs. Periodic passes are not run here: `controller.app.PassScheduler` runs them (the
controller process, or `controller.app.run_loops` for a loop on its own), gated on leadership and on
`ready()`.

What it must not do: mutate anything while not leading. It never imports `adapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from controller.gpus.devices import devices_by_uuid
from controller.gpus.dra import extended_resource_classes
from controller.gpus.feed import DEVICE_CLASSES
from controller.health import devicerules
from controller.health.act import Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.observe import (
    DEVICE_TAINT_RULES,
    JOBS,
    RESOURCE_SLICES,
    Observer,
    attach_dra,
    device_scoped,
    dra_backed,
    needs_devices,
)
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy, policy_from_config
from controller.health.series import absent_series, presence_query
from controller.health.snapshot import DeviceRulesApi, FleetSnapshot, OwnedRule, Streak
from controller.health.telemetry import Querier
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError, KubeNotFound, PrometheusError
from gpuwarden.kube import (
    NODES,
    PODS,
    EventRecorder,
    Informer,
    JsonObject,
    KubeClient,
)
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector
from gpuwarden.quarantine import DeviceRef
from gpuwarden.wellknown import VALIDATION_NODE as VALIDATION_NODE_LABEL

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
        self.policy: HealthPolicy = policy_from_config(config.health, dry_run=dry_run, domains=config.domains)
        self.prom, self.kube, self.clock = prom, kube, clock
        self.namespace = controller_namespace(config)
        self.metrics = HealthMetrics(registry)
        self.observer = Observer(config.health, gpu_resource=config.kubernetes.gpu_resource_name)
        self._owned: list[Informer] = []
        if informer is None:
            informer = Informer(
                kube,
                NODES,
                page_size=config.kubernetes.list_page_size,
                watch_timeout=int(config.kubernetes.watch_timeout_seconds),
            )
            self._owned.append(informer)
        self.informer = informer
        recorder = EventRecorder(kube, component="health", instance=instance or socket.gethostname())
        self.actuator = Actuator(
            kube,
            recorder,
            self.metrics,
            namespace=self.namespace,
            breaker_configmap=config.health.breaker.configmap_name,
            job_namespace=config.health.validation.namespace,
            hold_disruption=config.health.hold_autoscaler_disruption,
        )
        self.last_plan: HealthPlan | None = None
        self.streaks: dict[str, Streak] = {}  # debounce state between passes (see debounce.py)

    async def plan(self, nodes: list[JsonObject] | None = None) -> HealthPlan:
        """Observe and decide at `clock()` — no writes (what `gpuwarden plan` prints).

        `nodes` defaults to the informer's cache.
        """
        started = time.perf_counter()
        now = self.clock()
        breaker = await self.actuator.read_breaker()
        objects = self.informer.objects() if nodes is None else nodes
        failed = await self._failed_pods()
        jobs = await self._validation_jobs()
        snapshot = await self.observer.observe(
            self.prom, objects, breaker, now, streaks=self.streaks, failed_pods=failed, jobs=jobs
        )
        snapshot = await self._with_dra(snapshot)
        observed = time.perf_counter()
        plan = plan_quarantine(snapshot, self.policy, now)
        self.metrics.loop_duration.labels("observe").observe(observed - started)
        self.metrics.loop_duration.labels("decide").observe(time.perf_counter() - observed)
        self.metrics.observe_pass(snapshot, plan)
        return plan

    async def _with_dra(self, snap: FleetSnapshot) -> FleetSnapshot:
        """DRA facts (docs/health.md#dra-backed-nodes): which nodes DRA serves (DeviceClasses), whether the
        DeviceTaintRule v1 API is served (our rules listed: 404 = not served, another error = unknown; both
        fall back to the node taint), and the ResourceSlices of the DRA-backed nodes with something to say."""
        resource = self.config.kubernetes.gpu_resource_name
        page = self.config.kubernetes.list_page_size
        scoped = any(device_scoped(n) for n in snap.nodes)
        try:
            classes = extended_resource_classes(
                (await self.kube.list_objects(DEVICE_CLASSES, limit=page)).items
            )
        except KubeNotFound as exc:  # no resource.k8s.io/v1 at all: no DRA node, no device rule
            return replace(snap, device_rules="not-served", device_rules_why=str(exc))
        except KubeError as exc:
            log.warning("DeviceClasses not listed; DRA-backed nodes get node taints this pass",
                        extra={"error": str(exc)})  # fmt: skip
            return replace(snap, device_rules="unknown", device_rules_why=str(exc))
        dra = [n for n in snap.nodes if dra_backed(n, classes, resource)]
        if not dra and not scoped:
            return snap
        api: DeviceRulesApi = "served"
        why, owned = "", list[OwnedRule]()
        try:
            listed = await self.kube.list_objects(
                DEVICE_TAINT_RULES, label_selector=devicerules.OWNED_SELECTOR, limit=page
            )
            owned = [r for o in listed.items if (r := devicerules.owned_rule(o)) is not None]
        except KubeNotFound as exc:
            api, why = "not-served", str(exc)
        except KubeError as exc:
            api, why = "unknown", str(exc)
        devices: dict[str, dict[str, DeviceRef]] = {}
        for node in dra:
            devices[node.name] = {}
            if api != "served" or not needs_devices(node):
                continue
            try:
                slices = await self.kube.list_objects(
                    RESOURCE_SLICES, field_selector=f"spec.nodeName={node.name}", limit=page
                )
                devices[node.name] = devices_by_uuid(slices.items, node.name)
            except KubeError as exc:  # no device known: a quarantine there is node-level (scope_of)
                log.warning("ResourceSlices not listed", extra={"node": node.name, "error": str(exc)})
        return attach_dra(snap, devices, api=api, why=why, owned=owned)

    async def _failed_pods(self) -> list[JsonObject] | None:
        """Pods in phase Failed (for `admission_failures`); None when that signal is off or the list failed
        (then no node gets a count: not read is not zero)."""
        if self.config.health.signals.admission_failures.action == "off":
            return None
        try:
            listed = await self.kube.list_objects(
                PODS, field_selector="status.phase=Failed", limit=self.config.kubernetes.list_page_size
            )
        except KubeError as exc:
            log.warning(
                "failed pods not listed; admission failures unknown this pass", extra={"error": str(exc)}
            )
            return None
        return listed.items

    async def _validation_jobs(self) -> list[JsonObject]:
        """Our validation Jobs (label gpuwarden.io/validation-node); [] when validation is off.

        A failed list raises: deciding a release without knowing the Job's outcome is not allowed, and the
        loop retries next interval."""
        if not self.config.health.validation.enabled:
            return []
        listed = await self.kube.list_objects(
            JOBS,
            namespace=self.actuator.job_namespace,
            label_selector=VALIDATION_NODE_LABEL,
            limit=self.config.kubernetes.list_page_size,
        )
        return listed.items

    async def run_once(self, leading: asyncio.Event | None = None) -> HealthPlan:
        """One full pass: observe, decide, act (act honours dry-run). Acts only if still `leading`.

        The debounce streaks advance on every pass, applied or not (they describe what was observed).
        """
        plan = await self.plan()
        self.streaks = dict(plan.streaks)
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

    # --- scheduling (controller.app.PassScheduler runs the passes; see `run_loops`) --------------------

    def interval(self) -> float | None:
        """Seconds between passes; None when `health.enabled` is false."""
        return self.config.health.loop_interval_seconds if self.config.health.enabled else None

    def ready(self) -> bool:
        """A pass needs the node cache listed once."""
        return self.informer.synced.is_set()

    async def wait_ready(self) -> None:
        await self.informer.synced.wait()

    def caches(self) -> list[Informer]:
        """The informers this loop created itself and whoever runs it must run (none when injected)."""
        return list(self._owned)


def _kube(config: Config, kubeconfig: Path | None, registry: CollectorRegistry | None) -> KubeClient:
    k = config.kubernetes
    return KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig,
        context=k.context,
        request_timeout=k.request_timeout_seconds,
        field_manager=k.field_manager,
        registry=registry,
    )


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> HealthPlan:
    """`gpuwarden plan`: list nodes once, observe, decide; changes nothing (not even Events)."""
    async with PrometheusClient(config.prometheus) as prom, _kube(config, kubeconfig, None) as kube:
        nodes = await kube.list_objects(NODES, limit=config.kubernetes.list_page_size)
        plan = await plan_from(config, prom, kube, nodes.items)
        try:
            result = await prom.query(presence_query(config.health))
        except PrometheusError:
            return plan  # the plan already says Prometheus is unavailable
        present = (
            {s.labels.get("__name__", "") for s in result.samples} if isinstance(result, Vector) else set()
        )
        return replace(plan, absent_series=absent_series(config.health, present))


async def plan_from(
    config: Config, prom: PrometheusClient, kube: KubeClient, nodes: list[JsonObject]
) -> HealthPlan:
    """The quarantine plan for listed nodes: Prometheus and the breaker's state read, nothing written."""
    return await HealthLoop(config, prom, kube, registry=CollectorRegistry()).plan(nodes)
