"""The controller process (`gpuwarden controller`): one process, several loops, one HTTP listener.

Why one module for the wiring: every loop shares the same Kubernetes and Prometheus clients, the same
self-metrics registry and the same Lease. The loops that mutate the cluster (health quarantine, nomination
cleanup) run only while this replica leads; the scheduler-extender webhook answers on every replica from its
own watch-backed model (its bind claim protocol is safe between replicas). The listener serves the extender
routes, `/metrics`, `/healthz`, `/livez` and `/readyz` (ready once the extender's caches are synced).

This module decides nothing; it only builds and runs what the capability packages provide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CollectorRegistry

from controller.drain.loop import DrainLoop
from controller.extender.runtime import Extender, binder_advertisement, build_extender
from controller.extender.server import passthrough_preemption
from controller.gpus.feed import GpuModel, build_gpu_model
from controller.health.loop import HealthLoop, controller_namespace
from controller.idle.decide import table_lines
from controller.idle.loop import IdleLoop
from controller.makeroom.loop import RoomLoop
from controller.modes import METRIC, Mode, capability_modes, mode_samples
from controller.nominations.loop import NominationLoop
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import (
    LIVE_PODS,
    NODES,
    PDBS,
    PODS,
    Informer,
    KubeClient,
    LeaderElector,
    LeaseDurations,
    ProtobufSource,
)
from gpuwarden.kube.watch import WatchSource
from gpuwarden.promclient import PrometheusClient
from gpuwarden.selfmetrics import SnapshotCollector, metrics_handler, new_registry
from gpuwarden.transient import Episodes, transient_counter

log = logging.getLogger(__name__)

PASS_GRACE_SECONDS = 12.0
"""Stopping: how long a running pass may go on (a taint written, its Event not yet) before it is cancelled."""
HTTP_GRACE_SECONDS = 5.0
"""Stopping: how long requests being answered (a bind mid-way) may go on once the listener is closed."""
EVENTS_GRACE_SECONDS = 5.0
"""Stopping: how long the extender's queued bind Events may take to be written."""
LEASE_GRACE_SECONDS = 5.0
"""Stopping: how long releasing the Lease may take. The four graces add up to under Kubernetes' default
terminationGracePeriodSeconds (30 s)."""


def kube_client(config: Config, kubeconfig: Path | None, registry: CollectorRegistry | None) -> KubeClient:
    """The controller's one Kubernetes client, from the `kubernetes` section (in-cluster when unset)."""
    k = config.kubernetes
    return KubeClient.from_config(
        kubeconfig=kubeconfig or k.kubeconfig,
        context=k.context,
        request_timeout=k.request_timeout_seconds,
        field_manager=k.field_manager,
        registry=registry,
    )


def register_modes(registry: CollectorRegistry, modes: dict[str, Mode]) -> None:
    """`gpuwarden_capability_mode{capability, mode} 1`: what observes and what acts (controller/modes.py)."""
    samples = mode_samples(modes)
    registry.register(
        SnapshotCollector(
            METRIC,
            "Each controller capability's mode (off, observe: plans and counts only, act); always 1.",
            ["capability", "mode"],
            lambda: samples,
        )
    )
    log.info("controller capabilities", extra={"modes": modes})


def build_app(registry: CollectorRegistry, extender: Extender | None) -> web.Application:
    """Probes and /metrics, plus the extender's routes when it is enabled."""
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def ready(_request: web.Request) -> web.Response:
        if extender is not None and not extender.ready():
            return web.Response(status=503, text="extender caches not synced yet")
        return web.Response(text="ok")

    app.router.add_get("/healthz", ok)
    app.router.add_get("/livez", ok)
    app.router.add_get("/readyz", ready)
    app.router.add_get("/metrics", metrics_handler(registry))  # type: ignore[arg-type]
    if extender is not None:
        extender.mount(app)
    return app


def _tls_context(config: Config) -> ssl.SSLContext | None:
    tls = config.extender.tls
    if tls.cert_file is None or tls.key_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx


class PeriodicLoop(Protocol):
    """A leader-gated loop whose passes `PassScheduler` runs (`HealthLoop`, `NominationLoop`)."""

    def interval(self) -> float | None:
        """Seconds between passes; None: disabled in the config."""
        ...

    async def run_once(self, leading: asyncio.Event | None = None) -> object: ...

    def ready(self) -> bool:
        """Whether a pass may run now (its caches listed)."""
        ...

    async def wait_ready(self) -> None: ...

    def caches(self) -> list[Informer]:
        """Informers the loop created itself; whoever runs it runs them."""
        ...


