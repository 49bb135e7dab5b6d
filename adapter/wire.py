"""Wire formats of the custom and external metrics APIs, named after their upstream Go types.

Why this module exists: the HPA's decoder is strict about `kind`, `apiVersion` and field names, and the two
custom-metrics versions spell the same thing differently (v1beta1 `metricName`/`window`, v1beta2
`metric.name`/`windowSeconds`). Everything that goes on the wire is built here, from plain values, by pure
functions, so golden-file tests pin the exact bytes. Values are canonical Kubernetes Quantity strings and
times are RFC 3339 in UTC, as `resource.Quantity` and `metav1.Time` marshal them.

This module must not know about Prometheus, aiohttp or the registry.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal, NotRequired, TypedDict

CUSTOM_GROUP = "custom.metrics.k8s.io"
EXTERNAL_GROUP = "external.metrics.k8s.io"
CUSTOM_VERSIONS = ("v1beta2", "v1beta1")  # preferred first, as the legacy APIGroupList shows them
EXTERNAL_VERSIONS = ("v1beta1",)

CustomVersion = Literal["v1beta1", "v1beta2"]

_INT64_MAX = 2**63 - 1
_MILLI = Decimal("0.001")
_SUFFIXES = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


# --- scalar formats ---------------------------------------------------------------------------------------


def format_quantity(value: float) -> str:
    """Canonical DecimalSI Quantity for `value`, rounded half-up to milli precision (3 decimals).

    Canonical as apimachinery emits it: no fractional digits, the largest suffix that loses nothing
    (1.5 -> "1500m", 3000 -> "3k", 0 -> "0"). Magnitudes beyond int64 are clamped, as Quantity cannot hold
    them. NaN and ±Inf have no Quantity: callers must drop them before they get here (ValueError).
    """
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{value} cannot be represented as a Kubernetes Quantity")
    if -_EXACT < value < _EXACT and value == int(value):
        return _format_integer(int(value))
    return _format_decimal(value)


_EXACT = 2.0**53
"""Below this magnitude an integral float is an exact int: formatted without Decimal (the common GPU-percent
and count values; ~6x cheaper, and every answer formats one per object)."""


def _format_integer(number: int) -> str:
    """`format_quantity` of an integral value (the Decimal path's result for it, tested so)."""
    if number == 0:
        return "0"
    mantissa, exponent = abs(number), 0
    while mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    return f"{'-' if number < 0 else ''}{mantissa}{_SUFFIXES[exponent]}"


def _format_decimal(value: float) -> str:
    dec = Decimal(repr(value))
    if abs(dec) > _INT64_MAX:
        dec = Decimal(_INT64_MAX).copy_sign(dec)
    dec = dec.quantize(_MILLI, rounding=ROUND_HALF_UP)
    if dec.is_zero():
        return "0"
    sign, digits, exponent = dec.as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3  # Python's modulo is non-negative, matching Go's two-case switch on exp%3
    mantissa *= 10**shift
    exponent -= shift
    return f"{'-' if sign else ''}{mantissa}{_SUFFIXES[exponent]}"


@functools.lru_cache(maxsize=256)
def format_time(timestamp: float) -> str:
    """RFC 3339 in UTC with whole seconds, exactly as Go's `metav1.Time` marshals.

    Memoized: the objects of one answer share a handful of timestamps (`adapter.compact.Stamps`), and
    strftime per object was a tenth of a request's CPU."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- shared metav1 / core types ---------------------------------------------------------------------------


class ListMeta(TypedDict, total=False):
    """metav1.ListMeta; every field is omitempty, so it usually serializes as `{}`."""

    selfLink: str
    resourceVersion: str


class ObjectReference(TypedDict, total=False):
    """core/v1 ObjectReference as used for `describedObject` (all fields omitempty)."""

    kind: str
    namespace: str
    name: str
    apiVersion: str


class LabelSelectorRequirement(TypedDict):
    """metav1.LabelSelectorRequirement."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: NotRequired[list[str]]


class LabelSelector(TypedDict, total=False):
    """metav1.LabelSelector."""

    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirement]


