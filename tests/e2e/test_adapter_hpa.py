"""The real HPA controller scales a Deployment on metrics served by OUR adapter through a real APIService.

Everything on the path is real: an exporter (in this test) publishes dcgm-exporter-style GPU utilization and
`http_requests_total` for the Deployment's actual pods; a real Prometheus scrapes it every second; the
adapter (`run_adapter`, as `gpuwarden adapter` runs it) serves `custom.metrics.k8s.io` and
`external.metrics.k8s.io` over TLS with a given serving certificate, authenticates kube-apiserver's
front-proxy certificate from `kube-system/extension-apiserver-authentication`, and watches pods for
`labelSelector`; kube-aggregator reaches it through APIServices (ExternalName -> 127.0.0.1, real caBundle);
kube-controller-manager's HPA controller (sync 2 s) reads the two Pods metrics and scales.

Scenario: GPU utilization rises -> scale up to the maximum; utilization drops but QPS stays high -> stay;
QPS falls -> scale down to one. Direct, unauthenticated calls to the adapter are rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.app import run_adapter
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, scrape_target
from harness.testbed import (
    Cluster,
    LocalAPIService,
    poll,
    register_local_apiservice,
    wait_apiservice_available,
)
from harness.testbed.apiservice import delete_local_apiservice
from harness.testbed.pki import make_ca, serving_cert_for_service
from tests.e2e.conftest import BackgroundServer, free_port, pod_manifest
from tests.e2e.engine_workload import VllmShaped

pytestmark = pytest.mark.e2e

APP = "llm"
ZERO = "llm-zero"  # scaled 0 -> N -> 0 by an HPA on an External metric (HPAScaleToZero)
SERVICE = "gpuwarden-adapter-e2e"


@dataclass
class Workload:
    """What the exporter publishes for every current pod of the Deployment; the test turns the knobs."""

    cluster: Cluster
    namespace: str
    utilization: float = 20.0
    qps: float = 1.0
    gateway_qps: float = 0.0  # requests/s a gateway in front of ZERO sees: exists with no pod running
    engine: VllmShaped | None = None  # a vLLM-shaped Deployment's series (tests/e2e/engine_workload.py)
    _counters: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.monotonic)
    _pods: list[str] = field(default_factory=list)
    _pods_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pods(self) -> list[str]:
        if time.monotonic() - self._pods_at > 1.0:
            items = self.cluster.get_json("pods", "-n", self.namespace, "-l", f"app={APP}")["items"]
            self._pods = [p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"]
            self._pods_at = time.monotonic()
        return self._pods

    def exposition(self) -> str:
        with self._lock:
            now = time.monotonic()
            dt, self._last = now - self._last, now
            lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
            pods = self.pods()
            for i, pod in enumerate(pods):
                labels = (
                    f'gpu="0",UUID="GPU-{i}",Hostname="gpu-node-0",pod="{pod}",namespace="{self.namespace}"'
                )
                lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {self.utilization}")
            lines.append("# TYPE http_requests_total counter")
            for pod in pods:
                self._counters[pod] = self._counters.get(pod, 0.0) + self.qps * dt
                labels = f'pod="{pod}",namespace="{self.namespace}"'
                lines.append(f"http_requests_total{{{labels}}} {self._counters[pod]:.3f}")
            self._counters[ZERO] = self._counters.get(ZERO, 0.0) + self.gateway_qps * dt
            lines.append("# TYPE gateway_requests_total counter")
            labels = f'service="{ZERO}",namespace="{self.namespace}"'
            lines.append(f"gateway_requests_total{{{labels}}} {self._counters[ZERO]:.3f}")
        if self.engine is not None:
            lines += self.engine.lines()
        return "\n".join(lines) + "\n"


class AdapterThread:
    """`run_adapter` on its own event loop, as the CLI runs it; stopped by cancelling its task."""

    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, args=(config, registry), daemon=True)

    def _run(self, config: Config, registry: CollectorRegistry) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(run_adapter(config, registry=registry))
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)

    def start(self) -> AdapterThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=20)


def _replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", APP, "-n", namespace)["spec"]["replicas"])


def _wait_replicas(cluster: Cluster, namespace: str, want: int, timeout: float = 120) -> None:
    try:
        poll(lambda: _replicas(cluster, namespace) == want, timeout=timeout, what=f"{APP} replicas == {want}")
    except TimeoutError as exc:
        describe = cluster.kubectl("describe", "hpa", APP, "-n", namespace, check=False)
        raise AssertionError(f"{exc}\n--- kubectl describe hpa\n{describe}") from exc


def _get(url: str, cafile: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(cafile))
    ctx.check_hostname = False
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def stack(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> Iterator[tuple[Workload, CollectorRegistry, int, Path]]:
    workload = Workload(cluster, namespace)

    async def metrics(_: web.Request) -> web.Response:
        text = await asyncio.to_thread(workload.exposition)
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = BackgroundServer(app).start()
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("app", f"127.0.0.1:{exporter.port}", honor_labels=True)]
    )
    asyncio.run(prom.start())
    ca = make_ca("gpuwarden-adapter-e2e-ca")
    cert, key = serving_cert_for_service(ca, SERVICE, "kube-system").write(tmp_path / "tls", "serving")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "timeout_seconds": 5},
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
            "adapter": {
                "secure_port": port,
                "bind_address": "127.0.0.1",
                "tls": {"cert_file": str(cert), "key_file": str(key)},
                "relist_interval_seconds": 5,
                "cache": {"refresh_interval_seconds": 1, "max_age_seconds": 10},
                "presets": {"requests_per_second": {"rate_window_seconds": 10}},
                "externalRules": [
                    {
                        "seriesQuery": 'gateway_requests_total{namespace!="",service!=""}',
                        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                        "name": {"matches": "^gateway_requests_total$", "as": "gateway_requests_per_second"},
                        "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[10s])) by (namespace)",
                    }
                ],
            },
        }
    )
    registry = CollectorRegistry()
    adapter = AdapterThread(config, registry).start()
    registered: list[LocalAPIService] = []
    try:
        poll(
            lambda: _get(f"https://127.0.0.1:{port}/readyz", tmp_path / "ca.crt") == 200,
            timeout=60,
            what="adapter ready",
        )
        for group, version in (("custom.metrics.k8s.io", "v1beta2"), ("external.metrics.k8s.io", "v1beta1")):
            reg = register_local_apiservice(
                cluster, group=group, version=version, port=port, service_name=SERVICE, ca_bundle=ca.cert_pem
            )
            registered.append(reg)
            wait_apiservice_available(cluster, reg.name, timeout=90)
        yield workload, registry, port, tmp_path / "ca.crt"
    finally:
        for reg in registered:
            delete_local_apiservice(cluster, reg)
        adapter.stop()
        asyncio.run(prom.stop())
        exporter.stop()


def _deploy(cluster: Cluster, namespace: str) -> None:
    pod = pod_manifest(APP, gpus=1, nodeSelector={"nvidia.com/gpu.present": "true"})
    pods_metric: list[dict[str, Any]] = [
        {
            "type": "Pods",
            "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": t}},
        }
        for name, t in (("gpu_utilization", "50"), ("requests_per_second", "10"))
    ]
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": APP}},
                "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
            },
        },
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": pods_metric,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )


def test_hpa_scales_on_gpu_utilization_and_qps_from_our_adapter(
    cluster: Cluster, namespace: str, stack: tuple[Workload, CollectorRegistry, int, Path]
) -> None:
    workload, registry, port, cafile = stack

    # Unauthenticated direct calls are rejected; probes stay open.
    base = f"https://127.0.0.1:{port}"
    assert (
        _get(
            f"{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/gpu_utilization", cafile
        )
        == 401
    )
    assert _get(f"{base}/metrics", cafile) == 401
    assert _get(f"{base}/healthz", cafile) == 200

    workload.utilization, workload.qps = 20.0, 1.0
    _deploy(cluster, namespace)
    time.sleep(8)  # several HPA syncs at low load: no scaling
    assert _replicas(cluster, namespace) == 1

    workload.utilization = 90.0  # 90 / 50 per pod -> 2 -> 4 (max)
    _wait_replicas(cluster, namespace, 4)
    hpa = cluster.get_json("hpa", APP, "-n", namespace)
    current = {
        m["pods"]["metric"]["name"]: m["pods"]["current"]["averageValue"]
        for m in hpa["status"]["currentMetrics"]
    }
    assert set(current) == {"gpu_utilization", "requests_per_second"}, current

    workload.utilization, workload.qps = 20.0, 30.0  # QPS 30 / 10 keeps 4 although the GPUs idle
    time.sleep(10)
    assert _replicas(cluster, namespace) == 4

    workload.qps = 2.0  # QPS falls: 20/50 and 2/10 -> scale in to 1
    _wait_replicas(cluster, namespace, 1)

    # Through the aggregator the HPA (not just the probes) read values: wildcard requests were answered.
    served = registry.get_sample_value(
        "gpuwarden_adapter_requests_total", {"route": "custom_wildcard", "code": "200"}
    )
    assert served and served > 0
    body = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
            f"gpu_utilization?labelSelector=app%3D{APP}",
        )
    )
    assert body["kind"] == "MetricValueList" and body["items"], body
    assert {i["value"] for i in body["items"]} == {"20"}


def _zero_replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", ZERO, "-n", namespace)["spec"].get("replicas", 0))


def _wait_zero(cluster: Cluster, namespace: str, want: int) -> float:
    t0 = time.monotonic()
    try:
        poll(
            lambda: _zero_replicas(cluster, namespace) == want,
            timeout=120,
            what=f"{ZERO} replicas == {want}",
        )
    except TimeoutError as exc:
        describe = cluster.kubectl("describe", "hpa", ZERO, "-n", namespace, check=False)
        raise AssertionError(f"{exc}\n--- kubectl describe hpa\n{describe}") from exc
    return time.monotonic() - t0


def test_hpa_scales_to_zero_and_back_on_our_external_metric(
    cluster: Cluster, namespace: str, stack: tuple[Workload, CollectorRegistry, int, Path]
) -> None:
    """`minReplicas: 0` on an External metric (HPAScaleToZero; beta and on by default from 1.37, the test bed
    turns the gate on for older releases): no KEDA needed to park an inference Deployment at zero."""
    workload, registry, _, _ = stack
    workload.gateway_qps = 0.0
    pod = pod_manifest(ZERO, gpus=1, nodeSelector={"nvidia.com/gpu.present": "true"})
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": ZERO, "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": ZERO}},
                "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
            },
        },
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": ZERO, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": ZERO},
                "minReplicas": 0,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "External",
                        "external": {
                            "metric": {
                                "name": "gateway_requests_per_second",
                                "selector": {"matchLabels": {"service": ZERO}},
                            },
                            "target": {"type": "AverageValue", "averageValue": "5"},
                        },
                    }
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )
    hpa = cluster.get_json("hpa", ZERO, "-n", namespace)
    assert hpa["spec"]["minReplicas"] == 0, hpa["spec"]  # the API server kept it: the gate is on

    down = _wait_zero(cluster, namespace, 0)  # no traffic: 1 -> 0
    workload.gateway_qps = 12.0  # 12 req/s / 5 per replica -> 3, from zero
    up = _wait_zero(cluster, namespace, 3)
    status = cluster.get_json("hpa", ZERO, "-n", namespace)["status"]
    value = status["currentMetrics"][0]["external"]["current"]["averageValue"]
    workload.gateway_qps = 0.0  # traffic stops: back to zero
    again = _wait_zero(cluster, namespace, 0)
    print(
        f"\n[e2e] HPA scale-to-zero on gateway_requests_per_second: 1 -> 0 in {down:.1f}s, "
        f"0 -> 3 in {up:.1f}s (averageValue {value}), 3 -> 0 in {again:.1f}s"
    )
    served = registry.get_sample_value(
        "gpuwarden_adapter_requests_total", {"route": "external", "code": "200"}
    )
    assert served and served > 0
