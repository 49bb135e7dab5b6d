"""The serving-engine presets against a REAL Prometheus: recorded engine pages, and the simulator's engines.

Part 1 — recorded pages (tests/unit/golden/engines/*.txt, each naming its upstream source): every page is one
pod's /metrics in namespace `ml` (pod `<page>-0`, the `pod`/`namespace` labels Prometheus' Kubernetes
discovery adds), backfilled with promtool for ten minutes ending at T: gauges as recorded, counters and
histogram series growing by 1 % of their recorded value per 15 s step, so every rate is known (value x 0.01 /
15 per second) and a histogram's rate has the recorded distribution. The adapter's clock is pinned to T.
Expected values are worked out by hand from the pages (in the table below), in cache mode and per request.

Part 2 — the simulator (harness/simulator/engine.py) serves a vLLM-shaped workload live, scraped every
second: the router's queue is served as the external metric `router_queue_depth` while no pod runs (what
wakes a workload parked at zero), the pod's queue as `vllm_queue_depth` once it runs, and both answer KEDA's
scaler (`preset: router-queue`, `preset: vllm-queue`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from adapter.app import Adapter
from adapter.errors import NotFound
from adapter.kedaapi import externalscaler_pb2 as pb
from adapter.kedascaler import NoData
from adapter.objects import LabelIndex
from adapter.resources import PODS
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, backfill_openmetrics, scrape_target
from harness.simulator import start
from harness.simulator.scenario import parse_scenario

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden" / "engines"
PAGES = ("vllm-v1", "vllm-v0", "tgi", "sglang", "triton")
STEP, POINTS, GROWTH = 15, 41, 0.01
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"


def rate(recorded: float) -> float:
    """The per-second rate of a counter recorded at `recorded` (grows by GROWTH of it per STEP)."""
    return recorded * GROWTH / STEP


# metric -> {pod: value}, worked out by hand from the recorded pages
WANT: dict[str, dict[str, float]] = {
    "vllm_queue_depth": {"vllm-v1-0": 4 + 3, "vllm-v0-0": 2},  # two engine cores add up
    "vllm_running_requests": {"vllm-v1-0": 12 + 10, "vllm-v0-0": 8},
    # the fuller engine core; the old name alone before the rename
    "vllm_kv_cache_usage": {"vllm-v1-0": 0.71, "vllm-v0-0": 0.45},
    "vllm_tokens_per_second": {"vllm-v1-0": rate(456789 + 401234), "vllm-v0-0": rate(12000)},
    # 900 of 1000 first tokens by 0.25 s: the 0.9 quantile is the bucket's upper bound
    "vllm_ttft_p90_seconds": {"vllm-v1-0": 0.25},
    "tgi_queue_depth": {"tgi-0": 9},
    "tgi_running_requests": {"tgi-0": 24},
    "tgi_tokens_per_second": {"tgi-0": rate(1034567)},
    "sglang_queue_depth": {"sglang-0": 26},
    "sglang_running_requests": {"sglang-0": 162},
    "sglang_kv_cache_usage": {"sglang-0": 0.28},
    "sglang_tokens_per_second": {"sglang-0": rate(7.557572e6)},
    # rank 135 of 150 lies in (1.0, 2.5] holding 27..140: 1.0 + 1.5 x (135 - 27) / (140 - 27)
    "sglang_ttft_p90_seconds": {"sglang-0": 1.0 + 1.5 * 108 / 113},
    "triton_queue_depth": {"triton-0": 0 + 6},  # the ensemble and its tensorrt_llm step
    "triton_kv_cache_usage": {"triton-0": 3000 / 4000},
    # rank 900 of 1000 lies in (500, 2000] ms holding 800..1000: 500 + 1500 x 100 / 200 ms, in seconds
    "triton_ttft_p90_seconds": {"triton-0": 1.25},
}


def history(t_end: int) -> str:
    """Every page as OpenMetrics with ten minutes of samples ending at `t_end`, one pod per page."""
    series: dict[str, list[tuple[str, float, bool]]] = {}  # name -> (labels, value, grows)
    for page in PAGES:
        for family in text_string_to_metric_families((GOLDEN / f"{page}.txt").read_text()):
            grows = family.type in ("counter", "histogram")
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                labels = {**s.labels, "namespace": "ml", "pod": f"{page}-0"}
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                series.setdefault(s.name, []).append((text, s.value, grows))
    out: list[str] = []
    for name, samples in series.items():
        out.append(f"# TYPE {name} gauge")
        for i in range(POINTS):
            ts = t_end - (POINTS - 1 - i) * STEP
            for label_text, value, grows in samples:
                v = value * (1 + GROWTH * i) if grows else value
                out.append(f"{name}{{{label_text}}} {v} {ts}")
    return "\n".join(out) + "\n# EOF\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backfilled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalPrometheus, int]]:
    workdir = tmp_path_factory.mktemp("engine-pages-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield prom, t_end


def index_of(pods: list[str], namespace: str = "ml") -> LabelIndex:
    index = LabelIndex([PODS])
    for pod in pods:
        index.upsert(PODS, namespace, pod, {"app": pod.rsplit("-", 1)[0]})
    index.mark_synced(PODS)
    return index


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["cache", "per_request"])
async def client(
    request: pytest.FixtureRequest, backfilled: tuple[LocalPrometheus, int]
) -> AsyncIterator[TestClient[Any, Any]]:
    prom, t_end = backfilled
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "retries": 0},
            "adapter": {
                "authentication": {"enabled": False},
                "cache": {"mode": request.param},
                "metrics_max_age_seconds": 900,
            },
        }
    )
    adapter = Adapter(config, index=index_of([f"{p}-0" for p in PAGES]), clock=lambda: float(t_end))
    assert await adapter.discovery.relist()
    app = await adapter.start()
    async with TestClient(TestServer(app)) as c:
        yield c
    await adapter.stop()


async def values(client: TestClient[Any, Any], path: str) -> dict[str, float]:
    response = await client.get(path)
    body: dict[str, Any] = await response.json()
    assert response.status == 200, body
    return {item["describedObject"]["name"]: quantity(item["value"]) for item in body["items"]}


def quantity(text: str) -> float:
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    if text.endswith("k"):
        return float(text[:-1]) * 1000
    return float(text)


async def test_discovery_lists_each_engine_metric_the_pages_hold(client: TestClient[Any, Any]) -> None:
    response = await client.get(CUSTOM)
    names = {r["name"] for r in (await response.json())["resources"]}
    for metric in WANT:
        assert f"pods/{metric}" in names, metric
    assert "pods/tgi_kv_cache_usage" not in names  # TGI exports no KV-cache gauge: no such preset
    assert "pods/triton_tokens_per_second" not in names


@pytest.mark.parametrize("metric", sorted(WANT))
async def test_per_pod_values_from_recorded_engine_pages(client: TestClient[Any, Any], metric: str) -> None:
    got = await values(client, f"{CUSTOM}/namespaces/ml/pods/*/{metric}")
    assert got == pytest.approx(WANT[metric], rel=2e-3)


async def test_per_namespace_value(client: TestClient[Any, Any]) -> None:
    got = await values(client, f"{CUSTOM}/namespaces/ml/metrics/vllm_queue_depth")
    assert got == pytest.approx({"ml": 4 + 3 + 2})


# ---- part 2: the simulator's engines, live --------------------------------------------------------------


async def control(url: str, method: str, path: str, body: object) -> None:
    async with aiohttp.ClientSession() as http, http.request(method, url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()


async def eventually(check: Any, timeout: float = 30.0) -> Any:  # noqa: ASYNC109
    """`await check()` until it returns something truthy, or fail with the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"not reached in {timeout:g}s; last: {last!r}")


