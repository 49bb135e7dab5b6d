"""Fixtures for the integration tier: a REAL Prometheus server (Debian package), started per module.

- `prometheus`: an empty server that scrapes itself every second (job "prometheus"), for live queries.
- `backfilled_prometheus`: a server whose TSDB was backfilled with `promtool` before start, so tests can
  assert exact values at exact times (query with an explicit `time=`; the data sit a few hours in the past).

Servers are module-scoped (a start costs ~1 s of a slow CI machine); tests that stop a server start their
own. `LocalPrometheus` is loop-agnostic, so module fixtures and function-scoped test loops mix safely.
A missing binary fails loudly with the `make prometheus` hint — the integration tier never skips silently.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from harness.localprom import LocalPrometheus, backfill_openmetrics

STEP = 15  # seconds between backfilled samples
POINTS = 21  # five minutes of history per series
NODES = ("node-1", "node-2")
GPUS = ("0", "1")
MODEL = "NVIDIA A100-SXM4-80GB"


def gpu_util(node: str, gpu: str, i: int) -> float:
    """The backfilled DCGM_FI_DEV_GPU_UTIL value of (node, gpu) at sample i: distinct and exact in binary."""
    return NODES.index(node) * 50 + int(gpu) * 10 + i * 0.5


@dataclass(frozen=True)
class Backfilled:
    """A running server plus the facts about its backfilled history."""

    prom: LocalPrometheus
    t0: float  # unix seconds of the first sample

    def at(self, i: int) -> float:
        return self.t0 + i * STEP


def backfill_text(t0: int) -> str:
    """OpenMetrics with dcgm-exporter-style series, a steadily growing counter and NaN/±Inf samples."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for node in NODES:
        for gpu in GPUS:
            labels = f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}",modelName="{MODEL}"'
            for i in range(POINTS):
                lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {gpu_util(node, gpu, i)} {t0 + i * STEP}")
    lines.append("# TYPE gpuwarden_test_special gauge")
    for kind, value in (("nan", "NaN"), ("pinf", "+Inf"), ("ninf", "-Inf")):
        lines += [f'gpuwarden_test_special{{kind="{kind}"}} {value} {t0 + i * STEP}' for i in range(POINTS)]
    lines.append("# TYPE http_requests counter")  # +30 per 15 s: rate() is exactly 2/s
    lines += [f'http_requests_total{{pod="web-0"}} {i * 30} {t0 + i * STEP}' for i in range(POINTS)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prometheus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalPrometheus]:
    async with LocalPrometheus(tmp_path_factory.mktemp("prometheus"), self_scrape=True) as prom:
        yield prom


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backfilled_prometheus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Backfilled]:
    workdir = tmp_path_factory.mktemp("prometheus-backfilled")
    t0 = (int(time.time()) // 3600 - 4) * 3600  # older than any head block, well inside retention
    backfill_openmetrics(workdir, backfill_text(t0))
    async with LocalPrometheus(workdir) as prom:
        yield Backfilled(prom, float(t0))
