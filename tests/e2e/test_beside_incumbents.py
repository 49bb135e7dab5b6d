"""The chart beside a real prometheus-adapter and a real KEDA that own the metrics APIs (issue 46).

The incumbents are the real programs: prometheus-adapter v0.12.0 (built from its Go module by
`make upstream-adapter`) serving custom.metrics.k8s.io from a real Prometheus, and KEDA's operator and metrics
server (`make keda`) serving external.metrics.k8s.io. The test bed has no pod network to this machine, so they
run as local processes behind APIServices whose Services are ExternalName -> 127.0.0.1
(harness/testbed/apiservice.py), as kwokctl runs metrics-server; kube-aggregator proxies to them for real.

Then `helm install` of the chart: refused while it would take their APIs (naming the owner); with
`adapter.enabled=false` it installs and both APIs keep answering through the aggregator from their owners,
APIService objects unchanged; `helm upgrade` into `apiServices.takeOver=true` is refused (Helm would leave
them with their owners and report success); a fresh `helm install --take-ownership` with it re-points both
to gpuwarden's adapter and records the displaced Services; after `helm uninstall` the owners' registration,
re-applied as docs/uninstall.md says, serves again. (gpuwarden's own adapter does not run here: its pods land
on kwok nodes; tests/e2e/test_helm_chart.py serves through the chart's APIServices.)
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

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
from harness.testbed.pki import make_ca, serving_cert_for_service
from tests.e2e.conftest import BackgroundServer, free_port
from tests.e2e.test_deploy_dryrun import kubectl
from tests.e2e.test_helm_chart import CHART, helm, values_args
from tests.e2e.test_keda_e2e import KEDA_BIN, Process, keda_module_dir, write_keda_pki

pytestmark = pytest.mark.e2e

UPSTREAM = repo_root() / ".cache" / "upstream" / "current" / "bin" / "adapter"
NS = "gw-incumbents"
CUSTOM, EXTERNAL = "v1beta1.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io"
PA = ("monitoring", "prometheus-adapter")
KEDA = ("keda", "keda-operator-metrics-apiserver")
# prometheus-adapter's config: one custom metric per pod from an exporter of this test
PA_RULES = {"rules": [{
    "seriesQuery": 'gpu_busy_ratio{namespace!="",pod!=""}',
    "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
    "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
}]}  # fmt: skip
EXPOSITION = 'gpu_busy_ratio{namespace="ml",pod="infer-0"} 0.5\n'


@dataclass
class Incumbents:
    registered: dict[str, LocalAPIService]
    processes: list[Process]

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes)


def served(cluster: Cluster, api: str) -> dict[str, Any] | None:
    """The aggregated API's resource list through kube-apiserver; None while it does not answer."""
    group, version = api.split(".", 1)[1], api.split(".", 1)[0]
    done = kubectl(cluster, "get", "--raw", f"/apis/{group}/{version}")
    return json.loads(done.stdout) if done.returncode == 0 else None


def spec_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl(cluster, "get", "apiservice", name, "-o", "json").stdout)["spec"])


def register(cluster: Cluster, owner: tuple[str, str], group: str, port: int, ca: bytes) -> LocalAPIService:
    ensure_namespace(cluster, owner[0])
    return register_local_apiservice(cluster, group=group, version="v1beta1", port=port, namespace=owner[0],
                                     service_name=owner[1], ca_bundle=ca)  # fmt: skip


