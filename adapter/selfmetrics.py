"""The adapter's own metrics: API requests, Prometheus queries, cache freshness, discovery, items served.

Why one module: every series the adapter exports is declared here with its labels, so names follow the
project convention (`gpuwarden_adapter_*`, counters `_total`, durations `_seconds`) and label values stay
low-cardinality (routes are templates, never paths). State that is a snapshot — cache size and age, how many
metrics discovery found — is collected on scrape from the objects that own it, so it can never go stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuwarden.selfmetrics import SnapshotCollector

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
AGE_BUCKETS = (1.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)

Snapshot = Callable[[], dict[tuple[str, ...], float]]


@dataclass(frozen=True)
class AdapterMetrics:
    """Counters and histograms written by the request path, the cache and discovery."""

    requests: Counter
    request_duration: Histogram
    queries: Counter
    query_duration: Histogram
    items: Counter
    value_age: Histogram
    discovery_runs: Counter
    certificate_reloads: Counter
    certificate_expiry: Gauge
    keda_requests: Counter
    keda_request_duration: Histogram
    keda_pushes: Counter

    def observe_query(self, purpose: str, outcome: str, seconds: float) -> None:
        self.queries.labels(purpose, outcome).inc()
        self.query_duration.labels(purpose).observe(seconds)


def new_metrics(registry: CollectorRegistry | None) -> AdapterMetrics:
    """Create the adapter's collectors on `registry` (None: unregistered, for tests that do not scrape)."""
    return AdapterMetrics(
        requests=Counter(
            "gpuwarden_adapter_requests_total",
            "API requests by route template and HTTP status code.",
            ["route", "code"],
            registry=registry,
        ),
        request_duration=Histogram(
            "gpuwarden_adapter_request_duration_seconds",
            "API request latency by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        queries=Counter(
            "gpuwarden_adapter_prometheus_queries_total",
            "Prometheus calls by purpose (values, discovery) and outcome (success, empty, bad_query, "
            "timeout, unreachable, server_error).",
            ["purpose", "outcome"],
            registry=registry,
        ),
        query_duration=Histogram(
            "gpuwarden_adapter_prometheus_query_duration_seconds",
            "Prometheus call latency by purpose, retries included.",
            ["purpose"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        items=Counter(
            "gpuwarden_adapter_items_served_total",
            "Metric values returned to callers, by API (custom, external).",
            ["api"],
            registry=registry,
        ),
        value_age=Histogram(
            "gpuwarden_adapter_served_value_age_seconds",
            "Age of each value served (now minus its timestamp), by API.",
            ["api"],
            buckets=AGE_BUCKETS,
            registry=registry,
        ),
        discovery_runs=Counter(
            "gpuwarden_adapter_discovery_runs_total",
            "Series discovery rounds by outcome (success, partial, failed).",
            ["outcome"],
            registry=registry,
        ),
        certificate_reloads=Counter(
            "gpuwarden_adapter_certificate_reloads_total",
            "Serving certificate/key and client CA file changes by outcome (success; invalid, "
            "mismatched, unreadable: the previous pair or CAs stay in use).",
            ["outcome"],
            registry=registry,
        ),
        certificate_expiry=Gauge(
            "gpuwarden_adapter_serving_certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (unix seconds).",
            registry=registry,
        ),
        keda_requests=Counter(
            "gpuwarden_adapter_keda_requests_total",
            "KEDA external-scaler gRPC calls by method (IsActive, StreamIsActive, GetMetricSpec, "
            "GetMetrics, StreamMetricSpec) and gRPC status code (OK, INVALID_ARGUMENT, NOT_FOUND, "
            "UNAVAILABLE, ...); a stream counts once, when it ends.",
            ["rpc", "code"],
            registry=registry,
        ),
        keda_request_duration=Histogram(
            "gpuwarden_adapter_keda_request_duration_seconds",
            "KEDA external-scaler unary call latency by method (streams are not timed).",
            ["rpc"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        keda_pushes=Counter(
            "gpuwarden_adapter_keda_pushes_total",
            "external-push: activity changes sent on StreamIsActive streams, by value (true, false), and "
            "re-evaluations that could not be decided (error: no data, stale, Prometheus down).",
            ["result"],
            registry=registry,
        ),
    )


def register_keda_snapshots(registry: CollectorRegistry, *, streams: Snapshot) -> None:
    """Collect-on-scrape gauge of the KEDA external scaler's open streams."""
    registry.register(
        SnapshotCollector(
            "gpuwarden_adapter_keda_open_streams",
            "Push streams open now: StreamIsActive and StreamMetricSpec (KEDA 2.21 opens both per "
            "external-push trigger).",
            [],
            streams,
        )
    )


def register_snapshots(
    registry: CollectorRegistry,
    *,
    cache: Snapshot,
    cache_age: Snapshot,
    discovered: Snapshot,
    ready: Snapshot,
) -> None:
    """Collect-on-scrape gauges for the cache and discovery state."""
    registry.register(
        SnapshotCollector(
            "gpuwarden_adapter_cache_entries",
            "(metric, namespace, selector) entries the value cache refreshes, by API.",
            ["api"],
            cache,
        )
    )
    registry.register(
        SnapshotCollector(
            "gpuwarden_adapter_cache_oldest_age_seconds",
            "Age of the oldest successfully refreshed cache entry, by API (0 when empty).",
            ["api"],
            cache_age,
        )
    )
    registry.register(
        SnapshotCollector(
            "gpuwarden_adapter_discovered_metrics",
            "Metrics currently served, by API (custom counts one per resource and metric).",
            ["api"],
            discovered,
        )
    )
    registry.register(
        SnapshotCollector(
            "gpuwarden_adapter_ready",
            "1 once /readyz answers 200 (series discovered, label caches synced), else 0.",
            [],
            ready,
        )
    )
