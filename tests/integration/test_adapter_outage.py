"""Prometheus outages, against a REAL Prometheus scraping a live exporter: 503 in time, then recovery.

The exporter is a tiny aiohttp app serving dcgm-exporter-shaped series; Prometheus scrapes it every second.
Three failure modes are exercised without restarting the adapter:
- Prometheus killed: after the cached answer passes `max_age`, requests get a 503 Status at once (never a
  stale or made-up value);
- Prometheus frozen (SIGSTOP, connections accepted but never answered): 503 within the query timeout;
- Prometheus restarted on the same port: values come back on the next request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import harness.localprom as localprom
from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import PODS
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, find_free_port, scrape_target

URL = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3Dllm"
TIMEOUT = 2.0
MAX_AGE = 3.0
EXPOSITION = (
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="node-1",pod="llm-0",namespace="ml"} 42\n'
    'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",Hostname="node-1",pod="llm-1",namespace="ml"} 64\n'
)


async def exporter(port: int) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest_asyncio.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[LocalPrometheus, Adapter, TestClient[Any, Any]]]:
    port = find_free_port()
    runner = await exporter(port)
    prom = LocalPrometheus(tmp_path, [scrape_target("dcgm", f"127.0.0.1:{port}", honor_labels=True)])
    await prom.start()
    await prom.wait_for_up("dcgm")
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "retries": 0, "timeout_seconds": TIMEOUT},
            "adapter": {
                "authentication": {"enabled": False},
                "cache": {"refresh_interval_seconds": 1, "max_age_seconds": MAX_AGE},
            },
        }
    )
    index = LabelIndex([PODS])
    for pod in ("llm-0", "llm-1"):
        index.upsert(PODS, "ml", pod, {"app": "llm"})
    index.mark_synced(PODS)
    adapter = Adapter(config, index=index)
    app = await adapter.start()
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield prom, adapter, client
    finally:
        await client.close()
        await adapter.stop()
        await prom.stop()
        await runner.cleanup()


async def values(client: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
    response = await client.get(URL)
    body: dict[str, Any] = await response.json()
    return response.status, body


async def eventually_ok(client: TestClient[Any, Any], within: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        status, body = await values(client)
        if status == 200 and len(body["items"]) == 2:
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)


async def test_killed_prometheus_is_503_then_recovers_after_restart(
    setup: tuple[LocalPrometheus, Adapter, TestClient[Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    prom, adapter, client = setup
    body = await eventually_ok(client)
    assert {i["describedObject"]["name"]: i["value"] for i in body["items"]} == {"llm-0": "42", "llm-1": "64"}
    assert adapter.discovery.ready

    port = int(prom.url.rsplit(":", 1)[1])
    await prom.stop()
    await asyncio.sleep(MAX_AGE + 0.5)  # the last good answer is now too old to serve
    started = time.monotonic()
    status, body = await values(client)
    assert (status, body["kind"], body["reason"]) == (503, "Status", "ServiceUnavailable"), body
    assert time.monotonic() - started < TIMEOUT

    monkeypatch.setattr(localprom, "find_free_port", lambda: port)  # come back where the adapter looks
    await prom.start()
    body = await eventually_ok(client)
    assert [i["value"] for i in body["items"]] == ["42", "64"]


async def test_frozen_prometheus_is_503_within_the_query_timeout(
    setup: tuple[LocalPrometheus, Adapter, TestClient[Any, Any]],
) -> None:
    prom, _, client = setup
    await eventually_ok(client)
    pid = prom._proc.pid  # type: ignore[union-attr]  # the only handle on the real process
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(MAX_AGE + 0.5)
        started = time.monotonic()
        status, body = await values(client)
        elapsed = time.monotonic() - started
        assert (status, body["reason"]) == (503, "ServiceUnavailable"), body
        assert elapsed < TIMEOUT + 1.0, elapsed
    finally:
        os.kill(pid, signal.SIGCONT)
    await eventually_ok(client)
