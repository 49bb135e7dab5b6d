"""`gpuwarden preflight`: what a cluster already runs, and what an install would collide with or miss.

Why it exists: a GPU cluster rarely starts empty - a prometheus-adapter owns custom.metrics.k8s.io, KEDA owns
external.metrics.k8s.io, NVIDIA's device plugin runs on the GPU nodes, dcgm-exporter is scraped with the GPU
Operator's label style, a managed control plane runs a version of its own. Each finding names the chart value
that fits it, before anything is installed (docs/install.md, "Before you start").

`decide` is pure (facts -> findings, rendered as text: golden files in tests/unit/golden/preflight/);
`observe` reads the facts through the one Kubernetes client and the one Prometheus client, and never writes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpuwarden.errors import GpuwardenError, KubeError
from gpuwarden.kube import NODES, PODS, JsonObject, KubeClient, Resource
from gpuwarden.promclient import PrometheusClient

APISERVICES = Resource("apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False)
OUR_SERVICE = "gpuwarden-adapter"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
# name -> the chart value that leaves it to its owner
APIS = {
    "v1beta1.custom.metrics.k8s.io": "apiServices.customMetrics.enabled=false",
    "v1beta2.custom.metrics.k8s.io": "apiServices.customMetrics.enabled=false",
    "v1beta1.external.metrics.k8s.io": "apiServices.externalMetrics.enabled=false (or keda.enabled=true)",
    "v1beta1.metrics.k8s.io": "resourceMetrics.enabled=false (the default)",
}
# DCGM fields the health checks read (health.signals; deploy/dcgm-exporter/dcgm-metrics.csv has them all)
HEALTH_FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
)
# Fields an exporter serves only once they have something to say: dcgm-exporter writes no XID series until a
# GPU reports an XID, so its absence says nothing about the CSV (seen on the test bed's exporter).
SILENT_UNTIL_FAULT = frozenset({"DCGM_FI_DEV_XID_ERRORS"})
Status = Literal["ok", "warn", "conflict"]


@dataclass(frozen=True)
class Facts:
    """What preflight read. None: could not be read (unknown, never assumed fine)."""

    server_version: str | None
    apiservices: dict[str, str | None]  # name -> owner ("" ours, None absent)
    gpu_nodes: tuple[str, ...]
    device_plugin_nodes: tuple[str, ...]  # GPU nodes running an NVIDIA device plugin pod
    prometheus_url: str
    prometheus_error: str | None  # None: reachable
    dcgm_labels: frozenset[str] = field(default_factory=frozenset)  # label names on DCGM_FI_DEV_GPU_UTIL
    dcgm_fields: frozenset[str] = field(default_factory=frozenset)  # DCGM_FI_* names with series


@dataclass(frozen=True)
class Finding:
    status: Status
    check: str
    detail: str
    value: str = ""  # the chart value (or step) to set; "" none

    def line(self) -> str:
        tail = f"\n{'':13}-> {self.value}" if self.value else ""
        return f"[{self.status:^8}] {self.check}: {self.detail}{tail}"


@dataclass(frozen=True)
class Intent:
    """What the install would register, when known (the chart's hook passes it; `--claims`, `--take-over`).
    claims None: unknown, judged as the chart's defaults (custom and external metrics, not metrics.k8s.io)."""

    claims: frozenset[str] | None = None
    take_over: bool = False


def decide(facts: Facts, intent: Intent = Intent()) -> list[Finding]:
    findings = [_apiservice(name, owner, intent) for name, owner in facts.apiservices.items()]
    findings.append(_device_plugin(facts))
    findings += _prometheus(facts)
    findings.append(_control_plane(facts.server_version))
    return findings


def _apiservice(name: str, owner: str | None, intent: Intent) -> Finding:
    check = f"APIService {name}"
    if intent.claims is not None:
        return _claimed(check, owner, name in intent.claims, intent.take_over)
    if owner is None and name == "v1beta1.metrics.k8s.io":
        return Finding("ok", check, "not registered (the chart registers it with resourceMetrics.enabled)")
    if owner is None:
        return Finding("ok", check, "not registered: the chart registers it")
    if owner == "":
        return Finding("ok", check, "served by gpuwarden already")
    if name == "v1beta1.metrics.k8s.io":
        return Finding("ok", check, f"served by {owner}; the chart leaves it", APIS[name])
    return Finding("conflict", check, f"served by {owner}: the chart refuses it",
                   f"{APIS[name]}, or apiServices.takeOver=true with helm --take-ownership")  # fmt: skip


def _claimed(check: str, owner: str | None, claimed: bool, take_over: bool) -> Finding:
    """An APIService judged against what this install registers."""
    if not claimed:
        held = {None: "not registered", "": "served by gpuwarden"}.get(owner, f"served by {owner}")
        return Finding("ok", check, f"{held}; this install leaves it")
    if owner is None:
        return Finding("ok", check, "not registered: this install registers it")
    if owner == "":
        return Finding("ok", check, "served by gpuwarden already")
    if take_over:
        return Finding("warn", check, f"served by {owner}: this install takes it over (apiServices.takeOver)",
                       "docs/uninstall.md restores it from gpuwarden.io/displaced-service")  # fmt: skip
    return Finding("conflict", check, f"served by {owner}: this install would take it",
                   "switch it off (apiServices.*.enabled=false, resourceMetrics.enabled=false), or "
                   "apiServices.takeOver=true with helm --take-ownership")  # fmt: skip


def _device_plugin(facts: Facts) -> Finding:
    check = "NVIDIA device plugin"
    if not facts.gpu_nodes:
        return Finding(
            "warn", check, f"no GPU nodes (label {GPU_NODE_LABEL}=true): the node agent schedules nowhere"
        )
    if not facts.device_plugin_nodes:
        return Finding("ok", check, f"on none of {len(facts.gpu_nodes)} GPU node(s)",
                       "nodeAgent.devicePlugin=true is possible (enforce mode)")  # fmt: skip
    where = ", ".join(facts.device_plugin_nodes)
    return Finding("warn", check, f"runs on {len(facts.device_plugin_nodes)} of {len(facts.gpu_nodes)} GPU "
                   f"node(s) ({where}): the node agent's enforce mode would register a second plugin there",
                   "nodeAgent.devicePlugin=false (the default: observe beside it)")  # fmt: skip


def _prometheus(facts: Facts) -> list[Finding]:
    url = facts.prometheus_url
    if facts.prometheus_error is not None:
        return [Finding("conflict", "Prometheus", f"{url} unreachable ({facts.prometheus_error})",
                        "prometheus.url / prometheus.port (kube-prometheus-stack: "
                        "http://<release>-kube-prometheus-prometheus.<namespace>.svc)")]  # fmt: skip
    found = [Finding("ok", "Prometheus", f"{url} answers")]
    labels = facts.dcgm_labels
    if not labels:
        scrape = "scrape dcgm-exporter (gpu-operator: dcgmExporter.serviceMonitor.enabled)"
        found.append(Finding("warn", "dcgm-exporter", "no DCGM_FI_DEV_GPU_UTIL series in Prometheus", scrape))
    elif "exported_pod" in labels:
        found.append(Finding("warn", "dcgm-exporter labels", "honorLabels: false (pod is exported_pod)",
                             "config.adapter.presets.dcgm_pod_label=exported_pod, "
                             "config.adapter.presets.dcgm_namespace_label=exported_namespace"))  # fmt: skip
    else:
        found.append(Finding("ok", "dcgm-exporter labels", "honorLabels: true (pod, namespace)"))
    if labels:
        missing = [f for f in HEALTH_FIELDS if f not in facts.dcgm_fields and f not in SILENT_UNTIL_FAULT]
        if missing:
            detail = "missing from its CSV: " + ", ".join(missing)
            csv = "add them to the exporter's CSV (deploy/dcgm-exporter/dcgm-metrics.csv)"
            found.append(Finding("warn", "dcgm-exporter fields", detail, csv))
        else:
            found.append(Finding("ok", "dcgm-exporter fields", "every field the health checks read"))
    return found


def _control_plane(version: str | None) -> Finding:
    release = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version or "")
    if release is None:
        return Finding("warn", "control plane", "version unknown", "scheduler.image: pin it to your version")
    major, minor, patch = release.groups()
    image = f"registry.k8s.io/kube-scheduler:v{major}.{minor}.{patch}"
    detail = f"{version}: gpuwarden-scheduler runs kube-scheduler {major}.{minor}"
    return Finding("ok", "control plane", detail,
                   f"scheduler.image empty: the chart follows the cluster ({image})")  # fmt: skip