@pytest.fixture
def incumbents(cluster: Cluster, tmp_path: Path) -> Iterator[Incumbents]:
    for binary in (UPSTREAM, KEDA_BIN / "keda-operator", KEDA_BIN / "keda-adapter"):
        if not binary.is_file():
            pytest.fail(f"{binary} missing: run `make upstream-adapter` and `make keda`", pytrace=False)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = BackgroundServer(app).start()
    target = scrape_target("gpu", f"127.0.0.1:{exporter.port}", honor_labels=True, scrape_interval_seconds=1)
    prom = LocalPrometheus(tmp_path / "prom", [target])
    asyncio.run(prom.start())
    processes: list[Process] = []
    registered: dict[str, LocalAPIService] = {}
    kubeconfig = str(cluster.kubeconfig)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA[0],
           "POD_NAMESPACE": KEDA[0], "WATCH_NAMESPACE": ""}  # fmt: skip
    try:
        # prometheus-adapter v0.12.0
        rules = tmp_path / "pa-rules.yaml"
        rules.write_text(yaml.safe_dump(PA_RULES))
        pa_ca = make_ca("prometheus-adapter-ca")
        pa_cert, pa_key = serving_cert_for_service(pa_ca, PA[1], PA[0]).write(tmp_path / "pa", "tls")
        pa_port = free_port()
        processes.append(Process("prometheus-adapter", [
            str(UPSTREAM), f"--secure-port={pa_port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={pa_cert}", f"--tls-private-key-file={pa_key}", f"--prometheus-url={prom.url}",
            f"--config={rules}", "--metrics-relist-interval=2s", f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}", "--v=1",
        ], env, tmp_path / "prometheus-adapter.log"))  # fmt: skip
        registered[CUSTOM] = register(cluster, PA, "custom.metrics.k8s.io", pa_port, pa_ca.cert_pem)
        # KEDA: CRDs, operator (its gRPC metrics service), metrics server
        crds = sorted((keda_module_dir() / "config" / "crd" / "bases").glob("*.yaml"))
        cluster.apply(*[yaml.safe_load(p.read_text()) for p in crds])
        crd_names = [f"crd/{yaml.safe_load(p.read_text())['metadata']['name']}" for p in crds]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crd_names)
        ensure_namespace(cluster, KEDA[0])
        certs = tmp_path / "keda-certs"
        write_keda_pki(certs)
        grpc_port, keda_port = free_port(), free_port()
        processes.append(Process("keda-operator", [
            str(KEDA_BIN / "keda-operator"), f"--cert-dir={certs}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc_port}", "--leader-elect=false",
        ], env, tmp_path / "keda-operator.log"))  # fmt: skip
        keda_ca = make_ca("keda-metrics-ca")
        keda_cert, keda_key = serving_cert_for_service(keda_ca, KEDA[1], KEDA[0]).write(
            tmp_path / "keda", "tls"
        )
        processes.append(Process("keda-metrics-apiserver", [
            str(KEDA_BIN / "keda-adapter"), f"--secure-port={keda_port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={keda_cert}", f"--tls-private-key-file={keda_key}", f"--cert-dir={certs}",
            f"--metrics-service-address=127.0.0.1:{grpc_port}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--lister-kubeconfig={kubeconfig}",
            f"--port={free_port()}",
        ], env, tmp_path / "keda-metrics-apiserver.log"))  # fmt: skip
        registered[EXTERNAL] = register(cluster, KEDA, "external.metrics.k8s.io", keda_port, keda_ca.cert_pem)
        stack = Incumbents(registered, processes)
        try:
            for name in (CUSTOM, EXTERNAL):
                wait_apiservice_available(cluster, name, timeout=120)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{stack.logs()}") from exc
        yield stack
    finally:
        helm("uninstall", "gpuwarden", "-n", NS, cluster=cluster)
        kubectl(cluster, "delete", "namespace", NS, "--ignore-not-found", "--wait=false")
        for reg in registered.values():
            delete_local_apiservice(cluster, reg)
        for p in processes:
            p.stop()
        asyncio.run(prom.stop())
        exporter.stop()


def custom_metric_names(cluster: Cluster) -> set[str]:
    listed = served(cluster, CUSTOM) or {}
    return {r["name"] for r in listed.get("resources", [])}


