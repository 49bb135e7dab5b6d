"""`kubectl top` and the real HPA controller read metrics.k8s.io from OUR adapter, through a real APIService.

Everything on the path is real but the exporter: it publishes cAdvisor-shaped container series
(`container_cpu_usage_seconds_total`, `container_memory_working_set_bytes`, plus the pod-level `container=""`
cgroup that doubles totals when served) for the test's real pods, and node-exporter-shaped series
(`node_cpu_seconds_total` joined through `node_namespace_pod:kube_pod_info:`, `node_memory_MemTotal_bytes` /
`MemAvailable_bytes`) for every node of the cluster. A real Prometheus scrapes it every second; the adapter
(`run_adapter`, as `gpuwarden adapter` runs it) loads kube-prometheus's own adapter config file unchanged
except for the rate ranges, scaled from kube-prometheus' 4 x 30 s to 4 x this test's 1 s scrape interval (the
HPA ignores a new pod's CPU until its ready time plus the reported `window`); it serves over TLS, checks the
aggregator's front-proxy certificate and asks kube-apiserver (SubjectAccessReview) whether the HPA
controller may list PodMetrics. The built `kubectl top` prints what Prometheus holds; the HPA scales a
Deployment on a `type: Resource` cpu `averageUtilization` target; with Prometheus stopped both get errors.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

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
from tests.e2e.conftest import REAL_NODE, BackgroundServer, KubeletMetricsRelay, free_port, pod_manifest
from tests.e2e.test_adapter_hpa import AdapterThread, _get

pytestmark = pytest.mark.e2e

APP = "cpu-app"
SERVICE = "gpuwarden-resource-metrics-e2e"
REPO = Path(__file__).resolve().parents[2]
KUBE_PROMETHEUS = REPO / "tests/unit/golden/adapter/resource/kube-prometheus-config.yaml"
MEMORY = 50 * 2**20  # working set per container: kubectl prints 50Mi
NODE_TOTAL, NODE_AVAILABLE = 16 * 2**30, 12 * 2**30  # kubectl prints 4096Mi per node
NODE_IDLE = 0.75  # per cpu, 2 cpus: 500m per node


@dataclass
class Exporter:
    """cAdvisor and node-exporter look-alikes for the cluster's current pods and nodes."""

    cluster: Cluster
    namespace: str
    cores: float = 0.02  # per pod; the pods request 100m
    _cpu: dict[str, float] = field(default_factory=dict)
    _idle: float = 0.0
    _last: float = field(default_factory=time.monotonic)
    _pods: list[str] = field(default_factory=list)
    _nodes: list[str] = field(default_factory=list)
    _listed: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _list(self) -> None:
        if time.monotonic() - self._listed > 1.0:
            items = self.cluster.get_json("pods", "-n", self.namespace)["items"]
            self._pods = [p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"]
            self._nodes = [n["metadata"]["name"] for n in self.cluster.get_json("nodes")["items"]]
            self._listed = time.monotonic()

    def exposition(self) -> str:
        with self._lock:
            now = time.monotonic()
            dt, self._last = now - self._last, now
            self._list()
            cpu = ["# TYPE container_cpu_usage_seconds counter"]
            memory = ["# TYPE container_memory_working_set_bytes gauge"]
            for pod in self._pods:
                self._cpu[pod] = self._cpu.get(pod, 0.0) + self.cores * dt
                base = f'namespace="{self.namespace}",pod="{pod}",job="kubelet"'
                cpu.append(
                    f'container_cpu_usage_seconds_total{{{base},container="main"}} {self._cpu[pod]:.9f}'
                )
                cpu.append(f'container_cpu_usage_seconds_total{{{base},container=""}} {self._cpu[pod]:.9f}')
                memory.append(f'container_memory_working_set_bytes{{{base},container="main"}} {MEMORY}')
                memory.append(f'container_memory_working_set_bytes{{{base},container=""}} {MEMORY * 2}')
            self._idle += NODE_IDLE * dt
            nodes = ["# TYPE node_cpu_seconds counter"]
            info = ["# TYPE node_namespace_pod:kube_pod_info: gauge"]
            mem = ["# TYPE node_memory_MemTotal_bytes gauge", "# TYPE node_memory_MemAvailable_bytes gauge"]
            for node in self._nodes:
                exporter = f'namespace="monitoring",pod="node-exporter-{node}"'
                for c in ("0", "1"):
                    nodes.append(
                        f'node_cpu_seconds_total{{{exporter},instance="{node}",cpu="{c}",mode="idle"}} '
                        f"{self._idle:.9f}"
                    )
                info.append(f'node_namespace_pod:kube_pod_info:{{{exporter},node="{node}"}} 1')
                job = f'job="node-exporter",instance="{node}"'
                mem.append(f"node_memory_MemTotal_bytes{{{job}}} {NODE_TOTAL}")
                mem.append(f"node_memory_MemAvailable_bytes{{{job}}} {NODE_AVAILABLE}")
            return "\n".join(cpu + memory + nodes + info + mem) + "\n"


@dataclass
class Stack:
    exporter: Exporter
    prometheus: LocalPrometheus
    registry: CollectorRegistry


def e2e_config(
    prom_url: str, cluster: Cluster, port: int, cert: Path, key: Path, rate_range: str = "4s"
) -> Config:
    adapter = yaml.safe_load(KUBE_PROMETHEUS.read_text())
    for rule in adapter["resourceRules"].values():
        if isinstance(rule, dict):
            for query in ("containerQuery", "nodeQuery"):
                rule[query] = re.sub(r"\[(120s|60s|4m)\]", f"[{rate_range}]", rule[query])
    return Config.model_validate(
        {
            "prometheus": {"url": prom_url, "timeout_seconds": 5},
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
            "adapter": {
                **adapter,
                "secure_port": port,
                "bind_address": "127.0.0.1",
                "tls": {"cert_file": str(cert), "key_file": str(key)},
                "cache": {"refresh_interval_seconds": 1, "max_age_seconds": 5},
                "presets": {
                    p: {"enabled": False}
                    for p in ("gpu_utilization", "gpu_memory_used_ratio", "requests_per_second")
                },
            },
        }
    )


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    namespace = f"resource-metrics-{int(time.time()) % 100000}"
    cluster.kubectl("create", "namespace", namespace)
    exporter = Exporter(cluster, namespace)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=await asyncio.to_thread(exporter.exposition), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = BackgroundServer(app).start()
    tmp = tmp_path_factory.mktemp("resource-metrics")
    prom = LocalPrometheus(
        tmp / "prom", [scrape_target("k8s", f"127.0.0.1:{server.port}", honor_labels=True)]
    )
    asyncio.run(prom.start())
    ca = make_ca("gpuwarden-resource-metrics-ca")
    cert, key = serving_cert_for_service(ca, SERVICE, "kube-system").write(tmp / "tls", "serving")
    (tmp / "ca.crt").write_bytes(ca.cert_pem)
    port = free_port()
    registry = CollectorRegistry()
    adapter = AdapterThread(e2e_config(prom.url, cluster, port, cert, key), registry).start()
    registered: LocalAPIService | None = None
    try:
        poll(
            lambda: _get(f"https://127.0.0.1:{port}/readyz", tmp / "ca.crt") == 200, timeout=60, what="ready"
        )
        registered = register_local_apiservice(
            cluster,
            group="metrics.k8s.io",
            version="v1beta1",
            port=port,
            service_name=SERVICE,
            ca_bundle=ca.cert_pem,
        )
        wait_apiservice_available(cluster, registered.name, timeout=90)
        yield Stack(exporter, prom, registry)
    finally:
        if registered is not None:
            delete_local_apiservice(cluster, registered)
        adapter.stop()
        asyncio.run(prom.stop())
        server.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()[1:]]


