"""A vLLM-shaped Deployment scaled 0 -> N -> 0 on its queue: by the HPA through our adapter, by KEDA through
our external scaler. Everything on the path is real (the test bed's API server, kube-controller-manager's
HPA controller, a real Prometheus, the adapter as `gpuwarden adapter` runs it; for KEDA its operator and
metrics server): the fixtures are test_adapter_hpa's `stack` and test_keda_e2e's `keda`, their exporters
publishing the Deployment's engine and router series (tests/e2e/engine_workload.py).

The presets do the work, no rule is written: `router_queue_depth` (the router's queue, an external metric
that exists at zero replicas) wakes and sizes the workload, `vllm_queue_depth` (per pod) is served once pods
run. HPA: `minReplicas: 0` on the External metric (HPAScaleToZero). KEDA: `preset: router-queue` and
`preset: vllm-queue` triggers, `minReplicaCount: 0`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from harness.testbed import Cluster, poll
from tests.e2e.conftest import pod_manifest
from tests.e2e.engine_workload import VllmShaped
from tests.e2e.test_adapter_hpa import Workload, stack  # noqa: F401 - the fixture
from tests.e2e.test_keda_e2e import KedaStack, keda  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

NAME = "vllm"
PER_REPLICA = 5  # target: 5 requests waiting per replica


def deployment(namespace: str, replicas: int) -> dict[str, Any]:
    pod = pod_manifest(NAME, gpus=1, nodeSelector={"nvidia.com/gpu.present": "true"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": NAME}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", NAME, "-n", namespace)["spec"].get("replicas", 0))


def wait(cluster: Cluster, namespace: str, want: int, explain: str) -> float:
    began = time.monotonic()
    try:
        poll(lambda: replicas(cluster, namespace) == want, timeout=150, what=f"{NAME} replicas == {want}")
    except TimeoutError as exc:
        describe = cluster.kubectl("describe", explain, "-n", namespace, check=False)
        raise AssertionError(f"{exc}\n--- kubectl describe {explain}\n{describe}") from exc
    return time.monotonic() - began


def quantity(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def pod_queues(cluster: Cluster, namespace: str) -> dict[str, float]:
    """vllm_queue_depth per pod as the aggregator serves it (custom.metrics.k8s.io, our adapter)."""
    raw = cluster.kubectl(
        "get", "--raw", f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/vllm_queue_depth"
    )
    items = json.loads(raw)["items"]
    return {i["describedObject"]["name"]: quantity(i["value"]) for i in items}


def test_hpa_scales_a_vllm_shaped_deployment_from_zero_on_its_queue(
    cluster: Cluster,
    namespace: str,
    stack: tuple[Workload, CollectorRegistry, int, Path],  # noqa: F811
) -> None:
    workload, registry, _, _ = stack
    engine = workload.engine = VllmShaped(cluster, namespace, NAME)
    cluster.apply(
        deployment(namespace, 1),  # the HPA parks at zero only what it scaled there itself (docs/keda.md)
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
                "minReplicas": 0,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "External",
                        "external": {
                            "metric": {
                                "name": "router_queue_depth",
                                "selector": {"matchLabels": {"service": NAME}},
                            },
                            "target": {"type": "AverageValue", "averageValue": str(PER_REPLICA)},
                        },
                    }
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )
    down = wait(cluster, namespace, 0, "hpa")  # nothing waiting: parked
    engine.backlog = 3 * PER_REPLICA  # 15 requests wait at the router, no pod to take them
    up = wait(cluster, namespace, 3, "hpa")
    poll(lambda: len(pod_queues(cluster, namespace)) == 3, timeout=60, what="3 pods' vllm_queue_depth")
    queues = pod_queues(cluster, namespace)
    assert sorted(queues.values()) == pytest.approx([PER_REPLICA] * 3)  # the queue spread over the pods
    engine.backlog = 0.0
    again = wait(cluster, namespace, 0, "hpa")
    print(
        f"\n[e2e] HPA on router_queue_depth: 1 -> 0 in {down:.1f}s, 0 -> 3 in {up:.1f}s, "
        f"3 -> 0 in {again:.1f}s"
    )
    served = registry.get_sample_value(
        "gpuwarden_adapter_requests_total", {"route": "external", "code": "200"}
    )
    assert served and served > 0


def test_keda_scales_a_vllm_shaped_deployment_from_zero_on_its_queue(keda: KedaStack) -> None:  # noqa: F811
    cluster, namespace = keda.cluster, keda.namespace
    engine = keda.queues.engine = VllmShaped(cluster, namespace, NAME)
    address = f"127.0.0.1:{keda.keda_port}"
    cluster.apply(
        deployment(namespace, 0),
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {
                "scaleTargetRef": {"name": NAME},
                "pollingInterval": 2,
                "cooldownPeriod": 5,
                "minReplicaCount": 0,
                "maxReplicaCount": 4,
                "advanced": {
                    "horizontalPodAutoscalerConfig": {
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
                    }
                },
                "triggers": [
                    {  # exists at zero replicas: wakes the workload and sizes it
                        "type": "external",
                        "metadata": {
                            "scalerAddress": address,
                            "preset": "router-queue",
                            "labelSelector": f"service={NAME}",
                            "targetValue": str(PER_REPLICA),
                        },
                    },
                    {  # the engines' own queues, once pods run (NOT_FOUND, saying so, while none does)
                        "type": "external",
                        "metadata": {
                            "scalerAddress": address,
                            "preset": "vllm-queue",
                            "labelSelector": f"app={NAME}",
                            "targetValue": str(PER_REPLICA),
                        },
                    },
                ],
            },
        },
    )
    time.sleep(6)  # three polling intervals with nothing waiting: still parked
    assert replicas(cluster, namespace) == 0
    engine.backlog = 3 * PER_REPLICA
    up = wait(cluster, namespace, 3, "hpa")
    engine.backlog = 0.0
    down = wait(cluster, namespace, 0, "scaledobject")
    print(f"\n[e2e] KEDA on preset router-queue + vllm-queue: 0 -> 3 in {up:.1f}s, 3 -> 0 in {down:.1f}s")
    served = keda.registry.get_sample_value(
        "gpuwarden_adapter_keda_requests_total", {"rpc": "GetMetrics", "code": "OK"}
    )
    assert served and served > 0
