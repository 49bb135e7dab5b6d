"""The Helm chart (deploy/helm/gpuwarden) against the kustomize tree and the testbed's real kube-apiserver.

- `helm lint --strict` is clean for the default values, a prometheus-adapter chart's own defaults file and
  every optional part on;
- one source of truth: for each kustomize overlay, `helm template` with the equivalent values renders the same
  objects (same identities, same specs, same config after validation), only Helm's own labels differ;
- the renders pass server-side dry-run with strict field validation and raise no Pod Security warning in a
  restricted namespace; the chart's RBAC, applied for real, passes the SubjectAccessReview lists of the
  kustomize tree (tests/e2e/test_deploy_dryrun.py, both ways);
- a wrong value fails with its path (the schema) or with the key and what to do (a prometheus-adapter value
  gpuwarden cannot honour);
- `helm install` with a prometheus-adapter values file: the chart's adapter serves behind the chart's
  APIServices and the real HPA controller scales on an external metric from a migrated `rules.external`.

The install is real except where the adapter process runs: the testbed has no image registry and no pod
network route to kube-apiserver (it listens on 127.0.0.1) or to Prometheus, so the chart's adapter pods run on
kwok nodes (scheduled, Ready, Endpoints published) while `gpuwarden adapter` runs on the host with the chart's
rendered ConfigMap and the chart's ServiceAccount token, and this test plays kube-proxy for that one Service:
the Service's ClusterIP is added to the loopback interface and forwarded to the process, as kube-proxy would
DNAT it to a pod. Everything the chart decides (config, RBAC, Service, APIServices) is what runs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, scrape_target
from harness.testbed import Cluster, ensure_namespace, poll, wait_apiservice_available
from harness.testbed.binaries import repo_root
from tests.e2e.conftest import BackgroundServer, free_port, pod_manifest
from tests.e2e.test_deploy_dryrun import CRD_KINDS, RBAC_KINDS, as_list, check_rbac, kubectl
from tests.unit.test_deploy_render import DEPLOY, by_identity, render

pytestmark = pytest.mark.e2e

CHART = DEPLOY / "helm" / "gpuwarden"
PA_DEFAULTS = repo_root() / "tests" / "helm" / "prometheus-adapter-4.2.0-values.yaml"
MIGRATION = repo_root() / "tests" / "helm" / "migration-example-values.yaml"  # docs/install.md's example
CHART_CRD_KINDS = CRD_KINDS | {"PodMonitor"}  # the node agent's (the kustomize overlay has no node agent)
NS = "gw-helm"  # not gpuwarden: test_deploy_dryrun deletes that one without waiting
NODE_NS = "gw-helm-node"
Obj = dict[str, Any]

ALL_ON = [
    "resourceMetrics.kubePrometheusRules=true",
    "scheduler.enabled=true",
    "nodeAgent.enabled=true",
    "monitoring.serviceMonitors.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboards.enabled=true",
    "monitoring.metricsReader.enabled=true",
]
# kustomize overlay -> the chart values that install the same objects. The kustomize tree acts (its dry-run
# overlay aside) and grants every capability's rights (its config can switch any on); the chart observes
# unless mode=act and grants only the enabled capabilities' rights unless rbac.everyCapability.
PINNED_SCHEDULER = (
    "scheduler.image=registry.k8s.io/kube-scheduler:v1.35.4"  # the overlay's; the chart follows
)
ACT = ["mode=act", "rbac.everyCapability=true", "uninstallHook.enabled=false"]  # (the hook: Helm's only)
EQUIVALENT = {
    "base": ACT,
    # the dry-run overlay claims no APIService (it takes no metrics API from prometheus-adapter or KEDA)
    "overlays/dry-run": [
        "controller.dryRun=true",
        *ACT,
        "apiServices.customMetrics.enabled=false",
        "apiServices.externalMetrics.enabled=false",
    ],
    "overlays/monitoring": [*ACT, *ALL_ON[3:]],
    "overlays/scheduler": [*ACT, "scheduler.enabled=true", PINNED_SCHEDULER],
    "overlays/node-agent": [*ACT, "nodeAgent.enabled=true"],
    "overlays/resource-metrics": [
        *ACT,
        "resourceMetrics.enabled=true",
        "resourceMetrics.kubePrometheusRules=true",
    ],
    "overlays/keda": [*ACT, "keda.enabled=true"],
    "overlays/claim-bind": [*ACT, "controller.bindProtocol=claim"],
    "overlays/extender-mtls": [
        *ACT,
        "scheduler.enabled=true",
        PINNED_SCHEDULER,
        "controller.extenderTLS.enabled=true",
        "controller.extenderTLS.secretName=gpuwarden-extender-tls",
        "controller.extenderTLS.schedulerSecretName=gpuwarden-scheduler-extender",
    ],
}
EXTENDER_MTLS = ["scheduler.enabled=true", "controller.extenderTLS.enabled=true"]
GPUWARDEN_CONFIGS = {"gpuwarden-config", "gpuwarden-node-agent"}
# Labels only one side sets: kustomize's managed-by, Helm's release bookkeeping.
TOOL_LABELS = {
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}


def helm_binary() -> Path:
    path = repo_root() / ".cache" / "helm" / "current" / "bin" / "helm"
    if not path.is_file():
        pytest.fail(f"{path} missing: run `make helm` (bash tests/helm/build.sh)", pytrace=False)
    return path


def helm(
    *args: str, cluster: Cluster | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm_binary()), *args]
    if cluster is not None:
        cmd.append(f"--kubeconfig={cluster.kubeconfig}")
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/gwhelm/cache", "HELM_CONFIG_HOME": "/tmp/gwhelm/config",
           "HELM_DATA_HOME": "/tmp/gwhelm/data"}  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def values_args(sets: Sequence[str], files: Sequence[Path] = ()) -> list[str]:
    return [*(a for f in files for a in ("-f", str(f))), *(a for s in sets for a in ("--set", s))]


def template(sets: Sequence[str], files: Sequence[Path] = (), namespace: str = "gpuwarden") -> list[Obj]:
    done = helm("template", "gpuwarden", str(CHART), "-n", namespace, *values_args(sets, files))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def normalized(obj: Obj) -> Obj:
    """The object without tool labels and the config checksum; config files compared by content."""
    obj = json.loads(json.dumps(obj))
    labels = obj["metadata"].get("labels", {})
    for key in TOOL_LABELS:
        labels.pop(key, None)
    template_meta = obj.get("spec", {}).get("template", {}).get("metadata", {})
    template_meta.get("annotations", {}).pop("checksum/config", None)
    if template_meta.get("annotations") == {}:
        del template_meta["annotations"]
    if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
        data = yaml.safe_load(obj["data"]["config.yaml"])  # comments differ, not content
        if obj["metadata"]["name"] in GPUWARDEN_CONFIGS:  # as gpuwarden reads them
            data = Config.model_validate(data).model_dump(mode="json")
        obj["data"]["config.yaml"] = data
    return obj


# ------------------------------------------------------------------------------------------------ lint
@pytest.mark.parametrize(
    "case", ["defaults", "prometheus-adapter", "all-on", "extender-mtls", "preflight-hook"]
)
def test_helm_lint_is_clean(case: str) -> None:
    args = {
        "defaults": [],
        "prometheus-adapter": ["-f", str(PA_DEFAULTS)],
        "all-on": values_args(ALL_ON),
        "extender-mtls": values_args([*ALL_ON, *EXTENDER_MTLS]),
        "preflight-hook": values_args(["preflightHook.enabled=true", "apiServices.takeOver=true"]),
    }[case]
    done = helm("lint", "--strict", str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


# --------------------------------------------------------------------------------- one source of truth
@pytest.mark.parametrize("overlay", list(EQUIVALENT))
def test_chart_renders_the_objects_of_the_kustomize_overlay(overlay: str) -> None:
    kustomized = by_identity(render(DEPLOY / overlay))
    # The release namespace is the user's (helm install -n, labelled restricted: docs/install.md).
    kustomized = {k: v for k, v in kustomized.items() if k != ("v1", "Namespace", "", "gpuwarden")}
    charted = by_identity(template(EQUIVALENT[overlay]))
    assert sorted(charted) == sorted(kustomized)
    for key, obj in kustomized.items():
        assert normalized(charted[key]) == normalized(obj), key


def test_the_chart_makes_one_ca_for_the_extenders_two_pairs() -> None:
    """controller.extenderTLS without Secrets of the user's: one CA, the controller's pair for its Service
    name (server and client auth), the scheduler's client pair; the ServiceMonitor verifies with the CA."""
    from cryptography import x509

    objects = template([*EXTENDER_MTLS, "monitoring.serviceMonitors.enabled=true"])
    secrets = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "Secret"}
    server, client = secrets["gpuwarden-extender-tls"], secrets["gpuwarden-scheduler-extender"]
    assert server["ca.crt"] == client["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(server["ca.crt"]))
    for data in (server, client):
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        cert.verify_directly_issued_by(ca)
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert x509.ExtendedKeyUsageOID.CLIENT_AUTH in usages
    cert = x509.load_pem_x509_certificate(base64.b64decode(server["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpuwarden-controller.gpuwarden.svc" in names.get_values_for_type(x509.DNSName)
    monitor = next(
        o
        for o in objects
        if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == "gpuwarden-controller"
    )
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpuwarden-extender-tls", "key": "ca.crt"}


def test_chart_copies_of_rules_and_dashboards_are_current() -> None:
    done = subprocess.run([sys.executable, str(DEPLOY / "generate.py"), "--check"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_prometheus_adapter_values_are_mapped() -> None:
    """The chart's own defaults of prometheus-adapter 4.2.0: each key lands where docs/install.md says."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in template([], [PA_DEFAULTS], NS)}
    config = Config.model_validate(
        yaml.safe_load(objects["ConfigMap", "gpuwarden-config"]["data"]["config.yaml"])
    )
    assert str(config.prometheus.url) == "http://prometheus.default.svc:9090/"
    assert len(config.adapter.rules) == 6 and not config.adapter.external_rules  # rules.default: true
    assert config.adapter.relist_interval_seconds == 60 and config.adapter.secure_port == 6443
    assert config.logging.level == "info" and config.kubernetes.namespace == NS  # logLevel 4 < 5
    dep = objects["Deployment", "gpuwarden-adapter"]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": "25%", "maxSurge": "25%"}
    assert container["image"] == "ghcr.io/gpuwarden/gpuwarden:0.1.0"  # their image is not ours
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"  # their default probes: ours
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]  # "all" upper-cased for PSA
    assert container["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["fsGroup"] == 10001
    assert ("PodDisruptionBudget", "gpuwarden-adapter") not in objects  # podDisruptionBudget.enabled: false
    assert ("Secret", "gpuwarden-adapter-tls") not in objects
    apiservices = [o for o in objects.values() if o["kind"] == "APIService"]
    assert len(apiservices) == 3 and all(a["spec"]["insecureSkipTLSVerify"] for a in apiservices)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["controler.replicas=1"], "at '': additional properties 'controler' not allowed"),
        (["controller.replica=1"], "at '/controller': additional properties 'replica' not allowed"),
        (["replicas=two"], "at '/replicas': got string, want integer"),
        (["rules.custom[0].seriesQuery=x"], "at '/rules/custom/0': missing property 'metricsQuery'"),
        (["nodeAgent.deviceIdStrategy=serial"], "at '/nodeAgent/deviceIdStrategy'"),
        (["psp.create=true"], "psp.create: PodSecurityPolicy was removed"),
        (["hostNetwork.enabled=true"], "hostNetwork.enabled: not supported"),
        (["extraArguments[0]=--metrics-max-age=5m"], "extraArguments: [--metrics-max-age=5m]"),
        (["certManager.enabled=true"], "certManager.enabled: not supported"),
        (["service.type=NodePort"], 'service.type: "NodePort" is not supported'),
        (["serviceAccount.create=false"], "serviceAccount.name: required"),
        (["tls.enable=true"], "tls.ca: a PEM block is required"),
        (["metricsRelistInterval=1m30s"], 'metricsRelistInterval: "1m30s" is not a duration'),
        (["resourceMetrics.enabled=true"], "resourceMetrics.enabled: metrics.k8s.io needs resource rules"),
        (
            ["resourceMetrics.kubePrometheusRules=true", "rules.existing=cm"],
            "drop rules.existing / rules.resource",
        ),
        (
            ["resourceMetrics.kubePrometheusRules=true", "resourceMetrics.enabled=false"],
            "needs resourceMetrics.enabled",
        ),
        (["config.adapter.secure_port=7443"], "config.adapter.secure_port: set listenPort instead"),
        (["podDisruptionBudget.maxUnavailable=1"], "podDisruptionBudget: set minAvailable or maxUnavailable"),
        (["keda.tls.plaintext=true", "keda.tls.existingSecret=s"], "keda.tls.plaintext: cannot be combined"),
        (["keda.tls.mutualTLS=true"], "keda.tls.mutualTLS: needs keda.tls.existingSecret"),
        (["keda.enabled=true", "keda.port=6443"], "keda.port: 6443 is listenPort too"),
        (["keda.tls.mtls=true"], "at '/keda/tls'"),
        (["scheduler.extender.httpTimeout=1m"], "at '/scheduler/extender/httpTimeout'"),
    ],
)
def test_a_wrong_value_is_rejected_with_its_key(sets: list[str], message: str) -> None:
    done = helm("template", "gpuwarden", str(CHART), *values_args(sets))
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize(("timeout", "seconds"), [("5s", "5"), ("1500ms", "1.5"), ("2.5s", "2.5")])
def test_the_controller_binds_within_the_schedulers_http_timeout(timeout: str, seconds: str) -> None:
    """The scheduler's extender httpTimeout and the controller's bind deadline come from one value."""
    objects = template(["scheduler.enabled=true", f"scheduler.extender.httpTimeout={timeout}"])
    [controller] = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpuwarden-controller"
    ]
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUWARDEN_EXTENDER__SCHEDULER_HTTP_TIMEOUT_SECONDS"] == seconds
    [scheduler_config] = [
        o for o in objects if o["kind"] == "ConfigMap" and "httpTimeout" in str(o.get("data", {}))
    ]
    assert f"httpTimeout: {timeout}" in str(scheduler_config["data"])


def test_the_worked_example_of_the_docs_is_the_tested_file() -> None:
    docs = (repo_root() / "docs" / "install.md").read_text()
    example = "".join(
        line for line in MIGRATION.read_text().splitlines(keepends=True) if not line.startswith("#")
    )
    assert example in docs, (
        "docs/install.md's migration example differs from tests/helm/migration-example-values.yaml"
    )


def test_prometheus_adapter_resource_rules_serve_metrics_k8s_io(tmp_path: Path) -> None:
    """rules.resource (prometheus-adapter's commented example) -> adapter.resourceRules and the
    v1beta1.metrics.k8s.io APIService, as prometheus-adapter's chart does."""
    query = "sum by (<<.GroupBy>>) (rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[3m]))"
    overrides = {key: {"resource": key} for key in ("node", "namespace", "pod")}
    rule = {"containerQuery": query, "nodeQuery": query, "containerLabel": "container",
            "resources": {"overrides": overrides}}  # fmt: skip
    values = tmp_path / "resource.yaml"
    values.write_text(yaml.safe_dump({"rules": {"resource": {"cpu": rule, "memory": rule, "window": "3m"}}}))
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in template([], [PA_DEFAULTS, values])}
    config = Config.model_validate(
        yaml.safe_load(rendered["ConfigMap", "gpuwarden-config"]["data"]["config.yaml"])
    )
    assert config.adapter.resource_rules is not None and config.adapter.resource_rules.window == "3m"
    assert ("APIService", "v1beta1.metrics.k8s.io") in rendered
    assert ("ClusterRole", "gpuwarden-aggregated-metrics-reader") in rendered
    assert ("ConfigMap", "gpuwarden-resource-rules") not in rendered
    off = {
        (o["kind"], o["metadata"]["name"])
        for o in template(["resourceMetrics.enabled=false"], [PA_DEFAULTS, values])
    }
    assert ("APIService", "v1beta1.metrics.k8s.io") not in off


def test_a_migrated_values_file_with_tls_and_existing_rules(tmp_path: Path) -> None:
    """tls.* becomes a Secret, a mount, adapter.tls and every APIService's caBundle; rules.existing a mounted
    prometheus-adapter config file, the adapter's rules_file, replacing the inline rules."""
    from harness.testbed.pki import make_ca, serving_cert_for_service

    ca = make_ca("helm-e2e")
    cert, key = serving_cert_for_service(ca, "gpuwarden-adapter", NS).write(tmp_path, "serving")
    values = {"tls": {"enable": True, "ca": ca.cert_pem.decode(), "certificate": cert.read_text(),
                      "key": key.read_text()}, "rules": {"existing": "prometheus-adapter"}}  # fmt: skip
    (tmp_path / "tls.yaml").write_text(yaml.safe_dump(values))
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in template([], [PA_DEFAULTS, tmp_path / "tls.yaml"], NS)
    }
    config = Config.model_validate(
        yaml.safe_load(objects["ConfigMap", "gpuwarden-config"]["data"]["config.yaml"])
    )
    assert str(config.adapter.tls.cert_file) == "/etc/gpuwarden-tls/tls.crt"
    # The rules file is the adapter's alone: the controller reads the same config and has no such mount.
    assert (
        config.adapter.rules_file is None and not config.adapter.rules and not config.adapter.external_rules
    )
    container = objects["Deployment", "gpuwarden-adapter"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPUWARDEN_ADAPTER__RULES_FILE"] == "/etc/gpuwarden-rules/config.yaml"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["rules"] == "/etc/gpuwarden-rules" and mounts["tls"] == "/etc/gpuwarden-tls"
    secret = objects["Secret", "gpuwarden-adapter-tls"]
    assert base64.b64decode(secret["data"]["tls.crt"]).decode() == cert.read_text()
    for obj in objects.values():
        if obj["kind"] == "APIService":
            assert base64.b64decode(obj["spec"]["caBundle"]) == ca.cert_pem
            assert "insecureSkipTLSVerify" not in obj["spec"]
    volumes = objects["Deployment", "gpuwarden-adapter"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "rules", "configMap": {"name": "prometheus-adapter"}} in volumes
    assert {"name": "tls", "secret": {"secretName": "gpuwarden-adapter-tls"}} in volumes


# --------------------------------------------------------------------------- the real API server
@pytest.fixture(scope="module")
def namespaces(cluster: Cluster) -> Iterator[None]:
    ensure_namespace(cluster, NS, {"pod-security.kubernetes.io/enforce": "restricted",
                                   "pod-security.kubernetes.io/warn": "restricted"})  # fmt: skip
    yield
    kubectl(cluster, "delete", "namespace", NS, NODE_NS, "--ignore-not-found", "--wait=false")


RENDERS = {
    "defaults": ([], []),
    "prometheus-adapter": ([], [PA_DEFAULTS]),
    # + a serving certificate (tls.*) below, and docs/install.md's migration example.
    "all-on": (
        [*ALL_ON, f"nodeAgent.namespace={NODE_NS}", "controller.dryRun=true"],
        [PA_DEFAULTS, MIGRATION],
    ),
    "existing-rules": (["rules.existing=prometheus-adapter"], [PA_DEFAULTS]),
}


def tls_values(path: Path) -> Path:
    """tls.* values with a real certificate for the adapter's Service in NS."""
    from harness.testbed.pki import make_ca, serving_cert_for_service

    ca = make_ca("helm-e2e")
    cert, key = serving_cert_for_service(ca, "gpuwarden-adapter", NS).write(path, "serving")
    values = {"tls": {"enable": True, "ca": ca.cert_pem.decode(), "certificate": cert.read_text(),
                      "key": key.read_text()}}  # fmt: skip
    (path / "tls.yaml").write_text(yaml.safe_dump(values))
    return path / "tls.yaml"


@pytest.mark.parametrize("case", list(RENDERS))
def test_server_side_dry_run_strict_and_pod_security_clean(
    cluster: Cluster, namespaces: None, case: str, tmp_path: Path
) -> None:
    sets, files = RENDERS[case]
    if case == "all-on":
        files = [*files, tls_values(tmp_path)]
    objects = template(sets, files, NS)
    if case == "all-on":  # the node agent's namespace must exist for a dry-run of the objects in it
        ensure_namespace(cluster, NODE_NS, {"pod-security.kubernetes.io/enforce": "privileged"})
        kinds = {o["kind"] for o in objects}
        assert kinds >= CHART_CRD_KINDS | {"DaemonSet", "ValidatingAdmissionPolicy", "Secret", "Namespace"}, (
            kinds
        )
    objects = [o for o in objects if o["kind"] not in CHART_CRD_KINDS]  # no Prometheus Operator CRDs here
    done = kubectl(
        cluster, "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=as_list(objects)
    )
    assert done.returncode == 0, done.stderr
    warnings = [
        w for w in done.stderr.splitlines() if "Warning" in w and "last-applied-configuration" not in w
    ]
    assert not warnings, done.stderr
    assert done.stdout.count("(server dry run)") == len(objects), done.stdout


def test_chart_rbac_passes_the_kustomize_trees_access_reviews(cluster: Cluster, namespaces: None) -> None:
    ensure_namespace(cluster, NODE_NS, {"pod-security.kubernetes.io/enforce": "privileged"})
    sets = [*ALL_ON, f"nodeAgent.namespace={NODE_NS}", "rbac.everyCapability=true"]
    rbac = [o for o in template(sets, [PA_DEFAULTS], NS) if o["kind"] in RBAC_KINDS]
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(rbac))
    assert done.returncode == 0, done.stderr
    try:
        check_rbac(cluster, NS, NODE_NS)
    finally:
        # All of it: the install below must find no object it does not own.
        kubectl(cluster, "delete", "--ignore-not-found", "-f", "-", input=as_list(rbac))


# ---------------------------------------------------------------------------------- helm install
class ServiceIP:
    """Plays kube-proxy for one Service: its ClusterIP on the loopback interface, forwarded to a process."""

    def __init__(self, ip: str, port: int, target: int) -> None:
        self.ip, self.port, self.target = ip, port, target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="service-ip", daemon=True)
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> ServiceIP:
        added = subprocess.run(
            ["ip", "addr", "add", f"{self.ip}/32", "dev", "lo"], capture_output=True, text=True
        )
        # "File exists": left by an interrupted run; it is removed again in stop().
        assert added.returncode == 0 or "File exists" in added.stderr, added.stderr
        self._thread.start()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._handle, self.ip, self.port)

        self._server = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        subprocess.run(["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"], check=False, capture_output=True)


def sa_kubeconfig(cluster: Cluster, account: str, path: Path) -> Path:
    token = kubectl(cluster, "create", "token", account, "-n", NS, "--duration=1h")
    assert token.returncode == 0, token.stderr
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "t", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_cert)}}],
        "users": [{"name": account, "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "t", "user": account, "namespace": NS}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def test_helm_install_serves_the_hpa_through_the_charts_apiservices(
    cluster: Cluster, namespaces: None, namespace: str, tmp_path: Path
) -> None:
    """The worker and its HPA live in a namespace of their own (its kwok pods are not restricted-profile)."""
    series = f'queue_messages_ready{{namespace="{namespace}",queue="jobs"}} 30\n'

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="# TYPE queue_messages_ready gauge\n" + series, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    exporter = BackgroundServer(app).start()
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("queue", f"127.0.0.1:{exporter.port}", honor_labels=True)]
    )
    asyncio.run(prom.start())
    url, _, port = prom.url.rpartition(":")
    # docs/install.md's worked example; the test bed's Prometheus, and relisting fast enough for a test.
    test_bed = [f"prometheus.url={url}", f"prometheus.port={port}", "metricsRelistInterval=5s",
                "uninstallHook.enabled=false"]  # kwok pods never complete a hook Job  # fmt: skip
    proxy: ServiceIP | None = None
    adapter: subprocess.Popen[bytes] | None = None
    log = tmp_path / "adapter.log"
    t0 = time.monotonic()
    values = values_args(test_bed, [PA_DEFAULTS, MIGRATION])
    done = helm(
        "install", "gpuwarden", str(CHART), "-n", NS, *values, "--wait", "--timeout", "120s", cluster=cluster
    )
    print(f"\n[helm] install --wait: {time.monotonic() - t0:.1f}s")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "STATUS: deployed" in done.stdout
        # NOTES: their image is replaced; the namespace is restricted, so no warning.
        assert "gpuwarden's own image\nghcr.io/gpuwarden/gpuwarden:0.1.0 is used instead" in done.stdout
        assert "WARNING" not in done.stdout, done.stdout
        deployment = cluster.get_json("deployment", "gpuwarden-adapter", "-n", NS)
        assert deployment["status"].get("readyReplicas") == 2  # replicas: 2 from their values
        # The adapter as the chart's pod would run it: the chart's config, its ServiceAccount's token.
        config = cluster.get_json("configmap", "gpuwarden-config", "-n", NS)["data"]["config.yaml"]
        (tmp_path / "config.yaml").write_text(config)
        target = free_port()
        env = {**os.environ, "GPUWARDEN_ADAPTER__BIND_ADDRESS": "127.0.0.1"}
        cmd = [sys.executable, "-m", "gpuwarden", "adapter", "--config", str(tmp_path / "config.yaml"),
               "--kubeconfig", str(sa_kubeconfig(cluster, "gpuwarden-adapter", tmp_path / "sa.yaml")),
               "--secure-port", str(target)]  # fmt: skip
        with log.open("wb") as out:
            adapter = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        service = cluster.get_json("service", "gpuwarden-adapter", "-n", NS)["spec"]
        proxy = ServiceIP(service["clusterIP"], service["ports"][0]["port"], target).start()
        t1 = time.monotonic()
        for name in ("v1beta1.external.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"):
            try:
                wait_apiservice_available(cluster, name, timeout=90)
            except Exception as exc:
                raise AssertionError(f"{exc}\nadapter log:\n{log.read_text()[-3000:]}") from exc
        print(f"[helm] APIServices Available {time.monotonic() - t1:.1f}s after the adapter started")
        path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/queue_messages_ready"
        # The series is discovered within a relist (metricsRelistInterval: 5s) of its first scrape.
        poll(lambda: cluster.kubectl("get", "--raw", path, check=False), timeout=30, what=f"GET {path}")
        raw = json.loads(cluster.kubectl("get", "--raw", path))
        assert [i["value"] for i in raw["items"]] == ["30"], raw

        pod = pod_manifest("worker")
        selector = {"matchLabels": {"queue": "jobs"}}
        external = {"metric": {"name": "queue_messages_ready", "selector": selector},
                    "target": {"type": "AverageValue", "averageValue": "10"}}  # fmt: skip
        cluster.apply(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "worker", "namespace": namespace},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "worker"}},
                      "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}},
            {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
             "metadata": {"name": "worker", "namespace": namespace},
             "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "worker"},
                      "minReplicas": 1, "maxReplicas": 5,
                      "metrics": [{"type": "External", "external": external}]}},
        )  # fmt: skip

        def replicas() -> int:
            return int(cluster.get_json("deployment", "worker", "-n", namespace)["spec"]["replicas"])

        try:
            poll(lambda: replicas() == 3, timeout=90, what="worker scaled to 30 / 10 = 3 replicas")
        except TimeoutError as exc:
            describe = cluster.kubectl("describe", "hpa", "worker", "-n", namespace, check=False)
            raise AssertionError(f"{exc}\n{describe}\nadapter log:\n{log.read_text()[-3000:]}") from exc
        hpa = cluster.get_json("hpa", "worker", "-n", namespace)
        assert hpa["status"]["currentMetrics"][0]["external"]["metric"]["name"] == "queue_messages_ready"
    finally:
        # APIServices first, then their backend (namespace deletion and GC use discovery).
        t2 = time.monotonic()
        gone = helm("uninstall", "gpuwarden", "-n", NS, "--wait", "--timeout", "60s", cluster=cluster)
        print(f"[helm] uninstall --wait: {time.monotonic() - t2:.1f}s rc={gone.returncode}")
        if adapter is not None and adapter.poll() is None:
            os.killpg(adapter.pid, signal.SIGTERM)
            adapter.wait(timeout=20)
        if proxy is not None:
            proxy.stop()
        asyncio.run(prom.stop())
        exporter.stop()
    assert gone.returncode == 0, gone.stderr
    for kind in ("apiservice", "clusterrole", "clusterrolebinding"):
        left = kubectl(cluster, "get", kind, "-l", "app.kubernetes.io/instance=gpuwarden", "-o", "name")
        assert left.returncode == 0 and not left.stdout.strip(), left.stdout
