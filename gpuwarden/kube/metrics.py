"""Self-metrics of the Kubernetes access layer: API requests by outcome, and leadership per Lease.

Why a module of its own: the client, the watch loop and the leader elector all count into the same few
series, and a registry must get each series exactly once even when several clients or electors share it
(two electors in one test process, or an adapter and a controller loop in one binary). So metrics are
created once per injected `CollectorRegistry` and handed out from a weak cache. With no registry the
metrics are created unregistered: counting still works, nothing global is touched. A
`gpuwarden.litemetrics.Registry` (the node agent's), or no registry, gets the same series from
`litemetrics`, so a process that never exposes prometheus_client's registry does not import it.

This module must not grow snapshot-style state (e.g. "objects in cache"); those belong to collect-on-scrape
collectors (`gpuwarden.selfmetrics.SnapshotCollector`) next to the data they describe.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuwarden import litemetrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class Incrementable(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Settable(Protocol):
    def set(self, value: float) -> None: ...


class CounterFamily(Protocol):
    """A labelled counter: prometheus_client's or `litemetrics`'."""

    def labels(self, *labelvalues: Any) -> Incrementable: ...


class GaugeFamily(Protocol):
    def labels(self, *labelvalues: Any) -> Settable: ...


@dataclass(frozen=True)
class KubeMetrics:
    """The series this package writes; label values stay low-cardinality (verbs, plurals, outcomes)."""

    requests: CounterFamily
    """`gpuwarden_kube_requests_total{verb, resource, outcome}`; outcome is `success` or an error class."""
    leader: GaugeFamily
    """`gpuwarden_leader{lease}`: 1 while this process holds the Lease, else 0."""
    leader_transitions: CounterFamily
    """`gpuwarden_leader_transitions_total{lease}`: times this process started or stopped leading."""
    transient_failures: CounterFamily
    """`gpuwarden_transient_failures_total{component, cause}` (see gpuwarden.transient)."""


_cache: weakref.WeakKeyDictionary[Any, KubeMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _create(registry: CollectorRegistry | litemetrics.Registry | None) -> KubeMetrics:
    if registry is None or isinstance(registry, litemetrics.Registry):
        Counter: Any = litemetrics.Counter
        Gauge: Any = litemetrics.Gauge
    else:
        from prometheus_client import Counter, Gauge
    return KubeMetrics(
        requests=Counter(
            "gpuwarden_kube_requests_total",
            "Kubernetes API requests by verb, resource (plural) and outcome.",
            ["verb", "resource", "outcome"],
            registry=registry,
        ),
        leader=Gauge(
            "gpuwarden_leader",
            "1 while this process holds the named leader-election Lease, else 0.",
            ["lease"],
            registry=registry,
        ),
        leader_transitions=Counter(
            "gpuwarden_leader_transitions_total",
            "Times this process started or stopped leading, per Lease.",
            ["lease"],
            registry=registry,
        ),
        transient_failures=Counter(
            "gpuwarden_transient_failures_total",
            "Expected, retried failures (API unreachable, 429, 5xx, watch expiry, Prometheus down), by "
            "component and cause; each episode is logged once at warning.",
            ["component", "cause"],
            registry=registry,
        ),
    )


def kube_metrics(registry: CollectorRegistry | litemetrics.Registry | None) -> KubeMetrics:
    """The metrics for `registry`, created and registered on first use; unregistered ones for None."""
    if registry is None:
        return _create(None)
    with _lock:
        found = _cache.get(registry)
        if found is None:
            found = _create(registry)
            _cache[registry] = found
        return found