# --- custom.metrics.k8s.io ---------------------------------------------------------------------------------


class MetricIdentifier(TypedDict):
    """v1beta2 MetricIdentifier; `selector` has no omitempty, so it is `null` when absent."""

    name: str
    selector: LabelSelector | None


class MetricValueV1Beta1(TypedDict):
    """custom_metrics/v1beta1 MetricValue."""

    describedObject: ObjectReference
    metricName: str
    timestamp: str
    window: NotRequired[int]
    value: str
    selector: LabelSelector | None


class MetricValueV1Beta2(TypedDict):
    """custom_metrics/v1beta2 MetricValue."""

    describedObject: ObjectReference
    metric: MetricIdentifier
    timestamp: str
    windowSeconds: NotRequired[int]
    value: str


class MetricValueList(TypedDict):
    """custom_metrics MetricValueList, either version."""

    kind: Literal["MetricValueList"]
    apiVersion: str
    metadata: ListMeta
    items: list[MetricValueV1Beta1] | list[MetricValueV1Beta2]


def metric_value_list(
    version: CustomVersion,
    metric: str,
    selector: LabelSelector | None,
    objects: list[tuple[ObjectReference, float, float]],
    window_seconds: int | None,
) -> MetricValueList:
    """A MetricValueList for `objects` = [(describedObject, value, timestamp)], values already finite."""
    if version == "v1beta1":
        items1: list[MetricValueV1Beta1] = []
        for ref, value, ts in objects:
            item1 = MetricValueV1Beta1(
                describedObject=ref,
                metricName=metric,
                timestamp=format_time(ts),
                value=format_quantity(value),
                selector=selector,
            )
            if window_seconds is not None:
                item1["window"] = window_seconds
            items1.append(item1)
        return {
            "kind": "MetricValueList",
            "apiVersion": f"{CUSTOM_GROUP}/v1beta1",
            "metadata": {},
            "items": items1,
        }
    items2: list[MetricValueV1Beta2] = []
    for ref, value, ts in objects:
        item2 = MetricValueV1Beta2(
            describedObject=ref,
            metric={"name": metric, "selector": selector},
            timestamp=format_time(ts),
            value=format_quantity(value),
        )
        if window_seconds is not None:
            item2["windowSeconds"] = window_seconds
        items2.append(item2)
    return {
        "kind": "MetricValueList",
        "apiVersion": f"{CUSTOM_GROUP}/v1beta2",
        "metadata": {},
        "items": items2,
    }


# --- external.metrics.k8s.io -------------------------------------------------------------------------------


class ExternalMetricValue(TypedDict):
    """external_metrics/v1beta1 ExternalMetricValue; `metricLabels` has no omitempty."""

    metricName: str
    metricLabels: dict[str, str] | None
    timestamp: str
    window: NotRequired[int]
    value: str


class ExternalMetricValueList(TypedDict):
    """external_metrics/v1beta1 ExternalMetricValueList."""

    kind: Literal["ExternalMetricValueList"]
    apiVersion: str
    metadata: ListMeta
    items: list[ExternalMetricValue]


def external_metric_value_list(
    metric: str, samples: list[tuple[dict[str, str], float, float]], window_seconds: int | None
) -> ExternalMetricValueList:
    """An ExternalMetricValueList for `samples` = [(labels, value, timestamp)], values already finite."""
    items: list[ExternalMetricValue] = []
    for labels, value, ts in samples:
        item = ExternalMetricValue(
            metricName=metric,
            metricLabels=labels or None,
            timestamp=format_time(ts),
            value=format_quantity(value),
        )
        if window_seconds is not None:
            item["window"] = window_seconds
        items.append(item)
    return {
        "kind": "ExternalMetricValueList",
        "apiVersion": f"{EXTERNAL_GROUP}/v1beta1",
        "metadata": {},
        "items": items,
    }


