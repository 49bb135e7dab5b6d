"""Expected transient failures, logged once per episode: one warning with the cause when it starts, one info
line when it ends, and a counter for every occurrence.

Why it exists: an API server that is restarting, answering 429 or 5xx, or a watch that expired is an
expected, retried condition; a loop that logs it as a traceback every pass buries the errors that are not
expected (and pages nobody more usefully than the metric does). What is expected is decided once here,
from the error hierarchy's policy (`gpuwarden.errors`): retryable Kubernetes and Prometheus errors. Anything
else is not transient, and the caller logs it with its traceback as before.

What it must not do: retry, sleep or swallow anything - callers keep their own retry policy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpuwarden.errors import KubeError, KubeGone, KubeUnreachable, PrometheusError
from gpuwarden.kube.metrics import CounterFamily, kube_metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpuwarden.litemetrics import Registry

CAUSES = ("api-unreachable", "api-throttled", "api-server-error", "watch-expired", "conflict", "prometheus")


def transient_cause(exc: BaseException) -> str | None:
    """The cause of an expected, retried failure (a `CAUSES` value), or None when it is not one."""
    if isinstance(exc, KubeGone):
        return "watch-expired"
    if isinstance(exc, KubeUnreachable):
        if exc.status == 429:
            return "api-throttled"
        return "api-server-error" if exc.status is not None else "api-unreachable"
    if isinstance(exc, KubeError) and exc.retryable:
        return "conflict"
    if isinstance(exc, PrometheusError) and exc.retryable:
        return "prometheus"
    return None


def transient_counter(registry: CollectorRegistry | Registry | None) -> CounterFamily:
    """`gpuwarden_transient_failures_total{component, cause}`: every occurrence, logged or not (one
    counter per registry, shared by the pass scheduler and leader election)."""
    return kube_metrics(registry).transient_failures


class Episodes:
    """Per key (a loop's name), whether a transient episode is running and of which cause."""

    def __init__(self, counter: CounterFamily, log: logging.Logger) -> None:
        self._counter = counter
        self._log = log
        self._open: dict[str, str] = {}

    def failed(self, component: str, exc: BaseException) -> bool:
        """Count and (once per episode) log a transient `exc`; False when it is not transient."""
        cause = transient_cause(exc)
        if cause is None:
            return False
        self._counter.labels(component, cause).inc()
        if self._open.get(component) != cause:
            self._open[component] = cause
            self._log.warning(
                f"{component}: {cause}; retried, logged again when it ends or its cause changes",
                extra={"component": component, "cause": cause, "error": str(exc)},
            )
        return True

    def count(self, component: str, cause: str) -> None:
        """Count an expected failure that its caller handles and logs itself (e.g. a routine 410 relist)."""
        self._counter.labels(component, cause).inc()

    def succeeded(self, component: str) -> None:
        """The episode of `component`, if any, is over."""
        cause = self._open.pop(component, None)
        if cause is not None:
            self._log.info(f"{component}: recovered from {cause}", extra={"component": component})
