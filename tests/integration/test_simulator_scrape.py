"""A REAL Prometheus scrapes the fleet simulator every second: names, labels, and fault latency.

Two ways of scraping, as the simulator documents: job "sim" scrapes the whole fleet at /metrics (one target),
job "node" scrapes one node's exporter at /nodes/<node>/metrics (as a DaemonSet pod would be scraped).
A fault injected through the control API must be visible in Prometheus within two scrape intervals; the test
measures the latency and asserts it (with a small slack for query time), polling under a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, load_scenario, start

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

INTERVAL = 1.0  # Prometheus scrape interval (s)
SLACK = 0.5  # query round trip and scheduling on a busy 2-core machine (s)
SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "small.yaml"
NODE = "gpu-node-001"  # scraped on its own by job "node"
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
TARGET_LABELS = {"__name__", "job", "instance"}


@dataclass
class Setup:
    sim: RunningSimulator
    prom: LocalPrometheus
    client: PrometheusClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    sim = await start(load_scenario(SCENARIO), "127.0.0.1", 0)
    host_port = f"127.0.0.1:{sim.port}"
    configs = [
        scrape_target("sim", host_port),
        scrape_target("node", host_port, metrics_path=f"/nodes/{NODE}/metrics"),
    ]
    prom = LocalPrometheus(
        tmp_path_factory.mktemp("prom-sim"), scrape_configs=configs, scrape_interval_seconds=INTERVAL
    )
    try:
        await prom.start()
        await prom.wait_for_up("sim", timeout=30)
        await prom.wait_for_up("node", timeout=30)
        async with prom.client(timeout_seconds=5, retries=0) as client:
            yield Setup(sim, prom, client)
    finally:
        await prom.stop()
        await sim.stop()


async def vector(client: PrometheusClient, promql: str) -> Vector:
    result = await client.query(promql)
    assert isinstance(result, Vector), result
    return result


async def control(sim: RunningSimulator, method: str, path: str, body: object) -> None:
    async with aiohttp.ClientSession() as http, http.request(method, sim.url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()


async def latency_until(check: Callable[[], Awaitable[bool]], deadline: float) -> float:
    """Seconds until `check()` holds, polling every 50 ms; fails with the elapsed time at the deadline."""
    started = time.monotonic()
    while not await check():
        elapsed = time.monotonic() - started
        assert elapsed < deadline, f"not visible after {elapsed:.2f}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_every_gpu_series_has_the_exporter_labels(setup: Setup) -> None:
    util = await vector(setup.client, 'DCGM_FI_DEV_GPU_UTIL{job="sim"}')
    assert len(util.samples) == 4 * 8
    for s in util.samples:
        pod_labels = {"pod", "namespace", "container"} if "pod" in s.labels else set()
        assert set(s.labels) == DCGM_LABELS | TARGET_LABELS | pod_labels, s.labels
        assert s.labels["device"] == f"nvidia{s.labels['gpu']}"
        assert s.labels["UUID"].startswith("GPU-")
    held = sorted((s.labels["namespace"], s.labels["pod"]) for s in util.samples if "pod" in s.labels)
    assert held == [("inference", f"llm-serve-{i}") for i in range(4)] + [("training", "trainer-0")] * 4


async def test_all_families_are_queryable_by_their_exporter_names(setup: Setup) -> None:
    result = await vector(
        setup.client, 'count by (__name__) ({job="sim", __name__=~"DCGM_.+|http_requests_total"})'
    )
    names = {s.labels["__name__"] for s in result.samples}
    assert names >= {
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP", "http_requests_total",
    }  # fmt: skip
    node_only = await vector(setup.client, 'count(DCGM_FI_DEV_GPU_UTIL{job="node"}) by (Hostname)')
    assert [(s.labels["Hostname"], s.value) for s in node_only.samples] == [(NODE, 8.0)]


async def test_injected_xid_is_visible_within_two_scrape_intervals(setup: Setup) -> None:
    query = 'DCGM_FI_DEV_XID_ERRORS{job="sim", Hostname="gpu-node-002", gpu="6"}'

    async def visible() -> bool:
        samples = (await vector(setup.client, query)).samples
        return bool(samples) and samples[0].value == 79 and samples[0].labels["err_code"] == "79"

    assert not await visible()
    await control(
        setup.sim, "POST", "/control/faults", {"kind": "xid", "node": "gpu-node-002", "gpu": 6, "code": 79}
    )
    latency = await latency_until(visible, deadline=2 * INTERVAL + 5)
    print(f"XID visible in Prometheus after {latency:.2f}s")
    assert latency <= 2 * INTERVAL + SLACK, f"XID took {latency:.2f}s to reach Prometheus"
    count = await vector(setup.client, query.replace("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"))
    assert [(s.labels["xid"], s.labels["window_size_in_ms"], s.value) for s in count.samples] == [
        ("79", "300000", 1)
    ]


async def test_exporter_down_is_up_0_per_node_and_stale_series_in_the_fleet_target(setup: Setup) -> None:
    async def down() -> bool:
        up = (await vector(setup.client, 'up{job="node"}')).samples
        gone = (await vector(setup.client, f'DCGM_FI_DEV_GPU_UTIL{{job="sim", Hostname="{NODE}"}}')).samples
        return [s.value for s in up] == [0.0] and not gone

    await control(setup.sim, "POST", "/control/faults", {"kind": "exporter_down", "node": NODE})
    try:
        latency = await latency_until(down, deadline=2 * INTERVAL + 5)
        print(f"exporter outage visible in Prometheus after {latency:.2f}s")
        assert latency <= 2 * INTERVAL + SLACK, f"exporter outage took {latency:.2f}s to show"
        up_sim = await vector(setup.client, 'up{job="sim"}')
        assert [s.value for s in up_sim.samples] == [1.0]  # the fleet target itself still answers
    finally:
        await control(setup.sim, "DELETE", "/control/faults", {"node": NODE})
    await setup.prom.wait_for_up("node", timeout=2 * INTERVAL + 5)


async def test_load_change_reaches_gpu_utilization(setup: Setup) -> None:
    query = 'DCGM_FI_DEV_GPU_UTIL{job="sim", namespace="inference", pod="llm-serve-0"}'
    await control(
        setup.sim, "POST", "/control/load", {"namespace": "inference", "workload": "llm-serve", "qps": 100}
    )

    async def at_50() -> bool:
        return [s.value for s in (await vector(setup.client, query)).samples] == [
            50.0
        ]  # 100 QPS / 4 pods / 50

    latency = await latency_until(at_50, deadline=2 * INTERVAL + 5)
    assert latency <= 2 * INTERVAL + SLACK

    async def serving() -> bool:  # rate() needs two samples of the counter
        rate = await vector(
            setup.client, 'sum(rate(http_requests_total{job="sim", namespace="inference"}[10s]))'
        )
        return bool(rate.samples) and rate.samples[0].value > 0

    await latency_until(serving, deadline=3 * INTERVAL + 5)