def render(facts: Facts, findings: Sequence[Finding]) -> str:
    counts = {s: sum(f.status == s for f in findings) for s in ("ok", "warn", "conflict")}
    lines = [f.line() for f in findings]
    lines.append(
        f"preflight: {counts['conflict']} conflict(s), {counts['warn']} warning(s), {counts['ok']} ok"
    )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ observe
def owner_of(apiservice: JsonObject) -> str:
    """Who serves an APIService, as a user would name it; "" when it is gpuwarden's adapter."""
    spec = apiservice.get("spec") or {}
    service = spec.get("service")
    if not service:
        return "kube-apiserver (Local)"
    if service.get("name") == OUR_SERVICE:
        return ""
    meta = apiservice.get("metadata") or {}
    release = (meta.get("annotations") or {}).get("meta.helm.sh/release-name")
    owner = f"Service {service.get('namespace')}/{service.get('name')}"
    return f"{owner} (Helm release {release})" if release else owner


def device_plugin_nodes(pods: Sequence[JsonObject], gpu_nodes: Sequence[str]) -> tuple[str, ...]:
    on = set()
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", ""))
        node = (pod.get("spec") or {}).get("nodeName")
        if "nvidia-device-plugin" in name and node in gpu_nodes:
            on.add(str(node))
    return tuple(sorted(on))


async def observe(kube: KubeClient, prom: PrometheusClient, prometheus_url: str) -> Facts:
    try:
        version: str | None = str((await kube.request("GET", "/version", verb="get", resource="version"))
                                  .get("gitVersion", "")) or None  # fmt: skip
    except KubeError:
        version = None
    listed = {str(a["metadata"]["name"]): a for a in (await kube.list_objects(APISERVICES)).items}
    apiservices = {name: (owner_of(listed[name]) if name in listed else None) for name in APIS}
    nodes = (await kube.list_objects(NODES, label_selector=f"{GPU_NODE_LABEL}=true")).items
    gpu_nodes = tuple(sorted(str(n["metadata"]["name"]) for n in nodes))
    pods = (await kube.list_objects(PODS, field_selector="status.phase=Running")).items
    error: str | None = None
    labels: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()
    try:
        labels = frozenset(await prom.labels(["DCGM_FI_DEV_GPU_UTIL"]))
        fields = frozenset(n for n in await prom.label_values("__name__") if n.startswith("DCGM_FI_"))
    except GpuwardenError as exc:
        error = exc.message
    return Facts(version, apiservices, gpu_nodes, device_plugin_nodes(pods, gpu_nodes), prometheus_url, error,
                 labels, fields)  # fmt: skip
