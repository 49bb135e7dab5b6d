"""metrics.k8s.io on every route against a REAL Prometheus, with kube-prometheus's own `resourceRules`.

Ten minutes of cAdvisor- and node-exporter-shaped history ending at T are backfilled with promtool
(`container_cpu_usage_seconds_total`, `container_memory_working_set_bytes`, `node_cpu_seconds_total` joined
through `node_namespace_pod:kube_pod_info:`, `node_memory_MemTotal_bytes`/`MemAvailable_bytes`); the
adapter loads tests/unit/golden/adapter/resource/kube-prometheus-config.yaml as its `--config`, unchanged,
and its clock is pinned to T. Every answer is compared with a golden file (times written relative to T) and
the values are also checked against numbers computed here by hand, in cache and per-request mode.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import NODES, PODS
from adapter.wire import format_time
from gpuwarden.config.loader import load_config
from harness.localprom import LocalPrometheus, backfill_openmetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests/unit/golden/adapter/resource"
KUBE_PROMETHEUS = GOLDEN / "kube-prometheus-config.yaml"
API = "/apis/metrics.k8s.io/v1beta1"
STEP, POINTS = 15, 41

# (namespace, pod, container, cores, working-set bytes or None, seconds before T of the last scrape)
CONTAINERS = [
    ("ml", "llm-a", "main", 0.5, 14868480, 0),  # 14520Ki
    ("ml", "llm-a", "sidecar", 0.000043481, 123456789, 0),  # 43481n: reads 1m in kubectl, not 0
    ("ml", "llm-a", "POD", 0.001, 40960, 0),  # pause container: never served
    ("ml", "llm-b", "main", 1.5, 512, 30),  # last scrape 30 s before T: timestamp says so
    ("prod", "web-x", "main", 0.25, None, 0),  # no memory series: pod omitted, as metrics-server does
    ("ml", "gone-0", "main", 0.1, 1024, 0),  # not in the API server any more: never listed
]
POD_LABELS = {("ml", "llm-a"): {"app": "llm"}, ("ml", "llm-b"): {"app": "llm"}, ("prod", "web-x"): {}}
# (node, idle fraction per cpu over 2 cpus or None, MemTotal, MemAvailable or None)
NODES_DATA = [
    ("node-1", 0.75, 8 * 2**30, 6 * 2**30),
    ("node-2", None, 4 * 2**30, 2**30),
    ("node-3", 0.5, None, None),
]
NODE_LABELS = {"node-1": {"pool": "a100"}, "node-2": {"pool": "a100"}, "node-3": {"pool": "h100"}}


def history(t_end: int) -> str:
    fams: dict[str, list[str]] = {
        "container_cpu_usage_seconds_total": [],
        "container_memory_working_set_bytes": [],
        "node_cpu_seconds_total": [],
        "node_namespace_pod:kube_pod_info:": [],
        "node_memory_MemTotal_bytes": [],
        "node_memory_MemAvailable_bytes": [],
    }
    for i in range(POINTS):
        ts = t_end - (POINTS - 1 - i) * STEP
        for ns, pod, container, cores, memory, lag in CONTAINERS:
            if ts > t_end - lag:
                continue
            labels = f'namespace="{ns}",pod="{pod}",container="{container}",job="kubelet"'
            fams["container_cpu_usage_seconds_total"].append(
                f"container_cpu_usage_seconds_total{{{labels}}} {i * cores * STEP:.12g} {ts}"
            )
            # the pod-level cgroup (container="") that doubles totals without container!=""
            cgroup = f'namespace="{ns}",pod="{pod}",container="",job="kubelet"'
            fams["container_cpu_usage_seconds_total"].append(
                f"container_cpu_usage_seconds_total{{{cgroup}}} {i * 9:.12g} {ts}"
            )
            if memory is not None:
                fams["container_memory_working_set_bytes"].append(
                    f"container_memory_working_set_bytes{{{labels}}} {memory} {ts}"
                )
        for node, idle, total, available in NODES_DATA:
            exporter = f'namespace="monitoring",pod="node-exporter-{node}"'
            if idle is not None:
                fams["node_namespace_pod:kube_pod_info:"].append(
                    f'node_namespace_pod:kube_pod_info:{{{exporter},node="{node}"}} 1 {ts}'
                )
                for cpu in ("0", "1"):
                    value = i * idle * STEP
                    fams["node_cpu_seconds_total"].append(
                        f'node_cpu_seconds_total{{{exporter},cpu="{cpu}",mode="idle",instance="{node}"}} '
                        f"{value:.12g} {ts}"
                    )
            if total is not None and available is not None:
                job = f'job="node-exporter",instance="{node}"'
                fams["node_memory_MemTotal_bytes"].append(f"node_memory_MemTotal_bytes{{{job}}} {total} {ts}")
                fams["node_memory_MemAvailable_bytes"].append(
                    f"node_memory_MemAvailable_bytes{{{job}}} {available} {ts}"
                )
    out: list[str] = []
    for name, lines in fams.items():
        kind = "counter" if name.endswith("_total") else "gauge"
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
    workdir = tmp_path_factory.mktemp("resource-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield prom, t_end


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["cache", "per_request"])
async def client(
    request: pytest.FixtureRequest, backfilled: tuple[LocalPrometheus, int]
) -> AsyncIterator[TestClient[Any, Any]]:
    prom, t_end = backfilled
    config = load_config(
        KUBE_PROMETHEUS,
        env={},
        overrides={
            "prometheus.url": prom.url,
            "prometheus.retries": 0,
            "adapter.authentication.enabled": False,
            "adapter.cache.mode": request.param,
        },
    )
    adapter = Adapter(config, index=label_index(), clock=lambda: float(t_end))
    app = await adapter.start()
    async with TestClient(TestServer(app)) as c:
        c.t_end = t_end  # type: ignore[attr-defined]
        yield c
    await adapter.stop()


def relative(doc: Any, t_end: int) -> Any:
    """Absolute times in `doc` written as `T` or `T-<n>s`, so the golden files do not depend on T."""
    if isinstance(doc, dict):
        return {k: relative(v, t_end) for k, v in doc.items()}
    if isinstance(doc, list):
        return [relative(v, t_end) for v in doc]
    if isinstance(doc, str):
        for lag in range(0, 601):
            if doc == format_time(t_end - lag):
                return "T" if lag == 0 else f"T-{lag}s"
    return doc


async def golden(client: TestClient[Any, Any], path: str, name: str, status: int = 200) -> dict[str, Any]:
    response = await client.get(path, headers={"Accept": "application/vnd.kubernetes.protobuf, */*"})
    body: dict[str, Any] = await response.json()
    assert response.status == status, body
    assert response.headers["Content-Type"].startswith("application/json")
    got = relative(body, client.t_end)  # type: ignore[attr-defined]
    file = GOLDEN / f"{name}.json"
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        file.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(file.read_text()), json.dumps(got, indent=2)
    return body


def usage(body: dict[str, Any]) -> dict[str, Any]:
    if "containers" in body:
        return {c["name"]: (c["usage"]["cpu"], c["usage"]["memory"]) for c in body["containers"]}
    if "usage" in body:
        return body["usage"]
    return {(i["metadata"].get("namespace", ""), i["metadata"]["name"]): usage(i) for i in body["items"]}


async def test_discovery(client: TestClient[Any, Any]) -> None:
    body = await golden(client, API, "api_resource_list")
    assert [(r["name"], r["kind"], r["verbs"]) for r in body["resources"]] == [
        ("nodes", "NodeMetrics", ["get", "list"]),
        ("pods", "PodMetrics", ["get", "list"]),
    ]
    groups = await golden(client, "/apis", "api_group_list")
    assert "metrics.k8s.io" in [g["name"] for g in groups["groups"]]
    await golden(client, "/apis/metrics.k8s.io", "api_group")


async def test_nodes(client: TestClient[Any, Any]) -> None:
    body = await golden(client, f"{API}/nodes", "node_metrics_list")
    # node-1: 2 cpus x (1 - 0.75 idle) = 0.5 cores; 8 GiB - 6 GiB; node-2 has no cpu, node-3 no memory
    assert usage(body) == {("", "node-1"): {"cpu": "500m", "memory": "2Gi"}}
    item = body["items"][0]
    assert item["window"] == "4m0s" and item["metadata"]["labels"] == {"pool": "a100"}
    one = await golden(client, f"{API}/nodes/node-1", "node_metrics")
    assert one["kind"] == "NodeMetrics" and usage(one) == {"cpu": "500m", "memory": "2Gi"}
    selected = await client.get(f"{API}/nodes?labelSelector=pool%3Dh100")
    assert (await selected.json())["items"] == []
    by_field = await client.get(f"{API}/nodes?fieldSelector=metadata.name%21%3Dnode-1")
    assert (await by_field.json())["items"] == []
    await golden(client, f"{API}/nodes/node-2", "status_nodemetrics_not_found", 404)
    await golden(client, f"{API}/nodes/nope", "status_node_not_found", 404)


async def test_pods_all_namespaces_and_containers(client: TestClient[Any, Any]) -> None:
    body = await golden(client, f"{API}/pods", "pod_metrics_list")
    assert usage(body) == {
        ("ml", "llm-a"): {"main": ("500m", "14520Ki"), "sidecar": ("43481n", "123456789")},
        ("ml", "llm-b"): {"main": ("1500m", "512")},
    }
    stamps = {i["metadata"]["name"]: i["timestamp"] for i in body["items"]}
    t_end = client.t_end  # type: ignore[attr-defined]
    assert stamps == {"llm-a": format_time(t_end), "llm-b": format_time(t_end - 30)}
    assert {i["window"] for i in body["items"]} == {"2m0s"}


async def test_pods_of_a_namespace_with_selectors(client: TestClient[Any, Any]) -> None:
    body = await golden(client, f"{API}/namespaces/ml/pods?labelSelector=app%3Dllm", "pod_metrics_list_ml")
    assert [i["metadata"]["name"] for i in body["items"]] == ["llm-a", "llm-b"]
    body = await golden(
        client,
        f"{API}/pods?fieldSelector=metadata.namespace%3Dml,metadata.name%21%3Dllm-a",
        "pod_metrics_list_field",
    )
    assert [i["metadata"]["name"] for i in body["items"]] == ["llm-b"]
    empty = await golden(client, f"{API}/namespaces/prod/pods", "pod_metrics_list_empty")
    assert empty["items"] == []


async def test_one_pod_and_the_not_found_shapes(client: TestClient[Any, Any]) -> None:
    body = await golden(client, f"{API}/namespaces/ml/pods/llm-a", "pod_metrics")
    assert body["kind"] == "PodMetrics" and body["metadata"]["labels"] == {"app": "llm"}
    await golden(client, f"{API}/namespaces/prod/pods/web-x", "status_podmetrics_not_found", 404)
    await golden(client, f"{API}/namespaces/ml/pods/gone-0", "status_pod_not_found", 404)


async def test_bad_selectors_are_400(client: TestClient[Any, Any]) -> None:
    for query in ("labelSelector=app%3D%3D%3D", "fieldSelector=metadata.name"):
        response = await client.get(f"{API}/pods?{query}")
        assert response.status == 400, query
        assert (await response.json())["reason"] == "BadRequest"
