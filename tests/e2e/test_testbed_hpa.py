"""Proof (e): the real HPA controller scales a Deployment on a custom metric served by a local process.

The test's aggregated server (conftest.AggregatedServer) serves ``custom.metrics.k8s.io/v1beta2`` through an
APIService; an autoscaling/v2 HPA with an ``Object`` metric on the Deployment reads it via kube-apiserver.
Raising the value scales the Deployment out, lowering it scales it back in.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.testbed import Cluster, poll
from tests.e2e.conftest import AggregatedServer, pod_manifest

pytestmark = pytest.mark.e2e

METRIC = "gpu_queue_depth"
NAME = "hpa-target"


def _replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", NAME, "-n", namespace)["spec"]["replicas"])


def _wait_replicas(cluster: Cluster, namespace: str, want: int, timeout: float) -> None:
    try:
        poll(
            lambda: _replicas(cluster, namespace) == want, timeout=timeout, what=f"{NAME} replicas == {want}"
        )
    except TimeoutError as exc:
        describe = cluster.kubectl("describe", "hpa", NAME, "-n", namespace, check=False)
        raise AssertionError(f"{exc}\n--- kubectl describe hpa\n{describe}") from exc


def test_hpa_scales_deployment_on_custom_metric(
    cluster: Cluster, namespace: str, aggregated_server: AggregatedServer
) -> None:
    key = (namespace, "deployments.apps", NAME, METRIC)
    aggregated_server.metric_values[key] = "30"
    reg = aggregated_server.register(
        "custom.metrics.k8s.io",
        "v1beta2",
        [
            {
                "name": f"deployments.apps/{METRIC}",
                "singularName": "",
                "namespaced": True,
                "kind": "MetricValueList",
                "verbs": ["get"],
            }
        ],
    )
    aggregated_server.wait_available(reg)

    pod = pod_manifest(NAME, gpus=1, nodeSelector={"nvidia.com/gpu.present": "true"})
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": NAME}},
                "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
            },
        },
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
                "minReplicas": 1,
                "maxReplicas": 5,
                "metrics": [
                    {
                        "type": "Object",
                        "object": {
                            "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
                            "metric": {"name": METRIC},
                            "target": {"type": "AverageValue", "averageValue": "10"},
                        },
                    }
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )

    # 30 / averageValue 10 -> 3 replicas.
    _wait_replicas(cluster, namespace, 3, timeout=90)
    metric_path = (
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/deployments.apps/{NAME}/{METRIC}"
    )
    assert any(r.path == metric_path for r in aggregated_server.requests), "HPA never fetched the metric"

    # The HPA status reports what it read from our server divided by the scale's status.replicas (30 at 1
    # replica; 30/3 once scaled). A sync that read the scale before the new Deployment had status.replicas
    # divides by zero (GetObjectPerPodMetricReplicas, v1.35 and v1.37 alike) and reports
    # -9223372036854775808m while still scaling to ceil(30/10) = 3 (seen on v1.37.2); wait for a later sync.
    def reported() -> list[dict[str, Any]]:
        current: list[dict[str, Any]] = (
            cluster.get_json("hpa", NAME, "-n", namespace)["status"].get("currentMetrics") or []
        )
        return current

    try:
        poll(
            lambda: any(c["object"]["current"].get("averageValue") in ("30", "10") for c in reported()),
            timeout=30,
            what="HPA status reporting the served value",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {reported()}") from exc
    current = reported()
    assert current and current[0]["object"]["metric"]["name"] == METRIC, current

    # 5 / 10 -> 1 replica (scale-down stabilization is 0 for this HPA).
    aggregated_server.metric_values[key] = "5"
    _wait_replicas(cluster, namespace, 1, timeout=90)