def deploy(cluster: Cluster, namespace: str, replicas: int = 1, hpa: bool = False) -> None:
    pod = pod_manifest(APP)  # one container "main", cpu 100m (request = limit)
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": APP}},
                "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
            },
        }
    ]
    if hpa:
        objects.append(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": APP, "namespace": namespace},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP},
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {
                                "name": "cpu",
                                "target": {"type": "Utilization", "averageUtilization": 50},
                            },
                        }
                    ],
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
                },
            }
        )
    cluster.apply(*objects)


def replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", APP, "-n", namespace)["spec"]["replicas"])


def wait_replicas(cluster: Cluster, namespace: str, want: int, timeout: float = 120) -> None:
    try:
        poll(lambda: replicas(cluster, namespace) == want, timeout=timeout, what=f"{APP} replicas == {want}")
    except TimeoutError as exc:
        describe = cluster.kubectl("describe", "hpa", APP, "-n", namespace, check=False)
        raise AssertionError(f"{exc}\n--- kubectl describe hpa\n{describe}") from exc


def test_kubectl_top_prints_what_prometheus_holds(cluster: Cluster, stack: Stack) -> None:
    namespace = stack.exporter.namespace
    stack.exporter.cores = 0.0125  # 12.5m: kubectl rounds up to 13m (prometheus-adapter would print 12m)
    deploy(cluster, namespace, replicas=2)

    def top_pods() -> list[list[str]]:
        result = kubectl(cluster, "top", "pods", "-A", "--containers")
        mine = [r for r in rows(result.stdout) if r and r[0] == namespace] if result.returncode == 0 else []
        return mine if len(mine) == 2 and all(r[3] == "13m" for r in mine) else []

    try:
        poll(lambda: bool(top_pods()), timeout=60, what="kubectl top pods -A --containers")
    except TimeoutError as exc:
        result = kubectl(cluster, "top", "pods", "-A", "--containers")
        raise AssertionError(f"{exc}\n{result.stdout}\n{result.stderr}") from exc
    for ns, pod, container, cpu, memory in top_pods():  # no phantom "" container, no doubled totals
        assert (ns, container, cpu, memory) == (namespace, "main", "13m", "50Mi") and pod.startswith(APP)

    result = kubectl(cluster, "top", "nodes")
    assert result.returncode == 0, result.stderr
    nodes = {r[0]: r for r in rows(result.stdout)}
    assert set(nodes) == {n["metadata"]["name"] for n in cluster.get_json("nodes")["items"]}
    for name, row in nodes.items():  # 2 x (1 - 0.75 idle), give or take the scrape jitter of an irate
        assert row[1].endswith("m") and 490 <= int(row[1][:-1]) <= 510, (name, result.stdout)
        assert row[3] == "4096Mi", (name, result.stdout)

    one = json.loads(kubectl(cluster, "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/nodes/{name}").stdout)
    assert one["kind"] == "NodeMetrics" and one["window"] == "4s"
    missing = kubectl(cluster, "top", "pod", "no-such-pod", "-n", namespace)
    assert missing.returncode != 0 and "not found" in missing.stderr, missing.stderr


