"""Wiring the extender into the controller process: config -> model, feed, binder, service, routes.

Why it exists: the controller's entry point should need three lines - `build_extender(...)`, `mount(app)`,
`run()` - and every replica must be built the same way (each answers filter/prioritize/bind from its own
watch-backed model; under the claim bind protocol no leader is needed, as claims are safe between
replicas; under the leader protocol the controller's Lease holder binds and the others forward bind to it).

It reads the `extender` (including `claim_ttl_seconds` and `events`), `kubernetes` and `health` (node
labels of DCGM series) config sections and must not run a listener itself: the controller owns the HTTP
server, /metrics and the probes. Bind Events (`events.py`) are written by a task run beside the feed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.answers import warm
from controller.extender.bind import AlwaysSole, Binder, KubePodApi, SoleBinder
from controller.extender.events import BindEvents
from controller.extender.fastpath import LeanSite
from controller.extender.forward import Forwarder, advertised_url
from controller.extender.metrics import extender_metrics, register_model_collectors
from controller.extender.peerauth import certificate_check, lean_admits
from controller.extender.server import (
    ExtenderService,
    PreemptHook,
    add_extender_routes,
    passthrough_preemption,
    verb_replies,
)
from controller.extender.tlsport import ExtenderTls, extender_tls, tls_metrics
from controller.gpus.feed import ErrorTrends, GpuModel, ModelFeed, build_gpu_model
from controller.gpus.model import ClusterModel
from gpuwarden.config.extender import ExtenderConfig
from gpuwarden.config.root import Config
from gpuwarden.kube import EventRecorder, KubeClient, LeaderElector
from gpuwarden.kube.event_queue import EventSink
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import EXTENDER_URL

log = logging.getLogger(__name__)

WARM_CHUNK = 100
"""Nodes warmed between two yields to the event loop: ~10 ms of work for four request sizes."""

CLAIM_TTL_SECONDS = ExtenderConfig.model_fields["claim_ttl_seconds"].default
"""The default of `extender.claim_ttl_seconds` (kept for callers that imported the old constant)."""


@dataclass
class Extender:
    """One replica's extender: mount its routes on the controller's app, then `await run()`."""

    model: ClusterModel
    service: ExtenderService
    feed: ModelFeed
    trends: ErrorTrends | None
    prefix: str
    events: BindEvents | None = None
    warm_gpu_counts: tuple[int, ...] = ()
    """`extender.warm_gpu_counts`: request sizes whose answers `run` computes for every node once synced."""
    warmed: bool = False
    freeze_gc: bool = True
    """Freeze the long-lived cache (and the warmed answers) out of gen-2 GC scans once warmed (feed.py)."""
    owns_model: bool = True
    """`run` runs the model's feed and error trends; False when the controller runs a shared `GpuModel`."""
    tls: ExtenderTls | None = None
    """`extender.tls` with a certificate: the listener's context, kept current by `run`."""

    def mount(self, app: web.Application) -> None:
        """The routes, and with client certificates required the check every request passes first."""
        add_extender_routes(app, self.service, self.prefix)
        if self.tls is not None and self.tls.required:
            app.middlewares.append(certificate_check(self.prefix, self.tls.metrics.refusals))

    def site(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        lean: bool = True,
    ) -> web.TCPSite:
        """The listener of `runner`'s app (on which `mount` put the routes): with `lean`, the scheduler's
        requests are answered on the lean HTTP path (`fastpath.py`), everything else by aiohttp. TLS: the
        extender's own (`tls`, rotated) when it has one, else `ssl_context`."""
        if self.tls is not None:
            ssl_context = self.tls.context
        if not lean:
            return web.TCPSite(runner, host, port, ssl_context=ssl_context)
        return LeanSite(
            runner,
            host,
            port,
            routes=verb_replies(self.service, self.prefix),
            max_body_bytes=self.service.max_body_bytes,
            ssl_context=ssl_context,
            admit=lean_admits if self.tls is not None and self.tls.required else None,
            rejected=self.service.metrics.reject,
        )

    def ready(self) -> bool:
        """For the readiness probe: answer the scheduler only once the caches are synced and the usual
        request sizes' answers computed (`extender.warm_gpu_counts`)."""
        return self.model.synced and (self.warmed or not self.warm_gpu_counts)

    async def _warm(self) -> None:
        """After the first sync, compute every node's answers for `warm_gpu_counts` in chunks that yield
        to the event loop (the watches keep being applied meanwhile; a view they replace is computed again
        on first use, as always)."""
        if not self.warm_gpu_counts:
            return
        # a flag of the (loop-free) model, set by whichever feed fills it
        while not self.model.synced:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        started = time.perf_counter()
        names, done = self.model.node_names(), 0
        try:
            for i in range(0, len(names), WARM_CHUNK):
                # settings per chunk: a late NodeResourceTopology may change the fleet's NUMA size
                settings, now = self.service.current_settings(), self.service.clock()
                views = (self.model.view(name) for name in names[i : i + WARM_CHUNK])
                done += warm(
                    self.service.answers,
                    [v for v in views if v is not None],
                    self.warm_gpu_counts,
                    settings,
                    now,
                )
                await asyncio.sleep(0)
        except Exception:  # only an optimisation: answers are then computed on first use, as without it
            log.exception("warming the extender's answers failed; serving without")
        else:
            took = round(time.perf_counter() - started, 2)
            log.info("extender answers warmed", extra={"nodes": len(names), "answers": done, "seconds": took})
        if self.freeze_gc:
            gc.freeze()
        self.warmed = True

    async def run(self) -> None:
        """Feed the model, refresh the error trends and write bind Events until cancelled.

        The jobs live and die together: when one fails the others are cancelled (none may outlive the
        Kubernetes client the controller closes next) and its error is raised; a bind Event offered after
        that is counted as dropped."""
        try:
            async with asyncio.TaskGroup() as group:
                if self.owns_model:
                    group.create_task(self.feed.run(), name="extender-feed")
                group.create_task(self._warm(), name="extender-warm")
                if self.trends is not None and self.owns_model:
                    group.create_task(self.trends.run(), name="extender-error-trends")
                if self.events is not None:
                    group.create_task(self.events.run(), name="extender-events")
                if self.tls is not None:
                    group.create_task(self.tls.run(), name="extender-certificates")
        except BaseExceptionGroup as failed:  # the first failure; the rest are usually its consequences
            raise failed.exceptions[0] from failed
        finally:
            if self.service.forwarder is not None:
                await self.service.forwarder.close()

    async def close_events(self, grace: float) -> None:
        """Shutdown, after the listener stopped (no bind can queue another Event): give the Events writer up
        to `grace` seconds to write what is queued, before `run` is cancelled."""
        if self.events is not None:
            await self.events.close(grace)


