"""The HTTP shell and control API, in-process over aiohttp's test client with an injected clock."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from harness.simulator import Simulator, build_app, parse_scenario

SCENARIO: dict[str, Any] = {
    "fleet": {"nodes": 3, "gpus_per_node": 4, "numa_nodes": 2},
    "workloads": [{"name": "web", "namespace": "shop", "replicas": 2, "load": [{"at": 0, "qps": 100}]}],
    "faults": [{"at": "1m", "kind": "xid", "node": "gpu-node-002", "gpu": 3, "code": 79}],
}


class FakeClock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[TestClient[Any, Any]]:
    sim = Simulator(parse_scenario(SCENARIO), clock)
    async with TestClient(TestServer(build_app(sim))) as c:
        yield c


async def metrics(client: TestClient[Any, Any], path: str = "/metrics") -> str:
    resp = await client.get(path, headers={"Accept-Encoding": "identity"})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return await resp.text()


async def test_metrics_plain_and_gzip_are_the_same_body(client: TestClient[Any, Any]) -> None:
    plain = await metrics(client)
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(await resp.read()).decode() == plain
    assert plain.count("DCGM_FI_DEV_GPU_UTIL{") == 12


async def test_scheduled_fault_appears_when_the_clock_passes_its_time(
    client: TestClient[Any, Any], clock: FakeClock
) -> None:
    assert "DCGM_FI_DEV_XID_ERRORS{" not in await metrics(client)
    clock.t += 59
    assert "DCGM_FI_DEV_XID_ERRORS{" not in await metrics(client)
    clock.t += 1
    assert 'err_code="79"' in await metrics(client)


async def test_injected_fault_is_served_on_the_next_scrape_in_the_same_tick(
    client: TestClient[Any, Any],
) -> None:
    await metrics(client)  # fills the per-step cache
    resp = await client.post(
        "/control/faults", json={"kind": "ecc", "node": "gpu-node-000", "gpu": 1, "error": "dbe"}
    )
    assert resp.status == 200 and (await resp.json())["applied"] == 1
    (line,) = [
        line
        for line in (await metrics(client)).splitlines()
        if line.startswith('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"') and 'Hostname="gpu-node-000"' in line
    ]
    assert line.endswith(" 1")


async def test_exporter_down_per_node_503_and_series_gone(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/nodes/gpu-node-001/metrics")).status == 200
    resp = await client.post("/control/faults", json=[{"kind": "exporter_down", "node": "gpu-node-001"}])
    assert resp.status == 200
    assert (await client.get("/nodes/gpu-node-001/metrics")).status == 503
    assert "gpu-node-001" not in await metrics(client)
    assert (await client.delete("/control/faults", json={"node": "gpu-node-001"})).status == 200
    assert "gpu-node-001" in await metrics(client, "/nodes/gpu-node-001/metrics")


async def test_unknown_node_endpoint_is_404(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/nodes/nope/metrics")).status == 404
    assert (await client.get("/control/nodes/nope")).status == 404


async def test_app_metrics_endpoint(client: TestClient[Any, Any], clock: FakeClock) -> None:
    clock.t += 10
    text = await metrics(client, "/apps/metrics")
    assert "DCGM" not in text
    assert 'http_requests_total{code="200",method="GET",namespace="shop",pod="web-0"} 500' in text


XID = {"kind": "xid", "node": "gpu-node-000", "code": 79}


def pod(name: str, gpu: int, node: str = "gpu-node-000") -> dict[str, Any]:
    return {"pod": name, "node": node, "gpus": [gpu], "workload": "web"}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        pytest.param("POST", "/control/faults", "{nope", 400, "(body)", id="not-json"),
        pytest.param("POST", "/control/faults", {**XID, "code": None}, 400, "code", id="null-code"),
        pytest.param(
            "POST", "/control/faults", {**XID, "kind": "laser"}, 400, "(top level)", id="unknown-kind"
        ),
        pytest.param("POST", "/control/faults", {**XID, "node": "x"}, 400, "node", id="unknown-node"),
        pytest.param("POST", "/control/faults", [{**XID, "gpu": 9}], 400, "[0].gpu", id="gpu-out-of-range"),
        pytest.param("POST", "/control/faults", {**XID, "at": 5}, 400, "at", id="at-refused"),
        pytest.param("DELETE", "/control/faults", {"gpu": 1}, 400, "gpu", id="clear-gpu-without-node"),
        pytest.param(
            "DELETE", "/control/faults", {"everything": True}, 400, "everything", id="clear-unknown-key"
        ),
        pytest.param("POST", "/control/load", {"workload": "web"}, 400, "(top level)", id="load-needs-qps"),
        pytest.param("POST", "/control/load", {"workload": "web", "qps": -3}, 400, "qps", id="negative-qps"),
        pytest.param(
            "POST",
            "/control/load",
            {"workload": "w", "points": [{"at": "soon", "qps": 1}]},
            400,
            "points[0].at",
            id="bad-point",
        ),
        pytest.param("PUT", "/control/pods", {"pods": [pod("a", 7)]}, 400, "pods[0].gpus", id="no-such-gpu"),
        pytest.param(
            "PUT", "/control/pods", {"pods": [pod("a", 0), pod("b", 0)]}, 409, "pods", id="claimed-twice"
        ),
        pytest.param(
            "POST", "/control/pods", {"pods": [{"pod": "a"}]}, 400, "pods[0].node", id="pod-needs-node"
        ),
        pytest.param("DELETE", "/control/pods", {}, 400, "pods", id="delete-needs-pods"),
    ],
)
async def test_bad_control_requests(
    client: TestClient[Any, Any], method: str, path: str, body: Any, status: int, field: str
) -> None:
    kwargs = {"data": body} if isinstance(body, str) else {"json": body}
    resp = await client.request(method, path, **kwargs)
    assert resp.status == status
    doc = await resp.json()
    assert field in [p["field"] for p in doc["problems"]], doc
    assert doc["error"]


def util_of(text: str, pod_name: str) -> list[str]:
    """GPU_UTIL values of the GPUs `pod_name` holds."""
    return [
        line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'pod="{pod_name}"' in line
    ]


async def test_load_and_pods_drive_utilization(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/control/load", json={"namespace": "shop", "workload": "web", "qps": 150})
    assert (await resp.json())["qps"] == 150
    assert util_of(await metrics(client), "web-0") == ["75"]  # 150 QPS over 2 pods; 100 QPS = 100 % of a GPU
    names = ["web-a", "web-b", "web-c"]
    pods = {"pods": [{"namespace": "shop", **pod(p, i, "gpu-node-001")} for i, p in enumerate(names)]}
    assert (await client.put("/control/pods", json=pods)).status == 200
    text = await metrics(client)
    assert util_of(text, "web-0") == []  # PUT replaced the whole mapping
    assert util_of(text, "web-a") == ["50"]
    resp = await client.delete("/control/pods", json={"pods": [{"namespace": "shop", "pod": "web-c"}]})
    assert (await resp.json())["removed"] == 1
    assert util_of(await metrics(client), "web-a") == ["75"]


async def test_state_and_node_views(client: TestClient[Any, Any], clock: FakeClock) -> None:
    clock.t += 61
    state = await (await client.get("/control/state")).json()
    assert state["time"] == 61 and state["nodes"] == 3
    assert [(g["node"], g["gpu"], g["last_xid"]) for g in state["unhealthy_gpus"]] == [
        ("gpu-node-002", 3, 79)
    ]
    assert [(p["pod"], p["gpus"]) for p in state["pods"]] == [("web-0", [0]), ("web-1", [1])]
    node = await (await client.get("/control/nodes/gpu-node-000")).json()
    assert [g["numa_node"] for g in node["gpus"]] == [0, 0, 1, 1]
    assert node["gpus"][0]["pod"] == "shop/web-0"


async def test_healthz(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/healthz")).status == 200
