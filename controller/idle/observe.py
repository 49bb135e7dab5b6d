"""Observe: the pass's one Prometheus query, read into per-GPU usage — or None when it cannot be read.

Why a module: the I/O of the idle pass is here, once. A failed, timed-out or malformed answer is not an
empty fleet: it is `None`, and the decision treats every pod as unknown (docs/architecture.md, safety
rule 1). What it must not do: decide, or read the Kubernetes API (pods come from the shared informer).
"""

from __future__ import annotations

import logging
from typing import Protocol

from controller.idle.query import GpuUsage, idle_query, read_usage
from gpuwarden.config.idle import IdleConfig
from gpuwarden.errors import PrometheusError
from gpuwarden.promtypes import InstantResult, Vector

log = logging.getLogger(__name__)


class Querier(Protocol):
    async def query(
        self,
        promql: str,
        time: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InstantResult: ...


async def observe_usage(prom: Querier, config: IdleConfig, now: float) -> tuple[GpuUsage, ...] | None:
    """Every GPU's peak utilization and sample count over the window ending at `now`; None: unknown."""
    promql = idle_query(
        config.metric_labels, config.window_seconds, power=config.power_threshold_watts is not None
    )
    try:
        result = await prom.query(promql, time=now)
    except PrometheusError as exc:
        log.warning("idle-GPU query failed; every pod is unknown this pass", extra={"error": str(exc)})
        return None
    if not isinstance(result, Vector):
        log.warning("idle-GPU query answered no vector; every pod is unknown this pass")
        return None
    return read_usage(((s.labels, s.value) for s in result.samples), config.metric_labels)
