"""Self-metrics: the registry every component registers on, `gpuwarden_build_info`, and a `/metrics` handler.

Why one module: names follow one convention (prefix `gpuwarden_`, counters end `_total`, durations end
`_seconds`), and tests get a fresh `CollectorRegistry` each instead of sharing process-global state.
Snapshot-style state (e.g. "nodes quarantined now") should be exported with a collect-on-scrape collector so
label sets that disappear from the snapshot disappear from /metrics too.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwarden import __version__

if TYPE_CHECKING:  # aiohttp.web only where a handler is made: the node agent serves without it
    from aiohttp import web

PREFIX = "gpuwarden_"


def new_registry(component: str) -> CollectorRegistry:
    """A fresh registry carrying `gpuwarden_build_info{version, python, component} 1`."""
    registry = CollectorRegistry(auto_describe=True)
    info = Gauge(
        "gpuwarden_build_info",
        "Build information; always 1.",
        ["version", "python_version", "component"],
        registry=registry,
    )
    info.labels(__version__, platform.python_version(), component).set(1)
    return registry


class SnapshotCollector(Collector):
    """Collect-on-scrape gauge: `snapshot()` returns {label-values tuple: value} at scrape time.

    Stale label sets vanish because nothing is remembered between scrapes.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: list[str],
        snapshot: Callable[[], dict[tuple[str, ...], float]],
    ) -> None:
        if not name.startswith(PREFIX):
            raise ValueError(f"self-metric {name!r} must start with {PREFIX!r}")
        self._name = name
        self._doc = documentation
        self._labelnames = labelnames
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self._name, self._doc, labels=self._labelnames)
        for labels, value in sorted(self._snapshot().items()):
            family.add_metric(list(labels), value)
        yield family

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, labels=self._labelnames)


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], object]:
    """An aiohttp handler exposing `registry` in the Prometheus text format."""
    from aiohttp import web

    async def handle(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle
