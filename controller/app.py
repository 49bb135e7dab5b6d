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
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.runtime import Extender, build_extender
from controller.health.loop import HealthLoop, controller_namespace
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient, LeaderElector, LeaseDurations
from gpuwarden.promclient import PrometheusClient
from gpuwarden.selfmetrics import metrics_handler, new_registry

log = logging.getLogger(__name__)


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


async def run_controller(
    config: Config,
    *,
    kubeconfig: Path | None = None,
    dry_run: bool | None = None,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run every controller loop and the listener until `stop` is set or the task is cancelled."""
    registry = registry if registry is not None else new_registry("controller")
    stop = stop or asyncio.Event()
    le = config.kubernetes.leader_election
    identity = le.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    async with (
        PrometheusClient(config.prometheus, registry=registry) as prom,
        kube_client(config, kubeconfig, registry) as kube,
    ):
        health = HealthLoop(config, prom, kube, registry=registry, dry_run=dry_run, instance=identity)
        extender = None
        if config.extender.enabled:
            extender = build_extender(config, kube, prometheus=prom, registry=registry, dry_run=bool(dry_run))
        leading = asyncio.Event()
        elector: LeaderElector | None = None
        jobs: list[Coroutine[Any, Any, None]] = []
        election: asyncio.Future[None] | None = None
        if le.enabled:
            elector = LeaderElector(
                kube,
                name=le.lease_name,
                namespace=le.lease_namespace or controller_namespace(config),
                identity=identity,
                durations=LeaseDurations(
                    le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds
                ),
                registry=registry,
            )
            leading = elector.is_leader
            election = asyncio.ensure_future(elector.run())
        else:
            leading.set()
        jobs.append(health.run(leading, stop))
        if extender is not None:
            jobs.append(extender.run())

        runner = web.AppRunner(build_app(registry, extender), access_log=None, handle_signals=False)
        await runner.setup()
        ext = config.extender
        await web.TCPSite(runner, ext.bind_address, ext.port, ssl_context=_tls_context(config)).start()
        log.info(
            "controller serving",
            extra={"address": ext.bind_address, "port": ext.port, "identity": identity, "dry_run": dry_run},
        )
        tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(job) for job in jobs]
        if election is not None:
            tasks.append(election)
        try:
            stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            watched: list[asyncio.Future[Any]] = [*tasks, stopped]
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = None if task is stopped or task.cancelled() else task.exception()
                if error is not None:
                    log.error("controller loop failed; stopping", exc_info=error)
                    raise error
        finally:
            stop.set()
            for task in tasks:
                if task is not election:
                    task.cancel()
            for task in tasks:
                if task is not election:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if elector is not None and election is not None:
                elector.stop()  # the mutating loops are stopped: release the Lease so a standby takes over
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(election, timeout=5)
            await runner.cleanup()


async def plan_once(config: Config, *, kubeconfig: Path | None = None) -> Any:
    """`gpuwarden plan`: what the quarantine loop would do now; lists and reads only, writes nothing."""
    from controller.health.loop import plan_once as health_plan_once

    return await health_plan_once(config, kubeconfig=kubeconfig)
