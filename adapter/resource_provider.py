"""Answering metrics.k8s.io requests (`kubectl top`, the HPA's Resource metrics, the VPA recommender).

Why: the same grouped, demand-driven cache as custom metrics, so Prometheus load does not follow the number
of HPAs, `kubectl top` calls, nodes or pods. Each (rule, scope) someone asked for is one cache entry — cpu
and memory of all pods of the cluster, cpu and memory of all nodes — refreshed with one value query and one
timestamp query per refresh interval; every request in between is answered from memory and filtered here:
`labelSelector` against the watched pod/node labels, `fieldSelector` on metadata.name/namespace, as
metrics-server does. Only when a rule's container query does not group by `<<.GroupBy>>` is a namespace
its own entry (its answer cannot say which namespace a pod is in).

What is served, and what is not:
- a pod is listed only if every container seen in either answer has both cpu and memory: metrics-server
  omits a pod one of whose containers lacks a point (`allContainersPresent`), and an HPA reading a pod
  with a container lacking cpu would count it as missing anyway; prometheus-adapter's 0-fill would make
  the HPA average a made-up zero. A node needs both too;
- Prometheus down, timing out or failing → 503 Status (never zeros, never an empty 200); a rule Prometheus
  rejects → 500 with the detail in the log;
- a named pod or node unknown to the API server is `pods "x" not found`; known without metrics,
  `podmetrics.metrics.k8s.io "ns/x" not found` (metrics-server's two 404s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from adapter import fieldselectors, resource_wire
from adapter.cache import ValueCache
from adapter.errors import BadRequest, NotFound, Unavailable
from adapter.objects import LabelIndex
from adapter.provider import Cached, run_query
from adapter.resource_rules import (
    ALL_NAMESPACES,
    CompiledResourceRule,
    CompiledResourceRules,
    ObjectKey,
    Scope,
    Usage,
    read_usage,
    scope_queries,
)
from adapter.resources import NODES, PODS, GroupResource
from adapter.routing import ResourceRoute
from adapter.selfmetrics import AdapterMetrics
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Sample

PURPOSE = "resource"


def _sampled(samples: list[Sample]) -> list[tuple[Mapping[str, str], float, float]]:
    return [(s.labels, s.value, s.timestamp) for s in samples]


def not_found(group_resource: str, name: str) -> NotFound:
    """apimachinery's NewNotFound: `<resource>[.<group>] "<name>" not found`, with details."""
    kind, _, group = group_resource.partition(".")
    details = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return NotFound(f'{group_resource} "{name}" not found', details=details)


def complete_pod(cpu: Mapping[str, float] | None, memory: Mapping[str, float] | None) -> list[str] | None:
    """Sorted containers of a pod when every container has both resources, else None (pod omitted)."""
    if not cpu or not memory or set(cpu) != set(memory):
        return None
    return sorted(cpu)


