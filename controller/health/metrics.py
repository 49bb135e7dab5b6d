"""Self-metrics of the quarantine loop, all in one place so their names stay consistent.

Why: an operator must see, without reading logs, how many nodes are quarantined and why, whether the breaker
is open, how fast a fault becomes a taint, how long a pass takes and how fresh the data was. Snapshot state
(quarantined nodes by reason, skips by reason) is collect-on-scrape from the last plan, so reasons that no
longer apply disappear from /metrics instead of lingering at their last value.

What it must not do: decide anything or touch the cluster; it only records what `loop.py` and `act.py` report.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter

from controller.health.plan import HealthPlan
from controller.health.snapshot import FleetSnapshot
from gpuwarden.selfmetrics import SnapshotCollector

LATENCY_BUCKETS = (1, 2, 5, 10, 12, 15, 20, 30, 60, 120, 300, 600)
LOOP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class HealthMetrics:
    """Registered on `registry` (a fresh one per test; the controller's shared one in production)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._quarantined: dict[tuple[str, ...], float] = {}
        self._devices: dict[tuple[str, ...], float] = {}
        self._skips: dict[tuple[str, ...], float] = {}
        self._signals: dict[tuple[str, ...], float] = {}
        self._degraded: dict[tuple[str, ...], float] = {}
        self._domains: dict[tuple[str, ...], float] = {}
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_signals",
                "Fabric/degradation signals holding at the last pass, in GPUs (or nodes, for node-level "
                "signals), by signal, action and state (confirmed, debouncing, boot-grace).",
                ["signal", "action", "state"],
                lambda: dict(self._signals),
            )
        )
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_degraded_nodes",
                "Nodes with a confirmed degrade-class signal at the last pass (condition GPUDegraded=True), "
                "by signal.",
                ["signal"],
                lambda: dict(self._degraded),
            )
        )
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_nvlink_domains",
                "NVLink domains (cliques) judged at the last pass, in trays, by domain, this pass's state "
                "(healthy, degraded, failed, unknown) and what their members carry (degraded, failed or "
                "none).",
                ["domain", "state", "published"],
                lambda: dict(self._domains),
            )
        )
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_quarantined_nodes",
                "Nodes carrying the gpuwarden.io/gpu-unhealthy taint, by taint reason.",
                ["reason"],
                lambda: dict(self._quarantined),
            )
        )
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_quarantined_devices",
                "DeviceTaintRules of ours (one per quarantined device on DRA-backed nodes) as listed at the "
                "last pass, by taint reason and effect (None: dry-run's preview).",
                ["reason", "effect"],
                lambda: dict(self._devices),
            )
        )
        registry.register(
            SnapshotCollector(
                "gpuwarden_health_skipped_nodes",
                "Nodes the last pass deliberately left alone, by skip reason.",
                ["reason"],
                lambda: dict(self._skips),
            )
        )
        self.actions = PromCounter(
            "gpuwarden_health_actions_total",
            "Quarantine plan actions, by kind and reason; dry_run=true ones were logged and evented only.",
            ["kind", "reason", "dry_run"],
            registry=registry,
        )
        self.write_failures = PromCounter(
            "gpuwarden_health_write_failures_total",
            "Plan actions whose API write failed (retried next pass).",
            ["kind"],
            registry=registry,
        )
        self.breaker_open = Gauge(
            "gpuwarden_health_breaker_open",
            "1 while the quarantine circuit breaker is open.",
            registry=registry,
        )
        self.breaker_trips = PromCounter(
            "gpuwarden_health_breaker_trips_total",
            "Times the quarantine circuit breaker opened.",
            registry=registry,
        )
        self.detection_latency = Histogram(
            "gpuwarden_health_detection_latency_seconds",
            "From a fault's first sample in Prometheus to our taint being written.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.loop_duration = Histogram(
            "gpuwarden_health_loop_duration_seconds",
            "Duration of one observe-decide-act pass.",
            ["stage"],
            buckets=LOOP_BUCKETS,
            registry=registry,
        )
        self.prometheus_up = Gauge(
            "gpuwarden_health_prometheus_up", "1 when the last pass could read Prometheus.", registry=registry
        )
        self.queries = Gauge(
            "gpuwarden_health_prometheus_queries", "Prometheus queries the last pass sent.", registry=registry
        )
        self.data_age = Gauge(
            "gpuwarden_health_telemetry_age_seconds",
            "Age of the newest DCGM sample at the last pass (data freshness); NaN when there was none.",
            registry=registry,
        )
        self.unknown_nodes = Gauge(
            "gpuwarden_health_unknown_nodes",
            "GPU nodes whose telemetry was missing or stale at the last pass.",
            registry=registry,
        )
        self.stalled_gpus = Gauge(
            "gpuwarden_health_stalled_gpus",
            "GPUs whose DCGM samples are fresh but frozen (health.signals.stall_metric unchanged): their "
            "nodes are unknown.",
            registry=registry,
        )
        self.last_pass = Gauge(
            "gpuwarden_health_last_pass_timestamp_seconds",
            "Unix time of the last completed pass.",
            registry=registry,
        )

    def observe_pass(self, snapshot: FleetSnapshot, plan: HealthPlan) -> None:
        """Record what one pass saw and decided (before acting)."""
        reasons = Counter(t.value for node in snapshot.nodes if (t := node.our_taint) is not None)
        self._quarantined = {(r,): float(n) for r, n in reasons.items()}
        rules = Counter((r.value, r.effect) for r in snapshot.owned_rules)
        self._devices = {k: float(n) for k, n in rules.items()}
        self._skips = {(r,): float(n) for r, n in Counter(s.reason for s in plan.skips).items()}
        self.breaker_open.set(1 if plan.breaker.after.open else 0)
        if plan.breaker.after.open and not plan.breaker.before.open:
            self.breaker_trips.inc()
        self.prometheus_up.set(1 if snapshot.prometheus_ok else 0)
        self.queries.set(snapshot.queries)
        samples = [n.newest_sample for n in snapshot.nodes if n.newest_sample is not None]
        samples += [g.last_sample for n in snapshot.nodes for g in n.gpus or () if g.last_sample is not None]
        self.data_age.set(snapshot.taken_at - max(samples) if samples else float("nan"))
        self.unknown_nodes.set(
            len(plan.skips_of("telemetry-unknown"))
            + len(plan.skips_of("prometheus-unavailable"))
            + len(plan.skips_of("telemetry-stalled"))
        )
        self.stalled_gpus.set(plan.stalled_gpus)
        self._signals = {
            k: float(n) for k, n in Counter((s.signal, s.action, s.state) for s in plan.signals).items()
        }
        degraded = {
            (s.node, s.signal) for s in plan.signals if s.action == "degrade" and s.state == "confirmed"
        }
        self._degraded = {(sig,): float(n) for sig, n in Counter(sig for _, sig in degraded).items()}
        self._domains = {(d.domain, d.state, d.published or "none"): float(d.trays) for d in plan.domains}
        for action in plan.actions:
            self.actions.labels(action.kind, action.reason, str(plan.dry_run).lower()).inc()
        self.last_pass.set(plan.now)
