"""Wiring: from a validated `Config` to a running adapter (`run_adapter`, what `gpuwarden adapter` calls).

Why separate from `server`: building the pieces — compiled rules and presets, the Prometheus client, the
Kubernetes client with the pod/node label index, the value cache, authentication — and running their
background loops (discovery, cache refresh, watches) is start-up policy, not request handling. `Adapter`
exposes `start()`/`stop()` so integration tests drive the same assembly the CLI runs, with their own
Prometheus and without Kubernetes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter import auth, kedascaler, naming, presets, tls
from adapter.cache import ValueCache
from adapter.objects import WATCHED, LabelIndex, watch_objects
from adapter.provider import Cached, Provider
from adapter.registry import Discovery
from adapter.resource_provider import ResourceProvider
from adapter.resource_rules import compile_resource_rules, resource_rule_problems
from adapter.resources import GroupResource
from adapter.selfmetrics import new_metrics, register_keda_snapshots, register_snapshots
from adapter.server import AdapterState, Security, build_app
from gpuwarden import memtrim
from gpuwarden.certreload import CertificateReloader, expiry_of
from gpuwarden.errors import ConfigError
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.selfmetrics import new_registry
from gpuwarden.x509lite import Certificate

if TYPE_CHECKING:
    import grpc

    from adapter import kedaserver
    from gpuwarden.config.root import Config

log = logging.getLogger(__name__)

TRIM_INTERVAL = 15.0
"""Seconds between `malloc_trim` calls without the value cache (per-request mode; gpuwarden/memtrim.py)."""


def kube_client_for(config: Config, registry: CollectorRegistry | None) -> KubeClient | None:
    """A client from `kubernetes.kubeconfig`, else in-cluster, else $KUBECONFIG / ~/.kube/config; or None."""
    cfg = config.kubernetes
    kwargs: dict[str, Any] = {"request_timeout": cfg.request_timeout_seconds, "registry": registry}
    if cfg.kubeconfig is not None:
        return KubeClient.from_config(kubeconfig=cfg.kubeconfig, context=cfg.context, **kwargs)
    try:
        return KubeClient.from_config(in_cluster=True, **kwargs)
    except ConfigError:
        pass
    fallback = Path(os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
    if fallback.is_file():
        return KubeClient.from_config(kubeconfig=fallback, context=cfg.context, **kwargs)
    return None


def validate_config(data: Mapping[str, Any]) -> list[tuple[tuple[Hashable, ...], str]]:
    """`check-config`'s adapter checks: (data path, reason) for every rule template the adapter would
    reject at start, in the raw config mapping (after overrides and `rules_file` are merged in).

    On raw data rather than a `Config`, so these problems are reported with the model's own, all at once.
    """
    section = data.get("adapter")
    if not isinstance(section, Mapping):
        return []
    problems: list[tuple[tuple[Hashable, ...], str]] = []
    for key in ("rules", "externalRules", "external_rules"):
        rules = section.get(key)
        if not isinstance(rules, list):
            continue
        for i, rule in enumerate(rules):
            if isinstance(rule, Mapping):
                for path, reason in naming.template_problems(rule):
                    problems.append((("adapter", key, i, *path), reason))
    for key in ("resourceRules", "resource_rules"):
        resource_rules = section.get(key)
        if isinstance(resource_rules, Mapping):
            for path, reason in resource_rule_problems(resource_rules):
                problems.append((("adapter", key, *path), reason))
    return problems


class Adapter:
    """All adapter pieces for one config; `start()` runs the loops, `app` serves requests."""

    def __init__(
        self,
        config: Config,
        *,
        prometheus: PrometheusClient | None = None,
        kube: KubeClient | None = None,
        registry: CollectorRegistry | None = None,
        index: LabelIndex | None = None,
        clock: Callable[[], float] | None = None,
        cert_reload_interval: float | None = None,
    ) -> None:
        """`clock` pins wall time and query evaluation time (tests with backfilled data); None: real time.
        `cert_reload_interval` overrides `adapter.tls.reload_interval_seconds`, for tests that poll the
        certificate files faster than the config allows."""
        acfg = config.adapter
        now = clock or time.time
        self.config = config
        self.collector_registry = registry if registry is not None else new_registry("adapter")
        self.metrics = new_metrics(self.collector_registry)
        self.prometheus = prometheus or PrometheusClient(config.prometheus, registry=self.collector_registry)
        self._owns_prometheus = prometheus is None
        self.kube = kube
        try:
            rules = naming.compile_rules(
                [*acfg.rules, *presets.preset_rules(acfg.presets, acfg.max_sample_age_seconds)],
                external=False,
            )
            external = naming.compile_rules(
                [*acfg.external_rules, *presets.external_preset_rules(acfg.presets)], external=True
            )
        except naming.RuleError as exc:
            raise ConfigError([("adapter.rules", str(exc))]) from None
        try:
            resource_rules = (
                compile_resource_rules(acfg.resource_rules) if acfg.resource_rules is not None else None
            )
        except naming.RuleError as exc:
            raise ConfigError([("adapter.resourceRules", str(exc))]) from None
        self.discovery = Discovery(
            self.prometheus,
            rules,
            external,
            max_age=acfg.metrics_max_age_seconds or acfg.relist_interval_seconds,
            metrics=self.metrics,
            timeout=config.prometheus.timeout_seconds,
            clock=now,
        )
        self.index = index if index is not None else (LabelIndex(WATCHED) if kube is not None else None)
        self.cache: ValueCache[Cached] | None = None
        if acfg.cache.mode == "cache":
            self.cache = ValueCache(
                refresh_interval=acfg.cache.refresh_interval_seconds,
                max_age=acfg.cache.max_age_seconds,
                idle_expiry=acfg.cache.idle_expiry_seconds,
                clock=now,
            )
        self.provider = Provider(
            self.prometheus,
            lambda: self.discovery.registry,
            metrics=self.metrics,
            index=self.index,
            cache=self.cache,
            query_timeout=config.prometheus.timeout_seconds,
            clock=now,
            eval_time=clock,
        )
        self.resource: ResourceProvider | None = None
        if resource_rules is not None:
            self.resource = ResourceProvider(
                self.prometheus,
                resource_rules,
                metrics=self.metrics,
                index=self.index,
                cache=self.cache,
                query_timeout=config.prometheus.timeout_seconds,
                clock=now,
                eval_time=clock,
            )
        self.keda: kedaserver.ExternalScaler | None = None
        if acfg.keda.enabled:
            # gRPC and the API stubs cost ~9 MiB of RSS: imported only when KEDA's scaler is served
            from adapter import kedaserver

            self.keda = kedaserver.ExternalScaler(
                self.provider,
                kedascaler.keda_presets(acfg.presets),
                metrics=self.metrics,
                max_age=acfg.cache.max_age_seconds,
                push_interval=acfg.keda.push_interval_seconds,
                max_streams=acfg.keda.max_streams,
                refreshes=self.cache,
                clock=now,
            )
        self._keda_server: grpc.aio.Server | None = None
        self._register_snapshots()
        self.security: Security | None = None
        self.app: web.Application | None = None
        self.certificates: CertificateReloader | None = None
        self._cert_reload_interval = cert_reload_interval
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _register_snapshots(self) -> None:
        def cache_counts() -> dict[tuple[str, ...], float]:
            return self.cache.snapshot()[0] if self.cache is not None else {}

        def cache_ages() -> dict[tuple[str, ...], float]:
            return self.cache.snapshot()[1] if self.cache is not None else {}

        def discovered() -> dict[tuple[str, ...], float]:
            reg = self.discovery.registry
            return {("custom",): float(len(reg.custom)), ("external",): float(len(reg.external))}

        register_snapshots(
            self.collector_registry,
            cache=cache_counts,
            cache_age=cache_ages,
            discovered=discovered,
            ready=lambda: {(): 1.0 if self.not_ready() is None else 0.0},
        )
        keda = self.keda
        if keda is not None:
            register_keda_snapshots(self.collector_registry, streams=lambda: {(): float(keda.open_streams)})

    def not_ready(self) -> str | None:
        """None once every request can be answered, else why not (/readyz and gpuwarden_adapter_ready)."""
        return not_ready_reason(self.discovery.ready, self.index.unsynced() if self.index is not None else [])

    async def _security(self) -> Security | None:
        acfg = self.config.adapter.authentication
        if not acfg.enabled:
            log.warning("authentication is disabled: anyone who reaches the port can read every metric")
            return None
        if self.kube is None:
            raise ConfigError(
                [
                    (
                        "adapter.authentication.enabled",
                        "needs Kubernetes access for "
                        "SubjectAccessReviews; set kubernetes.kubeconfig or disable it",
                    )
                ]
            )
        requestheader, client_cas = await auth.load_trust(acfg, self.kube)
        if requestheader is None:
            log.warning("no front-proxy CA: aggregated requests cannot be authenticated")
        reviews = auth.KubeReviews(self.kube, acfg.cache_ttl_seconds, acfg.refresh_ahead_seconds)
        authenticator = auth.Authenticator(
            requestheader, client_cas, reviews.user_for_token if acfg.token_review else None
        )
        self._spawn(reviews.run_rechecks(), "review re-check")
        return Security(authenticator, reviews.allowed, frozenset(acfg.always_allow_paths))

    async def start(self) -> web.Application:
        """Build the app and start discovery, cache refresh and watches in the background."""
        self.security = await self._security()
        self.app = build_app(
            AdapterState(
                provider=self.provider,
                registry=lambda: self.discovery.registry,
                not_ready=self.not_ready,
                metrics=self.metrics,
                collector_registry=self.collector_registry,
                security=self.security,
                resource=self.resource,
            )
        )
        self._spawn(self.discovery.run(self.config.adapter.relist_interval_seconds), "discovery")
        if self.cache is not None:
            self._spawn(self.cache.run(), "cache refresh")
        if self.kube is not None and self.index is not None:
            for gr in WATCHED:
                self._spawn(watch_objects(self.kube, self.index, gr), f"watch {gr}")
        if self.index is not None:  # watched, or given already filled: settle once it holds everything
            self._spawn(self._settle(), "settle")
        if self.cache is not None:
            self._spawn(self._trim_after_refreshes(self.cache), "memory trim")
        else:
            self._spawn(memtrim.run_trimmer(TRIM_INTERVAL), "memory trim")
        return self.app

    @staticmethod
    async def _trim_after_refreshes(cache: ValueCache[Cached]) -> None:
        """`malloc_trim` right after each cache refresh round, when its decoded answers and the values
        it replaced have just been freed (the burst that sets the RSS; gpuwarden/memtrim.py)."""
        while True:
            await cache.refreshed(cache.rounds)
            memtrim.trim()

    async def _settle(self) -> None:
        """Once the label caches hold every object: move what exists now out of the collector's reach.

        `gc.freeze()`: the index, the informers' stores, the imported modules and the config are kept for
        the life of the process, and a full collection walked all of them — ~20 ms at 10,000 pods, a stall
        every request in flight waited out. Frozen objects are still freed by reference counting; only
        cycles among them would never be collected. Then the list pages' freed memory is handed back.
        """
        assert self.index is not None
        synced = asyncio.Event()
        self.index.on_synced = synced.set
        if not self.index.unsynced():
            synced.set()
        await synced.wait()
        gc.collect()
        gc.freeze()
        memtrim.trim()

    def _ca_sources(
        self,
    ) -> tuple[dict[str, tuple[Certificate, ...]], dict[str, Path], tuple[str, ...]]:
        """(trusted client CAs by kind, the kinds read from a file, the kinds read from the authentication
        ConfigMap) - both watched for changes."""
        if self.security is None:
            return {}, {}, ()
        trust = self.security.authenticator.trust
        cas = {
            "requestheader": trust.requestheader.ca if trust.requestheader else (),
            "client": trust.client_cas,
        }
        acfg = self.config.adapter.authentication
        files = {"requestheader": acfg.requestheader_client_ca_file, "client": acfg.client_ca_file}
        from_configmap = tuple(kind for kind, path in files.items() if path is None) if self.kube else ()
        return cas, {kind: path for kind, path in files.items() if path is not None}, from_configmap

    def _trust_cas(self, cas: Mapping[str, Sequence[Certificate]]) -> None:
        """Hand reloaded CA sets to the authenticator (called by the reloader with the new context)."""
        assert self.security is not None
        authenticator = self.security.authenticator
        names = self.config.adapter.authentication.requestheader_allowed_names or ()
        authenticator.replace_trust(
            auth.retrust(authenticator.trust, cas.get("requestheader", ()), cas.get("client", ()), names)
        )

    def serving_context(self) -> ssl.SSLContext:
        """The TLS context of the secure port; with certificate or CA files, or CAs from the authentication
        ConfigMap, kept current by a reloader."""
        tcfg = self.config.adapter.tls
        cas, ca_files, ca_from_configmap = self._ca_sources()
        trusted = [ca for group in cas.values() for ca in group]
        watched = tcfg.cert_file is not None and tcfg.key_file is not None
        pair = (
            (tcfg.cert_file.read_bytes(), tcfg.key_file.read_bytes())
            if tcfg.cert_file is not None and tcfg.key_file is not None
            else tls.self_signed_in_child(["localhost", socket.gethostname()])
        )
        ctx, cert_pem = tls.server_context(
            None, None, min_version=tcfg.min_version, client_cas=trusted, pair=pair
        )
        expiry = expiry_of(cert_pem)
        if expiry is not None:
            self.metrics.certificate_expiry.set(expiry)
        fetch = None
        if ca_from_configmap and self.kube is not None:
            fetch = functools.partial(auth.fetch_configmap_cas, self.kube, ca_from_configmap)
        if watched or ca_files or fetch is not None:
            self.certificates = CertificateReloader(
                ctx,
                tcfg.cert_file if watched else None,
                tcfg.key_file if watched else None,
                loaded=pair,
                metrics=self.metrics,
                make_context=functools.partial(tls.context_for, min_version=tcfg.min_version),
                interval=self._cert_reload_interval or tcfg.reload_interval_seconds,
                client_cas=cas,
                ca_files=ca_files,
                on_cas=self._trust_cas,
                ca_fetch=fetch,
                ca_fetch_source="ConfigMap {}/{}".format(*auth.AUTH_CONFIGMAP),
            )
            self._spawn(self.certificates.run(), "certificate reload")
        return ctx

    async def listen(self) -> None:
        """Serve `app` (after `start()`) on the secure port, and on the loopback plain port if configured."""
        assert self.app is not None, "start() first"
        acfg = self.config.adapter
        ssl_ctx = self.serving_context()
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, acfg.bind_address, acfg.secure_port, ssl_context=ssl_ctx).start()
        log.info("adapter serving", extra={"address": acfg.bind_address, "port": acfg.secure_port})
        if acfg.insecure_port is not None:
            await web.TCPSite(self._runner, "127.0.0.1", acfg.insecure_port).start()
            log.warning(
                "plain-HTTP listener on 127.0.0.1 (local use only)", extra={"port": acfg.insecure_port}
            )
        await self.serve_keda()

    async def serve_keda(self) -> None:
        """Start KEDA's external scaler (gRPC) when `adapter.keda.enabled`; `listen()` calls it."""
        if self.keda is None or self._keda_server is not None:
            return
        kcfg = self.config.adapter.keda
        if kcfg.tls.plaintext:
            log.warning("KEDA external scaler in plaintext (adapter.keda.tls.plaintext)")
        from adapter import kedaserver

        credentials = kedaserver.server_credentials(kcfg, self._serving_pair, self.metrics)
        self._keda_server = await kedaserver.start_server(self.keda, kcfg, credentials)

    def _serving_pair(self) -> tuple[bytes, bytes]:
        """(certificate, key) PEM of the adapter's serving certificate, or a new self-signed pair."""
        tcfg = self.config.adapter.tls
        if tcfg.cert_file is not None and tcfg.key_file is not None:
            return tcfg.cert_file.read_bytes(), tcfg.key_file.read_bytes()
        return tls.self_signed_in_child(["localhost", socket.gethostname()])

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"adapter {name}"))

    async def stop(self) -> None:
        """Stop listening, cancel the loops and close the clients this adapter created."""
        if self._keda_server is not None:
            await self._keda_server.stop(grace=1.0)
            self._keda_server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.cache is not None:
            await self.cache.aclose()
        if self._owns_prometheus:
            await self.prometheus.aclose()


def not_ready_reason(discovered: bool, unsynced: Sequence[GroupResource]) -> str | None:
    """Why the adapter cannot answer every request yet (None: it can).

    Series discovery must have succeeded once (else every metric is unknown), and every label cache must
    have completed its first list: until then a Pods/Nodes request with a labelSelector answers 503, and an
    aggregator or HPA that saw the adapter ready would get errors instead of values.
    """
    reasons = []
    if not discovered:
        reasons.append("series discovery has not succeeded yet")
    if unsynced:
        names = ", ".join(sorted(str(gr) for gr in unsynced))
        reasons.append(f"the {names} cache is not synced yet")
    return "; ".join(reasons) or None


async def run_adapter(config: Config, *, registry: CollectorRegistry | None = None) -> None:
    """Serve the metrics APIs until cancelled (SIGINT/SIGTERM are the caller's business)."""
    kube = kube_client_for(config, registry)
    if kube is None:
        log.warning("no Kubernetes access: labelSelector cannot be resolved and authentication cannot work")
    adapter = Adapter(config, kube=kube, registry=registry)
    try:
        await adapter.start()
        await adapter.listen()
        await asyncio.Event().wait()
    finally:
        await adapter.stop()
        if kube is not None:
            await kube.aclose()
