"""Fixtures of the e2e tier: one real control plane per session, plus the small servers the proofs need.

The cluster is created once per session (kwokctl binary runtime, binaries from ``make testbed``) with two fake
GPU nodes and a KubeSchedulerConfiguration whose extender points at a port reserved here, so the extender test
can serve it later. The extender is only "interested" in pods requesting ``gpuwarden.io/extender-probe``,
so no other test depends on it. If the binaries are missing, every test errors with the build instruction
instead of being skipped: ``make e2e`` builds them first, so a missing build is a real failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes import client as k8s

from gpuwarden import ports
from harness.localprom import scrape_target
from harness.testbed import (
    Binaries,
    Cluster,
    ClusterConfig,
    ExtenderSpec,
    GpuNodeSpec,
    LocalAPIService,
    SchedulerSettings,
    TestbedMissingError,
    add_gpu_nodes,
    delete_local_apiservice,
    ensure_namespace,
    register_local_apiservice,
    scheduler_configuration,
    wait_apiservice_available,
)
from harness.testbed.binaries import repo_root
from harness.testbed.cluster import sum_rss
from harness.testbed.pki import KeyPair, make_ca, serving_cert_for_service
from harness.testbed.realnode import RealNode, RealNodeSpec

EXTENDER_PROBE_RESOURCE = "gpuwarden.io/extender-probe"
REAL_NODE = "real-node-0"
KWOK_NODE = "kwok-gpu-0"
GPU_NODES = ("gpu-node-0", "gpu-node-1")


def free_port() -> int:
    """A free loopback TCP port, never handed out twice in this process (`gpuwarden.ports`)."""
    return ports.free_port("127.0.0.1")


# ------------------------------------------------------------------------------------------ local servers
class BackgroundServer:
    """Runs an aiohttp app on 127.0.0.1 in its own thread and event loop (tests stay synchronous)."""

    def __init__(
        self, app: web.Application, *, port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.app = app
        self.port = port
        self._ssl = ssl_context
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="e2e-server", daemon=True)
        self._runner: web.AppRunner | None = None

    async def _start(self) -> int:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl)
        await site.start()
        return int(self._runner.addresses[0][1])

    def start(self) -> BackgroundServer:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class KubeletMetricsRelay:
    """A real node's kubelet ``/metrics/cadvisor`` and ``/metrics/resource``, read through kube-apiserver's
    node proxy and served as they are on 127.0.0.1 (``/cadvisor``, ``/resource``) for a host Prometheus to
    scrape: the kubelet's port wants a client certificate the test Prometheus has not got.

    ``targets`` are the scrape configs (jobs ``kubelet-cadvisor`` and ``kubelet-resource``, ``honor_labels``
    so the kubelet's ``namespace``/``pod``/``container`` labels are kept as kube-prometheus keeps them).
    """

    ENDPOINTS = ("cadvisor", "resource")

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self._server: BackgroundServer | None = None

    def scrape(self, endpoint: str) -> str:
        return self.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{self.node}/proxy/metrics/{endpoint}")

    def start(self) -> KubeletMetricsRelay:
        async def relay(request: web.Request) -> web.Response:
            text = await asyncio.to_thread(self.scrape, request.match_info["endpoint"])
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/{endpoint:cadvisor|resource}", relay)
        self._server = BackgroundServer(app).start()
        return self

    def targets(self, scrape_interval_seconds: float = 2) -> list[dict[str, Any]]:
        assert self._server is not None, "start() first"
        return [
            scrape_target(
                f"kubelet-{e}", f"127.0.0.1:{self._server.port}", metrics_path=f"/{e}", honor_labels=True,
                scrape_interval_seconds=scrape_interval_seconds,
            )
            for e in self.ENDPOINTS
        ]  # fmt: skip

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


@dataclass
class RecordedRequest:
    """What a local server saw."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    remote_groups: list[str]
    peer_cn: str | None = None


def _peer_cn(request: web.Request) -> str | None:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


@dataclass
class AggregatedServer:
    """A tiny aggregated API server: discovery for its groups plus custom.metrics.k8s.io/v1beta2 values.

    It requires a client certificate signed by the cluster's front-proxy CA (as a real aggregated server
    doing requestheader authentication would) and records every request with its identity headers.
    """

    cluster: Cluster
    service_name: str = "e2e-aggregated"
    namespace: str = "kube-system"
    resources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """groupVersion -> APIResourceList resources."""
    metric_values: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    """(namespace, resource, name, metric) -> quantity string, for custom.metrics.k8s.io."""
    requests: list[RecordedRequest] = field(default_factory=list)
    _server: BackgroundServer | None = None
    _registered: list[LocalAPIService] = field(default_factory=list)
    _ca: KeyPair | None = None

    def start(self) -> AggregatedServer:
        assert self.cluster.front_proxy is not None
        self._ca = make_ca("e2e-aggregated-serving-ca")
        serving = serving_cert_for_service(self._ca, self.service_name, self.namespace)
        tls_dir = self.cluster.workdir / f"tls-{self.service_name}"
        cert, key = serving.write(tls_dir, "serving")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(cafile=str(self.cluster.front_proxy.ca_cert))
        ctx.verify_mode = ssl.CERT_REQUIRED
        app = web.Application()
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/apis/{group}/{version}", self._resource_list)
        app.router.add_get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/{resource}/{name}/{metric}", self._metric
        )
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._server = BackgroundServer(app, ssl_context=ctx).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.port

    def register(self, group: str, version: str, resources: list[dict[str, Any]]) -> LocalAPIService:
        """Serve ``group/version`` here and register its APIService (with a real caBundle)."""
        assert self._ca is not None
        self.resources[f"{group}/{version}"] = resources
        reg = register_local_apiservice(
            self.cluster,
            group=group,
            version=version,
            port=self.port,
            service_name=self.service_name,
            namespace=self.namespace,
            ca_bundle=self._ca.cert_pem,
        )
        self._registered.append(reg)
        return reg

    def wait_available(self, reg: LocalAPIService, timeout: float = 60) -> dict[str, Any]:
        return wait_apiservice_available(self.cluster, reg.name, timeout=timeout)

    def close(self) -> None:
        """APIServices first (so discovery never sees a dead backend), then the server."""
        for reg in self._registered:
            delete_local_apiservice(self.cluster, reg)
        if self._server is not None:
            self._server.stop()

    def _record(self, request: web.Request) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith(("x-remote-", "accept"))}
        groups = list(request.headers.getall("X-Remote-Group", []))
        self.requests.append(
            RecordedRequest(
                request.method, request.path, request.query_string, headers, groups, _peer_cn(request)
            )
        )

    @staticmethod
    def _json(obj: Any, status: int = 200) -> web.Response:
        return web.Response(text=json.dumps(obj), status=status, content_type="application/json")

    async def _apis(self, request: web.Request) -> web.Response:
        self._record(request)
        groups: dict[str, list[str]] = {}
        for gv in self.resources:
            group, version = gv.split("/")
            groups.setdefault(group, []).append(version)
        return self._json(
            {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in groups.items()
                ],
            }
        )

    async def _resource_list(self, request: web.Request) -> web.Response:
        self._record(request)
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        if gv not in self.resources:
            return await self._not_found(request, record=False)
        return self._json(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": gv,
                "resources": self.resources[gv],
            }
        )

    async def _metric(self, request: web.Request) -> web.Response:
        self._record(request)
        m = request.match_info
        key = (m["ns"], m["resource"], m["name"], m["metric"])
        value = self.metric_values.get(key)
        if value is None:
            return await self._not_found(request, record=False)
        kind = {"deployments.apps": ("Deployment", "apps/v1"), "pods": ("Pod", "v1")}.get(
            m["resource"], ("Unknown", "v1")
        )
        item = {
            "describedObject": {
                "kind": kind[0],
                "namespace": m["ns"],
                "name": m["name"],
                "apiVersion": kind[1],
            },
            "metric": {"name": m["metric"], "selector": None},
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "windowSeconds": 0,
            "value": value,
        }
        return self._json(
            {
                "kind": "MetricValueList",
                "apiVersion": "custom.metrics.k8s.io/v1beta2",
                "metadata": {},
                "items": [item],
            }
        )

    async def _not_found(self, request: web.Request, record: bool = True) -> web.Response:
        if record:
            self._record(request)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"{request.path} not found",
            "reason": "NotFound",
            "code": 404,
        }
        return self._json(status, status=404)