def test_hpa_scales_on_resource_cpu_utilization(cluster: Cluster, stack: Stack) -> None:
    namespace = stack.exporter.namespace
    cluster.kubectl("delete", "deployment", APP, "-n", namespace, "--ignore-not-found")
    stack.exporter.cores = 0.02  # 20% of the 100m request
    deploy(cluster, namespace, hpa=True)
    time.sleep(8)  # several HPA syncs (2 s) at low load: no scaling
    assert replicas(cluster, namespace) == 1

    stack.exporter.cores = 0.2  # 200% -> ceil(1 x 200 / 50) = 4 (max)
    wait_replicas(cluster, namespace, 4)
    hpa = cluster.get_json("hpa", APP, "-n", namespace)
    current = hpa["status"]["currentMetrics"][0]["resource"]["current"]
    assert current["averageUtilization"] >= 100, hpa["status"]

    stack.exporter.cores = 0.01  # 10% -> scale in to 1
    wait_replicas(cluster, namespace, 1)
    served = stack.registry.get_sample_value(
        "gpuwarden_adapter_requests_total", {"route": "resource_namespace_pods", "code": "200"}
    )
    assert served and served > 0


def test_prometheus_down_is_an_error_not_zeros(cluster: Cluster, stack: Stack) -> None:
    namespace = stack.exporter.namespace
    before = replicas(cluster, namespace)
    asyncio.run(stack.prometheus.stop())

    def failing() -> bool:
        nodes = kubectl(cluster, "top", "nodes")
        pods = kubectl(cluster, "top", "pods", "-n", namespace)
        return nodes.returncode != 0 and pods.returncode != 0

    poll(failing, timeout=30, what="kubectl top failing with Prometheus down")
    nodes, pods = kubectl(cluster, "top", "nodes"), kubectl(cluster, "top", "pods", "-n", namespace)
    for result in (nodes, pods):
        assert "ServiceUnavailable" in result.stderr or "unavailable" in result.stderr.lower(), result.stderr
        assert "0m" not in result.stdout
    raw = kubectl(cluster, "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods")
    assert raw.returncode != 0 and "unavailable" in raw.stderr.lower(), raw.stderr

    def hpa_failed() -> bool:
        conditions = cluster.get_json("hpa", APP, "-n", namespace)["status"].get("conditions", [])
        return any(
            c["type"] == "ScalingActive" and c["reason"] == "FailedGetResourceMetric" for c in conditions
        )

    poll(hpa_failed, timeout=30, what="HPA FailedGetResourceMetric")
    assert replicas(cluster, namespace) == before  # the HPA holds its scale


