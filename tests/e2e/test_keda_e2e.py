"""Real KEDA scales a Deployment through the HPA it creates, on values from gpuwarden's external scaler.

Everything on the path is real: an exporter (in this test) publishes a `queue_depth` gauge per queue; a real
Prometheus scrapes it every second; gpuwarden's adapter (`run_adapter`, as `gpuwarden adapter --keda` runs
it) serves KEDA's external scaler from its cache; the KEDA operator and metrics server, built from the
`github.com/kedacore/keda/v2` module tests/keda/go.mod pins (`tests/keda/build-keda.sh`, `make keda`), run
against the test bed's API server with KEDA's CRDs; kube-aggregator reaches KEDA's metrics server through
`v1beta1.external.metrics.k8s.io` (ExternalName -> 127.0.0.1, real caBundle), and kube-controller-manager's
HPA controller (sync 2 s) scales.

Scenarios: an `external` trigger scales 1 -> 4 -> 1 as the queue grows and drains; an `external-push`
trigger activates a Deployment at 0 replicas; Prometheus stopped -> the adapter answers UNAVAILABLE once its
cache expires (never 0) -> KEDA's `fallback` replicas.
"""

from __future__ import annotations

import asyncio
import os
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
    ensure_namespace,
    poll,
    register_local_apiservice,
    wait_apiservice_available,
)
from harness.testbed.apiservice import delete_local_apiservice
from harness.testbed.binaries import repo_root
from harness.testbed.pki import issue, make_ca, serving_cert_for_service
from tests.e2e.conftest import BackgroundServer, free_port, pod_manifest
from tests.e2e.engine_workload import VllmShaped
from tests.e2e.test_adapter_hpa import AdapterThread

pytestmark = pytest.mark.e2e

KEDA_BIN = Path(os.environ.get("GPUWARDEN_KEDA_BIN", repo_root() / ".cache" / "keda" / "current" / "bin"))
KEDA_NS = "keda"
SERVICE = "keda-metrics-e2e"


def keda_module_dir() -> Path:
    """KEDA's module source (CRDs), from the Go module cache, at the version tests/keda/go.mod pins."""
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "github.com/kedacore/keda/v2"],
        cwd=repo_root() / "tests" / "keda",
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local"},
    )
    return Path(done.stdout.strip())


@dataclass
class Queues:
    """What the exporter publishes: `queue_depth{queue=...}` in the test namespace; the test sets depths."""

    namespace: str
    depth: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    engine: VllmShaped | None = None  # a vLLM-shaped Deployment's series (tests/e2e/engine_workload.py)

    def exposition(self) -> str:
        with self._lock:
            lines = ["# TYPE queue_depth gauge"]
            for queue, depth in sorted(self.depth.items()):
                lines.append(f'queue_depth{{queue="{queue}",namespace="{self.namespace}"}} {depth}')
        if self.engine is not None:
            lines += self.engine.lines()
        return "\n".join(lines) + "\n"

    def set(self, queue: str, depth: float) -> None:
        with self._lock:
            self.depth[queue] = depth


