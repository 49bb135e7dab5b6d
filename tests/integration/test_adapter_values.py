"""Every value route of the adapter against a REAL Prometheus with exact backfilled data, end to end.

History for ten minutes ending at T is written with promtool (dcgm-exporter-shaped GPU series, request
counters, an external queue gauge, a NaN gauge); the adapter's clock is pinned to T so every query evaluates
there. Requests go through the real aiohttp app (routing, provider, cache, wire), in both cache and
per-request mode, and the answers must match values computed by hand from the data — exact Quantity strings.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import NODES, PODS
from adapter.wire import format_time
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, backfill_openmetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

STEP, POINTS = 15, 41  # ten minutes of history
CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"

# (node, gpu, pod, namespace, util, fb_used, fb_free); pod "" = idle GPU without pod labels
GPUS = [
    ("node-1", 0, "llm-a", "ml", 40.0, 20, 60),
    ("node-1", 1, "llm-a", "ml", 60.0, 40, 40),
    ("node-2", 0, "llm-b", "ml", 73.5, 72, 8),
    ("node-2", 1, "other-c", "ml", 10.0, 1, 79),
    ("node-2", 2, "", "", 0.0, 0, 80),
    ("node-3", 0, "web-x", "prod", 90.0, 10, 70),
]
# (pod, namespace, code, increase per step)
COUNTERS = [("llm-a", "ml", "200", 30), ("llm-a", "ml", "500", 3), ("llm-b", "ml", "200", 15)]
POD_LABELS = {
    ("ml", "llm-a"): {"app": "llm"},
    ("ml", "llm-b"): {"app": "llm"},
    ("ml", "other-c"): {"app": "other"},
    ("prod", "web-x"): {"app": "web"},
}
NODE_LABELS = {"node-1": {"pool": "a100"}, "node-2": {"pool": "a100"}, "node-3": {"pool": "h100"}}

RULES: dict[str, Any] = {
    "rules": [
        {
            "seriesQuery": 'weird_gauge{pod!=""}',
            "resources": {"template": "<<.Resource>>"},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }
    ],
    "externalRules": [
        {
            "seriesQuery": "queue_depth",
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)",
        }
    ],
}


def history(t_end: int) -> str:
    fams: dict[str, list[str]] = {
        m: []
        for m in (
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "http_requests_total",
            "queue_depth",
            "weird_gauge",
        )
    }
    for i in range(POINTS):
        ts = t_end - (POINTS - 1 - i) * STEP
        for node, gpu, pod, ns, util, used, free in GPUS:
            labels = f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}",modelName="A100"'
            if pod:
                labels += f',pod="{pod}",namespace="{ns}",container="main"'
            fams["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util} {ts}")
            fams["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used} {ts}")
            fams["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free} {ts}")
        for pod, ns, code, inc in COUNTERS:
            fams["http_requests_total"].append(
                f'http_requests_total{{pod="{pod}",namespace="{ns}",code="{code}"}} {i * inc} {ts}'
            )
        for queue, ns, depth in (("a", "ml", 7), ("b", "ml", 5), ("c", "prod", 100)):
            fams["queue_depth"].append(f'queue_depth{{queue="{queue}",namespace="{ns}"}} {depth} {ts}')
        fams["weird_gauge"].append(f'weird_gauge{{pod="llm-a",namespace="ml"}} NaN {ts}')
        fams["weird_gauge"].append(f'weird_gauge{{pod="llm-b",namespace="ml"}} 3 {ts}')
    out: list[str] = []
    for name, lines in fams.items():
        kind = "counter" if name == "http_requests_total" else "gauge"
        out.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n# EOF\n"


def label_index() -> LabelIndex:
    index = LabelIndex([PODS, NODES])
    for (ns, name), labels in POD_LABELS.items():
        index.upsert(PODS, ns, name, labels)
    for name, labels in NODE_LABELS.items():
        index.upsert(NODES, "", name, labels)
    index.mark_synced(PODS)
    index.mark_synced(NODES)
    return index


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backfilled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalPrometheus, int]]:
    workdir = tmp_path_factory.mktemp("adapter-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield prom, t_end


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["cache", "per_request"])
async def client(
    request: pytest.FixtureRequest, backfilled: tuple[LocalPrometheus, int]
) -> AsyncIterator[TestClient[Any, Any]]:
    prom, t_end = backfilled
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "retries": 0},
            "adapter": {
                **RULES,
                "authentication": {"enabled": False},
                "cache": {"mode": request.param},
                "metrics_max_age_seconds": 900,
            },
        }
    )
    adapter = Adapter(config, index=label_index(), clock=lambda: float(t_end))
    assert await adapter.discovery.relist()
    app = await adapter.start()
    async with TestClient(TestServer(app)) as c:
        c.t_end = t_end  # type: ignore[attr-defined]
        yield c
    await adapter.stop()


async def get(client: TestClient[Any, Any], path: str, status: int = 200) -> dict[str, Any]:
    response = await client.get(path)
    body: dict[str, Any] = await response.json()
    assert response.status == status, body
    assert response.content_type == "application/json"
    return body


def values(body: dict[str, Any]) -> dict[str, str]:
    return {item["describedObject"]["name"]: item["value"] for item in body["items"]}


async def test_pods_wildcard_with_label_selector_v1beta2(client: TestClient[Any, Any]) -> None:
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/%2A/gpu_utilization?labelSelector=app%3Dllm"
    )
    assert body["kind"] == "MetricValueList"
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert values(body) == {"llm-a": "50", "llm-b": "73500m"}
    item = body["items"][0]
    assert item["describedObject"] == {"kind": "Pod", "namespace": "ml", "name": "llm-a", "apiVersion": "v1"}
    assert item["metric"] == {"name": "gpu_utilization", "selector": None}
    assert item["timestamp"] == format_time(client.t_end)  # type: ignore[attr-defined]
    assert "windowSeconds" not in item


async def test_pods_wildcard_v1beta1_field_names(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta1/namespaces/ml/pods/*/gpu_utilization")
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    assert values(body) == {"llm-a": "50", "llm-b": "73500m", "other-c": "10"}
    assert {"metricName", "selector"} <= set(body["items"][0]) and "metric" not in body["items"][0]


async def test_single_pod_memory_ratio_is_the_max_over_its_gpus(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/llm-a/gpu_memory_used_ratio")
    assert values(body) == {"llm-a": "500m"}
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/llm-b/gpu_memory_used_ratio")
    assert values(body) == {"llm-b": "900m"}


async def test_nodes_root_scoped(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta2/nodes/%2A/gpu_utilization?labelSelector=pool%3Da100")
    assert values(body) == {"node-1": "50", "node-2": "27833m"}  # (73.5 + 10 + 0) / 3
    assert "namespace" not in body["items"][0]["describedObject"]
    body = await get(client, f"{CUSTOM}/v1beta1/nodes/node-3/gpu_utilization")
    assert values(body) == {"node-3": "90"}
    assert body["items"][0]["describedObject"]["kind"] == "Node"


async def test_namespace_metric_route(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/metrics/gpu_utilization")
    assert values(body) == {"ml": "45875m"}  # (40 + 60 + 73.5 + 10) / 4
    assert body["items"][0]["describedObject"]["kind"] == "Namespace"


async def test_rate_metric_has_window_and_metric_label_selector(client: TestClient[Any, Any]) -> None:
    path = f"{CUSTOM}/v1beta2/namespaces/ml/pods/%2A/requests_per_second?labelSelector=app%3Dllm"
    body = await get(client, path)
    assert values(body) == {"llm-a": "2200m", "llm-b": "1"}
    assert body["items"][0]["windowSeconds"] == 120
    body = await get(client, path + "&metricLabelSelector=code%3D200")
    assert values(body) == {"llm-a": "2", "llm-b": "1"}
    assert body["items"][0]["metric"]["selector"] == {"matchLabels": {"code": "200"}}
    body = await get(client, path.replace("v1beta2", "v1beta1") + "&metricLabelSelector=code+notin+%28200%29")
    assert values(body) == {"llm-a": "200m"}
    assert body["items"][0]["window"] == 120


async def test_external_metric_with_and_without_selector(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{EXTERNAL}/namespaces/ml/queue_depth")
    assert body["kind"] == "ExternalMetricValueList"
    assert sorted((i["metricLabels"]["queue"], i["value"]) for i in body["items"]) == [("a", "7"), ("b", "5")]
    body = await get(client, f"{EXTERNAL}/namespaces/ml/queue_depth?labelSelector=queue%3Da")
    assert [(i["metricName"], i["value"]) for i in body["items"]] == [("queue_depth", "7")]
    body = await get(client, f"{EXTERNAL}/namespaces/prod/queue_depth")
    assert [i["value"] for i in body["items"]] == ["100"]


async def test_nan_is_omitted_never_served_and_single_object_is_404(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/*/weird_gauge")
    assert values(body) == {"llm-b": "3"}
    status = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/llm-a/weird_gauge", 404)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)


async def test_selector_matching_no_pod_is_an_empty_list_not_zero(client: TestClient[Any, Any]) -> None:
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3Dnone"
    )
    assert body["items"] == []


async def test_errors_are_status_objects(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/*/no_such_metric", 404)
    assert body["message"] == "the server could not find the metric no_such_metric for pods"
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app+in+%28", 400
    )
    assert body["reason"] == "BadRequest" and "labelSelector" in body["message"]
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/ml/pods/*/gpu_utilization?metricLabelSelector=a%3E1", 400
    )
    assert "not supported by Prometheus" in body["message"]
    await get(client, f"{EXTERNAL}/namespaces/ml/nope", 404)


async def test_discovery_lists_discovered_metrics(client: TestClient[Any, Any]) -> None:
    body = await get(client, f"{CUSTOM}/v1beta1")
    names = {r["name"]: r["namespaced"] for r in body["resources"]}
    assert names["pods/gpu_utilization"] is True
    assert names["nodes/gpu_utilization"] is False
    assert names["namespaces/requests_per_second"] is False
    assert names["pods/weird_gauge"] is True
    body = await get(client, EXTERNAL)
    assert [r["name"] for r in body["resources"]] == ["queue_depth"]
