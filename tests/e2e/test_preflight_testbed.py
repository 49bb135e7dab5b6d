"""`gpuwarden preflight` against the test bed's real kube-apiserver and a real Prometheus (issue 46).

The cluster holds what a GPU cluster already runs: prometheus-adapter's and KEDA's APIServices (as their
charts register them), an NVIDIA device plugin pod on one GPU node, and a dcgm-exporter (the fleet simulator)
scraped GPU Operator style, `honor_labels: false` behind the exporter pod's own target labels, with a CSV that
leaves out two fields the health checks read. `gpuwarden preflight` (the real CLI, a subprocess) must name
each of them with the value to set, `--strict` must fail on the conflicts, and following its advice must get
the chart past its own APIService refusal. The rules rendered for the labels it found record, in that real
Prometheus, the pods holding the GPUs (tests/unit/test_deploy_rules.py shows the default render misreading
the same shape under promtool).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from gpuwarden.promtypes import Vector
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from harness.testbed import Cluster, ensure_namespace, poll
from tests.e2e.conftest import GPU_NODES, pod_manifest
from tests.e2e.test_deploy_dryrun import as_list, kubectl
from tests.e2e.test_helm_beside import keda_owns_external, server_render  # noqa: F401 (fixture)
from tests.e2e.test_helm_chart import template

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CUSTOM = "v1beta1.custom.metrics.k8s.io"
EXTERNAL = "v1beta1.external.metrics.k8s.io"
PLUGIN_NS = "gpu-operator"
PLUGIN_POD = "nvidia-device-plugin-daemonset-x7k2p"
# dcgm-exporter's CSV without two of the fields the health checks read (preflight.HEALTH_FIELDS)
CSV = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS",
       "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]  # fmt: skip
# what a ServiceMonitor's discovery puts on the exporter's target: its own pod, so the GPU's pod is exported_*
EXPORTER_TARGET = {"pod": "nvidia-dcgm-exporter-5xq8v", "namespace": PLUGIN_NS}


@pytest.fixture
def adapter_owns_custom(cluster: Cluster) -> Iterator[None]:
    """prometheus-adapter's APIService as its chart installs it."""
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": CUSTOM,
                     "annotations": {"meta.helm.sh/release-name": "prometheus-adapter",
                                     "meta.helm.sh/release-namespace": "monitoring"}},
        "spec": {"group": "custom.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": True,
                 "service": {"name": "prometheus-adapter", "namespace": "monitoring", "port": 443}},
    }  # fmt: skip
    previous = kubectl(cluster, "get", "apiservice", CUSTOM, "-o", "json")
    done = kubectl(cluster, "apply", "-f", "-", input=json.dumps(apiservice))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        kubectl(cluster, "delete", "apiservice", CUSTOM, "--ignore-not-found")
        if previous.returncode == 0:
            restored = json.loads(previous.stdout)
            for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
                restored["metadata"].pop(key, None)
            restored.pop("status", None)
            kubectl(cluster, "apply", "-f", "-", input=json.dumps(restored))


@pytest.fixture
def device_plugin(cluster: Cluster) -> Iterator[str]:
    """An NVIDIA device plugin DaemonSet's pod on the first GPU node (kwok runs it)."""
    ensure_namespace(cluster, PLUGIN_NS)
    pod = pod_manifest(PLUGIN_POD, nodeName=GPU_NODES[0], tolerations=[{"operator": "Exists"}])
    pod["metadata"]["namespace"] = PLUGIN_NS
    done = kubectl(cluster, "apply", "-f", "-", input=json.dumps(pod))
    assert done.returncode == 0, done.stderr
    poll(lambda: "Running" in kubectl(cluster, "get", "pod", "-n", PLUGIN_NS, PLUGIN_POD,
                                      "-o", "jsonpath={.status.phase}").stdout,
         timeout=60, what="the device plugin pod Running")  # fmt: skip
    try:
        yield GPU_NODES[0]
    finally:
        kubectl(cluster, "delete", "pod", "-n", PLUGIN_NS, PLUGIN_POD, "--grace-period=0", "--force")


