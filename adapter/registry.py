"""The metric registry: which metrics exist, for which resources, and how to query them.

Why: the registry is the meeting point of the config (compiled rules) and Prometheus (the series that exist).
`build_registry` is a pure function from (rules, discovered series) to a `Registry`, so prometheus-adapter's
series-registry cases run as plain data tables. `Discovery` is the thin shell that relists series on an
interval and swaps the registry atomically.

Differences from prometheus-adapter, on purpose:
- a seriesQuery that fails keeps its previous series instead of failing every rule (kube-prometheus#160);
- a seriesQuery naming one metric is discovered with `/api/v1/labels?match[]=` (label names only) instead
  of `/api/v1/series` (every series), which matters with 40,000 GPUs; so is one naming a few metrics as
  `{__name__=~"a|b"}` (one labels call per name: the GPU utilization preset reads whole-GPU and MIG fields);
- each entry remembers the label that actually carried the resource and the namespace in the series, so
  several overrides for one resource (dcgm-exporter's `Hostname` / `hostname`) just work;
- a resource known to be namespaced (pods) is not registered from series without a namespace label, which
  would break the aggregator's discovery merge ("scope do not match").
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from adapter import resources
from adapter.naming import CompiledRule
from adapter.resources import NAMESPACES, ROOT_SCOPED, GroupResource
from adapter.selfmetrics import AdapterMetrics
from gpuwarden.errors import PrometheusBadQuery, PrometheusError
from gpuwarden.promclient import PrometheusClient

log = logging.getLogger(__name__)

SeriesList = Sequence[Mapping[str, str]]
_ONE_METRIC = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{.*\})?\s*$", re.DOTALL)
_NAME_ALTERNATIVES = re.compile(
    r'^\s*\{\s*__name__\s*=~\s*"(\^?[a-zA-Z_:][a-zA-Z0-9_:]*(?:\|[a-zA-Z_:][a-zA-Z0-9_:]*)*\$?)"\s*\}\s*$'
)


@dataclass(frozen=True)
class CustomMetric:
    """One custom metric for one group-resource."""

    metric: str
    resource: GroupResource
    namespaced: bool
    series: str
    rule: CompiledRule
    resource_label: str
    namespace_label: str | None


@dataclass(frozen=True)
class ExternalMetric:
    """One external metric."""

    metric: str
    series: str
    rule: CompiledRule
    namespace_label: str | None


@dataclass(frozen=True)
class Registry:
    """An immutable snapshot; `Discovery` replaces it wholesale."""

    custom: Mapping[tuple[GroupResource, str], CustomMetric] = field(default_factory=dict)
    external: Mapping[str, ExternalMetric] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def custom_resources(self) -> list[tuple[str, bool, str]]:
        """APIResourceList entries: (`<resource>/<metric>`, namespaced, kind)."""
        return [(f"{gr}/{m}", e.namespaced, "MetricValueList") for (gr, m), e in self.custom.items()]

    def external_resources(self) -> list[tuple[str, bool, str]]:
        return [(name, True, "ExternalMetricValueList") for name in self.external]


_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")


def distinct_series(series: SeriesList) -> list[tuple[str, frozenset[str]]]:
    """(name, label names) combinations, label values stripped, first-seen order.

    Only classic metric and label names: `<<.Series>>` and label names are written into PromQL unquoted, so a
    UTF-8 name (Prometheus 3 allows them) could not be written safely and is not served.
    """
    seen: dict[tuple[str, frozenset[str]], None] = {}
    for s in series:
        name = s.get("__name__", "")
        if not _METRIC_NAME.match(name):
            continue
        seen.setdefault((name, frozenset(k for k in s if k != "__name__" and _LABEL_NAME.match(k))), None)
    return list(seen)


def _label_map(rule: CompiledRule, labels: Iterable[str]) -> dict[GroupResource, str]:
    out: dict[GroupResource, str] = {}
    for label in sorted(labels):
        gr = rule.resources.resource_for_label(label)
        if gr is not None:
            out.setdefault(gr, label)
    return out


def build_registry(
    rules: Sequence[CompiledRule], external_rules: Sequence[CompiledRule], series: Mapping[str, SeriesList]
) -> Registry:
    """Pure: the registry for `series` (seriesQuery -> discovered series) under the compiled rules."""
    custom: dict[tuple[GroupResource, str], CustomMetric] = {}
    external: dict[str, ExternalMetric] = {}
    notes: list[str] = []
    for rule in rules:
        for name, labels in distinct_series(series.get(rule.series_query, ())):
            metric = rule.metric_name(name) if rule.accepts(name) else None
            if not metric:
                continue
            by_resource = _label_map(rule, labels)
            ns_label = by_resource.get(NAMESPACES)
            for gr, label in by_resource.items():
                kind = resources.lookup(gr.resource, gr.group)
                root = gr in ROOT_SCOPED or (kind is not None and not kind.namespaced)
                if not root and ns_label is None:
                    if kind is not None:
                        notes.append(f"{rule.where}: {name} has {label} but no namespace label; {gr} skipped")
                        continue
                    root = True
                entry = CustomMetric(metric, gr, not root, name, rule, label, None if root else ns_label)
                previous = custom.setdefault((gr, metric), entry)
                if previous.rule is not rule or (previous.series != name and rule.query.mentions("Series")):
                    notes.append(
                        f"{rule.where}: {gr}/{metric} from {name} ignored, {previous.rule.where} won"
                    )
    for rule in external_rules:
        for name, labels in distinct_series(series.get(rule.series_query, ())):
            metric = rule.metric_name(name) if rule.accepts(name) else None
            if not metric:
                continue
            ns_label = rule.resources.label_for(NAMESPACES) or _label_map(rule, labels).get(NAMESPACES)
            previous_ext = external.setdefault(metric, ExternalMetric(metric, name, rule, ns_label))
            if previous_ext.rule is not rule or previous_ext.series != name:
                notes.append(
                    f"{rule.where}: external {metric} from {name} ignored, {previous_ext.rule.where} won"
                )
    return Registry(custom, external, tuple(dict.fromkeys(notes)))


def single_metric(series_query: str) -> str | None:
    """The metric name if `series_query` is `name` or `name{...}` (label names then suffice), else None."""
    m = _ONE_METRIC.match(series_query)
    return m.group(1) if m else None


def metric_names(series_query: str) -> list[str] | None:
    """The metric names a seriesQuery selects when label names per name suffice to discover it: `name`,
    `name{...}` or `{__name__=~"a|b"}` (literal names only; Prometheus anchors the regex); else None."""
    name = single_metric(series_query)
    if name is not None:
        return [name]
    m = _NAME_ALTERNATIVES.match(series_query)
    if not m:
        return None
    return list(dict.fromkeys(m.group(1).removeprefix("^").removesuffix("$").split("|")))


class Discovery:
    """Relists series for every distinct seriesQuery and keeps the current `Registry`."""

    def __init__(
        self,
        client: PrometheusClient,
        rules: Sequence[CompiledRule],
        external_rules: Sequence[CompiledRule],
        *,
        max_age: float,
        metrics: AdapterMetrics,
        timeout: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._rules, self._external_rules = list(rules), list(external_rules)
        self._queries = list(dict.fromkeys(r.series_query for r in [*rules, *external_rules]))
        self._max_age, self._timeout, self._clock = max_age, timeout, clock
        self._metrics = metrics
        self._series: dict[str, SeriesList] = {}
        self.registry = Registry()
        self.ready = False
        self.last_success: float | None = None

    async def _fetch(self, query: str, start: float) -> SeriesList:
        began = time.perf_counter()
        try:
            names = metric_names(query)
            if names is not None:
                selectors = [query] if len(names) == 1 else names
                answers = await asyncio.gather(
                    *(self._client.labels([sel], start=start, timeout=self._timeout) for sel in selectors)
                )
                found: SeriesList = [
                    {**dict.fromkeys(labels, ""), "__name__": name}
                    for name, labels in zip(names, answers, strict=True)
                    if labels
                ]
            else:
                found = await self._client.series([query], start=start, timeout=self._timeout)
        except PrometheusError as exc:
            outcome = "bad_query" if isinstance(exc, PrometheusBadQuery) else "unreachable"
            self._metrics.observe_query("discovery", outcome, time.perf_counter() - began)
            raise
        self._metrics.observe_query("discovery", "success", time.perf_counter() - began)
        return found

    async def relist(self) -> bool:
        """One discovery round; True when Prometheus answered every seriesQuery."""
        start = self._clock() - self._max_age
        results = await asyncio.gather(
            *(self._fetch(q, start) for q in self._queries), return_exceptions=True
        )
        failures = 0
        reachable = True
        for query, result in zip(self._queries, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, PrometheusError):
                    raise result
                failures += 1
                reachable = reachable and isinstance(result, PrometheusBadQuery)
                log.warning("series discovery failed", extra={"series_query": query, "error": str(result)})
                continue
            self._series[query] = result
        registry = build_registry(self._rules, self._external_rules, self._series)
        for note in set(registry.notes) - set(self.registry.notes):
            log.warning("metric discovery: %s", note)
        self.registry = registry
        outcome = "success" if not failures else "partial" if failures < len(self._queries) else "failed"
        self._metrics.discovery_runs.labels(outcome).inc()
        if reachable:
            if not self.ready:
                log.info(
                    "first discovery done",
                    extra={"custom": len(registry.custom), "external": len(registry.external)},
                )
            self.ready = True
            self.last_success = self._clock()
        return failures == 0

    async def run(self, interval: float) -> None:
        """Relist forever, every `interval` seconds (the first round immediately)."""
        while True:
            try:
                await self.relist()
            except Exception:
                log.exception("series discovery crashed; retrying next interval")
            await asyncio.sleep(interval)