class Process:
    """A KEDA binary run against the test bed, its log in a file (tail shown on failure)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.name} log (last {lines} lines)\n" + "\n".join(text[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._out.close()


@dataclass
class KedaStack:
    cluster: Cluster
    namespace: str
    queues: Queues
    prom: LocalPrometheus
    keda_port: int
    registry: CollectorRegistry
    processes: list[Process]

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes)


def write_keda_pki(directory: Path) -> bytes:
    """ca.crt, tls.crt, tls.key for the operator's gRPC metrics service and the metrics server's client
    (KEDA reads all three from one --cert-dir); returns the CA PEM."""
    ca = make_ca("keda-e2e-ca")
    pair = issue(
        ca,
        "keda-operator",
        dns_names=("keda-operator", f"keda-operator.{KEDA_NS}.svc", "localhost"),
        ip_addresses=("127.0.0.1",),
        server=True,
        client=True,
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    return ca.cert_pem


@pytest.fixture
def keda(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[KedaStack]:
    for binary in ("keda-operator", "keda-adapter"):
        if not (KEDA_BIN / binary).is_file():
            pytest.fail(f"{KEDA_BIN / binary} is missing: run `make keda` (tests/keda/build-keda.sh)")
    queues = Queues(namespace)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=queues.exposition(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = BackgroundServer(app).start()
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("queues", f"127.0.0.1:{exporter.port}", honor_labels=True)]
    )
    asyncio.run(prom.start())
    keda_port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "timeout_seconds": 2, "retries": 0},
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
            "adapter": {
                "secure_port": free_port(),
                "bind_address": "127.0.0.1",
                "relist_interval_seconds": 2,
                "cache": {"refresh_interval_seconds": 1, "max_age_seconds": 6},
                "externalRules": [
                    {
                        "seriesQuery": "queue_depth",
                        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)",
                    }
                ],
                "keda": {
                    "enabled": True,
                    "bind_address": "127.0.0.1",
                    "port": keda_port,
                    "tls": {"plaintext": True},
                    "push_interval_seconds": 2,
                },
            },
        }
    )
    registry = CollectorRegistry()
    adapter = AdapterThread(config, registry).start()
    processes: list[Process] = []
    registered: list[LocalAPIService] = []
    try:
        crds = sorted((keda_module_dir() / "config" / "crd" / "bases").glob("*.yaml"))
        cluster.apply(*[yaml.safe_load(p.read_text()) for p in crds])
        names = [f"crd/{yaml.safe_load(p.read_text())['metadata']['name']}" for p in crds]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
        ensure_namespace(cluster, KEDA_NS)
        certs = tmp_path / "keda-certs"
        write_keda_pki(certs)
        grpc_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NS,
            "POD_NAMESPACE": KEDA_NS,
            "WATCH_NAMESPACE": "",
        }
        processes.append(
            Process(
                "keda-operator",
                [
                    str(KEDA_BIN / "keda-operator"),
                    f"--cert-dir={certs}",
                    f"--metrics-bind-address=127.0.0.1:{free_port()}",
                    f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                    f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
                    "--leader-elect=false",
                    "--zap-log-level=info",
                ],
                env,
                tmp_path / "keda-operator.log",
            )
        )
        serving_ca = make_ca("keda-metrics-e2e-ca")
        cert, key = serving_cert_for_service(serving_ca, SERVICE, "kube-system").write(
            tmp_path / "serving", "tls"
        )
        metrics_port = free_port()
        kubeconfig = str(cluster.kubeconfig)
        processes.append(
            Process(
                "keda-metrics-apiserver",
                [
                    str(KEDA_BIN / "keda-adapter"),
                    f"--secure-port={metrics_port}",
                    "--bind-address=127.0.0.1",
                    f"--tls-cert-file={cert}",
                    f"--tls-private-key-file={key}",
                    f"--cert-dir={certs}",
                    f"--metrics-service-address=127.0.0.1:{grpc_port}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    f"--lister-kubeconfig={kubeconfig}",
                    f"--port={free_port()}",
                ],
                env,
                tmp_path / "keda-metrics-apiserver.log",
            )
        )
        reg = register_local_apiservice(
            cluster,
            group="external.metrics.k8s.io",
            version="v1beta1",
            port=metrics_port,
            service_name=SERVICE,
            ca_bundle=serving_ca.cert_pem,
        )
        registered.append(reg)
        stack = KedaStack(cluster, namespace, queues, prom, keda_port, registry, processes)
        try:
            wait_apiservice_available(cluster, reg.name, timeout=120)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from exc
        yield stack
    finally:
        for r in registered:
            delete_local_apiservice(cluster, r)
        for p in processes:
            p.stop()
        adapter.stop()
        asyncio.run(prom.stop())
        exporter.stop()


def _deployment(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=1, nodeSelector={"nvidia.com/gpu.present": "true"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def _scaled_object(
    name: str, namespace: str, port: int, queue: str, *, push: bool = False, min_replicas: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"name": name},
            "pollingInterval": 2,
            "cooldownPeriod": 5,
            "minReplicaCount": min_replicas,
            "maxReplicaCount": 4,
            "fallback": {"failureThreshold": 2, "replicas": 3},
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
                }
            },
            "triggers": [
                {
                    "type": "external-push" if push else "external",
                    "metadata": {
                        "scalerAddress": f"127.0.0.1:{port}",
                        "metricName": "queue_depth",
                        "labelSelector": f"queue={queue}",
                        "targetValue": "10",
                    },
                }
            ],
        },
    }


def _replicas(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.get_json("deployment", name, "-n", namespace)["spec"].get("replicas", 0))


def _wait(stack: KedaStack, name: str, want: int, timeout: float = 120) -> float:
    began = time.monotonic()
    try:
        poll(
            lambda: _replicas(stack.cluster, stack.namespace, name) == want,
            timeout=timeout,
            what=f"{name} replicas == {want}",
        )
    except TimeoutError as exc:
        so = stack.cluster.kubectl(
            "get", "scaledobject", name, "-n", stack.namespace, "-o", "yaml", check=False
        )
        hpa = stack.cluster.kubectl("describe", "hpa", "-n", stack.namespace, check=False)
        raise AssertionError(f"{exc}\n--- ScaledObject\n{so}\n--- HPA\n{hpa}\n{stack.logs()}") from exc
    return time.monotonic() - began


def test_keda_scales_through_its_hpa_on_gpuwardens_external_scaler(keda: KedaStack) -> None:
    cluster, ns = keda.cluster, keda.namespace
    keda.queues.set("work", 5)  # 5 / 10 per replica -> 1
    cluster.apply(_deployment("worker", ns, 1), _scaled_object("worker", ns, keda.keda_port, "work"))
    poll(
        lambda: cluster.get_json("hpa", "keda-hpa-worker", "-n", ns),
        timeout=60,
        what="KEDA created its HPA",
    )
    time.sleep(6)
    assert _replicas(cluster, ns, "worker") == 1
    keda.queues.set("work", 35)  # 35 / 10 -> 4
    up = _wait(keda, "worker", 4)
    hpa = cluster.get_json("hpa", "keda-hpa-worker", "-n", ns)
    external = [
        m["external"] for m in hpa["status"].get("currentMetrics") or [] if m.get("type") == "External"
    ]
    assert external and external[0]["metric"]["name"] == "s0-gpuwarden-queue_depth", hpa["status"]
    keda.queues.set("work", 3)  # drained -> 1
    down = _wait(keda, "worker", 1)
    served = keda.registry.get_sample_value(
        "gpuwarden_adapter_keda_requests_total", {"rpc": "GetMetrics", "code": "OK"}
    )
    assert served and served > 0
    print(f"\n[e2e] KEDA external trigger: 1 -> 4 in {up:.1f}s, 4 -> 1 in {down:.1f}s")

    # Prometheus gone: once the adapter's cache expires it answers UNAVAILABLE (never 0), and KEDA's
    # fallback (failureThreshold 2, replicas 3) takes over.
    asyncio.run(keda.prom.stop())
    fallback = _wait(keda, "worker", 3, timeout=150)
    unavailable = keda.registry.get_sample_value(
        "gpuwarden_adapter_keda_requests_total", {"rpc": "GetMetrics", "code": "UNAVAILABLE"}
    )
    assert unavailable and unavailable > 0
    print(f"[e2e] Prometheus stopped -> fallback replicas 3 in {fallback:.1f}s")


def test_keda_external_push_activates_from_zero(keda: KedaStack) -> None:
    cluster, ns = keda.cluster, keda.namespace
    keda.queues.set("burst", 0)
    cluster.apply(
        _deployment("burst", ns, 0),
        _scaled_object("burst", ns, keda.keda_port, "burst", push=True, min_replicas=0),
    )
    poll(  # KEDA 2.21's Run opens both, and keeps StreamMetricSpec open as it does StreamIsActive
        lambda: keda.registry.get_sample_value("gpuwarden_adapter_keda_open_streams") == 2,
        timeout=60,
        what="KEDA opened StreamIsActive and StreamMetricSpec",
    )
    time.sleep(4)
    assert _replicas(cluster, ns, "burst") == 0
    keda.queues.set("burst", 4)
    activated = _wait(keda, "burst", 1, timeout=60)
    pushed = keda.registry.get_sample_value("gpuwarden_adapter_keda_pushes_total", {"result": "true"})
    assert pushed and pushed >= 1
    print(f"\n[e2e] KEDA external-push: 0 -> 1 in {activated:.1f}s after the queue turned positive")
