"""The demo's Kubernetes objects and the pure pieces of its cluster view (gauges, pod -> GPU mapping)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from harness.demo import manifests
from harness.demo.observer import ClusterView, ViewCollector, hpa_metric_values, quantity
from harness.demo.podsync import mapping
from harness.demo.scenario import Deploy, Fleet, Hpa, Job
from harness.simulator.hardware import gpu_uuid
from harness.simulator.workload import numa_of


def test_nodes_carry_topology_like_the_simulator_and_pool_labels_and_taints() -> None:
    fleet = Fleet.model_validate({"nodes": 3, "pools": {"batch": {"nodes": ["gpu-node-02"]}}})
    specs = {s.name: s.manifest() for s in manifests.node_specs(fleet)}
    assert list(specs) == ["gpu-node-00", "gpu-node-01", "gpu-node-02"]
    topo = json.loads(specs["gpu-node-01"]["metadata"]["annotations"]["gpuwarden.io/gpu-topology"])
    assert (
        [topo[str(g)]["numa"] for g in range(8)] == [numa_of(g, 8, 2) for g in range(8)] == [0] * 4 + [1] * 4
    )
    assert topo["3"]["uuid"] == gpu_uuid("gpu-node-01", 3)
    assert specs["gpu-node-02"]["metadata"]["labels"]["gpuwarden.io/pool"] == "batch"
    assert specs["gpu-node-02"]["spec"]["taints"] == [
        {"key": "gpuwarden.io/pool", "value": "batch", "effect": "NoSchedule"}
    ]
    assert "taints" not in specs["gpu-node-00"]["spec"]


def test_deployment_and_hpa_on_the_adapter_metrics() -> None:
    d = Deploy(
        name="llm",
        namespace="inf",
        replicas=2,
        gpus=1,
        hpa=Hpa(min=2, max=8, gpu_utilization=70, requests_per_second=40),
    )
    deployment, hpa = manifests.workload_objects(d)
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == {"app": "llm", "gpuwarden.io/demo": "true"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "gpu_utilization"},
                "target": {"type": "AverageValue", "averageValue": "70"},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "requests_per_second"},
                "target": {"type": "AverageValue", "averageValue": "40"},
            },
        },
    ]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)


def test_a_scale_to_zero_hpa_reads_only_the_gateway_rate_as_an_external_metric() -> None:
    d = Deploy(
        name="burst", namespace="inf", replicas=1, hpa=Hpa(min=0, max=4, gateway_requests_per_second=20)
    )
    deployment, hpa = manifests.workload_objects(d)
    assert deployment["spec"]["replicas"] == 1
    assert hpa["spec"]["minReplicas"] == 0
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "gateway_requests_per_second",
                    "selector": {"matchLabels": {"service": "burst"}},
                },
                "target": {"type": "AverageValue", "averageValue": "20"},
            },
        }
    ]


def test_pool_nodes_priority_and_hold_shape_the_pods() -> None:
    d = Deploy(
        name="low", namespace="b", gpus=8, pool="batch", nodes=["n1", "n2"], priority_class="p", hold=True
    )
    pod = manifests.pod_template(d)
    assert pod["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    spec = pod["spec"]
    assert spec["nodeSelector"]["gpuwarden.io/pool"] == "batch"
    assert spec["tolerations"][0]["value"] == "batch"
    assert spec["priorityClassName"] == "p"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"][0]["values"] == ["n1", "n2"]


def test_preferred_nodes_are_a_preferred_node_affinity_beside_the_required_one() -> None:
    spec = manifests.pod_template(Deploy(name="w", nodes=["n1", "n2"], prefer_nodes=["n2"]))["spec"]
    affinity = spec["affinity"]["nodeAffinity"]
    (preferred,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == 100
    assert preferred["preference"]["matchExpressions"][0]["values"] == ["n2"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in affinity
    alone = manifests.pod_template(Deploy(name="w", prefer_nodes=["n2"]))["spec"]["affinity"]["nodeAffinity"]
    assert list(alone) == ["preferredDuringSchedulingIgnoredDuringExecution"]


def test_a_training_job_is_one_bare_pod_per_worker() -> None:
    pods = manifests.workload_objects(Job(name="pretrain", namespace="t", parallelism=2, gpus=4))
    assert [p["kind"] for p in pods] == ["Pod", "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["pretrain-worker-0", "pretrain-worker-1"]
    assert all(p["spec"]["restartPolicy"] == "Never" and p["metadata"]["namespace"] == "t" for p in pods)


@pytest.mark.parametrize(
    ("raw", "value"),
    [("250m", 0.25), ("12", 12.0), ("1.5k", 1500.0), ("37500m", 37.5), (9, 9.0)],
)
def test_quantity(raw: Any, value: float) -> None:
    assert quantity(raw) == value


def test_quantity_unknown_is_nan() -> None:
    assert math.isnan(quantity("12Zi"))


def hpa_object() -> dict[str, Any]:
    d = Deploy(name="llm", namespace="inf", hpa=Hpa(min=1, max=4, gpu_utilization=70, requests_per_second=40))
    hpa = manifests.workload_objects(d)[1]
    hpa["status"] = {
        "desiredReplicas": 3,
        "currentReplicas": 2,
        "currentMetrics": [
            {
                "type": "Pods",
                "pods": {"metric": {"name": "gpu_utilization"}, "current": {"averageValue": "75500m"}},
            }
        ],
    }
    return hpa


def test_hpa_metric_values_pairs_current_with_target() -> None:
    values = hpa_metric_values(hpa_object())
    assert values["gpu_utilization"] == (75.5, 70.0)
    current, target = values["requests_per_second"]
    assert math.isnan(current) and target == 40.0


def external_hpa(current: str) -> dict[str, Any]:
    d = Deploy(name="burst", namespace="inf", hpa=Hpa(min=0, max=4, gateway_requests_per_second=20))
    hpa = manifests.workload_objects(d)[1]
    metric = {"name": "gateway_requests_per_second", "selector": {"matchLabels": {"service": "burst"}}}
    hpa["status"] = {
        "desiredReplicas": 3,
        "currentMetrics": [
            {"type": "External", "external": {"metric": metric, "current": {"averageValue": current}}}
        ],
    }
    return hpa


@pytest.mark.parametrize(
    ("current", "value"),
    [
        pytest.param("16667m", 16.667, id="per-replica"),
        pytest.param("0", 0.0, id="idle"),
        # at zero replicas the controller divides by zero and reports math.MinInt64 milli-units
        pytest.param("-9223372036854775808m", math.nan, id="over-zero-replicas"),
    ],
)
def test_hpa_metric_values_read_external_metrics_too(current: str, value: float) -> None:
    got, target = hpa_metric_values(external_hpa(current))["gateway_requests_per_second"]
    assert target == 20.0
    assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value)


def pod(
    name: str, node: str = "", gpus: str = "", phase: str = "Running", app: str = "llm"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "inf",
            "labels": {"app": app},
            "annotations": {"gpuwarden.io/gpu-ids": gpus} if gpus else {},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def test_mapping_lists_bound_pods_with_recorded_gpus_only() -> None:
    pods = [
        pod("b", "n1", "4,5"),
        pod("a", "n0", "0"),
        pod("pending"),
        pod("no-ids", "n0"),
        pod("done", "n2", "1", phase="Succeeded"),
    ]
    assert mapping(pods) == [
        {"namespace": "inf", "pod": "a", "node": "n0", "gpus": [0], "workload": "llm"},
        {"namespace": "inf", "pod": "b", "node": "n1", "gpus": [4, 5], "workload": "llm"},
    ]


def test_view_gauges_follow_the_caches() -> None:
    view = ClusterView(kube=None)  # type: ignore[arg-type]  # informers do no I/O until run
    view.hpas = [hpa_object()]
    view.pods.store = {"inf/a": pod("a", "n0", "0"), "inf/p": pod("p")}
    view.pods.store["inf/p"]["status"]["nominatedNodeName"] = "n3"
    view.nodes.store = {
        "n0": {
            "metadata": {"name": "n0"},
            "spec": {
                "taints": [{"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
            },
        }
    }
    registry = CollectorRegistry()
    registry.register(ViewCollector(view))
    text = generate_latest(registry).decode()
    assert 'gpuwarden_demo_hpa_replicas{hpa="llm",kind="desired",namespace="inf"} 3.0' in text
    assert (
        'gpuwarden_demo_hpa_metric{hpa="llm",kind="current",metric="gpu_utilization",namespace="inf"} 75.5'
        in text
    )
    assert 'gpuwarden_demo_node_quarantined{node="n0",reason="xid-79"} 1.0' in text
    assert 'pod="a",terminating="false",workload="llm"} 1.0' in text
    assert 'gpuwarden_demo_pod_nominated{namespace="inf",node="n3",pod="p",workload="llm"} 1.0' in text


def test_an_engine_hpa_reads_the_router_per_service_and_the_engine_sums_per_namespace() -> None:
    targets = {"router_queue_depth": 10, "vllm_workload_queue_depth": 5, "vllm_workload_kv_cache_usage": 0.8}
    d = Deploy(name="vllm", namespace="serving", qps=0, engine="vllm", hpa=Hpa(min=0, max=5, **targets))
    _, hpa = manifests.workload_objects(d)
    assert hpa["spec"]["minReplicas"] == 0
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["External"] * 3
    got = {
        m["external"]["metric"]["name"]: (m["external"]["metric"].get("selector"), m["external"]["target"])
        for m in hpa["spec"]["metrics"]
    }
    assert got == {
        "router_queue_depth": (
            {"matchLabels": {"service": "vllm"}},
            {"type": "AverageValue", "averageValue": "10"},
        ),
        "vllm_workload_queue_depth": (None, {"type": "AverageValue", "averageValue": "5"}),
        "vllm_workload_kv_cache_usage": (None, {"type": "AverageValue", "averageValue": "0.8"}),
    }
