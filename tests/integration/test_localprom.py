"""harness.localprom against the real `prometheus` and `promtool` binaries."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuwarden.errors import PrometheusUnreachable
from gpuwarden.promtypes import Vector
from harness.localprom import (
    LocalPrometheus,
    LocalPrometheusError,
    backfill_openmetrics,
    find_free_port,
    scrape_target,
    storage_dir,
)

pytestmark = pytest.mark.integration


async def test_stopped_server_is_unreachable(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    prom = LocalPrometheus(tmp_path)
    await prom.start()
    url = prom.url
    async with prom.client(registry=registry, retries=2, retry_backoff_seconds=0.01) as client:
        assert (await client.query("vector(1)")).samples[0].value == 1.0  # type: ignore[union-attr]
        await prom.stop()
        assert not prom.running
        with pytest.raises(PrometheusUnreachable, match=url.removeprefix("http://")):
            await client.query("vector(1)")
    labels = {"endpoint": "query", "outcome": "unreachable"}
    assert registry.get_sample_value("gpuwarden_prometheus_requests_total", labels) == 3  # 1 try + 2 retries
    with pytest.raises(LocalPrometheusError, match="not running"):
        _ = prom.url
    await prom.stop()  # idempotent


async def test_self_scrape_is_up_and_its_series_are_queryable(prometheus: LocalPrometheus) -> None:
    await prometheus.wait_for_up("prometheus", timeout=30)
    async with prometheus.client() as client:
        series = await client.series(['up{job="prometheus"}'])
    instance = prometheus.url.removeprefix("http://")
    assert series == [{"__name__": "up", "instance": instance, "job": "prometheus"}]


async def test_reload_picks_up_a_new_scrape_config(prometheus: LocalPrometheus) -> None:
    dead = f"127.0.0.1:{find_free_port()}"  # nothing listens there
    prometheus.scrape_configs = [scrape_target("nothing-there", dead, scrape_interval_seconds=0.5)]
    try:
        await prometheus.reload()
        async with prometheus.client() as client:
            deadline = time.monotonic() + 30
            samples: list[tuple[str, float]] = []
            while not samples and time.monotonic() < deadline:
                result = await client.query('up{job="nothing-there"}')
                assert isinstance(result, Vector)
                samples = [(s.labels["instance"], s.value) for s in result.samples]
                await asyncio.sleep(0.2)
        assert samples == [(dead, 0.0)]
        with pytest.raises(LocalPrometheusError, match="not up"):
            await prometheus.wait_for_up("nothing-there", timeout=1)
    finally:
        prometheus.scrape_configs = []
        await prometheus.reload()


async def test_a_server_that_dies_at_start_reports_its_log(tmp_path: Path) -> None:
    prom = LocalPrometheus(tmp_path, scrape_configs=[{"job_name": "x", "no_such_field": 1}])
    with pytest.raises(LocalPrometheusError, match=r"exited with status \d+(.|\n)*no_such_field"):
        await prom.start(timeout=30)
    assert not prom.running


async def test_missing_binary_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalPrometheusError, match="make prometheus"):
        await LocalPrometheus(tmp_path).start()
    with pytest.raises(LocalPrometheusError, match="make prometheus"):
        backfill_openmetrics(tmp_path, "up 1 1\n")


def test_backfill_rejects_invalid_openmetrics(tmp_path: Path) -> None:
    with pytest.raises(LocalPrometheusError, match="promtool backfill failed"):
        backfill_openmetrics(tmp_path, "this is { not openmetrics\n")
    assert not any(storage_dir(tmp_path).iterdir())


def test_scrape_target_builds_a_static_config() -> None:
    assert scrape_target("sim", ["127.0.0.1:9400", "127.0.0.1:9401"], scrape_interval_seconds=0.5) == {
        "job_name": "sim",
        "metrics_path": "/metrics",
        "honor_labels": False,
        "static_configs": [{"targets": ["127.0.0.1:9400", "127.0.0.1:9401"]}],
        "scrape_interval": "500ms",
        "scrape_timeout": "500ms",
    }
