"""The extender's port authenticated, end to end (issue 44): the real kube-scheduler, configured with an
extender `tlsConfig` (the CA of our serving certificate, its own client certificate and key), filters,
prioritizes and binds a GPU pod through mutual TLS; a client without a client certificate is refused the
verbs (403) while the probes and /metrics answer it; a client with a certificate of another CA does not
get through the handshake; under the leader bind protocol the replica the scheduler calls forwards bind to
the binder over mutual TLS, presenting its own pair.

The extender runs in this process as the controller runs it (`build_extender`, `Extender.site` with the
lean HTTP path, `extender.tls` with `client_ca_file`), on a thread with its own event loop; the session
scheduler is restarted for this module with our extender and restored afterwards. The certificates come
from a CA generated here (tests/pki.py).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.runtime import Extender, build_extender
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient, LeaderElector, LeaseDurations
from gpuwarden.wellknown import EXTENDER_URL
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, poll
from harness.testbed.scheduler import ExtenderSpec
from tests.e2e.conftest import free_port, gpuwarden_extender, pod_manifest, scheduler_calling
from tests.pki import CA

pytestmark = pytest.mark.e2e

SUFFIX = uuid.uuid4().hex[:5]
POOL = f"mtls-{SUFFIX}"
NODE = f"mtls-{SUFFIX}-0"
PREFIX = "/gpuwarden"
TOPOLOGY = {str(i): {"numa": i // 4, "pcie": f"pci{i // 2}", "nvlink": f"nvl{i // 2}"} for i in range(8)}


class Pki:
    """The extender's serving pair, the scheduler's client pair and a stranger's, in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = CA.new("gpuwarden-extender-ca")
        self.write("ca.crt", self.ca.pem)
        self.pair("tls", *self.ca.issue("localhost", server=True, client_too=True))
        self.pair("scheduler", *self.ca.issue("system:kube-scheduler", server=False))
        self.pair("stranger", *CA.new("stranger-ca").issue("system:kube-scheduler", server=False))

    def write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def pair(self, stem: str, cert: bytes, key: bytes) -> None:
        self.write(f"{stem}.crt", cert)
        self.write(f"{stem}.key", key)

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def client(self, stem: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.path("ca.crt"))
        if stem is not None:
            context.load_cert_chain(self.path(f"{stem}.crt"), self.path(f"{stem}.key"))
        return context


class MtlsExtender:
    """`build_extender` with `extender.tls` (client CA required) served on 127.0.0.1:`port`; with `lease`,
    a replica under the leader bind protocol (as test_extender_scheduler.RunningExtender), forwarding bind
    to the holder over mutual TLS with its own pair."""

    def __init__(self, cluster: Cluster, port: int, pki: Pki, lease: str | None = None) -> None:
        self.cluster, self.port, self.pki, self.lease = cluster, port, pki, lease
        self.elector: LeaderElector | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="extender-mtls", daemon=True)
        self.extender: Extender | None = None
        self.registry = CollectorRegistry()

    async def _start(self) -> None:
        tls = {
            "cert_file": self.pki.path("tls.crt"),
            "key_file": self.pki.path("tls.key"),
            "client_ca_file": self.pki.path("ca.crt"),
        }
        url = f"https://127.0.0.1:{self.port}{PREFIX}"
        section: dict[str, Any] = {"path_prefix": PREFIX, "tls": tls}
        if self.lease is not None:
            section |= {"bind_protocol": "leader", "advertise_url": url}
        config = Config.model_validate(
            {"kubernetes": {"kubeconfig": str(self.cluster.kubeconfig)}, "extender": section}
        )
        self.kube = KubeClient.from_config(kubeconfig=self.cluster.kubeconfig)
        if self.lease is not None:
            self.elector = LeaderElector(
                self.kube, name=self.lease, namespace="default", identity=f"replica-{self.port}",
                durations=LeaseDurations(4.0, 3.0, 0.5), annotations={EXTENDER_URL: url},
            )  # fmt: skip
        self.extender = build_extender(config, self.kube, registry=self.registry, elector=self.elector)
        app = web.Application()

        async def ok(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/readyz", ok)
        app.router.add_get("/metrics", ok)
        self.extender.mount(app)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await self.extender.site(self.runner, "127.0.0.1", self.port, lean=True).start()
        self.feed = asyncio.ensure_future(self.extender.run())
        self.election = asyncio.ensure_future(self.elector.run()) if self.elector is not None else None

    async def _stop(self) -> None:
        self.feed.cancel()
        await asyncio.gather(self.feed, return_exceptions=True)
        await self.runner.cleanup()
        if self.elector is not None and self.election is not None:
            self.elector.stop()
            await asyncio.gather(self.election, return_exceptions=True)
        await self.kube.aclose()

    def counter(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def start(self) -> MtlsExtender:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        poll(lambda: self.extender is not None and self.extender.ready(), timeout=60, what="extender synced")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("extender-mtls"))


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[str]:
    taint = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
    spec = GpuNodeSpec(
        name=NODE, gpus=8, labels={"gpuwarden.io/e2e-pool": POOL}, topology=TOPOLOGY, taints=[taint]
    )
    names = add_gpu_nodes(cluster, [spec])
    try:
        yield NODE
    finally:
        delete_nodes(cluster, names)


def scheduler_spec(port: int, pki: Pki) -> ExtenderSpec:
    """The scheduler calling our extender at `port` over HTTPS: trusting our CA, presenting its pair."""
    return replace(
        gpuwarden_extender(port, PREFIX),
        url_prefix=f"https://127.0.0.1:{port}{PREFIX}",
        enable_https=True,
        tls_config={
            "caFile": pki.path("ca.crt"),
            "certFile": pki.path("scheduler.crt"),
            "keyFile": pki.path("scheduler.key"),
        },
    )


@pytest.fixture(scope="module")
def running(cluster: Cluster, node: str, pki: Pki) -> Iterator[MtlsExtender]:
    """Our extender over mTLS, and the session scheduler calling it with its client certificate."""
    port = free_port()
    extender = MtlsExtender(cluster, port, pki).start()
    try:
        with scheduler_calling(cluster, scheduler_spec(port, pki)):
            yield extender
    finally:
        extender.stop()


def gpu_pod(namespace: str, name: str, gpus: int) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=gpus)
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["nodeSelector"] = {"gpuwarden.io/e2e-pool": POOL}
    pod["spec"]["tolerations"] = [{"key": "gpuwarden.io/e2e-pool", "operator": "Equal", "value": POOL}]
    return pod