async def test_simulated_vllm_queue_and_router_queue_from_zero_to_one(tmp_path: Path) -> None:
    scenario = parse_scenario({"fleet": {"nodes": 1, "gpus_per_node": 2}})
    sim = await start(scenario, "127.0.0.1", 0)
    prom = LocalPrometheus(
        tmp_path / "prom",
        scrape_configs=[scrape_target("sim", f"127.0.0.1:{sim.port}", metrics_path="/apps/metrics")],
        scrape_interval_seconds=1,
    )
    adapter: Adapter | None = None
    try:
        await prom.start()
        await prom.wait_for_up("sim", timeout=30)
        # 150 req/s at a vLLM-shaped workload with no pod: the router holds them
        body = {"namespace": "ml", "workload": "llm", "qps": 150, "qps_per_gpu": 100, "engine": "vllm"}
        await control(sim.url, "POST", "/control/load", body)
        config = Config.model_validate(
            {
                "prometheus": {"url": prom.url, "retries": 0},
                "adapter": {
                    "authentication": {"enabled": False},
                    "relist_interval_seconds": 1,
                    "cache": {"refresh_interval_seconds": 1, "max_age_seconds": 10},
                    "keda": {"enabled": True, "tls": {"plaintext": True}},
                },
            }
        )
        adapter = Adapter(config, index=index_of(["llm-a"]))
        app = await adapter.start()
        assert adapter.keda is not None
        async with TestClient(TestServer(app)) as c:

            async def router() -> float:
                await adapter.discovery.relist()
                r = await c.get(f"{EXTERNAL}/namespaces/ml/router_queue_depth?labelSelector=service%3Dllm")
                items = (await r.json()).get("items", []) if r.status == 200 else []
                return quantity(items[0]["value"]) if items else 0.0

            held = await eventually(router)
            assert held > 0
            woken = pb.ScaledObjectRef(
                name="llm",
                namespace="ml",
                scalerMetadata={"preset": "router-queue", "labelSelector": "service=llm", "targetValue": "5"},
            )
            _, value = await adapter.keda.evaluate(woken)
            assert value > 0  # KEDA's IsActive would say true: the workload wakes from zero
            per_pod = pb.ScaledObjectRef(
                name="llm",
                namespace="ml",
                scalerMetadata={"preset": "vllm-queue", "labelSelector": "app=llm", "targetValue": "5"},
            )
            with pytest.raises((NoData, NotFound), match="preset: router-queue"):
                await adapter.keda.evaluate(per_pod)  # no pod, no engine: the per-pod preset says so

            # one pod (capacity 100 req/s) takes over: the router hands over, the pod's queue grows by ~50/s
            pod = {"namespace": "ml", "pod": "llm-a", "node": "gpu-node-000", "gpus": [0], "workload": "llm"}
            await control(sim.url, "PUT", "/control/pods", {"pods": [pod]})

            async def queue() -> dict[str, float]:
                await adapter.discovery.relist()
                r = await c.get(f"{CUSTOM}/namespaces/ml/pods/*/vllm_queue_depth")
                return (
                    {i["describedObject"]["name"]: quantity(i["value"]) for i in (await r.json())["items"]}
                    if r.status == 200
                    else {}
                )

            first = (await eventually(queue))["llm-a"]
            assert first > 0
            later = await eventually(lambda: _grown(queue, first))
            assert later > first  # 150 req/s into a pod serving 100: the queue grows with load
            assert await eventually(lambda: _zero(router)) == "zero"  # handed to the pod
            _, pod_value = await adapter.keda.evaluate(per_pod)
            assert pod_value > 0
    finally:
        if adapter is not None:
            await adapter.stop()
        await prom.stop()
        await sim.stop()


async def _grown(queue: Any, than: float) -> float:
    value: float = (await queue()).get("llm-a", 0.0)
    return value if value > than else 0.0


async def _zero(router: Any) -> str:
    return "zero" if await router() == 0.0 else ""