# ------------------------------------------------------------------------------------ the real kubelet node
def test_kubectl_top_pod_shows_a_real_containers_usage_from_its_kubelet(
    node_cluster: Cluster, node_ns: str, tmp_path: Path
) -> None:
    """The real node's kubelet, scraped by the real Prometheus (through kube-apiserver's node proxy, relayed
    byte for byte) at `/metrics/cadvisor` and `/metrics/resource` -> our adapter with kube-prometheus's rules
    -> APIService -> `kubectl top pod`: the real container's usage, and no phantom container.

    On this test bed cAdvisor sees pods only as cgroups (`container=""`: its containerd factory dials the
    default socket, the test bed's containerd listens elsewhere; kubernetes#89903), which is exactly the
    pod-level series that prometheus-adapter users see doubled; the kubelet's CRI-based `/metrics/resource`
    (what metrics-server reads) carries the same metric names per container.
    """
    from tests.e2e.test_kubelet_node import tool_pod, wait_phase

    kubelet = KubeletMetricsRelay(node_cluster, REAL_NODE).start()
    prom = LocalPrometheus(tmp_path / "prom", kubelet.targets(scrape_interval_seconds=2))
    asyncio.run(prom.start())
    ca = make_ca("gpuwarden-real-node-ca")
    cert, key = serving_cert_for_service(ca, SERVICE, "kube-system").write(tmp_path / "tls", "serving")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    port = free_port()
    # the kubelet stamps samples with its stats' time (cAdvisor every 10-15 s): an irate needs two in range
    config = e2e_config(prom.url, node_cluster, port, cert, key, rate_range="60s")
    adapter = AdapterThread(config, CollectorRegistry()).start()
    registered: LocalAPIService | None = None

    async def held(query: str) -> list[Any]:
        client = prom.client()
        try:
            result = await client.query(query)
        finally:
            await client.aclose()
        return list(getattr(result, "samples", []))

    try:
        poll(
            lambda: _get(f"https://127.0.0.1:{port}/readyz", tmp_path / "ca.crt") == 200,
            timeout=60,
            what="ready",
        )
        registered = register_local_apiservice(
            node_cluster,
            group="metrics.k8s.io",
            version="v1beta1",
            port=port,
            service_name=SERVICE,
            ca_bundle=ca.cert_pem,
        )
        wait_apiservice_available(node_cluster, registered.name, timeout=90)
        doc = {"apiVersion": "v1", "kind": "List", "items": [tool_pod("real-usage", ["--sleep", "0"])]}
        node_cluster.kubectl("create", "-n", node_ns, "-f", "-", input=json.dumps(doc))
        wait_phase(node_cluster, node_ns, "real-usage", "Running")

        path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{node_ns}/pods/real-usage"

        def served() -> dict[str, Any] | None:
            result = kubectl(node_cluster, "get", "--raw", path)
            return json.loads(result.stdout) if result.returncode == 0 else None

        try:
            body = poll(served, timeout=120, what="PodMetrics of the real pod")
        except TimeoutError as exc:
            lines = [ln for ln in kubelet.scrape("resource").splitlines() if "real-usage" in ln][:8]
            answer = kubectl(node_cluster, "get", "--raw", path)
            raise AssertionError(f"{exc}\n/metrics/resource: {lines}\nadapter: {answer.stderr}") from exc
        assert body is not None
        [container] = body["containers"]  # the pod-level cgroup (container="") is no container
        assert container["name"] == "main"
        pod = f'namespace="{node_ns}",pod="real-usage"'
        cgroup = asyncio.run(
            held(f'container_memory_working_set_bytes{{{pod},container="",job="kubelet-cadvisor"}}')
        )
        assert cgroup, "no cAdvisor series for the pod"  # the real cAdvisor series, scraped (not served)
        [working_set] = asyncio.run(held(f'container_memory_working_set_bytes{{{pod},container="main"}}'))
        assert working_set.value > 0
        text = container["usage"]["memory"]
        units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
        served_bytes = int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)
        assert abs(served_bytes - working_set.value) <= 4 * 2**20, (
            container,
            working_set,
        )  # later scrapes move

        top = kubectl(node_cluster, "top", "pod", "real-usage", "-n", node_ns, "--containers")
        assert top.returncode == 0, top.stderr
        [[name, container_name, cpu, memory]] = rows(top.stdout)
        assert (name, container_name) == ("real-usage", "main") and cpu.endswith("m"), top.stdout
        assert memory.endswith("Mi") and abs(int(memory[:-2]) - working_set.value / 2**20) <= 4, top.stdout
    finally:
        if registered is not None:
            delete_local_apiservice(node_cluster, registered)
        adapter.stop()
        asyncio.run(prom.stop())
        kubelet.stop()
