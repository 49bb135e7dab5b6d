"""Answering one metrics request: registry lookup, object selection, query (cached or not), wire response.

Why: this is the only place where the stages meet — routing gives a typed request, the registry says how
to query, the label index says which objects the HPA means, the cache (or Prometheus directly) gives values,
and `build_metric_values` (pure) turns them into items. Its rules:
- only objects matching `labelSelector` are returned; a named object without a value is a 404;
- NaN and ±Inf are dropped, never served; an empty answer is an empty list or a 404, never a made-up 0;
- Prometheus unreachable / timing out / failing → `Unavailable` (503, the HPA holds its scale); a query
  Prometheus rejects is a rule bug → `Internal` (500, detail logged only).
In cache mode a metric is queried for all objects of a namespace (the HPA's selector is applied here, from
the label index), and refreshes batch the namespaces of one metric into one query when the rule's template
groups by `<<.GroupBy>>`. An external metric is cached per (metric, namespace) for every `labelSelector`
when its template allows (`adapter.sharing`: one query, each selector answered in memory), else per
selector.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from adapter import compact, queries, resources, selectors, sharing, wire
from adapter.cache import FetchMany, ValueCache
from adapter.errors import BadRequest, Internal, NotFound, Unavailable
from adapter.objects import LabelIndex
from adapter.registry import CustomMetric, ExternalMetric, Registry
from adapter.resource_rules import Usage
from adapter.routing import WILDCARD, CustomRoute, ExternalRoute
from adapter.selfmetrics import AdapterMetrics
from gpuwarden.errors import PrometheusBadQuery, PrometheusError, PrometheusTimeout, PrometheusUnreachable
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Sample, Scalar, Vector

log = logging.getLogger(__name__)

Point = tuple[float, float]
"""(value, timestamp): all that is kept per object, so a cached answer for 50,000 pods stays small."""
ObjectValues = dict[str, Point]
Cached = ObjectValues | list[Sample] | sharing.SeriesSet | Usage


def outcome_of(exc: PrometheusError) -> str:
    """Self-metric outcome label of a failed Prometheus call."""
    if isinstance(exc, PrometheusBadQuery):
        return "bad_query"
    if isinstance(exc, PrometheusTimeout):
        return "timeout"
    if isinstance(exc, PrometheusUnreachable):
        return "unreachable"
    return "server_error"


async def run_query(
    client: PrometheusClient,
    promql: str,
    metrics: AdapterMetrics,
    *,
    at: float | None,
    query_timeout: float | None,
    scalar_ok: bool = False,
    purpose: str = "values",
) -> list[Sample]:
    """One instant query for values: Prometheus failures become `Unavailable` (503), a rejected query or an
    answer of the wrong type `Internal` (500, a rule bug); counted under `purpose` in the self-metrics."""
    began = time.perf_counter()
    try:
        result = await client.query(promql, time=at, timeout=query_timeout)
    except PrometheusError as exc:
        metrics.observe_query(purpose, outcome_of(exc), time.perf_counter() - began)
        if isinstance(exc, PrometheusBadQuery):
            raise Internal(f"Prometheus rejected {promql!r}: {exc.message}") from exc
        raise Unavailable(
            "unable to fetch metrics: Prometheus is unavailable", retry_after=exc.retry_after
        ) from exc
    samples: list[Sample] | None = None
    if isinstance(result, Vector):
        samples = result.samples
    elif isinstance(result, Scalar) and scalar_ok:
        samples = [Sample({}, result.timestamp, result.value)]
    outcome = "success" if samples else "empty" if samples is not None else "wrong_type"
    metrics.observe_query(purpose, outcome, time.perf_counter() - began)
    if samples is None:
        raise Internal(f"query {promql!r} returned a {type(result).__name__}, expected an instant vector")
    return samples


def values_by_object(samples: Sequence[Sample], label: str) -> ObjectValues:
    """(value, timestamp) keyed by the object name in `label`; unlabelled samples ignored, first one wins."""
    out: ObjectValues = {}
    stamps = compact.Stamps()
    for s in samples:
        name = s.labels.get(label)
        if name and name not in out:
            out[compact.name(name)] = (s.value, stamps.shared(s.timestamp))
    return out


def build_metric_values(
    entry: CustomMetric, namespace: str, values: Mapping[str, Point], names: Sequence[str] | None
) -> list[tuple[wire.ObjectReference, float, float]]:
    """(describedObject, value, timestamp) for `names` (None: every object with a value), finite only."""
    kind, api_version = resources.object_reference_fields(entry.resource)
    out: list[tuple[wire.ObjectReference, float, float]] = []
    for name in sorted(values) if names is None else names:
        point = values.get(name)
        if point is None or not math.isfinite(point[0]):
            continue
        ref: wire.ObjectReference = {"kind": kind, "name": name, "apiVersion": api_version}
        if entry.namespaced:
            ref["namespace"] = namespace
        out.append((ref, point[0], point[1]))
    return out


class Provider:
    """Serves custom and external metric values from the current registry."""

    def __init__(
        self,
        client: PrometheusClient,
        registry: Callable[[], Registry],
        *,
        metrics: AdapterMetrics,
        index: LabelIndex | None = None,
        cache: ValueCache[Cached] | None = None,
        query_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        eval_time: Callable[[], float] | None = None,
    ) -> None:
        """`eval_time`: evaluation time of value queries (None: Prometheus' now); tests pin it."""
        self._client = client
        self._registry = registry
        self._metrics = metrics
        self._index = index
        self._cache = cache
        self._timeout = query_timeout
        self._clock = clock
        self._eval_time = eval_time

    async def _query(self, promql: str, *, scalar_ok: bool) -> list[Sample]:
        at = self._eval_time() if self._eval_time is not None else None
        return await run_query(
            self._client, promql, self._metrics, at=at, query_timeout=self._timeout, scalar_ok=scalar_ok
        )

    def _names(self, route: CustomRoute) -> list[str] | None:
        """Objects the request means; None = every object that has a value."""
        if route.name != WILDCARD:
            return [route.name]
        if self._index is not None and self._index.supports(route.resource):
            if not self._index.synced(route.resource):
                raise Unavailable(f"the {route.resource} cache is not synced yet", retry_after=1)
            return self._index.names(route.resource, route.namespace, route.label_selector)
        if route.label_selector:
            raise BadRequest(
                f"labelSelector is not supported for {route.resource}: its objects are not watched"
            )
        return None

    def _object_query(
        self,
        entry: CustomMetric,
        route: CustomRoute,
        names: Sequence[str] | None,
        namespaces: list[str] | None = None,
    ) -> str:
        try:
            return queries.build_object_query(
                entry.rule,
                entry.series,
                entry.resource_label,
                entry.namespace_label,
                route.namespace if namespaces is None else namespaces,
                route.metric_selector,
                names,
            )
        except selectors.SelectorError as exc:
            raise BadRequest(f"metricLabelSelector: {exc}") from None
        except queries.QueryError as exc:
            raise NotFound(
                f"the server could not find the metric {route.metric} for {route.resource}"
            ) from exc

    def _batch(self, entry: CustomMetric, route: CustomRoute) -> tuple[Hashable, FetchMany[Cached]] | None:
        """Refresh this metric for every requested namespace with one query, when the rule allows it."""
        ns_label = entry.namespace_label
        if not route.namespace or ns_label is None or not queries.batchable(entry.rule):
            return None

        async def fetch_many(keys: list[Hashable]) -> dict[Hashable, Cached]:
            by_namespace: dict[str, ObjectValues] = {str(k[3]): {} for k in keys if isinstance(k, tuple)}
            promql = self._object_query(entry, route, None, sorted(by_namespace))
            stamps = compact.Stamps()
            for s in await self._query(promql, scalar_ok=False):
                values = by_namespace.get(s.labels.get(ns_label, ""))
                name = s.labels.get(entry.resource_label)
                if values is not None and name and name not in values:
                    values[compact.name(name)] = (s.value, stamps.shared(s.timestamp))
            return {k: by_namespace[str(k[3])] for k in keys if isinstance(k, tuple)}

        return ("custom", route.resource, route.metric, str(route.metric_selector)), fetch_many

    async def custom(self, route: CustomRoute) -> wire.MetricValueList:
        entry, items = await self.custom_items(route)
        self.account("custom", [ts for _, _, ts in items])
        return wire.metric_value_list(
            route.version,
            route.metric,
            selectors.to_label_selector(route.metric_selector),
            items,
            entry.rule.window_seconds,
        )

    async def custom_items(
        self, route: CustomRoute
    ) -> tuple[CustomMetric, list[tuple[wire.ObjectReference, float, float]]]:
        """(the metric's registry entry, (describedObject, value, timestamp) per object) for `route`, from
        the cache when on; the raw values behind `custom()`, also read by the KEDA external scaler."""
        entry = self._registry().custom.get((route.resource, route.metric))
        if entry is None or entry.namespaced != bool(route.namespace):
            raise NotFound(f"the server could not find the metric {route.metric} for {route.resource}")
        names = self._names(route)
        values: Mapping[str, Point] = {}
        if names != []:
            if self._cache is not None:
                key = ("custom", route.resource, route.metric, route.namespace, str(route.metric_selector))

                async def fetch() -> Cached:  # the query is built on a miss only: hits answer from memory
                    promql = self._object_query(entry, route, None)
                    return values_by_object(await self._query(promql, scalar_ok=False), entry.resource_label)

                cached, _ = await self._cache.get(key, fetch, group="custom", batch=self._batch(entry, route))
                assert isinstance(cached, dict)
                values = cached
            else:
                promql = self._object_query(entry, route, names)
                values = values_by_object(await self._query(promql, scalar_ok=False), entry.resource_label)
        items = build_metric_values(entry, route.namespace, values, names)
        if route.name != WILDCARD and not items:
            raise NotFound(
                f"the server could not find the metric {route.metric} for {route.resource} {route.name}"
            )
        return entry, items

    async def external(self, route: ExternalRoute) -> wire.ExternalMetricValueList:
        entry, items = await self.external_items(route)
        self.account("external", [ts for _, _, ts in items])
        return wire.external_metric_value_list(route.metric, items, entry.rule.window_seconds)

    async def external_items(
        self, route: ExternalRoute
    ) -> tuple[ExternalMetric, list[tuple[dict[str, str], float, float]]]:
        """(the metric's registry entry, (series labels, value, timestamp) per finite sample) for `route`,
        from the cache when on; the raw values behind `external()`, also read by the KEDA external scaler."""
        entry: ExternalMetric | None = self._registry().external.get(route.metric)
        if entry is None:
            raise NotFound(f"the server could not find the external metric {route.metric}")
        try:
            promql = queries.build_external_query(
                entry.rule, entry.series, entry.namespace_label, route.namespace, route.selector
            )
        except selectors.SelectorError as exc:
            raise BadRequest(f"labelSelector: {exc}") from None
        except queries.QueryError as exc:
            raise Internal(str(exc)) from exc
        how = sharing.plan(sharing.shape_of(entry.rule.query), route.selector)
        if self._cache is not None and how is not None:
            shared = queries.build_external_query(
                entry.rule,
                entry.series,
                entry.namespace_label,
                route.namespace,
                selectors.EVERYTHING,
                how.group_by,
            )
            shared_key = ("external", route.metric, route.namespace, "shared", how.group_by)

            async def fetch_shared() -> Cached:
                return sharing.SeriesSet(await self._query(shared, scalar_ok=True))

            cached, _ = await self._cache.get(shared_key, fetch_shared, group="external")
            assert isinstance(cached, sharing.SeriesSet)
            samples = sharing.answer(cached, route.selector, how)
        elif self._cache is not None:
            key = ("external", route.metric, route.namespace, str(route.selector))

            async def fetch() -> Cached:
                return await self._query(promql, scalar_ok=True)

            cached, _ = await self._cache.get(key, fetch, group="external")
            assert isinstance(cached, list)
            samples = cached
        else:
            samples = await self._query(promql, scalar_ok=True)
        items = [(s.labels, s.value, s.timestamp) for s in samples if math.isfinite(s.value)]
        return entry, items

    def account(self, api: str, timestamps: list[float]) -> None:
        """Count the values served under `api` (custom, external, keda) and observe their ages."""
        now = self._clock()
        self._metrics.items.labels(api).inc(len(timestamps))
        age = self._metrics.value_age.labels(api)  # one label lookup per answer, not per value
        for ts in timestamps:
            age.observe(max(0.0, now - ts))
