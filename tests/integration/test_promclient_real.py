"""PrometheusClient against a REAL Prometheus: typed results with exact values, errors with its own words."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuwarden.errors import PrometheusBadQuery, PrometheusTimeout
from gpuwarden.promtypes import Matrix, Scalar, String, Vector
from harness.localprom import LocalPrometheus
from tests.integration.conftest import GPUS, NODES, POINTS, STEP, Backfilled, gpu_util

pytestmark = pytest.mark.integration

# ~1.8 M subquery steps: well over a second of CPU on any machine, with no data needed.
HEAVY_QUERY = "count_over_time(vector(1)[30m:1ms])"


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("i", [0, 7, POINTS - 1])
async def test_instant_query_returns_exact_backfilled_values(
    backfilled_prometheus: Backfilled, method: str, i: int
) -> None:
    data = backfilled_prometheus
    async with data.prom.client(registry=CollectorRegistry(), method=method) as prom:
        result = await prom.query("DCGM_FI_DEV_GPU_UTIL", time=data.at(i))
    assert isinstance(result, Vector)
    got = {(s.labels["Hostname"], s.labels["gpu"]): (s.timestamp, s.value) for s in result.samples}
    assert got == {(n, g): (data.at(i), gpu_util(n, g, i)) for n in NODES for g in GPUS}
    sample = result.samples[0]
    assert sample.labels["UUID"] == f"GPU-{sample.labels['Hostname']}-{sample.labels['gpu']}"
    assert result.warnings == []


async def test_nan_and_infinities_survive_the_round_trip(backfilled_prometheus: Backfilled) -> None:
    data = backfilled_prometheus
    async with data.prom.client() as prom:
        result = await prom.query("gpuwarden_test_special", time=data.at(3))
    assert isinstance(result, Vector)
    values = {s.labels["kind"]: s.value for s in result.samples}
    assert set(values) == {"nan", "pinf", "ninf"}
    assert math.isnan(values["nan"]) and values["pinf"] == math.inf and values["ninf"] == -math.inf


async def test_range_query_returns_every_step(backfilled_prometheus: Backfilled) -> None:
    data = backfilled_prometheus
    async with data.prom.client() as prom:
        matrix = await prom.query_range(
            'DCGM_FI_DEV_GPU_UTIL{Hostname="node-2",gpu="1"}', data.at(2), data.at(10), step=2 * STEP
        )
    assert isinstance(matrix, Matrix) and len(matrix.series) == 1
    assert matrix.series[0].points == [(data.at(i), gpu_util("node-2", "1", i)) for i in range(2, 11, 2)]


async def test_rate_of_the_backfilled_counter_is_exact(backfilled_prometheus: Backfilled) -> None:
    data = backfilled_prometheus
    async with data.prom.client() as prom:
        matrix = await prom.query_range("rate(http_requests_total[1m])", data.at(8), data.at(12), step=60)
    assert matrix.series[0].points == [(data.at(8), 2.0), (data.at(12), 2.0)]


async def test_scalar_string_and_range_selector_result_types(backfilled_prometheus: Backfilled) -> None:
    data = backfilled_prometheus
    async with data.prom.client() as prom:
        assert await prom.query("scalar(vector(2.5))", time=data.t0) == Scalar(data.t0, 2.5)
        assert await prom.query('"hello"', time=data.t0) == String(data.t0, "hello")
        ranged = await prom.query('http_requests_total{pod="web-0"}[1m]', time=data.at(4))
    assert isinstance(ranged, Matrix)
    assert ranged.series[0].points == [(data.at(i), i * 30.0) for i in range(0, 5)]


async def test_series_labels_and_label_values(backfilled_prometheus: Backfilled) -> None:
    data = backfilled_prometheus
    start, end = data.t0 - 60, data.at(POINTS)
    async with data.prom.client() as prom:
        series = await prom.series(['DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "http_requests_total"], start, end)
        names = await prom.labels(start=start, end=end)
        uuids = await prom.label_values("UUID", ["DCGM_FI_DEV_GPU_UTIL"], start=start, end=end)
    assert sorted(s.get("UUID", s["__name__"]) for s in series) == [
        "GPU-node-1-0",
        "GPU-node-2-0",
        "http_requests_total",
    ]
    assert {"Hostname", "UUID", "gpu", "modelName", "pod", "kind"} <= set(names)
    assert uuids == sorted(f"GPU-{n}-{g}" for n in NODES for g in GPUS)


@pytest.mark.parametrize(
    ("promql", "error_type", "words"),
    [
        ("sum(DCGM_FI_DEV_GPU_UTIL", "bad_data", "unclosed left parenthesis"),
        ("rate(http_requests_total)", "bad_data", "expected type range vector"),
        ("DCGM_FI_DEV_GPU_UTIL + on() DCGM_FI_DEV_GPU_UTIL", "execution", "many-to-many matching"),
    ],
    ids=["parse-error", "type-error", "execution-error"],
)
async def test_bad_query_raises_with_prometheus_message(
    backfilled_prometheus: Backfilled, promql: str, error_type: str, words: str
) -> None:
    registry = CollectorRegistry()
    data = backfilled_prometheus
    async with data.prom.client(registry=registry, retries=3) as prom:
        with pytest.raises(PrometheusBadQuery) as caught:
            await prom.query(promql, time=data.at(5))
    assert words in caught.value.message
    assert caught.value.error_type == error_type
    labels = {"endpoint": "query", "outcome": "bad_query"}
    assert registry.get_sample_value("gpuwarden_prometheus_requests_total", labels) == 1  # never retried


async def test_tiny_timeout_on_a_heavy_query_raises_timeout(prometheus: LocalPrometheus) -> None:
    async with prometheus.client(retries=2) as prom:
        light = await prom.query("vector(1)", timeout=0.1)  # the same budget is plenty for a light query
        assert isinstance(light, Vector) and light.samples[0].value == 1.0
        started = time.monotonic()
        with pytest.raises(PrometheusTimeout):
            await prom.query(HEAVY_QUERY, timeout=0.1)
        elapsed = time.monotonic() - started
    assert elapsed < 1.5, "the client must give up at its budget, not wait for Prometheus"