class PassScheduler:
    """Periodic passes of the mutating loops on APScheduler, gated on leadership and synced caches.

    APScheduler gives us what hand-rolled sleep loops get wrong: a pass never overlaps itself
    (`max_instances=1`), missed runs after a stall are coalesced into one, and one failing pass is logged
    without ending the schedule. What it does not give: its asyncio executor's shutdown cancels a running
    pass without waiting for it, so `stop()` pauses the schedule and lets running passes finish first
    (bounded by `grace`). A pass stopped anyway (or a leader killed) between a taint and its Event leaves the
    record's Event mark pending, and the next pass writes the Event once (`controller.health.decide`).
    """

    def __init__(
        self,
        leading: asyncio.Event,
        *,
        grace: float = PASS_GRACE_SECONDS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.leading = leading
        self.grace = grace
        self.episodes = Episodes(transient_counter(registry), log)
        """Expected failures (API down, 429, 5xx, Prometheus down): one warning per episode, not a trace."""
        self.scheduler = AsyncIOScheduler(timezone="UTC")
        self.inflight: dict[asyncio.Task[Any], str] = {}
        """Running passes (their APScheduler tasks) by loop name."""
        self._loops: list[PeriodicLoop] = []

    def every(
        self,
        name: str,
        seconds: float,
        run_once: Callable[[asyncio.Event], Awaitable[object]],
        ready: Callable[[], bool],
    ) -> None:
        async def gated() -> None:
            if not self.leading.is_set() or not ready():
                return
            task = asyncio.current_task()
            if task is not None:
                self.inflight[task] = name
            try:
                await run_once(self.leading)
            except Exception as exc:  # the next pass starts on schedule
                if not self.episodes.failed(name, exc):
                    log.exception("pass failed", extra={"loop": name})
            else:
                self.episodes.succeeded(name)
            finally:
                if task is not None:
                    self.inflight.pop(task, None)

        self.scheduler.add_job(
            gated,
            IntervalTrigger(seconds=seconds),
            id=name,
            name=name,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(seconds)),
            next_run_time=datetime.now(UTC),
        )

    def add(self, name: str, loop: PeriodicLoop) -> bool:
        """Schedule `loop`'s passes at its interval; False (nothing scheduled) when it is disabled."""
        interval = loop.interval()
        if interval is None:
            return False
        self.every(name, interval, loop.run_once, loop.ready)
        self._loops.append(loop)
        return True

    async def start_when_ready(self) -> None:
        """Start the schedule once every added loop is ready, so the first pass comes straight after the
        first list (started earlier, the first due pass would find the caches empty and be skipped)."""
        await asyncio.gather(*(loop.wait_ready() for loop in self._loops))
        if not self.scheduler.running:
            self.scheduler.start()

    async def stop(self) -> None:
        """No new pass; running passes get `grace` seconds to finish, then are cancelled (and logged)."""
        if not self.scheduler.running:
            return
        self.scheduler.pause()
        running = set(self.inflight)
        late: set[asyncio.Task[Any]] = set()
        if running:
            _, late = await asyncio.wait(running, timeout=self.grace)
        for task in late:
            log.warning(
                "pass still running at shutdown; cancelling it",
                extra={"loop": self.inflight.get(task, ""), "grace_seconds": self.grace},
            )
            task.cancel()
        self.scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # AsyncIOScheduler shuts down on the event loop's next turn
        if late:
            await asyncio.wait(late, timeout=LEASE_GRACE_SECONDS)  # let the cancellations unwind


