"""Self-metrics of the preemption observer and throttle, in one place so their names stay consistent.

Why: an operator must see, without reading logs, how much preemption happens, how deep the chains get, and
what the throttle refuses and why. Names follow docs/architecture.md (prefix `gpuwarden_`, counters `_total`,
durations `_seconds`); no label carries a pod, node or namespace name (unbounded cardinality). What the
graph holds right now is collect-on-scrape, so it always describes the current window.

What it must not do: decide anything; it only records what `observer.py` and `hook.py` report.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from controller.preemption.graph import PreemptionGraph
from gpuwarden.selfmetrics import SnapshotCollector

DEPTH_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 16)
DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class PreemptionMetrics:
    """Registered on `registry` when given (a fresh one per test; the controller's shared one in prod)."""

    def __init__(self, registry: CollectorRegistry | None, graph: PreemptionGraph | None = None) -> None:
        self.observed = Counter(
            "gpuwarden_preemptions_observed_total",
            "Preemption victims observed (one per victim pod, from its Preempted Event or its "
            "DisruptionTarget condition, whichever came first).",
            registry=registry,
        )
        self.chain_depth = Histogram(
            "gpuwarden_preemption_chain_depth",
            "Chain depth of observed preemptions: 1 = the preemptor's workload was not a recent victim.",
            buckets=DEPTH_BUCKETS,
            registry=registry,
        )
        self.ping_pong = Counter(
            "gpuwarden_preemption_ping_pong_total",
            "Observed preemptions that reversed a recent one between the same two workloads (A<->B).",
            registry=registry,
        )
        self.decisions = Counter(
            "gpuwarden_preemption_decisions_total",
            "Answers of the extender's preempt verb: passed, narrowed, vetoed, exempt; dry_run=true ones "
            "were computed but the scheduler's candidates went back unchanged.",
            ["outcome", "dry_run"],
            registry=registry,
        )
        self.throttled = Counter(
            "gpuwarden_preemption_throttled_total",
            "Preempt-verb decisions that dropped candidates or vetoed, by reason (one per distinct reason).",
            ["reason"],
            registry=registry,
        )
        self.records = Counter(
            "gpuwarden_preemption_records_total",
            "Preemption records the preempt verb wrote on preemptors before answering (what every replica "
            "and the next leader count): written; failed (the write failed, so the preemption was vetoed "
            "this time and the scheduler retries the pod); gpu-preemption (vetoed, nothing written: GPU "
            "preemption is making room for the pod).",
            ["outcome"],
            registry=registry,
        )
        self.decision_latency = Histogram(
            "gpuwarden_preemption_decision_seconds",
            "Time to decide one preempt-verb request (the throttle's share of the extender's answer).",
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        if registry is not None and graph is not None:
            registry.register(
                SnapshotCollector(
                    "gpuwarden_preemption_window_records",
                    "Preemption victims the throttle currently remembers (its sliding window), by chain "
                    "depth; depth 0 = preemptor not known yet.",
                    ["depth"],
                    lambda: _depths(graph),
                )
            )


def _depths(graph: PreemptionGraph) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {(str(d),): float(n) for d, n in graph.depth_histogram().items()}
    unknown = sum(1 for r in graph.records() if r.preemptor is None)
    if unknown:
        out[("0",)] = float(unknown)
    return out
