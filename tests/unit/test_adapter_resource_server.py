"""metrics.k8s.io through the aiohttp app, with Prometheus answers a real server cannot be made to give:
the grouped cache (queries per refresh independent of requests, namespaces and pods), the outage shapes
(503 Status, never zeros or an empty 200), the metrics group absent without `resourceRules`, and
self-metrics. Values against a real Prometheus: tests/integration/test_adapter_resource_metrics.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import pytest_asyncio
import respx
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import NODES, PODS
from gpuwarden.config.root import Config
from gpuwarden.promclient import PrometheusClient

BASE = "http://prom.test"
API = "/apis/metrics.k8s.io/v1beta1"
T = 1787220000.0
KUBE_PROMETHEUS = Path(__file__).parent / "golden/adapter/resource/kube-prometheus-config.yaml"
NAMESPACES = [f"ns-{i}" for i in range(20)]


def answer(request: httpx.Request) -> httpx.Response:
    """A cAdvisor/node-exporter-shaped answer for whichever of the adapter's queries this is."""
    query = parse_qs(request.content.decode())["query"][0]
    stamp = query.startswith("min by")
    result: list[dict[str, Any]] = []
    if "container_" in query:
        only = re.search(r'namespace="([^"]+)"', query)
        for ns in [only.group(1)] if only else NAMESPACES:
            for i in range(5):
                labels = {"namespace": ns, "pod": f"p-{i}"}
                if not stamp:
                    labels["container"] = "main"
                value = T - 10 if stamp else (0.25 if "cpu" in query else 2**20)
                result.append({"metric": labels, "value": [T, str(value)]})
    else:
        label = "instance" if "MemTotal" in query else "node"
        for n in range(3):
            value = T - 5 if stamp else (1.5 if "cpu" in query else 2**30)
            result.append({"metric": {label: f"node-{n}"}, "value": [T, str(value)]})
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return httpx.Response(200, json=body)


class Env:
    def __init__(self, mode: str) -> None:
        self.router = respx.MockRouter(assert_all_called=False)
        self.router.post(f"{BASE}/api/v1/labels").mock(
            return_value=httpx.Response(200, json={"status": "success", "data": []})
        )
        self.query = self.router.post(f"{BASE}/api/v1/query")
        self.query.mock(side_effect=answer)
        self.registry = CollectorRegistry()
        adapter = yaml.safe_load(KUBE_PROMETHEUS.read_text())
        config = Config.model_validate(
            {
                "prometheus": {"url": BASE, "retries": 0},
                "adapter": {**adapter, "authentication": {"enabled": False}, "cache": {"mode": mode}},
            }
        )
        client = PrometheusClient(
            config.prometheus,
            registry=self.registry,
            transport=httpx.MockTransport(self.router.async_handler),
        )
        index = LabelIndex([PODS, NODES])
        for ns in NAMESPACES:
            for i in range(5):
                index.upsert(PODS, ns, f"p-{i}", {"app": "a" if i < 3 else "b"})
        for n in range(3):
            index.upsert(NODES, "", f"node-{n}", {})
        index.mark_synced(PODS)
        index.mark_synced(NODES)
        self.adapter = Adapter(
            config, prometheus=client, index=index, registry=self.registry, clock=lambda: T
        )


@pytest_asyncio.fixture(params=["cache", "per_request"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Env, TestClient[Any, Any]]]:
    e = Env(request.param)
    app = await e.adapter.start()
    async with TestClient(TestServer(app)) as client:
        yield e, client
    await e.adapter.stop()
    await e.adapter.prometheus.aclose()


async def call(client: TestClient[Any, Any], path: str, status: int = 200) -> dict[str, Any]:
    response = await client.get(path, headers={"Accept": "application/vnd.kubernetes.protobuf, */*"})
    body: dict[str, Any] = json.loads(await response.text())
    assert response.status == status, body
    assert response.headers["Content-Type"].startswith("application/json")
    return body


