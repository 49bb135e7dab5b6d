"""The one PromQL query of an idle pass, and its answer read into per-GPU usage.

Why a module: the query must stay one grouped query per pass whatever the fleet size (40,000 GPU pods are
one answer, not 40,000 requests), and must say per GPU both the highest utilization in the window and how
many samples it has, so a gap is told from idleness. `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio) is preferred
and scaled to percent; a GPU without it falls back to `DCGM_FI_DEV_GPU_UTIL` (percent), per GPU, with `or`.
The answer carries a `stat` label: `max` (percent), `samples` (count over the window) and, when power
corroboration is on, `power` (the highest `DCGM_FI_DEV_POWER_USAGE`, watts).

Shared GPUs (docs/idle.md "Shared GPUs"): series are grouped by the GPU's UUID and MIG instance too, so the
join can find every series of one physical GPU (whichever pod dcgm-exporter names on it) and each MIG
instance's own. The fallback never reads `DCGM_FI_DEV_GPU_UTIL` on a MIG instance's series (NVML does not
support utilization on MIG: a value there is not the instance's), nor dcgm-exporter's per-pod copies under
`KUBERNETES_VIRTUAL_GPUS` (label `vgpu`): their utilization is a per-process sum that reads 0, not unknown,
when the exporter cannot map processes to pods, and a sharer's 0 must not hide the GPU's other sharers.

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
VGPU_LABEL = "vgpu"
"""dcgm-exporter's label on the per-pod copies of a shared GPU's series (`KUBERNETES_VIRTUAL_GPUS`)."""


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
    uuid: str = ""
    """The physical GPU's UUID (the parent's on a MIG series); "" when the series has none."""
    instance: str = ""
    """The MIG GPU instance id of a per-instance series; "" for a whole GPU's."""


def _stat(expr: str, value: str) -> str:
    return f'label_replace({expr}, "{STAT_LABEL}", "{value}", "", "")'


def idle_query(labels: IdleMetricLabels, window_seconds: float, *, power: bool = False) -> str:
    """The pass's query: per (namespace, pod, node, gpu, UUID, MIG instance), the highest utilization and the
    sample count (and with `power`, the highest power draw)."""
    by = ", ".join((labels.namespace, labels.pod, labels.node, labels.gpu, labels.uuid, labels.gpu_instance))
    w = f"{int(window_seconds)}s"
    util = f'{UTIL_METRIC}{{{labels.gpu_instance}="", {VGPU_LABEL}=""}}'
    peak = (
        f"(max by ({by}) (max_over_time({PROF_METRIC}[{w}])) * 100)"
        f" or max by ({by}) (max_over_time({util}[{w}]))"
    )
    count = (
        f"max by ({by}) (count_over_time({PROF_METRIC}[{w}])) or max by ({by}) (count_over_time({util}[{w}]))"
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
    Key = tuple[str, str, str, str, str, str]
    peaks: dict[Key, float | None] = {}
    counts: dict[Key, int] = {}
    watts: dict[Key, float] = {}
    for metric, value in samples:
        key = (
            metric.get(labels.node, ""),
            metric.get(labels.gpu, ""),
            metric.get(labels.namespace, ""),
            metric.get(labels.pod, ""),
            metric.get(labels.uuid, ""),
            metric.get(labels.gpu_instance, ""),
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
        GpuUsage(node, gpu, ns, pod, peaks.get(k), counts.get(k, 0), watts.get(k), uuid, instance)
        for k in sorted(set(peaks) | set(counts))
        for node, gpu, ns, pod, uuid, instance in (k,)
    )
