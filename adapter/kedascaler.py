"""KEDA's external-scaler contract as pure decisions: `scalerMetadata` in, a trigger; values in, answers.

Why: KEDA's `external` trigger forwards every key of the ScaledObject's trigger metadata to us in
`ScaledObjectRef.scalerMetadata`, and reads back one number, an HPA target and an activity bit. What those
keys mean, how several series or pods become one number, when the answer is too old to serve and how the
number is written into the wire fields are policy: decided here, table-tested, with no gRPC, no clock read
and no Prometheus. `adapter.kedaserver` is the shell that reads values from the provider (the same grouped
cache the metrics APIs use) and maps `TriggerError`s to gRPC status codes.

The metadata names a metric exactly as our metrics APIs do: `metricName` + `namespace` + `labelSelector`
is the external.metrics.k8s.io request `/namespaces/<ns>/<metricName>?labelSelector=...`; with
`metricKind: custom` (or a preset) it is the custom.metrics.k8s.io request
`/namespaces/<ns>/<resource>/*/<metricName>?labelSelector=...&metricLabelSelector=...`. The route is built
by `adapter.routing`, so names and selectors are validated by the same code, and the provider's cache key
is the one an HPA reading the same metric would use.

Rules this module keeps (reference/keda.md "What this means for gpuwarden"):
- no data, or data older than the cache's `max_age`, is an error, never a 0 (KEDA then applies `fallback`;
  a silent 0 scaled fleets to their minimum in kedacore/keda#3065);
- active means `value > activationThreshold`, strictly, as KEDA's own Prometheus scaler decides;
- both the float fields and the deprecated int64 fields are filled (KEDA before 2.17 reads only the ints);
- unknown metadata keys are errors naming the key, so a typo (`targetvalue`) is not silently a default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast, get_args
from urllib.parse import quote

from adapter import engines, resources, routing
from adapter.errors import BadRequest, NotFound
from adapter.resources import NAMESPACES, ROOT_SCOPED
from adapter.routing import CustomRoute, ExternalRoute
from adapter.wire import CUSTOM_GROUP, EXTERNAL_GROUP

if TYPE_CHECKING:
    from gpuwarden.config.adapter import Presets

Aggregation = Literal["sum", "avg", "max", "min"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
MetricKind = Literal["external", "custom"]

KEDA_KEYS = frozenset({"scalerAddress", "enableTLS", "unsafeSsl"})
"""Keys KEDA's `external` trigger reads itself and forwards too; accepted and ignored here."""

OUR_KEYS = (
    "preset",
    "metricName",
    "metricKind",
    "resource",
    "namespace",
    "labelSelector",
    "metricLabelSelector",
    "aggregation",
    "targetValue",
    "activationThreshold",
)

INT64_MAX = 2**63 - 1
AT_ZERO_HINT = (
    " (a per-object metric has no value while no pod runs: to wake a workload from zero, add a trigger on "
    f"an external metric such as preset: {engines.ROUTER_QUEUE_KEDA})"
)
"""Appended to a custom (per-pod) trigger's NOT_FOUND: what to do for 0 -> 1."""
METRIC_NAME_PREFIX = "gpuwarden-"


class TriggerError(Exception):
    """Why a call cannot be answered; `code` is the gRPC status name the shell answers with."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidMetadata(TriggerError):
    """The trigger's metadata is malformed (INVALID_ARGUMENT); the message names every bad key at once."""

    code = "INVALID_ARGUMENT"


class NoData(TriggerError):
    """The metric exists but nothing matched (NOT_FOUND): never answered as 0."""

    code = "NOT_FOUND"


class StaleData(TriggerError):
    """The newest value is older than allowed (UNAVAILABLE): KEDA's fallback applies, as when Prometheus
    is down."""

    code = "UNAVAILABLE"


@dataclass(frozen=True)
class Preset:
    """What `preset: <name>` stands for: a custom metric on pods, or (`kind: external`) an external metric
    that exists while no pod runs, served by one of our built-in rules."""

    metric: str
    description: str
    kind: MetricKind = "custom"


