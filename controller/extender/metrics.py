"""Self-metrics of the scheduler extender: requests, latency, filter outcomes, placements, bind conflicts,
dropped bind Events.

Why a module of its own: the HTTP edge and the binder count into the same series, and a registry must get
each series exactly once (tests create a fresh `CollectorRegistry` each). The model's size and sync state are
collect-on-scrape gauges so they always describe the current cache. Names follow docs/architecture.md: prefix
`gpuwarden_`, counters end `_total`, durations `_seconds`. No label carries a node or pod name.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from controller.gpus.model import ClusterModel
from gpuwarden.selfmetrics import SnapshotCollector

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Up to the scheduler's default 5 s extender timeout; the interesting range is 1-15 ms."""


@dataclass(frozen=True)
class ExtenderMetrics:
    requests: Counter
    """`gpuwarden_extender_requests_total{verb, outcome}`; outcome: ok, error, bad_request."""
    latency: Histogram
    """`gpuwarden_extender_request_duration_seconds{verb}`."""
    filter_nodes: Counter
    """`gpuwarden_extender_filter_nodes_total{result}`; result: passed, failed, unresolvable."""
    placements: Counter
    """`gpuwarden_extender_placements_total{alignment}`: bound pods by how local their GPU set is."""
    bind_conflicts: Counter
    """`gpuwarden_extender_bind_conflicts_total{kind}`; kind: pod_changed, gpu_claimed,
    cache_stale (the watch cache found no GPU set; bind chose again from a consistent LIST), watch_lag (the
    pod watch did not show a claim within `claim_watch_timeout_seconds`; verified with a LIST instead),
    not_binder (leader protocol: asked to bind while not the fenced binder)."""
    events_dropped: Counter
    """`gpuwarden_extender_events_dropped_total`: bind Events neither written nor summarized (offered after
    the writer stopped)."""
    events_summarized: Counter
    """`gpuwarden_extender_events_summarized_total`: bind Events counted into their node's summary Event
    instead of written one by one (the queue was full)."""
    forwarded: Counter
    """`gpuwarden_extender_binds_forwarded_total{outcome}`: binds a follower passed to the binder (leader
    bind protocol); outcome ok or error (the binder's Error, or it could not be reached)."""
    bind_phases: Histogram
    """`gpuwarden_extender_bind_phase_seconds{phase}`: where a bind's time goes; phase: claim (the claim
    PATCH), verify (until the claim is known to be the only one: watch wait or LIST), binding (the Binding
    POST)."""
    bind_overload: Counter
    """`gpuwarden_extender_bind_overload_total{action}`: binds kept inside the scheduler's httpTimeout;
    action: cancelled (past its deadline, before a write; its GPUs freed), shed (refused at once: it could
    not finish in time at the current bind rate), joined (a retry joined the running bind of its pod)."""
    rejected: Counter
    """`gpuwarden_http_requests_rejected_total{reason}`: requests the lean HTTP core refused (malformed,
    over a limit, too slow; `gpuwarden/http1/server.py`), by reason."""

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()


def extender_metrics(registry: CollectorRegistry | None) -> ExtenderMetrics:
    """Create (and register on `registry`, when given) the extender's series."""
    return ExtenderMetrics(
        requests=Counter(
            "gpuwarden_extender_requests_total",
            "Scheduler-extender requests by verb and outcome (ok, error = Error field or HTTP 5xx, "
            "bad_request = HTTP 400).",
            ["verb", "outcome"],
            registry=registry,
        ),
        latency=Histogram(
            "gpuwarden_extender_request_duration_seconds",
            "Time to answer one scheduler-extender request, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        filter_nodes=Counter(
            "gpuwarden_extender_filter_nodes_total",
            "Candidate nodes judged by filter: passed, failed (preemption may help), unresolvable, "
            "dra_passthrough (DRA-backed nodes passed through unjudged), shared_passthrough (nodes that "
            "share their GPUs: time-slicing, MPS, MIG).",
            ["result"],
            registry=registry,
        ),
        placements=Counter(
            "gpuwarden_extender_placements_total",
            "Pods bound with a recorded GPU set, by alignment (single, nvlink, pcie, numa, whole-numa, "
            "cross-numa, unknown).",
            ["alignment"],
            registry=registry,
        ),
        bind_conflicts=Counter(
            "gpuwarden_extender_bind_conflicts_total",
            "Binds that lost a race: pod_changed (resourceVersion conflict, retried) or gpu_claimed "
            "(another bind claimed an overlapping GPU; the scheduler retries the pod) or cache_stale "
            "(the cache found no GPU set, e.g. preemption victims not yet seen gone; chosen again from a "
            "consistent LIST).",
            ["kind"],
            registry=registry,
        ),
        events_dropped=Counter(
            "gpuwarden_extender_events_dropped_total",
            "GPUsAssigned / GPUBindFailed Events dropped: offered after the writer stopped (shutdown); "
            "a full queue summarizes instead (events_summarized_total).",
            registry=registry,
        ),
        events_summarized=Counter(
            "gpuwarden_extender_events_summarized_total",
            "Bind Events (GPUsAssigned, GPUBindFailed ...) counted into their node's summary Event instead "
            "of written one by one, because too many were waiting to be written.",
            registry=registry,
        ),
        forwarded=Counter(
            "gpuwarden_extender_binds_forwarded_total",
            "Binds this replica passed to the binder replica (bind_protocol leader), by outcome: ok, "
            "error (the binder's Error, or it could not be reached; the scheduler retries the pod).",
            ["outcome"],
            registry=registry,
        ),
        bind_phases=Histogram(
            "gpuwarden_extender_bind_phase_seconds",
            "Time of each step of a bind: claim (writing the GPU claim on the pod), verify (until the "
            "claim is known to be the only one on its GPUs), binding (creating the Binding).",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        bind_overload=Counter(
            "gpuwarden_extender_bind_overload_total",
            "Binds kept inside the scheduler's httpTimeout, by action: cancelled (past the deadline, before "
            "a write; GPUs freed), shed (refused at once: could not finish in time), joined (a retried bind "
            "joined the running bind of its pod).",
            ["action"],
            registry=registry,
        ),
        rejected=Counter(
            "gpuwarden_http_requests_rejected_total",
            "HTTP requests refused before any handler saw them (400 malformed, 413 body over the limit, "
            "431 head or line too long, 408 too slow), by reason.",
            ["reason"],
            registry=registry,
        ),
    )


def register_model_collectors(registry: CollectorRegistry, model: ClusterModel) -> None:
    """`gpuwarden_extender_model_synced` and `gpuwarden_extender_model_nodes`, read at scrape time."""
    registry.register(
        SnapshotCollector(
            "gpuwarden_extender_model_synced",
            "1 once the extender's node and pod caches completed their first list, else 0.",
            [],
            lambda: {(): 1.0 if model.synced else 0.0},
        )
    )
    registry.register(
        SnapshotCollector(
            "gpuwarden_extender_model_nodes",
            "Nodes in the extender's cluster model.",
            [],
            lambda: {(): float(model.node_count())},
        )
    )
