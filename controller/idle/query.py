"""The one PromQL query of an idle pass, and its answer read into per-GPU usage.

Why a module: the query must stay one grouped query per pass whatever the fleet size (40,000 GPU pods are
one answer, not 40,000 requests), and must say per GPU both the highest utilization in the window and how
many samples it has, so a gap is told from idleness. `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio) is preferred
and scaled to percent; a GPU without it falls back to `DCGM_FI_DEV_GPU_UTIL` (percent), per GPU, with `or`.
The answer carries a `stat` label: `max` (percent), `samples` (count over the window) and, when power
corroboration is on, `power` (the highest `DCGM_FI_DEV_POWER_USAGE`, watts).

What it must not do: I/O, clocks, or decide anything. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuwarden.config.idle import IdleMetricLabels

PROF_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
POWER_METRIC = "DCGM_FI_DEV_POWER_USAGE"
STAT_LABEL = "gpuwarden_stat"


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's utilization over the window, as seen by one series group (node, gpu, and its pod labels)."""

    node: str
    gpu: str
    namespace: str
    pod: str
    max_percent: float | None
    samples: int
    max_watts: float | None = None


def _stat(expr: str, value: str) -> str:
    return f'label_replace({expr}, "{STAT_LABEL}", "{value}", "", "")'


def idle_query(labels: IdleMetricLabels, window_seconds: float, *, power: bool = False) -> str:
    """The pass's query: per (namespace, pod, node, gpu), the highest utilization and the sample count (and
    with `power`, the highest power draw)."""
    by = f"{labels.namespace}, {labels.pod}, {labels.node}, {labels.gpu}"
    w = f"{int(window_seconds)}s"
    peak = (
        f"(max by ({by}) (max_over_time({PROF_METRIC}[{w}])) * 100)"
        f" or max by ({by}) (max_over_time({UTIL_METRIC}[{w}]))"
    )
    count = (
        f"max by ({by}) (count_over_time({PROF_METRIC}[{w}]))"
        f" or max by ({by}) (count_over_time({UTIL_METRIC}[{w}]))"
    )
    query = f"{_stat(f'({peak})', 'max')} or {_stat(f'({count})', 'samples')}"
    if power:
        query += f" or {_stat(f'max by ({by}) (max_over_time({POWER_METRIC}[{w}]))', 'power')}"
    return query


def read_usage(
    samples: Iterable[tuple[Mapping[str, str], float]], labels: IdleMetricLabels
) -> tuple[GpuUsage, ...]:
    """The query's answer (label set, value) as one `GpuUsage` per series group; series without a node or
    GPU label cannot be attributed and are dropped; a NaN peak is unknown."""
    peaks: dict[tuple[str, str, str, str], float | None] = {}
    counts: dict[tuple[str, str, str, str], int] = {}
    watts: dict[tuple[str, str, str, str], float] = {}
    for metric, value in samples:
        key = (
            metric.get(labels.node, ""),
            metric.get(labels.gpu, ""),
            metric.get(labels.namespace, ""),
            metric.get(labels.pod, ""),
        )
        if not key[0] or not key[1]:
            continue
        stat = metric.get(STAT_LABEL)
        if stat == "max":
            peaks[key] = None if value != value else value  # NaN: unknown
        elif stat == "samples" and value == value:
            counts[key] = int(value)
        elif stat == "power" and value == value:
            watts[key] = value
    return tuple(
        GpuUsage(node, gpu, ns, pod, peaks.get(k), counts.get(k, 0), watts.get(k))
        for k in sorted(set(peaks) | set(counts))
        for node, gpu, ns, pod in (k,)
    )
