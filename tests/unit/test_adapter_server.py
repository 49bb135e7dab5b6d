"""The aiohttp app end to end with Prometheus answers a real server cannot be made to give (respx).

Covers the error mapping (Prometheus 503 / truncated body / rejected query / wrong result type), discovery
and readiness before and after the first discovery, NaN/±Inf handling, cache vs per-request load, the
self-metrics, OpenAPI and method handling. Values against a real Prometheus are in tests/integration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import respx
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from adapter.app import Adapter, not_ready_reason
from adapter.objects import LabelIndex
from adapter.resources import NODES, PODS, GroupResource
from gpuwarden.config.root import Config
from gpuwarden.promclient import PrometheusClient

BASE = "http://prom.test"
PODS_URL = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3Dllm"
ONE_POD = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/llm-0/gpu_utilization"
T = 1787220000.0


def vector(*samples: tuple[dict[str, str], str]) -> httpx.Response:
    result = [{"metric": labels, "value": [T, value]} for labels, value in samples]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


LABELS_OK = httpx.Response(
    200, json={"status": "success", "data": ["__name__", "pod", "namespace", "Hostname"]}
)


class Env:
    def __init__(self, mode: str = "cache", index: LabelIndex | None = None) -> None:
        self.router = respx.MockRouter(assert_all_called=False)
        self.labels = self.router.post(f"{BASE}/api/v1/labels")
        self.labels.mock(return_value=LABELS_OK)
        self.query = self.router.post(f"{BASE}/api/v1/query")
        self.registry = CollectorRegistry()
        config = Config.model_validate(
            {
                "prometheus": {"url": BASE, "retries": 0},
                "adapter": {"authentication": {"enabled": False}, "cache": {"mode": mode}},
            }
        )
        client = PrometheusClient(
            config.prometheus,
            registry=self.registry,
            transport=httpx.MockTransport(self.router.async_handler),
        )
        if index is None:
            index = LabelIndex([PODS])
            for pod in ("llm-0", "llm-1", "llm-2"):
                index.upsert(PODS, "ml", pod, {"app": "llm"})
                index.upsert(PODS, "prod", pod, {"app": "llm"})
            index.mark_synced(PODS)
        self.adapter = Adapter(config, prometheus=client, index=index, registry=self.registry)


@pytest_asyncio.fixture(params=["cache", "per_request"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Env, TestClient[Any, Any]]]:
    e = Env(request.param)
    assert await e.adapter.discovery.relist()
    app = await e.adapter.start()
    async with TestClient(TestServer(app)) as client:
        yield e, client
    await e.adapter.stop()
    await e.adapter.prometheus.aclose()


async def call(client: TestClient[Any, Any], path: str, status: int, method: str = "GET") -> dict[str, Any]:
    response = await client.request(method, path)
    body: dict[str, Any] = json.loads(await response.text())
    assert response.status == status, body
    return body


async def test_values_drop_nan_and_inf(env: tuple[Env, TestClient[Any, Any]]) -> None:
    e, client = env
    e.query.mock(
        return_value=vector(
            ({"pod": "llm-0"}, "12.5"),
            ({"pod": "llm-1"}, "NaN"),
            ({"pod": "llm-2"}, "+Inf"),
            ({"pod": "x"}, "1"),
        )
    )
    body = await call(client, PODS_URL, 200)
    assert [(i["describedObject"]["name"], i["value"]) for i in body["items"]] == [("llm-0", "12500m")]


@pytest.mark.parametrize(
    ("answer", "code", "reason"),
    [
        pytest.param(
            httpx.Response(503, text="overloaded", headers={"Retry-After": "3"}),
            503,
            "ServiceUnavailable",
            id="prometheus-503",
        ),
        pytest.param(
            httpx.Response(200, text='{"status":"success","da'),
            503,
            "ServiceUnavailable",
            id="truncated-body",
        ),
        pytest.param(
            httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"}),
            500,
            "InternalError",
            id="rejected-query-is-a-rule-bug",
        ),
        pytest.param(
            httpx.Response(
                200, json={"status": "success", "data": {"resultType": "scalar", "result": [T, "1"]}}
            ),
            500,
            "InternalError",
            id="scalar-for-object-metric",
        ),
        pytest.param(httpx.ConnectError("refused"), 503, "ServiceUnavailable", id="unreachable"),
    ],
)
async def test_prometheus_failures_map_to_status(
    env: tuple[Env, TestClient[Any, Any]],
    answer: Any,
    code: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    e, client = env
    if isinstance(answer, Exception):
        e.query.mock(side_effect=answer)
    else:
        e.query.mock(return_value=answer)
    with caplog.at_level(logging.ERROR, logger="adapter.server"):
        body = await call(client, PODS_URL, code)
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", reason, code)
    if code == 500:
        assert body["message"] == "Internal error occurred: unable to fetch metrics"
        assert "parse error" not in body["message"]
        assert any("request failed" in r.message for r in caplog.records)


async def test_empty_answer_is_an_empty_list_or_404_never_zero(env: tuple[Env, TestClient[Any, Any]]) -> None:
    e, client = env
    e.query.mock(return_value=vector())
    assert (await call(client, PODS_URL, 200))["items"] == []
    body = await call(client, ONE_POD, 404)
    assert body["message"] == "the server could not find the metric gpu_utilization for pods llm-0"


async def test_cache_serves_repeat_requests_from_memory(env: tuple[Env, TestClient[Any, Any]]) -> None:
    e, client = env
    e.query.mock(return_value=vector(({"pod": "llm-0"}, "1"), ({"pod": "llm-1"}, "2")))
    for _ in range(5):
        await call(client, PODS_URL, 200)
    await call(client, ONE_POD, 200)
    expected = 1 if e.adapter.cache is not None else 6
    assert e.query.call_count == expected
    sent = e.query.calls[0].request.content.decode()
    if e.adapter.cache is not None:  # one grouped query for the whole namespace
        assert "pod%21%3D%22%22" in sent
    else:  # prometheus-adapter's shape: the selected pods by name
        assert "pod%3D~%22llm-0%7Cllm-1%7Cllm-2%22" in sent


async def test_refresh_serves_every_requested_namespace_with_one_query() -> None:
    e = Env("cache")
    assert await e.adapter.discovery.relist()
    app = await e.adapter.start()
    async with TestClient(TestServer(app)) as client:
        await _refresh_batches(e, client)
    await e.adapter.stop()
    await e.adapter.prometheus.aclose()


async def _refresh_batches(e: Env, client: TestClient[Any, Any]) -> None:
    assert e.adapter.cache is not None
    e.query.mock(
        return_value=vector(
            ({"pod": "llm-0", "namespace": "ml"}, "1"), ({"pod": "llm-0", "namespace": "prod"}, "2")
        )
    )
    for ns in ("ml", "prod"):
        await call(client, PODS_URL.replace("/ml/", f"/{ns}/"), 200)
    assert e.query.call_count == 2  # first requests: one query each, answered at once
    assert await e.adapter.cache.refresh_due(everything=True) == 2
    assert e.query.call_count == 3  # the refresh: one query for both namespaces
    sent = e.query.calls[-1].request.content.decode()
    assert "namespace%3D~%22ml%7Cprod%22" in sent and "by+%28namespace%2Cpod%29" in sent
    body = await call(client, PODS_URL.replace("/ml/", "/prod/"), 200)
    assert [(i["describedObject"]["namespace"], i["value"]) for i in body["items"]] == [("prod", "2")]


async def test_discovery_never_fails_and_readiness_follows_first_discovery() -> None:
    e = Env()
    e.labels.mock(return_value=httpx.Response(503, text="down"))
    app = await e.adapter.start()
    async with TestClient(TestServer(app)) as client:
        assert not await e.adapter.discovery.relist()
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/livez")).status == 200
        body = await call(client, "/apis", 200)
        assert body["kind"] == "APIGroupList"
        body = await call(client, "/apis/custom.metrics.k8s.io/v1beta1", 200)
        assert body["resources"] == []
        e.labels.mock(return_value=LABELS_OK)
        assert await e.adapter.discovery.relist()
        assert (await client.get("/readyz")).status == 200
        body = await call(client, "/apis/custom.metrics.k8s.io/v1beta2", 200)
        assert {"pods/gpu_utilization", "nodes/gpu_utilization", "namespaces/gpu_utilization"} <= {
            r["name"] for r in body["resources"]
        }
        body = await call(client, "/apis/custom.metrics.k8s.io", 200)
        assert body["preferredVersion"]["version"] == "v1beta2"
    await e.adapter.stop()
    await e.adapter.prometheus.aclose()


@pytest.mark.parametrize(
    ("discovered", "unsynced", "reason"),
    [
        pytest.param(True, [], None, id="ready"),
        pytest.param(False, [], "series discovery has not succeeded yet", id="no-discovery"),
        pytest.param(True, [PODS], "the pods cache is not synced yet", id="pods-unsynced"),
        pytest.param(
            False,
            [NODES, PODS],
            "series discovery has not succeeded yet; the nodes, pods cache is not synced yet",
            id="both",
        ),
    ],
)
def test_not_ready_reason(discovered: bool, unsynced: list[GroupResource], reason: str | None) -> None:
    assert not_ready_reason(discovered, unsynced) == reason


async def test_readiness_waits_for_the_label_caches() -> None:
    """Discovery alone is not enough: a selector request before the pod cache synced answers 503."""
    index = LabelIndex([PODS, NODES])
    index.upsert(PODS, "ml", "llm-0", {"app": "llm"})
    e = Env(index=index)
    assert await e.adapter.discovery.relist()
    app = await e.adapter.start()
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/readyz")
        assert response.status == 503
        assert "the nodes, pods cache is not synced yet" in await response.text()
        assert "gpuwarden_adapter_ready 0.0" in await (await client.get("/metrics")).text()
        assert (await call(client, PODS_URL, 503))["reason"] == "ServiceUnavailable"
        index.mark_synced(PODS)
        response = await client.get("/readyz")
        assert (response.status, await response.text()) == (
            503,
            "not ready: the nodes cache is not synced yet",
        )
        index.mark_synced(NODES)
        assert (await client.get("/readyz")).status == 200
        assert "gpuwarden_adapter_ready 1.0" in await (await client.get("/metrics")).text()
        e.query.mock(return_value=vector(({"pod": "llm-0", "namespace": "ml"}, "1")))
        await call(client, PODS_URL, 200)
    await e.adapter.stop()
    await e.adapter.prometheus.aclose()


async def test_openapi_metrics_and_methods(env: tuple[Env, TestClient[Any, Any]]) -> None:
    e, client = env
    e.query.mock(return_value=vector(({"pod": "llm-0"}, "1")))
    await call(client, PODS_URL, 200)
    assert (await call(client, "/openapi/v2", 200))["swagger"] == "2.0"
    index = await call(client, "/openapi/v3", 200)
    assert "apis/custom.metrics.k8s.io/v1beta2" in index["paths"]
    assert (await call(client, "/openapi/v3/apis/external.metrics.k8s.io/v1beta1", 200))["openapi"] == "3.0.0"
    assert (await call(client, PODS_URL, 405, method="POST"))["reason"] == "MethodNotAllowed"
    assert (await call(client, "/nope", 404))["reason"] == "NotFound"
    text = await (await client.get("/metrics")).text()
    assert 'gpuwarden_adapter_requests_total{code="200",route="custom_wildcard"}' in text
    assert 'gpuwarden_adapter_prometheus_queries_total{outcome="success",purpose="values"}' in text
    assert 'gpuwarden_adapter_items_served_total{api="custom"} 1.0' in text
    assert "gpuwarden_adapter_ready 1.0" in text
    assert 'gpuwarden_adapter_discovered_metrics{api="custom"}' in text
