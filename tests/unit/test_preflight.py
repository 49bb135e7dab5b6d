"""gpuwarden/preflight.py: the findings for a bare cluster, the stack a GPU cluster runs, and a conflicting
one (golden files: tests/unit/golden/preflight/*.txt; regenerate with GPUWARDEN_UPDATE_GOLDEN=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.preflight import HEALTH_FIELDS, Facts, Intent, decide, device_plugin_nodes, owner_of, render

GOLDEN = Path(__file__).parent / "golden" / "preflight"
NONE_REGISTERED: dict[str, str | None] = dict.fromkeys(
    ["v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io",
     "v1beta1.metrics.k8s.io"]
)  # fmt: skip
STACK_PROM = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
GPU_NODES = ("gpu-a", "gpu-b")
PA = "Service monitoring/prometheus-adapter (Helm release prometheus-adapter)"
KEDA = "Service keda/keda-operator-metrics-apiserver (Helm release keda)"

CASES = {
    # kubeadm, nothing installed yet, no Prometheus
    "bare": Facts("v1.36.2", NONE_REGISTERED, (), (), "http://prometheus-k8s.monitoring.svc:9090",
                  "connection refused"),
    # kube-prometheus-stack + GPU Operator (device plugin, dcgm-exporter honorLabels: true, full CSV),
    # metrics-server; no other metrics adapter
    "stack": Facts("v1.36.2-eks-1f2a",
                   {**NONE_REGISTERED, "v1beta1.metrics.k8s.io": "Service kube-system/metrics-server"},
                   GPU_NODES, GPU_NODES, STACK_PROM, None,
                   frozenset({"__name__", "gpu", "UUID", "pod", "namespace", "container", "Hostname"}),
                   frozenset(HEALTH_FIELDS)),
    # the same with prometheus-adapter owning custom.metrics, KEDA external.metrics, dcgm-exporter's
    # default honorLabels: false and its default CSV (no ECC, retired pages or remapping fields)
    "conflicting": Facts(
        "v1.36.2",
        {"v1beta1.custom.metrics.k8s.io": PA,
         "v1beta2.custom.metrics.k8s.io": None,
         "v1beta1.external.metrics.k8s.io": KEDA,
         "v1beta1.metrics.k8s.io": PA},
        GPU_NODES, ("gpu-b",), STACK_PROM, None,
        frozenset({"__name__", "gpu", "UUID", "exported_pod", "exported_namespace", "namespace"}),
        frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"}),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_golden_output(case: str) -> None:
    facts = CASES[case]
    text = render(facts, decide(facts))
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize(
    ("case", "conflicts"),
    [("bare", ["Prometheus"]), ("stack", []),
     ("conflicting", ["APIService v1beta1.custom.metrics.k8s.io",
                      "APIService v1beta1.external.metrics.k8s.io"])],
)  # fmt: skip
def test_conflicts(case: str, conflicts: list[str]) -> None:
    assert [f.check for f in decide(CASES[case]) if f.status == "conflict"] == conflicts


@pytest.mark.parametrize(
    ("apiservice", "owner"),
    [
        pytest.param({"spec": {}}, "kube-apiserver (Local)", id="local"),
        pytest.param({"spec": {"service": {"name": "gpuwarden-adapter", "namespace": "x"}}}, "", id="ours"),
        pytest.param(
            {"metadata": {"annotations": {"meta.helm.sh/release-name": "keda"}},
             "spec": {"service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda"}}},
            "Service keda/keda-operator-metrics-apiserver (Helm release keda)",
            id="helm-release",
        ),
    ],
)  # fmt: skip
def test_owner_of(apiservice: dict[str, object], owner: str) -> None:
    assert owner_of(apiservice) == owner


def test_device_plugin_nodes_are_gpu_nodes_running_it() -> None:
    pods = [
        {"metadata": {"name": "nvidia-device-plugin-daemonset-x1"}, "spec": {"nodeName": "gpu-a"}},
        {"metadata": {"name": "nvidia-device-plugin-daemonset-x2"}, "spec": {"nodeName": "cpu-1"}},
        {"metadata": {"name": "dcgm-exporter-x"}, "spec": {"nodeName": "gpu-b"}},
    ]
    assert device_plugin_nodes(pods, GPU_NODES) == ("gpu-a",)


CUSTOM = "v1beta1.custom.metrics.k8s.io"


@pytest.mark.parametrize(
    ("owner", "claims", "take_over", "status", "detail"),
    [
        pytest.param(
            PA, {CUSTOM}, False, "conflict", f"served by {PA}: this install would take it", id="claimed"
        ),
        pytest.param(PA, set(), False, "ok", f"served by {PA}; this install leaves it", id="switched-off"),
        pytest.param(
            PA,
            {CUSTOM},
            True,
            "warn",
            f"served by {PA}: this install takes it over (apiServices.takeOver)",
            id="take-over",
        ),
        pytest.param(None, {CUSTOM}, False, "ok", "not registered: this install registers it", id="free"),
        pytest.param(None, set(), False, "ok", "not registered; this install leaves it", id="free-unclaimed"),
        pytest.param("", {CUSTOM}, False, "ok", "served by gpuwarden already", id="ours"),
        pytest.param(
            "", set(), True, "ok", "served by gpuwarden; this install leaves it", id="ours-unclaimed"
        ),
    ],
)
def test_apiservices_judged_against_what_the_install_claims(
    owner: str | None, claims: set[str], take_over: bool, status: str, detail: str
) -> None:
    facts = Facts("v1.36.2", {CUSTOM: owner}, (), (), STACK_PROM, None)
    (finding,) = [f for f in decide(facts, Intent(frozenset(claims), take_over)) if f.check.startswith("API")]
    assert (finding.status, finding.detail) == (status, detail)


def test_an_unknown_intent_is_judged_as_the_charts_defaults() -> None:
    facts = CASES["conflicting"]
    defaults = frozenset({CUSTOM, "v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io"})
    conflicts = [f.check for f in decide(facts, Intent(defaults)) if f.status == "conflict"]
    assert conflicts == [f.check for f in decide(facts) if f.status == "conflict"]


def test_a_field_served_only_after_a_fault_is_not_called_missing() -> None:
    """dcgm-exporter writes DCGM_FI_DEV_XID_ERRORS only once a GPU reported an XID: none while healthy."""
    from dataclasses import replace

    healthy = replace(CASES["stack"], dcgm_fields=frozenset(HEALTH_FIELDS) - {"DCGM_FI_DEV_XID_ERRORS"})
    (fields,) = [f for f in decide(healthy) if f.check == "dcgm-exporter fields"]
    assert fields.status == "ok"
    without_ecc = replace(healthy, dcgm_fields=healthy.dcgm_fields - {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"})
    (fields,) = [f for f in decide(without_ecc) if f.check == "dcgm-exporter fields"]
    assert fields.detail == "missing from its CSV: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