def _ended(task: asyncio.Future[Any]) -> BaseException:
    """Why a job that should run until cancelled ended: its error, or one saying it returned."""
    error = None if task.cancelled() else task.exception()
    return error if error is not None else RuntimeError("a cache or loop ended unexpectedly")


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel every task, then wait for each to end, however it ends."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def run_loops(
    leading: asyncio.Event, stop: asyncio.Event, *, grace: float = PASS_GRACE_SECONDS, **loops: PeriodicLoop
) -> None:
    """Run the given loops (by name) without the rest of the controller, until `stop` is set or cancelled:
    their own caches, then - once every loop is ready, so the first pass comes straight after the first
    list - their passes on one `PassScheduler`, only while `leading` is set. A cache that fails (before or
    after its first list) ends the run with its error. On stop a running pass gets `grace` seconds to
    finish. For tests and tools that run a loop on its own; `run_controller` schedules the same way."""
    active = {name: loop for name, loop in loops.items() if loop.interval() is not None}
    if not active:
        return
    passes = PassScheduler(leading, grace=grace)
    for name, loop in active.items():
        passes.add(name, loop)
    caches = [asyncio.ensure_future(i.run()) for loop in active.values() for i in loop.caches()]
    starting = asyncio.ensure_future(passes.start_when_ready())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stopped, *caches], return_when=asyncio.FIRST_COMPLETED)
        for task in caches:
            if task.done():
                error = _ended(task)
                log.error("loop cache failed; stopping the loops", exc_info=error)
                raise error
    finally:
        stopped.cancel()
        starting.cancel()
        await passes.stop()
        await _cancel(caches)


@dataclass(frozen=True)
class Capabilities:
    """What the controller process runs, each built once: the shared node and live-pod informers, the GPU
    model, the preemption throttle, the extender (None when it is off) and the leader-gated loops by pass
    name, in the order their passes are scheduled."""

    nodes: Informer
    pods: Informer
    gpus: GpuModel
    throttle: PreemptionThrottle
    extender: Extender | None
    loops: dict[str, PeriodicLoop]

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """What runs on every replica, leader or not, until cancelled: the informers, the model's feed, the
        throttle's observer and the extender."""
        jobs = [self.nodes.run(), self.pods.run(), self.gpus.run(), self.throttle.run()]
        if self.extender is not None:
            jobs.append(self.extender.run())
        return jobs


def build_capabilities(
    config: Config,
    kube: KubeClient,
    prom: PrometheusClient,
    *,
    registry: CollectorRegistry,
    dry_run: bool | None,
    identity: str,
    elector: LeaderElector | None = None,
) -> Capabilities:
    """One node informer and one live-pod informer (one list+watch stream each) serve every capability: the
    GPU model (built once, whether or not the extender is on), quarantine, drain, nominations, make-room, the
    idle loop and the preemption observer. With `kubernetes.protobuf` the pods are listed and watched as
    protobuf, as kube-scheduler does, and decoded to the fields those readers read (`podproto.py`); through
    a proxy, or from a server that answers JSON, they arrive as whole JSON objects."""
    k = config.kubernetes
    page, timeout = k.list_page_size, int(k.watch_timeout_seconds)
    nodes = Informer(kube, NODES, page_size=page, watch_timeout=timeout)
    pod_source: WatchSource = kube
    if k.protobuf:
        # Imported here: a controller configured for JSON never loads the protobuf runtime.
        from controller.gpus.podproto import pod_object

        pod_source = ProtobufSource(kube, decode=pod_object)
    pods = Informer(pod_source, PODS, field_selector=LIVE_PODS, page_size=page, watch_timeout=timeout)
    gpus = build_gpu_model(config, kube, prometheus=prom, nodes=nodes, pods=pods)
    throttle = PreemptionThrottle(
        config, kube, registry=registry, dry_run=dry_run, instance=identity, pods=pods
    )
    if config.preemption.enabled:  # the preempt verb chooses victims with the GPU model
        throttle.use_gpu_model(gpus.model, gpus.settings)
    extender: Extender | None = None
    if config.extender.enabled:
        hook = throttle if config.preemption.enabled else passthrough_preemption
        extender = build_extender(
            config,
            kube,
            prometheus=prom,
            registry=registry,
            dry_run=bool(dry_run),
            preempt_hook=hook,
            instance=identity,
            gpus=gpus,
            elector=elector,
        )
    loops = _build_loops(
        config, kube, prom, gpus, throttle, nodes, pods, registry=registry, dry_run=dry_run, identity=identity
    )
    return Capabilities(nodes, pods, gpus, throttle, extender, loops)


