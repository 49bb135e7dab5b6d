"""Self-metrics of the nomination cleanup loop, all in one place so their names stay consistent.

Why: an operator must see, without reading logs, how many nominations are pending and in which state (fresh,
held by a terminating victim, ...), how many were cleared and why, whether escalation evicts or is blocked by
PDBs, and how old the oldest nomination is. Snapshot state is collect-on-scrape from the last plan, so a
state that no longer occurs disappears from /metrics instead of lingering at its last value.

What it must not do: decide or touch the cluster; it records what `loop.py` and `act.py` report. No label
carries a pod, node or namespace name.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.nominations.plan import NominationPlan
from gpuwarden.selfmetrics import SnapshotCollector

LOOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)


class NominationMetrics:
    """Registered on `registry` when given (a fresh one per test; the controller's shared one in prod)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._states: dict[tuple[str, ...], float] = {}
        if registry is not None:
            registry.register(
                SnapshotCollector(
                    "gpuwarden_nominations",
                    "Pending pods with a nominatedNodeName at the last pass, by state: a stale reason "
                    "(cleared this pass), evict, or why it was held (fresh, victim-terminating, ...).",
                    ["state"],
                    lambda: dict(self._states),
                )
            )
        self.cleared = Counter(
            "gpuwarden_nominations_cleared_total",
            "Nominations cleared, by stale reason; dry_run=true ones were only logged and evented.",
            ["reason", "dry_run"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpuwarden_nominations_evictions_total",
            "Escalation evictions of pods stuck with a nomination: evicted, blocked (a PDB said 429), "
            "failed, dry_run.",
            ["outcome"],
            registry=registry,
        )
        self.write_failures = Counter(
            "gpuwarden_nominations_write_failures_total",
            "API writes of the nomination loop that failed (retried next pass), by kind: clear, record.",
            ["kind"],
            registry=registry,
        )
        self.guarded = Counter(
            "gpuwarden_nominations_guard_rechecks_total",
            "Clears skipped at write time because a fresh read showed a preemption victim still "
            "terminating on the node (or the read failed).",
            registry=registry,
        )
        self.oldest = Gauge(
            "gpuwarden_nominations_oldest_age_seconds",
            "Age of the oldest nomination at the last pass (0 when there is none).",
            registry=registry,
        )
        self.loop_duration = Histogram(
            "gpuwarden_nominations_loop_duration_seconds",
            "Duration of one nomination pass, by stage (decide, act).",
            ["stage"],
            buckets=LOOP_BUCKETS,
            registry=registry,
        )
        self.last_pass = Gauge(
            "gpuwarden_nominations_last_pass_timestamp_seconds",
            "Unix time of the last completed pass.",
            registry=registry,
        )

    def observe_plan(self, plan: NominationPlan) -> None:
        """Record what one pass decided (before acting)."""
        self._states = {(state,): float(n) for state, n in plan.counts.items()}
        self.oldest.set(plan.oldest_age())
        self.last_pass.set(plan.now)