@dataclass
class ExtenderServer:
    """A scheduler extender (kube-scheduler extender/v1 wire format); tests choose its filter answer."""

    port: int
    allow: Callable[[str], bool] = lambda _node: True
    filter_requests: list[dict[str, Any]] = field(default_factory=list)
    prioritize_requests: list[dict[str, Any]] = field(default_factory=list)
    _server: BackgroundServer | None = None

    def start(self) -> ExtenderServer:
        app = web.Application()
        app.router.add_post("/scheduler/filter", self._filter)
        app.router.add_post("/scheduler/prioritize", self._prioritize)
        self._server = BackgroundServer(app, port=self.port).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    async def _filter(self, request: web.Request) -> web.Response:
        args = await request.json()
        self.filter_requests.append(args)
        nodes = (args.get("Nodes") or {}).get("items") or []
        passed = [n for n in nodes if self.allow(n["metadata"]["name"])]
        failed = {
            n["metadata"]["name"]: "rejected by the e2e test extender" for n in nodes if n not in passed
        }
        result = {
            "Nodes": {"metadata": {}, "items": passed},
            "NodeNames": None,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        return web.json_response(result)

    async def _prioritize(self, request: web.Request) -> web.Response:
        args = await request.json()
        self.prioritize_requests.append(args)
        nodes = (args.get("Nodes") or {}).get("items") or []
        return web.json_response([{"Host": n["metadata"]["name"], "Score": 0} for n in nodes])


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def extender_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, extender_port: int) -> Iterator[Cluster]:
    missing: str | None = None
    try:
        binaries = Binaries.locate()
    except TestbedMissingError as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    scheduler = scheduler_configuration(
        SchedulerSettings(
            extenders=[
                ExtenderSpec(
                    url_prefix=f"http://127.0.0.1:{extender_port}/scheduler",
                    filter_verb="filter",
                    prioritize_verb="prioritize",
                    weight=1,
                    managed_resources=[EXTENDER_PROBE_RESOURCE],
                    ignored_by_scheduler=True,
                )
            ]
        )
    )
    config = ClusterConfig(
        name=f"gw-e2e-{os.getpid()}",
        workdir=tmp_path_factory.mktemp("kwok"),
        scheduler_config=scheduler,
        hpa_sync_period="2s",
        hpa_downscale_stabilization="3s",
        # HPA minReplicas 0 on Object/External metrics: beta and on by default from 1.37, alpha before.
        kwokctl_options={"kubeFeatureGates": "HPAScaleToZero=true"},
    )
    t0 = time.monotonic()
    created = Cluster.create(config, binaries)
    try:
        add_gpu_nodes(
            created,
            [
                GpuNodeSpec(
                    name=name,
                    gpus=8,
                    # the gpuwarden.io/gpu-topology format (gpuwarden/wellknown.py): gpu id -> numa,
                    # pcie switch, nvlink.
                    topology={
                        str(g): {"numa": g // 4, "pcie": f"pci{g // 2}", "nvlink": f"nvl{g // 4}"}
                        for g in range(8)
                    },
                )
                for name in GPU_NODES
            ],
        )
        ready_s = time.monotonic() - t0
        rss = created.control_plane_rss()
        metrics = {
            "cluster_create_to_ready_s": round(created.timings.get("ready_s", 0.0), 1),
            "cluster_plus_gpu_nodes_ready_s": round(ready_s, 1),
            "control_plane_rss_mib": {k: round(v / 2**20) for k, v in rss.items()},
            "control_plane_rss_sum_mib": round(sum_rss(rss) / 2**20),
            "versions": binaries.versions,
        }
        print(f"\n[e2e] test bed metrics: {json.dumps(metrics)}", file=sys.stderr)
        out = repo_root() / ".cache" / "testbed" / "last-e2e-metrics.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2) + "\n")
        yield created
        rss_end = created.control_plane_rss()
        metrics["control_plane_rss_sum_mib_at_end"] = round(sum_rss(rss_end) / 2**20)
        metrics["session_s"] = round(time.monotonic() - t0, 1)
        out.write_text(json.dumps(metrics, indent=2) + "\n")
    finally:
        t_down = time.monotonic()
        created.delete()
        print(f"\n[e2e] test bed teardown took {time.monotonic() - t_down:.1f}s", file=sys.stderr)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards without waiting (kwok removes the pods)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    ensure_namespace(cluster, name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def aggregated_server(cluster: Cluster) -> Iterator[AggregatedServer]:
    server = AggregatedServer(cluster, service_name=f"e2e-agg-{uuid.uuid4().hex[:5]}").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def extender(extender_port: int) -> Iterator[ExtenderServer]:
    server = ExtenderServer(port=extender_port).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        name=f"gw-node-{os.getpid()}",
        workdir=tmp_path_factory.mktemp("kwok-node"),
        real_nodes=[RealNodeSpec(name=REAL_NODE)],
    )
    created = Cluster.create(config, Binaries.locate())
    try:
        add_gpu_nodes(created, [GpuNodeSpec(name=KWOK_NODE, gpus=8)])
        node = created.real_node()
        rss = {k: round(v / 2**20) for k, v in node.rss().items()}
        print(f"\n[e2e] real node: timings {node.timings} rss_mib {rss}")
        yield created
    finally:
        created.delete()


@pytest.fixture
def real_node(node_cluster: Cluster) -> RealNode:
    return node_cluster.real_node()


@pytest.fixture
def node_ns(node_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"{re.sub(r'[^a-z0-9-]+', '-', request.node.name.lower())[:30].strip('-')}-{uuid.uuid4().hex[:5]}"
    ensure_namespace(node_cluster, name)
    yield name
    node_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def node_core(node_cluster: Cluster) -> Iterator[k8s.CoreV1Api]:
    api = node_cluster.api_client()
    try:
        yield k8s.CoreV1Api(api)
    finally:
        api.close()


def gpuwarden_extender(port: int, prefix: str) -> ExtenderSpec:
    """kube-scheduler calling all four of our verbs for `nvidia.com/gpu` pods, as docs/extender.md configures
    it (nodeCacheCapable, weight 12, not ignorable, 5 s timeout)."""
    return ExtenderSpec(
        url_prefix=f"http://127.0.0.1:{port}{prefix}",
        filter_verb="filter",
        prioritize_verb="prioritize",
        preempt_verb="preempt",
        bind_verb="bind",
        weight=12,
        node_cache_capable=True,
        ignorable=False,
        http_timeout="5s",
        managed_resources=["nvidia.com/gpu"],
        ignored_by_scheduler=False,
    )


@contextmanager
def scheduler_calling(cluster: Cluster, spec: ExtenderSpec) -> Iterator[None]:
    """The session scheduler restarted with `spec` as its only extender; the original configuration back
    afterwards."""
    original = yaml.safe_load(Path(cluster.scheduler_config_path()).read_text())
    cluster.restart_scheduler(scheduler_configuration(SchedulerSettings(extenders=[spec])))
    try:
        yield
    finally:
        cluster.restart_scheduler(original)


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    extra_limits: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod (or pod template body) for kwok: the image is never pulled."""
    limits = {"cpu": "100m", "memory": "64Mi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    limits.update(extra_limits or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.invalid/gpuwarden/e2e:0", "resources": {"limits": limits}}
            ],
            **spec,
        },
    }


def repo_path(*parts: str) -> Path:
    return repo_root().joinpath(*parts)