def _build_loops(
    config: Config,
    kube: KubeClient,
    prom: PrometheusClient,
    gpus: GpuModel,
    throttle: PreemptionThrottle,
    nodes: Informer,
    pods: Informer,
    *,
    registry: CollectorRegistry,
    dry_run: bool | None,
    identity: str,
) -> dict[str, PeriodicLoop]:
    """The leader-gated loops by pass name, every one reading the shared `nodes` and `pods` informers. A
    loop that is off in the config is built anyway; `PassScheduler.add` schedules nothing for it."""
    room = RoomLoop(
        config,
        kube,
        throttle=throttle,
        model=gpus.model,
        settings=gpus.settings,
        nodes=nodes,
        registry=registry,
        dry_run=dry_run,
        instance=identity,
    )
    health = HealthLoop(
        config, prom, kube, registry=registry, dry_run=dry_run, instance=identity, informer=nodes
    )
    nominations = NominationLoop(
        config,
        kube,
        registry=registry,
        dry_run=dry_run,
        instance=identity,
        pods=pods,
        nodes=nodes,
        model=gpus.model,
        settings=gpus.settings,
    )
    idle = IdleLoop(
        config, prom, kube, registry=registry, dry_run=dry_run, instance=identity, pods=pods, nodes=nodes
    )
    drain = DrainLoop(
        config, kube, registry=registry, dry_run=dry_run, instance=identity, pods=pods, nodes=nodes
    )
    # make-room's pass keeps the name it shipped with, `gpu-preemption` (docs/architecture.md)
    return {
        "health": health,
        "nominations": nominations,
        "drain": drain,
        "gpu-preemption": room,
        "idle": idle,
    }


def _leadership(
    config: Config, kube: KubeClient, identity: str, registry: CollectorRegistry
) -> tuple[asyncio.Event, LeaderElector | None]:
    """The event the mutating passes are gated on, and the elector to run for it: the Lease's `is_leader`
    when leader election is on; else an event set now (this replica always leads) and no elector."""
    le = config.kubernetes.leader_election
    if not le.enabled:  # (the extender's leader bind protocol then binds in this one replica)
        leading = asyncio.Event()
        leading.set()
        return leading, None
    elector = LeaderElector(
        kube,
        name=le.lease_name,
        namespace=le.lease_namespace or controller_namespace(config),
        identity=identity,
        durations=LeaseDurations(
            le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds
        ),
        registry=registry,
        annotations=binder_advertisement(config.extender),
    )
    return elector.is_leader, elector


async def _serve(
    config: Config,
    registry: CollectorRegistry,
    extender: Extender | None,
    *,
    identity: str,
    dry_run: bool | None,
) -> web.AppRunner:
    """Start the one listener (the extender's routes when it is on, `/metrics`, the health probes); the
    caller cleans the returned runner up."""
    runner = web.AppRunner(
        build_app(registry, extender),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=HTTP_GRACE_SECONDS,
    )
    await runner.setup()
    ext = config.extender
    tls = _tls_context(config) if extender is None or extender.tls is None else None  # else the extender's
    if extender is not None:
        site = extender.site(runner, ext.bind_address, ext.port, ssl_context=tls, lean=ext.lean_http)
    else:
        site = web.TCPSite(runner, ext.bind_address, ext.port, ssl_context=tls)
    await site.start()
    log.info(
        "controller serving",
        extra={"address": ext.bind_address, "port": ext.port, "identity": identity, "dry_run": dry_run},
    )
    return runner


