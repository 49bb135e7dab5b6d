"""Render time of the Helm chart (deploy/helm/gpuwarden) against `kubectl kustomize` of the same objects.

The anchor is the kustomize tree the chart must stay equal to (tests/e2e/test_helm_chart.py): `kubectl
kustomize` of the overlay with the most objects (monitoring: dashboards and rules are most of the bytes),
measured in the same run. Each tool runs as a fresh process, as a user or CI runs it; median of 15 runs.
Needs `make helm` and `make testbed` (kubectl).
"""

from __future__ import annotations

import statistics
import subprocess
import time

from harness.testbed.binaries import repo_root
from tests.bench.summary import record

ROOT = repo_root()
CHART = ROOT / "deploy" / "helm" / "gpuwarden"
RUNS = 15
ALL_ON = (
    "resourceMetrics.kubePrometheusRules=true,scheduler.enabled=true,nodeAgent.enabled=true,"
    "monitoring.serviceMonitors.enabled=true,monitoring.prometheusRule.enabled=true,"
    "monitoring.dashboards.enabled=true,monitoring.metricsReader.enabled=true"
)


def _median_ms(cmd: list[str]) -> tuple[float, int]:
    times, out = [], b""
    for _ in range(RUNS):
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, out.count(b"\nkind: ") + out.startswith(b"kind: ")


def main() -> None:
    helm = ROOT / ".cache" / "helm" / "current" / "bin" / "helm"
    kubectl = next(iter(sorted((ROOT / ".cache" / "testbed").glob("*/bin/kubectl"))), None)
    if not helm.is_file() or kubectl is None:
        raise RuntimeError("needs `make helm` and `make testbed`")
    pa = ROOT / "tests" / "helm" / "prometheus-adapter-4.2.0-values.yaml"
    overlay = ROOT / "deploy" / "overlays" / "monitoring"
    anchor, anchor_n = _median_ms([str(kubectl), "kustomize", str(overlay)])
    print(f"kubectl kustomize overlays/monitoring: {anchor:.0f} ms median, {anchor_n} objects [anchor]")
    cases = {
        "defaults": [],
        "prometheus-adapter 4.2.0 values": ["-f", str(pa)],
        "prometheus-adapter values + every part on": ["-f", str(pa), "--set", ALL_ON],
    }
    for name, args in cases.items():
        ms, n = _median_ms([str(helm), "template", "gpuwarden", str(CHART), "-n", "gpuwarden", *args])
        print(f"helm template, {name}: {ms:.0f} ms median, {n} objects, {ms / anchor:.2f}x the anchor")
        record(
            "helm_chart",
            f"helm template, {name} ({n} objects): median",
            ms,
            "ms",
            anchor=f"kubectl kustomize overlays/monitoring ({anchor_n} objects)",
            anchor_value=anchor,
        )