async def test_queries_do_not_follow_requests_namespaces_or_pods(
    env: tuple[Env, TestClient[Any, Any]],
) -> None:
    e, client = env
    for ns in NAMESPACES:  # one HPA per namespace, twice
        for _ in range(2):
            body = await call(client, f"{API}/namespaces/{ns}/pods?labelSelector=app%3Da")
            assert [i["metadata"]["name"] for i in body["items"]] == ["p-0", "p-1", "p-2"]
    everything = await call(client, f"{API}/pods")  # kubectl top pods -A, the VPA recommender
    assert len(everything["items"]) == 100
    nodes = await call(client, f"{API}/nodes")
    assert [i["usage"] for i in nodes["items"]] == [{"cpu": "1500m", "memory": "1Gi"}] * 3
    sent = [parse_qs(c.request.content.decode())["query"][0] for c in e.query.calls]
    if e.adapter.cache is not None:
        assert len(sent) == 8  # (cpu, memory) x (values, timestamps) x (pods, nodes), whatever was asked
        assert not [q for q in sent if 'namespace="ns-' in q]  # no namespace matcher: one cluster-wide entry
    else:
        assert len(sent) == 4 * 41 + 4  # per request: 4 per request, one per rule, never one per pod
    assert not [q for q in sent if "=~" in q or "p-1" in q]  # never a regex of names
    item = body["items"][0]
    assert item["timestamp"] == "2026-08-20T09:59:50Z" and item["window"] == "2m0s"


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(httpx.Response(503, text="overloaded"), id="prometheus-503"),
        pytest.param(httpx.ConnectError("refused"), id="unreachable"),
        pytest.param(httpx.ReadTimeout("slow"), id="timeout"),
    ],
)
async def test_outage_is_503_never_zeros_or_an_empty_list(
    env: tuple[Env, TestClient[Any, Any]], failure: Any
) -> None:
    e, client = env
    e.query.mock(side_effect=failure)
    for path in (
        f"{API}/nodes",
        f"{API}/pods",
        f"{API}/namespaces/ns-0/pods",
        f"{API}/namespaces/ns-0/pods/p-0",
    ):
        body = await call(client, path, 503)
        assert (body["kind"], body["reason"]) == ("Status", "ServiceUnavailable")
    e.query.mock(side_effect=answer)
    assert len((await call(client, f"{API}/nodes"))["items"]) == 3


async def test_self_metrics_count_resource_requests_and_freshness(
    env: tuple[Env, TestClient[Any, Any]],
) -> None:
    _, client = env
    await call(client, f"{API}/namespaces/ns-0/pods")
    await call(client, f"{API}/nodes/node-1")
    text = await (await client.get("/metrics")).text()
    assert 'gpuwarden_adapter_requests_total{code="200",route="resource_namespace_pods"} 1.0' in text
    assert 'gpuwarden_adapter_requests_total{code="200",route="resource_node"} 1.0' in text
    assert 'gpuwarden_adapter_items_served_total{api="resource"} 6.0' in text
    assert 'gpuwarden_adapter_served_value_age_seconds_bucket{api="resource",le="5.0"} 1.0' in text
    assert 'gpuwarden_adapter_served_value_age_seconds_bucket{api="resource",le="10.0"} 6.0' in text
    assert 'gpuwarden_adapter_prometheus_queries_total{outcome="success",purpose="resource"}' in text


async def test_without_resource_rules_the_group_does_not_exist() -> None:
    config = Config.model_validate(
        {"prometheus": {"url": BASE}, "adapter": {"authentication": {"enabled": False}}}
    )
    adapter = Adapter(config, prometheus=PrometheusClient(config.prometheus), registry=CollectorRegistry())
    app = await adapter.start()
    async with TestClient(TestServer(app)) as client:
        assert "metrics.k8s.io" not in [g["name"] for g in (await call(client, "/apis"))["groups"]]
        for path in (API, f"{API}/nodes", "/apis/metrics.k8s.io"):
            assert (await call(client, path, 404))["reason"] == "NotFound"
    await adapter.stop()
    await adapter.prometheus.aclose()