# --- discovery ---------------------------------------------------------------------------------------------


class APIResource(TypedDict):
    """metav1.APIResource as custom-metrics-apiserver fills it."""

    name: str
    singularName: str
    namespaced: bool
    kind: str
    verbs: list[str]


class APIResourceList(TypedDict):
    """metav1.APIResourceList; 200 with `resources: []` when nothing is known yet."""

    kind: Literal["APIResourceList"]
    apiVersion: Literal["v1"]
    groupVersion: str
    resources: list[APIResource]


class GroupVersionForDiscovery(TypedDict):
    """metav1.GroupVersionForDiscovery."""

    groupVersion: str
    version: str


class APIGroup(TypedDict):
    """metav1.APIGroup (`kind`/`apiVersion` present at top level, absent inside an APIGroupList)."""

    kind: NotRequired[Literal["APIGroup"]]
    apiVersion: NotRequired[Literal["v1"]]
    name: str
    versions: list[GroupVersionForDiscovery]
    preferredVersion: GroupVersionForDiscovery


class APIGroupList(TypedDict):
    """metav1.APIGroupList, the legacy `/apis` document."""

    kind: Literal["APIGroupList"]
    apiVersion: Literal["v1"]
    groups: list[APIGroup]


def api_group(group: str, versions: tuple[str, ...], *, top_level: bool) -> APIGroup:
    """The APIGroup for `group`; the first version is the preferred one."""
    gvs = [GroupVersionForDiscovery(groupVersion=f"{group}/{v}", version=v) for v in versions]
    doc = APIGroup(name=group, versions=gvs, preferredVersion=gvs[0])
    if top_level:
        return {"kind": "APIGroup", "apiVersion": "v1", **doc}
    return doc


def api_group_list(groups: list[tuple[str, tuple[str, ...]]]) -> APIGroupList:
    """The legacy `/apis` discovery document."""
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [api_group(g, vs, top_level=False) for g, vs in groups],
    }


def api_resource_list(group_version: str, resources: list[tuple[str, bool, str]]) -> APIResourceList:
    """An APIResourceList from [(name, namespaced, kind)], sorted by name for stable output."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            APIResource(name=name, singularName="", namespaced=namespaced, kind=kind, verbs=["get"])
            for name, namespaced, kind in sorted(resources)
        ],
    }


# --- errors ------------------------------------------------------------------------------------------------

StatusReason = Literal[
    "BadRequest",
    "NotFound",
    "Unauthorized",
    "Forbidden",
    "MethodNotAllowed",
    "InternalError",
    "ServiceUnavailable",
    "Timeout",
]


class StatusCause(TypedDict):
    """metav1.StatusCause (message only)."""

    message: str


class StatusDetails(TypedDict, total=False):
    """metav1.StatusDetails (subset)."""

    name: str
    group: str
    kind: str
    causes: list[StatusCause]
    retryAfterSeconds: int


class Status(TypedDict):
    """metav1.Status, the body of every error response."""

    kind: Literal["Status"]
    apiVersion: Literal["v1"]
    metadata: ListMeta
    status: Literal["Failure", "Success"]
    message: str
    reason: StatusReason
    code: int
    details: NotRequired[StatusDetails]


def status(code: int, reason: StatusReason, message: str, *, retry_after: int | None = None) -> Status:
    """A Failure Status; `retry_after` (seconds) goes into `details.retryAfterSeconds`."""
    doc = Status(
        kind="Status",
        apiVersion="v1",
        metadata={},
        status="Failure",
        message=message,
        reason=reason,
        code=code,
    )
    if retry_after is not None:
        doc["details"] = {"retryAfterSeconds": retry_after}
    return doc


def not_found_status(message: str, details: StatusDetails) -> Status:
    """A 404 NotFound Status naming the object (apimachinery's NewNotFound)."""
    doc = status(404, "NotFound", message)
    doc["details"] = details
    return doc
