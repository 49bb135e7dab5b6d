"""The helm-installed gpuwarden release of tests/e2e/test_installed_image.py and what its tests read.

Kept apart from the tests so each reads in one screen: the values of the one `helm install`, the release's
pods and their timings, the node's and `kubectl top`'s view of their memory, the chart's scheduler
configuration adapted to the test bed's host-process kube-scheduler, the Lease and the extender's Service, and
a user's kustomize overlay of deploy/base.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from harness.testbed import Cluster, poll
from harness.testbed.product_image import ProductImage
from harness.testbed.realnode import REAL_NODE_LABEL
from tests.e2e.test_helm_chart import CHART, helm

NS = "gw-installed"


RELEASE = "gpuwarden"


NODE = "real-node-0"


NODE_NS = "gw-installed-node"


APISERVICES = (
    "v1beta1.custom.metrics.k8s.io",
    "v1beta2.custom.metrics.k8s.io",
    "v1beta1.external.metrics.k8s.io",
)


# resourceMetrics.enabled: the chart's metrics.k8s.io, served by the same adapter pods (kubectl top).
RESOURCE_APISERVICE = "v1beta1.metrics.k8s.io"


UUIDS = [f"GPU-1a5a11ed-0000-0000-0000-00000000000{i}" for i in range(8)]


Obj = dict[str, Any]


@dataclass
class Installed:
    cluster: Cluster
    image: ProductImage
    prometheus_url: str
    install_output: str
    values: Path
    numbers: dict[str, Any] = field(default_factory=dict)

    def kubectl_json(self, *args: str) -> Obj:
        doc: Obj = json.loads(self.cluster.kubectl(*args, "-o", "json"))
        return doc

    def pods(self, component: str | None = None) -> list[Obj]:
        selector = ["-l", f"app.kubernetes.io/component={component}"] if component else []
        items = self.kubectl_json("get", "pods", "-n", NS, *selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def node_agent_pod(self) -> Obj | None:
        """The node agent pod on the real node, once Ready (its pods on kwok GPU nodes are kwok's)."""
        items = self.kubectl_json("get", "pods", "-n", NODE_NS)["items"]
        pods = [p for p in items if p["spec"].get("nodeName") == NODE and ready(p)]
        return pods[0] if len(pods) == 1 else None


def install_values(prometheus_url: str, prometheus_port: int, chart_defaults: Obj) -> Obj:
    """What the one `helm install` sets: the adapter and controller on the real node (the controller with
    the leader bind protocol), resource metrics on (kube-prometheus's resource rules, unchanged), and the
    node agent as the real node's device plugin with an 8-GPU topology (this machine has no GPU)."""

    def toleration() -> Obj:
        return {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}

    def placement() -> Obj:  # a fresh copy each time: no YAML anchors in the values file
        return {"tolerations": [toleration()], "nodeSelector": {REAL_NODE_LABEL: "true"}}

    gpus = [
        {
            "index": i,
            "uuid": uuid,
            "pciBusId": f"0000:{0x10 + i:02x}:00.0",
            "numa": i // 4,
            "pcieSwitch": f"sw{i // 2}",
            "nvlinkPeers": [f"0000:{0x10 + j:02x}:00.0" for j in range(8) if j // 4 == i // 4 and j != i],
        }
        for i, uuid in enumerate(UUIDS)
    ]
    return {
        # what these tests prove is the acting install (a fresh one observes: tests/e2e/test_helm_beside.py)
        "mode": "act",
        "prometheus": {"url": prometheus_url, "port": prometheus_port},
        **placement(),
        "metricsRelistInterval": "10s",
        "resourceMetrics": {"enabled": True, "kubePrometheusRules": True},
        # the leader bind protocol: a bind the Service routes to the other replica is forwarded pod to pod
        "controller": {**placement(), "bindProtocol": "leader"},
        "nodeAgent": {
            "enabled": True,
            "devicePlugin": True,
            "namespace": NODE_NS,
            "tolerations": [*chart_defaults["nodeAgent"]["tolerations"], toleration()],
            "topology": {"gpus": gpus},
        },
    }


def ready(pod: Obj) -> bool:
    conds = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    return bool(conds.get("Ready", {}).get("status") == "True") and not pod["metadata"].get(
        "deletionTimestamp"
    )


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def start_to_ready(pod: Obj) -> tuple[float, float]:
    """(pod created -> Ready, container started -> Ready) in seconds, from the API's own timestamps."""
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    ready = _ts(conds["Ready"]["lastTransitionTime"])
    started = _ts(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    return ready - _ts(pod["metadata"]["creationTimestamp"]), ready - started


def pod_rss_mib(uid: str) -> float:
    """Sum of VmRSS of the node's processes whose cgroup path names the pod (cgroupfs: pod<uid>)."""
    total = 0
    needle = f"pod{uid}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "cgroup").read_text():
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(m.group(1)) if m else 0
    return total / 1024


def run_kubectl(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """kubectl with its stderr (warnings, errors) kept, and its exit code not checked."""
    cmd = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def top_rows(output: str) -> list[list[str]]:
    """`kubectl top` output without its header, split into columns."""
    return [line.split() for line in output.strip().splitlines()[1:] if line.strip()]


def mib(quantity: str) -> float:
    """A memory quantity as kubectl top prints it (Ki, Mi, Gi or bytes) in MiB."""
    units = {"Ki": 2**-10, "Mi": 1, "Gi": 2**10}
    return float(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity) / 2**20


PSA = "pod-security.kubernetes.io"


def pod_security_warnings(cluster: Cluster, namespace: str) -> str:
    """Pod Security admission's warnings for the namespace's existing pods against ``restricted``.

    A server-side dry run of the namespace's enforce labels, pinned to the server's version: a changed
    enforce policy (level or version) makes the admission evaluate every pod of the namespace and answer with
    a warning per violation, and nothing is changed."""
    server = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]
    version = f"v{server['major']}.{server['minor'].rstrip('+')}"
    labels = [f"{PSA}/enforce=restricted", f"{PSA}/enforce-version={version}"]
    result = run_kubectl(cluster, "label", "--dry-run=server", "--overwrite", "namespace", namespace, *labels)
    assert result.returncode == 0, result.stderr
    return result.stderr


WORKING_SET = "container_memory_working_set_bytes"


def kubectl_top(cluster: Cluster, namespace: str, pods: set[str]) -> dict[str, list[str]] | None:
    """`kubectl top pods -n NAMESPACE --containers` as {pod: [pod, container, cpu, memory]}, once it has a
    row for every pod in `pods` (None until then)."""
    result = run_kubectl(cluster, "top", "pods", "-n", namespace, "--containers")
    rows = {r[0]: r for r in top_rows(result.stdout)} if result.returncode == 0 else {}
    return rows if pods <= set(rows) else None


def prom_query(url: str, query: str) -> list[Obj]:
    """An instant query's result vector (`[{metric, value: [t, "v"]}]`)."""
    query_string = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query_string}", timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    result: list[Obj] = doc["data"]["result"]
    return result


def wait_release_ready(inst: Installed, timeout: float = 240) -> list[Obj]:
    def all_ready() -> list[Obj] | None:
        pods = inst.pods()
        deployments = inst.kubectl_json("get", "deployments", "-n", NS)["items"]
        want = sum(int(d["spec"]["replicas"]) for d in deployments)
        updated = all(
            (d.get("status") or {}).get("updatedReplicas") == d["spec"]["replicas"]
            and (d.get("status") or {}).get("replicas") == d["spec"]["replicas"]
            for d in deployments
        )
        return pods if updated and len(pods) == want and all(ready(p) for p in pods) else None

    try:
        return poll(all_ready, timeout=timeout, interval=1.0, what=f"every pod of release {RELEASE} Ready")
    except TimeoutError as exc:
        summary = [
            (p["metadata"]["name"], p["status"].get("phase"), p["status"].get("containerStatuses"))
            for p in inst.pods()
        ]
        events = inst.cluster.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
        raise AssertionError(f"{exc}\npods: {summary}\nevents:\n{events[-4000:]}") from exc


def chart_scheduler_config(inst: Installed) -> Obj:
    """The chart's KubeSchedulerConfiguration (scheduler.enabled) for the test bed's kube-scheduler.

    Two changes, both because that kube-scheduler is a host process and not the chart's pod: the extender's
    Service is dialled at its ClusterIP (kube-proxy routes it to a controller pod; the host has no cluster
    DNS), and the default profile is kept beside gpuwarden-scheduler (it schedules everything else here).
    """
    done = helm(
        "template", RELEASE, str(CHART), "-n", NS, "-f", str(inst.values), "--set", "scheduler.enabled=true"
    )
    assert done.returncode == 0, done.stderr
    configmap = next(
        d
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuwarden-scheduler-config"
    )
    config: Obj = yaml.safe_load(configmap["data"]["config.yaml"])
    ip = inst.cluster.get_json("service", "gpuwarden-controller", "-n", NS)["spec"]["clusterIP"]
    for ext in config["extenders"]:
        ext["urlPrefix"] = ext["urlPrefix"].replace(f"gpuwarden-controller.{NS}.svc", ip)
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{"schedulerName": "default-scheduler"}, *config["profiles"]]
    return config


def lease_holder(cluster: Cluster) -> str:
    lease = cluster.get_json("lease", "gpuwarden-controller", "-n", NS)
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def extender_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


CLUSTER_SCOPED = (
    "clusterroles,clusterrolebindings,apiservices,namespaces,priorityclasses,mutatingwebhookconfigurations,"
    "validatingadmissionpolicies,validatingadmissionpolicybindings"
)


def release_objects(cluster: Cluster) -> list[str]:
    out = cluster.kubectl(
        "get", CLUSTER_SCOPED, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name", check=False
    )
    return out.split()


def kustomize_overlay(inst: Installed, directory: Path) -> Path:
    """deploy/base as a user would adapt it: their Prometheus URL, and the test bed's real node."""
    base = CHART.parent.parent / "base"
    configmap = yaml.safe_load((base / "configmap.yaml").read_text())
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["prometheus"]["url"] = inst.prometheus_url
    configmap["data"]["config.yaml"] = yaml.safe_dump(config, sort_keys=False)
    placement = {
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {REAL_NODE_LABEL: "true"},
                    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                }
            }
        }
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "configmap.yaml").write_text(yaml.safe_dump(configmap))
    patches = [{"path": "configmap.yaml"}]
    for name in ("gpuwarden-adapter", "gpuwarden-controller"):
        doc = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "gpuwarden"},
        }
        (directory / f"{name}.yaml").write_text(yaml.safe_dump({**doc, **placement}))
        patches.append({"path": f"{name}.yaml"})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, directory)],  # kustomize refuses an absolute base
        "patches": patches,
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory
