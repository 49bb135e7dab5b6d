"""Range queries for the demo report, through prometheus-api-client.

Why it exists: the report's plots are drawn from what the demo's Prometheus recorded over the run — the GPU
metrics the simulator exported, what the HPA saw and decided, our taints, where pods ran — so every plot
shares one time base with the data the adapter and the controller acted on. prometheus-api-client is the
synchronous client the design names for this (the report is written once, after the scenario), used with a
session that ignores proxy settings: the server is on 127.0.0.1.

The queries themselves are here too, named, so the report and docs/demo.md agree on what is plotted.
What it must not do: reach any Prometheus but the demo's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and (unix time, value) points, NaN-free."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


def hpa_replicas(namespace: str, hpa: str) -> str:
    return f'gpuwarden_demo_hpa_replicas{{namespace="{namespace}",hpa="{hpa}"}}'


def hpa_metric(namespace: str, hpa: str) -> str:
    return f'gpuwarden_demo_hpa_metric{{namespace="{namespace}",hpa="{hpa}"}}'


def offered_qps(namespace: str, workload: str) -> str:
    """Requests per second arriving at the gateway in front of the workload: served by its pods, or by none
    while it is parked at zero replicas (the pods' own `http_requests_total` would show nothing then)."""
    return f'sum(rate(gateway_requests_total{{namespace="{namespace}",service="{workload}"}}[10s]))'


def gpu_utilization(namespace: str, workload: str) -> str:
    """Average DCGM utilization of the GPUs the workload's pods hold."""
    return f'avg(DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}",pod=~"{workload}-.*"}})'


XID_LAST = "max by (Hostname) (DCGM_FI_DEV_XID_ERRORS)"
FABRIC_MANAGER_FAILED = "count by (Hostname) (DCGM_FI_DEV_FABRIC_MANAGER_STATUS == 4)"
"""GPUs per node whose Fabric Manager status is Failure (dcgmFabricManagerStatus_t 4)."""
NVLINK_ERRORS = "count by (Hostname) (rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[5s]) > 0)"
"""GPUs per node whose NVLink CRC flit error counter is moving."""
QUARANTINED = "gpuwarden_demo_node_quarantined"


def pods_bound(namespace: str) -> str:
    return f'gpuwarden_demo_pod_bound{{namespace="{namespace}"}}'


def pods_nominated(namespace: str) -> str:
    return f'gpuwarden_demo_pod_nominated{{namespace="{namespace}"}}'


class RangeReader:
    """Range queries over [start, end] at a fixed step against one Prometheus."""

    def __init__(self, url: str, start: float, end: float, step_seconds: float = 1.0) -> None:
        session = requests.Session()
        session.trust_env = False
        self._prom = PrometheusConnect(url=url, disable_ssl=True, session=session, timeout=30)
        self.start = datetime.fromtimestamp(start, UTC)
        self.end = datetime.fromtimestamp(end, UTC)
        self.step = f"{step_seconds:g}s"

    def range(self, query: str) -> list[Series]:
        raw: list[dict[str, Any]] = self._prom.custom_query_range(
            query, start_time=self.start, end_time=self.end, step=self.step
        )
        out = []
        for item in raw:
            points = [(float(ts), float(v)) for ts, v in item.get("values") or []]
            points = [(ts, v) for ts, v in points if not math.isnan(v)]
            if points:
                out.append(Series({str(k): str(v) for k, v in (item.get("metric") or {}).items()}, points))
        return out


def intervals(points: list[tuple[float, float]], gap: float = 2.5) -> list[tuple[float, float]]:
    """Where a 0/1-style series was present (value > 0): merged (start, end) spans; a gap longer than `gap`
    seconds between samples ends a span (the series went away)."""
    spans: list[tuple[float, float]] = []
    running = False
    for ts, value in points:
        if value <= 0:
            running = False
            continue
        if running and ts - spans[-1][1] <= gap:
            spans[-1] = (spans[-1][0], ts)
        else:
            spans.append((ts, ts))
        running = True
    return spans