async def _until_stopped(stop: asyncio.Event, running: Sequence[asyncio.Future[Any]]) -> None:
    """Return once `stop` is set; raise the error of any `running` job that ends first (they run until
    cancelled, so one that ends has failed)."""
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([*running, stopped], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is stopped:
            continue
        error = _ended(task)
        log.error("controller loop failed; stopping", exc_info=error)
        raise error


async def run_controller(
    config: Config,
    *,
    kubeconfig: Path | None = None,
    dry_run: bool | None = None,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run every controller loop and the listener until `stop` is set or the task is cancelled.

    Every replica runs the shared informers, the GPU model and the extender (`Capabilities.jobs`: the
    extender answers on every replica); the mutating passes run only while this replica leads.
    """
    registry = registry if registry is not None else new_registry("controller")
    register_modes(registry, capability_modes(config, dry_run=dry_run))
    stop = stop or asyncio.Event()
    identity = config.kubernetes.leader_election.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    async with (
        PrometheusClient(config.prometheus, registry=registry) as prom,
        kube_client(config, kubeconfig, registry) as kube,
    ):
        leading, elector = _leadership(config, kube, identity, registry)
        built = build_capabilities(
            config, kube, prom, registry=registry, dry_run=dry_run, identity=identity, elector=elector
        )
        election = asyncio.ensure_future(elector.run()) if elector is not None else None
        passes = PassScheduler(leading, grace=PASS_GRACE_SECONDS, registry=registry)
        for name, loop in built.loops.items():
            passes.add(name, loop)  # nothing scheduled for a loop that is off
        jobs = built.jobs()
        runner = await _serve(config, registry, built.extender, identity=identity, dry_run=dry_run)
        tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(job) for job in jobs]
        starting = asyncio.ensure_future(passes.start_when_ready())
        try:
            await _until_stopped(stop, tasks if election is None else [*tasks, election])
        finally:
            # In this order: mutations end first (passes finish, bounded) while the Lease is still held;
            # then the listener, so no bind queues another Event; then the Events writer drains; then the
            # caches and feeds; then the Lease goes; the clients close last (leaving `async with`).
            stop.set()
            starting.cancel()
            await passes.stop()
            await runner.cleanup()
            if built.extender is not None:
                await built.extender.close_events(EVENTS_GRACE_SECONDS)
            await _cancel(tasks)
            if elector is not None and election is not None:
                elector.stop()  # the mutating loops are stopped: release the Lease so a standby takes over
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(election, timeout=LEASE_GRACE_SECONDS)


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> ControllerPlan:
    """`gpuwarden plan`: what every mutating loop would do now; reads only, writes nothing. Nodes, live pods
    and PodDisruptionBudgets are listed once, through one client, and one GPU model is built from them."""
    from controller.drain.loop import plan_from as drain_plan
    from controller.drain.plan import plan_to_dict
    from controller.gpus.domains import domain_rows, domains_of
    from controller.gpus.feed import model_from_lists
    from controller.gpus.objects import node_info
    from controller.gpus.shared import sharing_rows
    from controller.health.loop import plan_from as health_plan
    from controller.idle.loop import plan_from as idle_plan
    from controller.idle.loop import usage_now
    from controller.makeroom.loop import list_tenancy
    from controller.makeroom.loop import plan_from as room_plan
    from controller.nominations.loop import plan_from as nominations_plan

    k = config.kubernetes
    async with PrometheusClient(config.prometheus) as prom, kube_client(config, kubeconfig, None) as kube:
        nodes = (await kube.list_objects(NODES, limit=k.list_page_size)).items
        pods = (await kube.list_objects(PODS, field_selector=LIVE_PODS, limit=k.list_page_size)).items
        pdbs = (await kube.list_objects(PDBS, limit=k.list_page_size)).items
        namespaces, quotas = await list_tenancy(config, kube)
        quarantine = await health_plan(config, prom, kube, nodes)
        now = time.time()
        usage = await usage_now(prom, config, now) if config.idle.enabled else None
    gpus = model_from_lists(config, nodes, pods)
    nominations = nominations_plan(config, pods, nodes, model=gpus.model, settings=gpus.settings(), now=now)
    drain = drain_plan(config, nodes, pods, now=now)
    room = room_plan(config, nodes, pods, pdbs, gpus=gpus, now=now, namespaces=namespaces, quotas=quotas)
    idle = idle_plan(config, pods, usage, now=now, nodes=nodes).to_dict() if config.idle.enabled else {}
    return ControllerPlan(
        quarantine.to_dict(),
        quarantine.render_table(),
        nominations.to_json(),
        plan_to_dict(drain),
        room.to_dict(),
        idle,
        sharing_rows(node_info(n, k.gpu_resource_name) for n in nodes),
        domain_rows(domains_of(nodes, config.domains.clique_label, k.gpu_resource_name))
        if config.domains.enabled
        else [],
    )


@dataclass(frozen=True)
class ControllerPlan:
    """Both loops' plans, ready to print as JSON or as a table."""

    quarantine: dict[str, Any]
    quarantine_table: str
    nominations: dict[str, Any]
    drain: dict[str, Any] = field(default_factory=dict)
    gpu_preemption: dict[str, Any] = field(default_factory=dict)
    idle: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    """Per GPU node: how it shares its GPUs and how many physical GPUs it has (controller.gpus.shared)."""
    nvlink_domains: list[dict[str, Any]] = field(default_factory=list)
    """Per NVLink domain (clique): its members and their GPUs (controller.gpus.domains)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "nvlink_domains": self.nvlink_domains,
            "quarantine": self.quarantine,
            "nominations": self.nominations,
            "drain": self.drain,
            "gpu_preemption": self.gpu_preemption,
            "idle": self.idle,
        }

    def room_table(self) -> list[str]:
        planned = self.gpu_preemption.get("preemptions") or []
        lines = ["", "GPU PREEMPTION" + ("" if planned else ": no pending pod rejected as fragmented")]
        for p in planned:
            if p["node"]:
                lines.append(f"  {p['pod']} (priority {p['priority']}) on {p['node']}: evict "
                             f"{', '.join(p['victims'])} -> GPUs {','.join(p['gpus'])}")  # fmt: skip
            else:
                lines.append(f"  {p['pod']} (priority {p['priority']}): {p['reason']}")
        return lines

    def idle_table(self) -> list[str]:
        return table_lines(self.idle) if self.idle else []  # empty: detection off (idle.enabled)

    def tenants_table(self) -> list[str]:
        rows = self.gpu_preemption.get("tenants") or []
        if not rows:  # rule `any`: tenants play no part
            return []
        lines = ["", f"TENANTS (rule {rows[0]['rule']}): guaranteed / held / preemptable by others GPUs"]
        for r in rows:
            lines.append(f"  {r['tenant']}: {r['guaranteed']} / {r['held']} / {r['preemptable']}"
                         f"  ({', '.join(r['namespaces']) or 'no namespace'})")  # fmt: skip
        return lines

    def drain_table(self) -> list[str]:
        lines = ["", "DRAIN" + ("" if self.drain.get("nodes") else ": no quarantined node to drain")]
        for why in self.drain.get("gate_closed") or []:
            lines.append(f"gate closed: {why}")
        for node in self.drain.get("nodes") or []:
            state = "held: " + node["held"] if node["held"] else "done" if node["done"] else "draining"
            note = f": {node['scope_note']}" if node.get("scope_note") else ""
            lines.append(f"{node['node']} ({node['scope']} scope{note}, {state})")
            for pod in node["pods"]:
                lines.append(f"  {pod['verdict']:<16} {pod['pod']:<40} {pod['mode']:<17} {pod['reason']}")
        return lines

    def gpus_table(self) -> list[str]:
        if not self.gpus:
            return []
        header = ("NODE", "SHARING", "PHYSICAL GPUS", "SLOTS")
        rows = [
            (
                g["node"],
                g["mode"] + (f" ({g['mig_profile']})" if g.get("mig_profile") else ""),
                "unknown" if g["physical_gpus"] is None else str(g["physical_gpus"]),
                f"{g['slots']} {g['resource']}"
                + (f" ({g['replicas']} per GPU)" if g["mode"] in ("time-slicing", "mps") else ""),
            )
            for g in self.gpus
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        lines = ["GPU NODES"]
        for row in [header, *rows]:
            lines.append("  ".join(v.ljust(w) for v, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
        return [*lines, ""]

    def domains_table(self) -> list[str]:
        if not self.nvlink_domains:
            return []
        lines = ["NVLINK DOMAINS"]
        for d in self.nvlink_domains:
            out = f", {d['quarantined_trays']} quarantined" if d["quarantined_trays"] else ""
            lines.append(f"  {d['domain']}: {d['trays']} trays, {d['gpus']} GPUs{out}")
            lines.append("    " + ", ".join(m["node"] for m in d["members"]))
        return [*lines, ""]

    def render_table(self) -> str:
        lines = [*self.gpus_table(), *self.domains_table()]
        lines += ["QUARANTINE", self.quarantine_table, "", "NOMINATIONS"]
        rows = [("clear", c["pod"], c["node"], c["reason"], c["message"]) for c in self.nominations["clear"]]
        rows += [("evict", e["pod"], e["node"], "ttl", e["message"]) for e in self.nominations["evict"]]
        rows += [("hold", h["pod"], h["node"], h["reason"], h["message"]) for h in self.nominations["hold"]]
        if not rows:
            lines.append("no nominations to act on")
        else:
            header = ("ACTION", "POD", "NODE", "REASON", "MESSAGE")
            widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
            for row in [header, *rows]:
                lines.append(
                    "  ".join(str(v).ljust(w) for v, w in zip(row[:4], widths, strict=True))
                    + "  "
                    + str(row[4])
                )
        return "\n".join(
            lines + self.drain_table() + self.room_table() + self.tenants_table() + self.idle_table()
        )