def keda_presets(presets: Presets) -> dict[str, Preset]:
    """The `preset` values a trigger may name, for the presets enabled in `adapter.presets`."""
    out: dict[str, Preset] = {}
    if presets.gpu_utilization.enabled:
        out["gpu-utilization"] = Preset(
            presets.gpu_utilization.name, "mean GPU utilization per pod, percent (dcgm-exporter)"
        )
    if presets.gpu_memory_used_ratio.enabled:
        out["gpu-memory"] = Preset(
            presets.gpu_memory_used_ratio.name, "GPU framebuffer used ratio per pod, 0-1 (dcgm-exporter)"
        )
    if presets.requests_per_second.enabled:
        out["qps"] = Preset(presets.requests_per_second.name, "requests per second per pod")
    if presets.engines.enabled:
        for metric in engines.catalog(presets.engines.engines):
            out[metric.keda_preset] = Preset(metric.metric, f"{metric.engine} {metric.quantity} per pod")
    if presets.router_queue.enabled:
        out[engines.ROUTER_QUEUE_KEDA] = Preset(
            presets.router_queue.name,
            "requests waiting at the router, external (exists at zero pods)",
            "external",
        )
    return out


@dataclass(frozen=True)
class Trigger:
    """One parsed `external` trigger: which values to read, how to fold them, target and activation."""

    route: ExternalRoute | CustomRoute
    aggregation: Aggregation
    target: float
    activation_threshold: float

    @property
    def kind(self) -> MetricKind:
        return "external" if isinstance(self.route, ExternalRoute) else "custom"

    @property
    def metric_name(self) -> str:
        """The name in MetricSpec / MetricValue (KEDA prefixes it with `s<triggerIndex>-`)."""
        return metric_name_for(self.route.metric)


def metric_name_for(metric: str) -> str:
    """`gpuwarden-<metric>`, with the characters KEDA's NormalizeString replaces (`/ . : %`) made `-`."""
    return METRIC_NAME_PREFIX + re.sub(r"[/.:%]", "-", metric)


def _number(metadata: Mapping[str, str], key: str, problems: list[str], *, default: float | None) -> float:
    raw = metadata.get(key)
    if raw is None or raw.strip() == "":
        if default is None:
            problems.append(f'{key}: required (a number, e.g. {key}: "80")')
            return math.nan
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        problems.append(f"{key}: {raw!r} is not a number")
        return math.nan
    if not math.isfinite(value):
        problems.append(f"{key}: {raw!r} must be a finite number")
    return value


def parse_trigger(
    metadata: Mapping[str, str], scaled_object_namespace: str, presets: Mapping[str, Preset]
) -> Trigger:
    """The trigger `metadata` describes; `InvalidMetadata` naming every problem (all at once) otherwise.

    `namespace` defaults to the ScaledObject's own (KEDA's `ScaledObjectRef.namespace`), as an HPA in that
    namespace would ask. A preset fixes `metricName`, `metricKind: custom` and `resource: pods`.
    """
    problems: list[str] = []
    unknown = sorted(k for k in metadata if k not in OUR_KEYS and k not in KEDA_KEYS)
    for key in unknown:
        problems.append(f"{key}: unknown key (known: {', '.join(OUR_KEYS)})")

    metric = metadata.get("metricName", "").strip()
    kind = metadata.get("metricKind", "").strip()
    resource = metadata.get("resource", "").strip()
    preset_name = metadata.get("preset", "").strip()
    if preset_name:
        preset = presets.get(preset_name)
        if preset is None:
            known = ", ".join(sorted(presets)) or "none enabled"
            problems.append(f"preset: {preset_name!r} is not a preset (known: {known})")
        for key in ("metricName", "metricKind", "resource"):
            if metadata.get(key, "").strip():
                problems.append(f"{key}: not allowed with preset (the preset sets it)")
        if preset is not None and preset.kind == "external":
            metric, kind, resource = preset.metric, "external", ""
        else:
            metric, kind, resource = (preset.metric if preset else "x"), "custom", "pods"
    elif not metric:
        problems.append("metricName: required (or preset: one of " + ", ".join(sorted(presets)) + ")")
    if kind not in ("", "external", "custom"):
        problems.append(f"metricKind: {kind!r} must be external or custom")
    if kind != "custom" and (resource or metadata.get("metricLabelSelector", "").strip()):
        key = "resource" if resource else "metricLabelSelector"
        problems.append(f"{key}: only for metricKind: custom")

    aggregation: Aggregation = "sum"
    raw_aggregation = metadata.get("aggregation", "").strip()
    if raw_aggregation in AGGREGATIONS:
        aggregation = cast(Aggregation, raw_aggregation)
    elif raw_aggregation:
        problems.append(f"aggregation: {raw_aggregation!r} must be one of {', '.join(AGGREGATIONS)}")
    target = _number(metadata, "targetValue", problems, default=None)
    if math.isfinite(target) and target <= 0:
        problems.append(f"targetValue: {target:g} must be greater than 0 (KEDA reads 0 as unset)")
    threshold = _number(metadata, "activationThreshold", problems, default=0.0)

    namespace = metadata.get("namespace", "").strip() or scaled_object_namespace
    route: ExternalRoute | CustomRoute | None = None
    if metric:
        try:
            route = _route(
                kind or "external",
                metric,
                resource or "pods",
                namespace,
                metadata.get("labelSelector", ""),
                metadata.get("metricLabelSelector", ""),
            )
        except (BadRequest, NotFound) as exc:
            problems.append(exc.message)
    if problems or route is None:
        raise InvalidMetadata("invalid scalerMetadata: " + "; ".join(problems))
    return Trigger(route, aggregation, target, threshold)