def binder_advertisement(cfg: ExtenderConfig) -> dict[str, str]:
    """What the controller's Lease carries for the leader bind protocol: this replica's extender URL (so
    the other replicas can forward bind to it while it leads); {} otherwise."""
    if not cfg.enabled or cfg.bind_protocol != "leader":
        return {}
    url = advertised_url(cfg)
    if not url:
        log.warning(
            "extender.bind_protocol is leader but this replica has no address to advertise (set "
            "extender.advertise_url or POD_IP): the other replicas cannot forward bind to it"
        )
        return {}
    return {EXTENDER_URL: url}


def _sole_binding(
    cfg: ExtenderConfig, elector: LeaderElector | None, tls: ExtenderTls | None
) -> tuple[SoleBinder | None, Forwarder | None]:
    """The leader bind protocol's parts: who may bind here (the fenced Lease holder; without an election,
    this one replica) and where a follower forwards bind to. (None, None) under the claim protocol."""
    if cfg.bind_protocol != "leader":
        return None, None
    if elector is None:
        return AlwaysSole(), None

    def binder_url() -> str:
        return elector.holder_annotations.get(EXTENDER_URL, "") if elector.leader else ""

    forwarder = Forwarder(
        binder_url,
        own_url=advertised_url(cfg),
        timeout=cfg.forward_timeout_seconds,
        ssl_context=tls.client_context if tls is not None else None,  # plain HTTP without a pair
    )
    return elector, forwarder


def build_extender(
    config: Config,
    kube: KubeClient,
    *,
    prometheus: PrometheusClient | None = None,
    registry: CollectorRegistry | None = None,
    dry_run: bool = False,
    preempt_hook: PreemptHook = passthrough_preemption,
    clock: Callable[[], float] = time.time,
    instance: str = "",
    recorder: EventSink | None = None,
    gpus: GpuModel | None = None,
    elector: LeaderElector | None = None,
) -> Extender:
    """Build the extender from config; `prometheus` None disables the error-trend penalty. `gpus`: the
    controller's shared GPU model (run by the controller), else the extender builds and runs its own.

    With `extender.events` on, bind outcomes become Events written by `recorder` (default: an
    `EventRecorder` reporting as gpuwarden.io/extender, `instance` defaulting to the host name)."""
    cfg = config.extender
    owns_model = gpus is None
    if gpus is None:
        gpus = build_gpu_model(config, kube, prometheus=prometheus)
    model = gpus.model
    metrics = extender_metrics(registry)
    if registry is not None:
        register_model_collectors(registry, model)
    events = None
    if cfg.events:
        events = BindEvents(
            recorder or EventRecorder(kube, component="extender", instance=instance or socket.gethostname()),
            on_drop=metrics.events_dropped.inc,
            on_summarized=metrics.events_summarized.inc,
            dry_run=dry_run,
        )
    service = ExtenderService(
        model,
        gpus.settings.base,
        metrics,
        preempt_hook=preempt_hook,
        clock=clock,
        events=events,
        fleet=gpus.settings,
    )
    tls = extender_tls(cfg.tls, tls_metrics(registry))
    sole, forwarder = _sole_binding(cfg, elector, tls)
    service.binder = Binder(
        KubePodApi(kube),
        model,
        service.current_settings,
        clock=clock,
        dry_run=dry_run,
        on_conflict=lambda kind: metrics.bind_conflicts.labels(kind).inc(),
        watch_timeout=cfg.claim_watch_timeout_seconds,
        on_phase=lambda phase, seconds: metrics.bind_phases.labels(phase).observe(seconds),
        sole=sole,
        http_timeout=cfg.scheduler_http_timeout_seconds,
        on_overload=lambda action: metrics.bind_overload.labels(action).inc(),
    )
    if sole is not None and forwarder is not None:
        service.forwarder, service.is_binder = forwarder, sole.fenced
    service.max_body_bytes = cfg.max_request_bytes
    if gpus.feed is None:
        raise ValueError("the extender needs a GPU model kept current by a feed")
    gpus.feed.add_pod_listener(service.binder.pod_seen)
    return Extender(
        model,
        service,
        gpus.feed,
        gpus.trends,
        cfg.path_prefix,
        events,
        warm_gpu_counts=tuple(cfg.warm_gpu_counts),
        owns_model=owns_model,
        tls=tls,
    )