def test_the_chart_beside_a_real_prometheus_adapter_and_keda(
    cluster: Cluster, incumbents: Incumbents
) -> None:
    ensure_namespace(cluster, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    poll(lambda: "pods/gpu_busy_ratio" in custom_metric_names(cluster), timeout=60,
         what="prometheus-adapter serving pods/gpu_busy_ratio")  # fmt: skip
    assert served(cluster, EXTERNAL) is not None, incumbents.logs()
    before = {name: spec_of(cluster, name) for name in (CUSTOM, EXTERNAL)}
    base = ["uninstallHook.enabled=false"]  # kwok pods never complete a hook Job

    refused = helm("install", "gpuwarden", str(CHART), "-n", NS, *values_args(base), cluster=cluster)
    assert refused.returncode != 0
    assert f"is served by Service {PA[0]}/{PA[1]}" in refused.stderr, refused.stderr

    beside = [*base, "adapter.enabled=false"]
    done = helm("install", "gpuwarden", str(CHART), "-n", NS, *values_args(beside), cluster=cluster)
    assert done.returncode == 0, done.stderr
    assert {name: spec_of(cluster, name) for name in (CUSTOM, EXTERNAL)} == before
    assert "pods/gpu_busy_ratio" in custom_metric_names(cluster)  # still prometheus-adapter's answer
    assert served(cluster, EXTERNAL) is not None  # still KEDA's
    for name in (CUSTOM, EXTERNAL):
        wait_apiservice_available(cluster, name, timeout=30)

    # Taking over is a fresh install (docs/install.md): `helm upgrade --take-ownership` from the adapter-off
    # release exits 0 and leaves the APIServices with their owners (Helm v3.22.0), so the chart refuses it.
    take = [*base, "apiServices.takeOver=true"]
    upgrade = helm("upgrade", "gpuwarden", str(CHART), "-n", NS, "--take-ownership", *values_args(take),
                   cluster=cluster)  # fmt: skip
    assert upgrade.returncode != 0 and "helm install --take-ownership" in upgrade.stderr, upgrade.stderr
    assert {name: spec_of(cluster, name) for name in (CUSTOM, EXTERNAL)} == before
    assert helm("uninstall", "gpuwarden", "-n", NS, cluster=cluster).returncode == 0
    moved = helm("install", "gpuwarden", str(CHART), "-n", NS, "--take-ownership", *values_args(take),
                 cluster=cluster)  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    displaced = {}
    for name, owner in ((CUSTOM, PA), (EXTERNAL, KEDA)):
        obj = json.loads(kubectl(cluster, "get", "apiservice", name, "-o", "json").stdout)
        assert obj["spec"]["service"]["name"] == "gpuwarden-adapter"
        assert obj["spec"]["service"]["namespace"] == NS
        displaced[name] = obj["metadata"]["annotations"]["gpuwarden.io/displaced-service"]
        assert displaced[name] == f"{owner[0]}/{owner[1]}"

    gone = helm("uninstall", "gpuwarden", "-n", NS, cluster=cluster)
    assert gone.returncode == 0, gone.stderr
    for name in (CUSTOM, EXTERNAL):
        assert kubectl(cluster, "get", "apiservice", name).returncode != 0, f"{name} outlived helm uninstall"
    # docs/uninstall.md: the owner's release re-creates its APIService (here: its registration re-applied,
    # to the Service the annotation named)
    for name, reg in incumbents.registered.items():
        assert displaced[name] == f"{reg.namespace}/{reg.service_name}"
        spec = before[name]
        obj = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
               "spec": spec}  # fmt: skip
        assert kubectl(cluster, "apply", "-f", "-", input=json.dumps(obj)).returncode == 0
        wait_apiservice_available(cluster, name, timeout=60)
    poll(lambda: "pods/gpu_busy_ratio" in custom_metric_names(cluster), timeout=60,
         what="prometheus-adapter serving again")  # fmt: skip
    assert served(cluster, EXTERNAL) is not None, incumbents.logs()
