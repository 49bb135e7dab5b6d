"""Self-metrics of the idle-GPU loop, in one place so their names stay consistent.

Why: the dashboard's "idle GPU-hours by namespace" and the idle alert read `gpuwarden_idle_gpus`; an
operator sees how many GPU pods are idle, busy, unknown, young, excluded or acknowledged, whether the
utilization query answers, and what was reported. Snapshot state is collect-on-scrape from the last plan, so
a namespace with no idle pod any more disappears, and so does all of it once passes stop (this replica lost
the lease: the new leader reports). The only name in a label is the pod's namespace, as `pod_namespace`
(the scrape target's own `namespace` label would clash), never a pod or node.

What it must not do: decide or touch the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.idle.decide import IdlePlan
from gpuwarden.selfmetrics import SnapshotCollector

LOOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)


class IdleMetrics:
    """Registered on `registry` when given (a fresh one per test; the controller's shared one in prod)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        stale_after: float = 180.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._states: dict[tuple[str, ...], float] = {}
        self._gpus: dict[tuple[str, ...], float] = {}
        self._telemetry: dict[tuple[str, ...], float] = {}
        self._observed: float | None = None
        self._stale_after, self._monotonic = stale_after, monotonic
        if registry is not None:
            registry.register(
                SnapshotCollector(
                    "gpuwarden_idle_pods",
                    "GPU pods at the last idle pass, by state: idle, acknowledged (idle, action held), busy, "
                    "unknown (missing data), young, excluded.",
                    ["state"],
                    lambda: self._fresh(self._states),
                )
            )
            registry.register(
                SnapshotCollector(
                    "gpuwarden_idle_gpus",
                    "GPUs held by idle pods at the last idle pass (acknowledged ones too), by namespace.",
                    ["pod_namespace"],
                    lambda: self._fresh(self._gpus),
                )
            )
            registry.register(
                SnapshotCollector(
                    "gpuwarden_idle_telemetry_up",
                    "1 when the last idle pass read utilization from Prometheus, 0 when it could not (every "
                    "pod unknown).",
                    [],
                    lambda: self._fresh(self._telemetry),
                )
            )
        self.marked = Counter(
            "gpuwarden_idle_marked_total",
            "Pods reported idle (idle-since written, Events emitted); dry_run=true ones were only evented.",
            ["dry_run"],
            registry=registry,
        )
        self.unmarked = Counter(
            "gpuwarden_idle_unmarked_total",
            "Pods whose idle-since was removed because they are no longer idle.",
            ["dry_run"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpuwarden_idle_evictions_total",
            "Evictions of idle pods (action evict): evicted, blocked (a PDB said 429), failed, dry_run.",
            ["outcome"],
            registry=registry,
        )
        self.write_failures = Counter(
            "gpuwarden_idle_write_failures_total",
            "Annotation writes of the idle loop that failed (retried next pass).",
            registry=registry,
        )
        self.loop_duration = Histogram(
            "gpuwarden_idle_loop_duration_seconds",
            "Duration of one idle pass, by stage (observe, decide, act).",
            ["stage"],
            buckets=LOOP_BUCKETS,
            registry=registry,
        )
        self.last_pass = Gauge(
            "gpuwarden_idle_last_pass_timestamp_seconds",
            "Unix time of the last completed idle pass.",
            registry=registry,
        )

    def _fresh(self, state: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
        """The last pass's state, or nothing once it is older than `stale_after` seconds."""
        if self._observed is None or self._monotonic() - self._observed > self._stale_after:
            return {}
        return dict(state)

    def observe_plan(self, plan: IdlePlan) -> None:
        """Record what one pass decided (before acting)."""
        self._observed = self._monotonic()
        self._states = {(state,): float(n) for state, n in plan.counts.items()}
        self._gpus = {(ns,): float(n) for ns, n in plan.idle_gpus_by_namespace().items()}
        self._telemetry = {(): 1.0 if plan.telemetry else 0.0}