def _generate() -> Any:
    """deploy/generate.py (a script) as a module: render_rules is the chart's own substitution."""
    spec = importlib.util.spec_from_file_location("deploy_generate", ROOT / "deploy" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Exporter:
    prom: LocalPrometheus


@pytest_asyncio.fixture
async def operator_exporter(tmp_path: Path) -> AsyncIterator[Exporter]:
    """dcgm-exporter (the simulator, a pod holding a GPU on each node) scraped as the GPU Operator's
    ServiceMonitor does; the recording rules rendered for exported_pod / exported_namespace loaded."""
    scenario = parse_scenario({
        "fleet": {"nodes": len(GPU_NODES), "node_name_pattern": "gpu-node-{index}"},
        "exporter": {"tick": 0.5, "metrics": CSV},
        "workloads": [{"name": "infer", "namespace": "ml", "replicas": 2,
                       "load": [{"at": 0, "qps": 100}]}],
    })  # fmt: skip
    rules = tmp_path / "exported.rules.yaml"
    rules.write_text(_generate().render_rules(_generate().RULES_TEMPLATE.read_text(), "exported_pod",
                                              "exported_namespace"))  # fmt: skip
    sim = await start(scenario)
    target = scrape_target("dcgm-exporter", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0,
                           honor_labels=False, labels=EXPORTER_TARGET)  # fmt: skip
    prom = LocalPrometheus(tmp_path / "prom", [target], rule_files=[rules])
    try:
        await prom.start()
        await prom.wait_for_up("dcgm-exporter")
        yield Exporter(prom)
    finally:
        await prom.stop()
        await sim.stop()


def preflight(cluster: Cluster, prom_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpuwarden", "preflight", f"--kubeconfig={cluster.kubeconfig}",
           f"--prometheus-url={prom_url}", "--log-format=text", *flags]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


async def recorded_pods(prom: LocalPrometheus, within: float) -> set[tuple[str, str]]:
    """The (namespace, pod) pairs namespace_pod:dcgm_gpu_utilization:avg records, once it records any."""
    deadline = time.monotonic() + within
    async with prom.client() as client:
        while True:
            result = await client.query("namespace_pod:dcgm_gpu_utilization:avg")
            assert isinstance(result, Vector)
            pods = {(s.labels.get("namespace", ""), s.labels.get("pod", "")) for s in result.samples}
            if pods or time.monotonic() > deadline:
                return pods
            await asyncio.sleep(0.5)


def test_a_bare_test_bed_has_no_conflict(cluster: Cluster) -> None:
    """No incumbent: every APIService free, no device plugin, Prometheus unreachable is the one conflict."""
    done = preflight(cluster, "http://127.0.0.1:1", "--strict")
    out = done.stdout
    for api in (CUSTOM, EXTERNAL):
        assert f"[   ok   ] APIService {api}: not registered: the chart registers it" in out, out
    assert "NVIDIA device plugin: on none of" in out
    assert "[conflict] Prometheus: http://127.0.0.1:1/ unreachable" in out, out
    assert done.returncode == 1


async def test_preflight_names_each_incumbent_with_the_value_to_set(
    cluster: Cluster,
    adapter_owns_custom: None,
    keda_owns_external: None,  # noqa: F811
    device_plugin: str,
    operator_exporter: Exporter,
) -> None:
    # (in a thread: the simulator serves from this event loop)
    t0 = time.monotonic()
    done = await asyncio.to_thread(preflight, cluster, operator_exporter.prom.url, "--strict")
    print(
        f"\n[walkthrough] gpuwarden preflight: {time.monotonic() - t0:.2f} s\n{done.stdout}", file=sys.stderr
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr  # --strict: the two conflicts
    lines = {line.split("] ", 1)[1].split(":", 1)[0]: line for line in out.splitlines() if "] " in line}
    custom = lines[f"APIService {CUSTOM}"]
    assert custom.startswith("[conflict]")
    assert "Service monitoring/prometheus-adapter (Helm release prometheus-adapter)" in custom
    assert "apiServices.customMetrics.enabled=false" in out
    external = lines[f"APIService {EXTERNAL}"]
    assert external.startswith("[conflict]") and "Service keda/keda-operator-metrics-apiserver" in external
    assert "apiServices.externalMetrics.enabled=false (or keda.enabled=true)" in out
    plugin = lines["NVIDIA device plugin"]
    assert f"runs on 1 of {len(GPU_NODES)} GPU node(s) ({device_plugin})" in plugin
    assert "honorLabels: false (pod is exported_pod)" in lines["dcgm-exporter labels"]
    assert "config.adapter.presets.dcgm_pod_label=exported_pod" in out
    fields = lines["dcgm-exporter fields"]
    assert fields.endswith("missing from its CSV: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, DCGM_FI_DEV_RETIRED_DBE")
    version = json.loads(kubectl(cluster, "version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert lines["control plane"].startswith(f"[   ok   ] control plane: {version}:")
    assert out.rstrip().endswith("preflight: 2 conflict(s), 3 warning(s), 4 ok")
    report = await asyncio.to_thread(preflight, cluster, operator_exporter.prom.url)
    assert report.returncode == 0 and report.stdout == out  # without --strict: a report

    # Its advice, followed: the chart no longer refuses, and leaves both APIServices to their owners.
    refused = await asyncio.to_thread(server_render, cluster, [])
    assert refused.returncode != 0 and "prometheus-adapter" in refused.stderr
    advice = ["apiServices.customMetrics.enabled=false", "apiServices.externalMetrics.enabled=false"]
    advised = await asyncio.to_thread(server_render, cluster, advice)
    assert advised.returncode == 0, advised.stderr
    assert "kind: APIService" not in advised.stdout

    # The rules rendered for the labels it found record the pod holding each GPU, not the exporter's pod.
    assert await recorded_pods(operator_exporter.prom, 30) == {("ml", "infer-0"), ("ml", "infer-1")}


# ------------------------------------------------------------------------------------ the chart's hook Job
HOOK_NS = "gw-preflight"


def hook_objects(sets: list[str]) -> list[dict[str, Any]]:
    objects = template(["preflightHook.enabled=true", *sets], namespace=HOOK_NS)
    return [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "preflight"
    ]


def hook_args(objects: list[dict[str, Any]], prom_url: str) -> list[str]:
    """The hook container's args, its in-cluster Prometheus URL swapped for the test's."""
    (job,) = [o for o in objects if o["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return [f"--prometheus-url={prom_url}" if a.startswith("--prometheus-url=") else a for a in args]


@pytest.fixture
def hook_rights(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The hook's ServiceAccount and ClusterRole applied; a kubeconfig with that account's token."""
    ensure_namespace(cluster, HOOK_NS)
    rbac = [o for o in hook_objects([]) if o["kind"] != "Job"]
    assert sorted(o["kind"] for o in rbac) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    done = kubectl(cluster, "apply", "-f", "-", input=as_list(rbac))
    assert done.returncode == 0, done.stderr
    token = kubectl(cluster, "create", "token", "gpuwarden-preflight", "-n", HOOK_NS, "--duration=1h")
    assert token.returncode == 0, token.stderr
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "t", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_cert)}}],
        "users": [{"name": "preflight", "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "t", "user": "preflight", "namespace": HOOK_NS}}],
    }  # fmt: skip
    path = tmp_path / "preflight.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    try:
        yield path
    finally:
        kubectl(cluster, "delete", "--ignore-not-found", "-f", "-", input=as_list(rbac))


@pytest.mark.parametrize(
    ("sets", "code", "expected"),
    [
        pytest.param([], 1, [f"[conflict] APIService {CUSTOM}: served by Service monitoring/prometheus-",
                             f"[conflict] APIService {EXTERNAL}: served by Service keda/"], id="defaults"),
        pytest.param(["apiServices.customMetrics.enabled=false", "keda.enabled=true"], 0,
                     [f"[   ok   ] APIService {CUSTOM}: served by Service monitoring/prometheus-adapter "
                      "(Helm release prometheus-adapter); this install leaves it"], id="as-advised"),
        pytest.param(["apiServices.takeOver=true"], 0,
                     [f"[  warn  ] APIService {CUSTOM}: served by Service monitoring/prometheus-adapter "
                      "(Helm release prometheus-adapter): this install takes it over"], id="take-over"),
        pytest.param(["adapter.enabled=false"], 0,
                     [f"[   ok   ] APIService {EXTERNAL}: served by Service keda/"], id="adapter-off"),
    ],
)  # fmt: skip
async def test_the_hook_jobs_preflight_fails_the_install_only_on_what_it_would_take(
    cluster: Cluster,
    adapter_owns_custom: None,
    keda_owns_external: None,  # noqa: F811
    operator_exporter: Exporter,
    hook_rights: Path,
    sets: list[str],
    code: int,
    expected: list[str],
) -> None:
    """The Job's own args (claims and take-over from the values) run as its ServiceAccount: its rights are
    enough, and --strict fails exactly when this release would take an APIService from its owner. (Run from
    the host: the test bed's kwok nodes run no containers.)"""
    args = hook_args(hook_objects(sets), operator_exporter.prom.url)
    cmd = [sys.executable, "-m", "gpuwarden", *args, f"--kubeconfig={hook_rights}"]
    done = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == code, done.stdout + done.stderr
    for line in expected:
        assert line in done.stdout, done.stdout
    assert "control plane: v" in done.stdout  # /version readable with the hook's rights


def test_the_hook_is_opt_in_and_leaves_no_cluster_scoped_object() -> None:
    assert not any(o["metadata"]["name"] == "gpuwarden-preflight" for o in template([]))  # off by default
    for obj in hook_objects([]):
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        policy = set(annotations["helm.sh/hook-delete-policy"].split(","))
        if obj["kind"] == "Job":  # kept when it fails: its pod's log holds the findings
            assert policy == {"before-hook-creation", "hook-succeeded"}
        else:  # created before the Job, gone when the hook ends either way
            assert policy == {"before-hook-creation", "hook-succeeded", "hook-failed"}
            assert int(annotations["helm.sh/hook-weight"]) < 0