def request(port: int, method: str, path: str, context: ssl.SSLContext, body: bytes | None = None) -> int:
    """The HTTP status of one request over TLS with `context` (an `OSError` when the handshake fails)."""
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=context, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_the_scheduler_binds_through_mutual_tls(
    cluster: Cluster, namespace: str, running: MtlsExtender
) -> None:
    cluster.apply(gpu_pod(namespace, "mtls-4gpu", 4))

    def bound() -> bool:
        obj = cluster.get_json("pods", "mtls-4gpu", "-n", namespace)
        return bool(obj["spec"].get("nodeName"))

    poll(bound, timeout=60, what="pod bound through the mTLS extender")
    obj = cluster.get_json("pods", "mtls-4gpu", "-n", namespace)
    assert obj["spec"]["nodeName"] == NODE
    ids = obj["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(",")
    assert len(ids) == 4 and len({TOPOLOGY[i]["numa"] for i in ids}) == 1, ids  # the extender bound it
    assert running.counter("gpuwarden_extender_requests_total", {"verb": "bind", "outcome": "ok"}) >= 1
    assert running.counter("gpuwarden_extender_requests_total", {"verb": "filter", "outcome": "ok"}) >= 1
    assert running.counter("gpuwarden_extender_client_certificate_refusals_total") == 0


def test_a_client_without_the_client_certificate_is_refused(pki: Pki, running: MtlsExtender) -> None:
    anonymous = pki.client(None)
    bind = json.dumps({"PodName": "x", "PodNamespace": "y", "PodUID": "z", "Node": NODE}).encode()
    refused_before = running.counter("gpuwarden_extender_client_certificate_refusals_total")
    assert request(running.port, "POST", f"{PREFIX}/bind", anonymous, bind) == 403
    assert request(running.port, "POST", f"{PREFIX}/filter", anonymous, b"{}") == 403
    assert request(running.port, "GET", "/readyz", anonymous) == 200  # the kubelet's probe
    assert request(running.port, "GET", "/metrics", anonymous) == 200  # Prometheus' scrape
    assert running.counter("gpuwarden_extender_client_certificate_refusals_total") == refused_before + 2
    with pytest.raises(OSError):  # ssl.SSLError, or a reset: another CA's certificate fails the handshake
        request(running.port, "GET", "/readyz", pki.client("stranger"))


def test_a_follower_forwards_bind_to_the_binder_over_mutual_tls(
    cluster: Cluster, namespace: str, node: str, pki: Pki
) -> None:
    """Leader bind protocol: the scheduler calls replica B, A holds the Lease; B forwards bind to A's
    `bind/forwarded`, a verb like the others, presenting its own pair - A binds it."""
    lease = f"mtls-binder-{SUFFIX}"
    a = MtlsExtender(cluster, free_port(), pki, lease).start()
    try:
        poll(lambda: a.elector is not None and a.elector.fenced(), timeout=30, what="replica A leading")
        b = MtlsExtender(cluster, free_port(), pki, lease).start()
        try:
            with scheduler_calling(cluster, scheduler_spec(b.port, pki)):
                cluster.apply(gpu_pod(namespace, "fwd-2gpu", 2))

                def bound() -> bool:
                    return bool(cluster.get_json("pods", "fwd-2gpu", "-n", namespace)["spec"].get("nodeName"))

                poll(bound, timeout=60, what="pod bound by the binder through the follower")
            forwarded = b.counter("gpuwarden_extender_binds_forwarded_total", {"outcome": "ok"})
            by_binder = a.counter(
                "gpuwarden_extender_requests_total", {"verb": "bind_forwarded", "outcome": "ok"}
            )
            assert (forwarded, by_binder) == (1, 1)
            assert a.counter("gpuwarden_extender_client_certificate_refusals_total") == 0
            obj = cluster.get_json("pods", "fwd-2gpu", "-n", namespace)
            assert len(obj["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(",")) == 2
        finally:
            b.stop()
    finally:
        a.stop()
