"""Request routing for the metrics APIs: a raw URL path and query string in, a typed request out.

Why pure and separate: the route table is the API contract (metrics-api.md §1.2-§1.4 and
custom-metrics-apiserver's conformance cases) and deserves a table test of its own, independent of aiohttp.
Segments are split on the *raw* path and percent-decoded one by one, so `%2A` is `*` and an encoded `/`
cannot forge an extra segment. Unknown shapes are 404 (as the Go mux answers); known shapes with invalid
names or selectors are 400 naming the problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from adapter import fieldselectors, resources, selectors
from adapter.errors import BadRequest, NotFound
from adapter.resource_wire import METRICS_GROUP, METRICS_VERSIONS
from adapter.resources import NAMESPACES, GroupResource
from adapter.wire import CUSTOM_GROUP, CUSTOM_VERSIONS, EXTERNAL_GROUP, EXTERNAL_VERSIONS, CustomVersion

WILDCARD = "*"
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_OBJECT_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.:]*[A-Za-z0-9])?\Z")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")


@dataclass(frozen=True)
class DiscoveryRoute:
    """`/apis`, `/apis/<group>` or `/apis/<group>/<version>`."""

    group: str = ""
    version: str = ""


@dataclass(frozen=True)
class CustomRoute:
    """A custom.metrics.k8s.io value request; `namespace` is "" for root-scoped objects."""

    version: CustomVersion
    resource: GroupResource
    namespace: str
    name: str
    metric: str
    label_selector: selectors.Selector
    metric_selector: selectors.Selector

    @property
    def template(self) -> str:
        """Low-cardinality route name for self-metrics."""
        if self.resource == NAMESPACES and not self.namespace:
            return "custom_namespace_metric"
        return "custom_wildcard" if self.name == WILDCARD else "custom_object"


@dataclass(frozen=True)
class ExternalRoute:
    """An external.metrics.k8s.io value request."""

    namespace: str
    metric: str
    selector: selectors.Selector
    template: Literal["external"] = "external"


@dataclass(frozen=True)
class ResourceRoute:
    """A metrics.k8s.io request: NodeMetrics or PodMetrics, one by `name` or a list ("" name).

    `namespace` is "" for nodes and for the all-namespaces pod list.
    """

    kind: Literal["nodes", "pods"]
    namespace: str
    name: str
    label_selector: selectors.Selector
    field_selector: fieldselectors.FieldSelector

    @property
    def template(self) -> str:
        if self.kind == "nodes":
            return "resource_node" if self.name else "resource_nodes"
        if self.name:
            return "resource_pod"
        return "resource_namespace_pods" if self.namespace else "resource_pods"


Route = DiscoveryRoute | CustomRoute | ExternalRoute | ResourceRoute


def _namespace(value: str) -> str:
    if len(value) > 63 or not _NAMESPACE.match(value):
        raise BadRequest(
            f"invalid namespace {value!r}: must be a DNS label (lower-case alphanumeric and '-')"
        )
    return value


def _object_name(value: str) -> str:
    if value != WILDCARD and (len(value) > 253 or not _OBJECT_NAME.match(value)):
        raise BadRequest(f"invalid object name {value!r}")
    return value


def _metric(value: str) -> str:
    if not value or value in (".", "..") or any(c in value for c in "%/?") or not value.isprintable():
        raise BadRequest(
            f"invalid metric name {value!r}: may not contain '%', '/' or '?', nor be '.' or '..'"
        )
    return value


def _resource(value: str) -> GroupResource:
    if not _RESOURCE.match(value):
        raise BadRequest(f"invalid resource {value!r}: expected <resource> or <resource>.<group>")
    return resources.parse(value)


def _selector(query: Mapping[str, str], param: str) -> selectors.Selector:
    try:
        return selectors.parse(query.get(param, ""))
    except selectors.SelectorError as exc:
        raise BadRequest(f"{param}: {exc}") from None


def _field_selector(query: Mapping[str, str]) -> fieldselectors.FieldSelector:
    try:
        return fieldselectors.parse(query.get("fieldSelector", ""))
    except fieldselectors.FieldSelectorError as exc:
        raise BadRequest(f"fieldSelector: {exc}") from None


def _resource_metrics(parts: list[str], query: Mapping[str, str]) -> ResourceRoute:
    """`nodes[/name]`, `pods`, `namespaces/<ns>/pods[/name]` (metrics-server's routes)."""
    namespace = ""
    if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == "pods":
        namespace, parts = _namespace(parts[1]), parts[2:]
    if not parts or parts[0] not in ("nodes", "pods") or len(parts) > 2:
        raise NotFound("the server could not find the requested resource")
    kind: Literal["nodes", "pods"] = "nodes" if parts[0] == "nodes" else "pods"
    if kind == "pods" and len(parts) == 2 and not namespace:
        raise NotFound("the server could not find the requested resource")
    name = _object_name(parts[1]) if len(parts) == 2 else ""
    if name == WILDCARD:
        raise BadRequest(f"invalid object name {name!r}")
    return ResourceRoute(kind, namespace, name, _selector(query, "labelSelector"), _field_selector(query))


def _custom(version: CustomVersion, parts: list[str], query: Mapping[str, str]) -> CustomRoute:
    if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "metrics":
        ns, metric = _namespace(parts[1]), _metric(parts[3])
        return CustomRoute(
            version, NAMESPACES, "", ns, metric, selectors.EVERYTHING, _selector(query, "metricLabelSelector")
        )
    if len(parts) == 5 and parts[0] == "namespaces":
        namespace, resource, name, metric = _namespace(parts[1]), parts[2], parts[3], parts[4]
    elif len(parts) == 3:
        namespace, resource, name, metric = "", parts[0], parts[1], parts[2]
    else:
        raise NotFound("the server could not find the requested resource")
    gr = _resource(resource)
    name = _object_name(name)
    if gr == NAMESPACES and not namespace and name == WILDCARD:
        raise BadRequest("cannot fetch metrics for multiple namespaces at once")
    return CustomRoute(
        version,
        gr,
        namespace,
        name,
        _metric(metric),
        _selector(query, "labelSelector"),
        _selector(query, "metricLabelSelector"),
    )


def route(raw_path: str, query: Mapping[str, str]) -> Route:
    """Route `raw_path` (still percent-encoded) with its decoded query parameters."""
    path = raw_path.split("?", 1)[0]
    if path.endswith("/") and path != "/":
        path = path[:-1]
    parts = [unquote(p) for p in path.split("/")[1:]] if path.startswith("/") else []
    if not parts or parts[0] != "apis" or any(p == "" for p in parts):
        raise NotFound("the server could not find the requested resource")
    if len(parts) == 1:
        return DiscoveryRoute()
    group, rest = parts[1], parts[2:]
    versions = {
        CUSTOM_GROUP: CUSTOM_VERSIONS,
        EXTERNAL_GROUP: EXTERNAL_VERSIONS,
        METRICS_GROUP: METRICS_VERSIONS,
    }.get(group)
    if versions is None or (rest and rest[0] not in versions):
        raise NotFound("the server could not find the requested resource")
    if len(rest) <= 1:
        return DiscoveryRoute(group, rest[0] if rest else "")
    version, parts = rest[0], rest[1:]
    if group == METRICS_GROUP:
        return _resource_metrics(parts, query)
    if group == CUSTOM_GROUP:
        return _custom("v1beta1" if version == "v1beta1" else "v1beta2", parts, query)
    if len(parts) == 3 and parts[0] == "namespaces":
        return ExternalRoute(_namespace(parts[1]), _metric(parts[2]), _selector(query, "labelSelector"))
    raise NotFound("the server could not find the requested resource")