def _route(
    kind: str, metric: str, resource: str, namespace: str, label_selector: str, metric_selector: str
) -> ExternalRoute | CustomRoute:
    """The metrics-API request this trigger stands for, parsed by the API's own router."""

    def seg(text: str) -> str:
        """One path segment, percent-encoded as a client would send it."""
        return quote(text, safe="")

    if kind == "external":
        if not namespace:
            raise BadRequest("namespace: required for an external metric")
        path = f"/apis/{EXTERNAL_GROUP}/v1beta1/namespaces/{seg(namespace)}/{seg(metric)}"
        route = routing.route(path, {"labelSelector": label_selector})
        assert isinstance(route, ExternalRoute)
        return route
    gr = resources.parse(resource)
    if gr == NAMESPACES:
        raise BadRequest(f"resource: {resource!r} cannot be aggregated over (use pods, nodes or a workload)")
    scope = "" if gr in ROOT_SCOPED else f"namespaces/{seg(namespace)}/"
    path = f"/apis/{CUSTOM_GROUP}/v1beta2/{scope}{seg(resource)}/*/{seg(metric)}"
    route = routing.route(path, {"labelSelector": label_selector, "metricLabelSelector": metric_selector})
    assert isinstance(route, CustomRoute)
    return route


def aggregate(values: Sequence[float], how: Aggregation) -> float:
    """One number from the values of several series or objects (`values` is never empty)."""
    if how == "sum":
        return math.fsum(values)
    if how == "avg":
        return math.fsum(values) / len(values)
    if how == "max":
        return max(values)
    return min(values)


def decide_value(
    points: Sequence[tuple[float, float]], trigger: Trigger, *, now: float, max_age: float
) -> float:
    """The trigger's value from (value, timestamp) points; `NoData` / `StaleData` instead of a made-up 0.

    Non-finite values are dropped first (as the metrics APIs drop them). Staleness is judged on the newest
    timestamp: values evaluated more than `max_age` seconds ago (the cache's limit) are not served.
    """
    finite = [(v, ts) for v, ts in points if math.isfinite(v)]
    if not finite:
        what = f"{trigger.kind} metric {trigger.route.metric!r} in namespace {trigger.route.namespace!r}"
        hint = AT_ZERO_HINT if trigger.kind == "custom" else ""
        raise NoData(f"no value for {what} matching the trigger's selectors{hint}")
    newest = max(ts for _, ts in finite)
    if now - newest > max_age:
        raise StaleData(
            f"the newest value of {trigger.route.metric!r} is {now - newest:.0f}s old (limit {max_age:g}s)"
        )
    return aggregate([v for v, _ in finite], trigger.aggregation)


def is_active(value: float, activation_threshold: float) -> bool:
    """KEDA's activation rule: strictly greater than the threshold (default 0)."""
    return value > activation_threshold


def metric_value_fields(value: float) -> tuple[int, float]:
    """(deprecated int64 `metricValue`, `metricValueFloat`) for `value`.

    KEDA ≥ 2.17 uses the float when it is > 0 and the int otherwise; older KEDA reads only the int. The int
    is the value rounded half up, clamped to [0, int64 max] (KEDA turns negatives into 0 anyway), so both
    readers see the same number up to rounding and a 0 stays 0 on both paths.
    """
    rounded = math.floor(value + 0.5) if value > 0 else 0
    return min(rounded, INT64_MAX), value


def target_fields(target: float) -> tuple[int, float]:
    """(deprecated int64 `targetSize`, `targetSizeFloat`): the int rounded, but at least 1, because a
    target of 0 means "unset" to KEDA and would divide by zero in an old HPA."""
    return max(1, min(math.floor(target + 0.5), INT64_MAX)), target