class ResourceProvider:
    """Serves NodeMetrics and PodMetrics from the two compiled resource rules."""

    def __init__(
        self,
        client: PrometheusClient,
        rules: CompiledResourceRules,
        *,
        metrics: AdapterMetrics,
        index: LabelIndex | None = None,
        cache: ValueCache[Cached] | None = None,
        query_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        eval_time: Callable[[], float] | None = None,
    ) -> None:
        self._client = client
        self._rules = rules
        self._metrics = metrics
        self._index = index
        self._cache = cache
        self._timeout = query_timeout
        self._clock = clock
        self._eval_time = eval_time

    async def _fetch(self, rule: CompiledResourceRule, scope: Scope) -> Usage:
        value_query, stamp_query = scope_queries(rule, scope)
        at = self._eval_time() if self._eval_time is not None else None

        async def run(promql: str) -> list[Sample]:
            return await run_query(
                self._client, promql, self._metrics, at=at, query_timeout=self._timeout, purpose=PURPOSE
            )

        if stamp_query is None:
            values, stamps = await run(value_query), list[Sample]()
        else:
            values, stamps = await asyncio.gather(run(value_query), run(stamp_query))
        return read_usage(rule, scope, _sampled(values), _sampled(stamps))

    async def _usage(self, rule: CompiledResourceRule, scope: Scope) -> Usage:
        if self._cache is None:
            return await self._fetch(rule, scope)
        key: Hashable = ("resource", rule.name, str(scope))

        async def fetch() -> Cached:
            return await self._fetch(rule, scope)

        cached, _ = await self._cache.get(key, fetch, group="resource")
        assert isinstance(cached, Usage)
        return cached

    async def _both(self, scope: Scope) -> tuple[Usage, Usage]:
        cpu, memory = await asyncio.gather(
            self._usage(self._rules.cpu, scope), self._usage(self._rules.memory, scope)
        )
        return cpu, memory

    def _synced_index(self, gr: GroupResource) -> LabelIndex | None:
        if self._index is None or not self._index.supports(gr):
            return None
        if not self._index.synced(gr):
            raise Unavailable(f"the {gr} cache is not synced yet", retry_after=1)
        return self._index

    # --- nodes ------------------------------------------------------------------------------------------

    async def nodes(self, route: ResourceRoute) -> Mapping[str, Any]:
        index = self._synced_index(NODES)
        if index is None and route.label_selector:
            raise BadRequest("labelSelector is not supported: nodes are not watched (no Kubernetes access)")
        if route.name and index is not None and index.labels_of(NODES, "", route.name) is None:
            raise not_found("nodes", route.name)
        cpu, memory = await self._both(Scope("nodes"))
        if route.name:
            names = [route.name]
        elif index is not None:
            names = index.names(NODES, "", route.label_selector)
        else:
            names = sorted(name for _, name in cpu.values)
        now, window = self._clock(), self._rules.window("nodes")
        items: list[resource_wire.NodeMetrics] = []
        stamps: list[float] = []
        for name in names:
            if not route.field_selector.matches(fieldselectors.object_fields(name, None)):
                continue
            key: ObjectKey = ("", name)
            c, m = cpu.values.get(key, {}).get(""), memory.values.get(key, {}).get("")
            if c is None or m is None:
                continue
            ts = min(cpu.times[key], memory.times[key])
            labels = dict(index.labels_of(NODES, "", name) or {}) if index is not None else {}
            meta = resource_wire.object_meta(name, "", labels, now)
            items.append(resource_wire.node_metrics(meta, ts, window, c, m))
            stamps.append(ts)
        self._account(stamps)
        if route.name:
            if not items:
                raise not_found("nodemetrics.metrics.k8s.io", route.name)
            return resource_wire.top_level_node(items[0])
        return resource_wire.node_metrics_list(items)

    # --- pods -------------------------------------------------------------------------------------------

    def _scopes(self, route: ResourceRoute, index: LabelIndex | None) -> list[Scope]:
        """Cached: every pod at once, which every request shares. Per request: just the namespace asked."""
        batchable = self._rules.cpu.batchable and self._rules.memory.batchable
        if batchable and (self._cache is not None or not route.namespace):
            return [Scope("pods", ALL_NAMESPACES)]
        if route.namespace:
            return [Scope("pods", route.namespace)]
        if index is None:
            raise BadRequest(
                "listing pods of all namespaces needs a containerQuery that groups by <<.GroupBy>>, "
                "or Kubernetes access to know the namespaces"
            )
        return [Scope("pods", ns) for ns in index.namespaces(PODS)]

    def _pod_names(self, route: ResourceRoute, index: LabelIndex | None, cpu: Usage) -> list[ObjectKey]:
        if route.name:
            return [(route.namespace, route.name)]
        if index is None:
            return sorted(k for k in cpu.values if not route.namespace or k[0] == route.namespace)
        namespaces = [route.namespace] if route.namespace else index.namespaces(PODS)
        return [(ns, n) for ns in sorted(namespaces) for n in index.names(PODS, ns, route.label_selector)]

    async def pods(self, route: ResourceRoute) -> Mapping[str, Any]:
        index = self._synced_index(PODS)
        if index is None and route.label_selector:
            raise BadRequest("labelSelector is not supported: pods are not watched (no Kubernetes access)")
        if route.name and index is not None and index.labels_of(PODS, route.namespace, route.name) is None:
            raise not_found("pods", route.name)
        answers = await asyncio.gather(*(self._both(s) for s in self._scopes(route, index)))
        if len(answers) == 1:
            cpu, memory = answers[0]
        else:  # one entry per namespace: only for rules that cannot group by namespace
            cpu, memory = Usage(), Usage()
            for scope_cpu, scope_memory in answers:
                cpu.values.update(scope_cpu.values)
                cpu.times.update(scope_cpu.times)
                memory.values.update(scope_memory.values)
                memory.times.update(scope_memory.times)
        now, window = self._clock(), self._rules.window("pods")
        items: list[resource_wire.PodMetrics] = []
        stamps: list[float] = []
        for key in self._pod_names(route, index, cpu):
            namespace, name = key
            if not route.field_selector.matches(fieldselectors.object_fields(name, namespace)):
                continue
            c, m = cpu.values.get(key), memory.values.get(key)
            containers = complete_pod(c, m)
            if containers is None or c is None or m is None:
                continue
            ts = min(cpu.times[key], memory.times[key])
            labels = dict(index.labels_of(PODS, namespace, name) or {}) if index is not None else {}
            meta = resource_wire.object_meta(name, namespace, labels, now)
            rows = [(n, c[n], m[n]) for n in containers]
            items.append(resource_wire.pod_metrics(meta, ts, window, rows))
            stamps.append(ts)
        self._account(stamps)
        if route.name:
            if not items:
                raise not_found("podmetrics.metrics.k8s.io", f"{route.namespace}/{route.name}")
            return resource_wire.top_level_pod(items[0])
        return resource_wire.pod_metrics_list(items)

    def _account(self, timestamps: list[float]) -> None:
        now = self._clock()
        self._metrics.items.labels("resource").inc(len(timestamps))
        for ts in timestamps:
            self._metrics.value_age.labels("resource").observe(max(0.0, now - ts))
