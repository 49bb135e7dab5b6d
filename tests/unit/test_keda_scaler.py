"""The KEDA external scaler's pure core (`adapter.kedascaler`): metadata, values, activation, wire fields."""

from __future__ import annotations

import math
import re

import pytest

from adapter.kedascaler import (
    INT64_MAX,
    InvalidMetadata,
    NoData,
    Preset,
    StaleData,
    Trigger,
    decide_value,
    is_active,
    keda_presets,
    metric_name_for,
    metric_value_fields,
    parse_trigger,
    target_fields,
)
from adapter.resources import GroupResource
from adapter.routing import CustomRoute, ExternalRoute
from gpuwarden.config.adapter import Presets

PRESETS = keda_presets(Presets())


def route_of(t: Trigger) -> tuple[object, ...]:
    """(kind, metric, namespace, resource, labelSelector, metricLabelSelector) of a parsed trigger."""
    r = t.route
    if isinstance(r, ExternalRoute):
        return ("external", r.metric, r.namespace, None, str(r.selector), "")
    assert isinstance(r, CustomRoute)
    return ("custom", r.metric, r.namespace, str(r.resource), str(r.label_selector), str(r.metric_selector))


@pytest.mark.parametrize(
    ("metadata", "expected_route", "aggregation", "target", "threshold"),
    [
        pytest.param(
            {"metricName": "queue_depth", "targetValue": "10"},
            ("external", "queue_depth", "ml", None, "", ""),
            "sum",
            10.0,
            0.0,
            id="external-minimal-namespace-from-scaledobject",
        ),
        pytest.param(
            {
                "metricName": "queue_depth",
                "namespace": "prod",
                "labelSelector": "queue in (a,b),tier!=batch",
                "targetValue": "2.5",
                "activationThreshold": "0.5",
                "aggregation": "max",
                "scalerAddress": "gpuwarden-keda.gpuwarden:6000",
                "enableTLS": "true",
                "unsafeSsl": "false",
            },
            ("external", "queue_depth", "prod", None, "queue in (a,b),tier!=batch", ""),
            "max",
            2.5,
            0.5,
            id="external-everything-keda-keys-accepted",
        ),
        pytest.param(
            {
                "metricName": "gpu_utilization",
                "metricKind": "custom",
                "labelSelector": "app=llm",
                "metricLabelSelector": "modelName=A100",
                "targetValue": "70",
                "aggregation": "avg",
            },
            ("custom", "gpu_utilization", "ml", "pods", "app=llm", "modelName=A100"),
            "avg",
            70.0,
            0.0,
            id="custom-pods-default-resource",
        ),
        pytest.param(
            {
                "metricName": "gpu_utilization",
                "metricKind": "custom",
                "resource": "nodes",
                "labelSelector": "pool=a100",
                "targetValue": "50",
            },
            ("custom", "gpu_utilization", "", "nodes", "pool=a100", ""),
            "sum",
            50.0,
            0.0,
            id="custom-nodes-root-scoped-no-namespace",
        ),
        pytest.param(
            {"metricName": "m", "metricKind": "custom", "resource": "deployments.apps", "targetValue": "1"},
            ("custom", "m", "ml", "deployments.apps", "", ""),
            "sum",
            1.0,
            0.0,
            id="custom-grouped-resource",
        ),
        pytest.param(
            {"preset": "gpu-utilization", "labelSelector": "app=llm", "targetValue": "80"},
            ("custom", "gpu_utilization", "ml", "pods", "app=llm", ""),
            "sum",
            80.0,
            0.0,
            id="preset-gpu-utilization",
        ),
        pytest.param(
            {"preset": "qps", "targetValue": "100", "activationThreshold": "1"},
            ("custom", "requests_per_second", "ml", "pods", "", ""),
            "sum",
            100.0,
            1.0,
            id="preset-qps",
        ),
        pytest.param(
            {"preset": "gpu-memory", "targetValue": "0.8", "aggregation": "max", "namespace": "other"},
            ("custom", "gpu_memory_used_ratio", "other", "pods", "", ""),
            "max",
            0.8,
            0.0,
            id="preset-gpu-memory-other-namespace",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": " 3 ", "activationThreshold": "", "aggregation": ""},
            ("external", "q", "ml", None, "", ""),
            "sum",
            3.0,
            0.0,
            id="blank-optional-values-are-defaults",
        ),
    ],
)
def test_parse_trigger(
    metadata: dict[str, str],
    expected_route: tuple[object, ...],
    aggregation: str,
    target: float,
    threshold: float,
) -> None:
    trigger = parse_trigger(metadata, "ml", PRESETS)
    assert route_of(trigger) == expected_route
    assert (trigger.aggregation, trigger.target, trigger.activation_threshold) == (
        aggregation,
        target,
        threshold,
    )


@pytest.mark.parametrize(
    ("metadata", "messages"),
    [
        pytest.param({"targetValue": "1"}, ["metricName: required"], id="no-metric"),
        pytest.param({"metricName": "q"}, ["targetValue: required"], id="no-target"),
        pytest.param({"metricName": "q", "targetValue": "0"}, ["must be greater than 0"], id="zero-target"),
        pytest.param({"metricName": "q", "targetValue": "-5"}, ["must be greater than 0"], id="negative"),
        pytest.param({"metricName": "q", "targetValue": "ten"}, ["'ten' is not a number"], id="nan-target"),
        pytest.param({"metricName": "q", "targetValue": "inf"}, ["must be a finite number"], id="inf-target"),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "activationThreshold": "x"},
            ["activationThreshold: 'x' is not a number"],
            id="bad-threshold",
        ),
        pytest.param(
            {"metricName": "q", "targetvalue": "1"},
            ["targetvalue: unknown key", "targetValue: required"],
            id="typo-is-unknown-not-default",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "aggregation": "median"},
            ["aggregation: 'median' must be one of sum, avg, max, min"],
            id="bad-aggregation",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "metricKind": "object"},
            ["metricKind: 'object' must be external or custom"],
            id="bad-kind",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "resource": "pods"},
            ["resource: only for metricKind: custom"],
            id="resource-on-external",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "metricLabelSelector": "a=b"},
            ["metricLabelSelector: only for metricKind: custom"],
            id="metric-selector-on-external",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "labelSelector": "a in ("},
            ["labelSelector:"],
            id="bad-selector",
        ),
        pytest.param(
            {"metricName": "q", "targetValue": "1", "namespace": "Not_A_Label"},
            ["invalid namespace 'Not_A_Label'"],
            id="bad-namespace",
        ),
        pytest.param(
            {"metricName": "a/b", "targetValue": "1"}, ["invalid metric name 'a/b'"], id="bad-metric-name"
        ),
        pytest.param(
            {"metricName": "m", "metricKind": "custom", "resource": "namespaces", "targetValue": "1"},
            ["resource: 'namespaces' cannot be aggregated over"],
            id="namespaces-resource",
        ),
        pytest.param(
            {"preset": "gpu", "targetValue": "1"},
            ["preset: 'gpu' is not a preset (known: gpu-memory, gpu-utilization, qps, router-queue, sglang-"],
            id="unknown-preset",
        ),
        pytest.param(
            {"preset": "qps", "metricName": "x", "resource": "nodes", "targetValue": "1"},
            ["metricName: not allowed with preset", "resource: not allowed with preset"],
            id="preset-with-its-own-keys",
        ),
        pytest.param(
            {"bogus": "1", "other": "2", "aggregation": "mean"},
            ["bogus: unknown key", "other: unknown key", "metricName: required", "aggregation: 'mean'"],
            id="every-problem-at-once",
        ),
    ],
)
def test_parse_trigger_rejects(metadata: dict[str, str], messages: list[str]) -> None:
    with pytest.raises(InvalidMetadata) as caught:
        parse_trigger(metadata, "ml", PRESETS)
    assert caught.value.code == "INVALID_ARGUMENT"
    for message in messages:
        assert message in caught.value.message


def test_external_metric_needs_a_namespace_somewhere() -> None:
    with pytest.raises(InvalidMetadata, match="namespace: required"):
        parse_trigger({"metricName": "q", "targetValue": "1"}, "", PRESETS)


def test_disabled_presets_are_not_offered() -> None:
    presets = Presets.model_validate(
        {
            "gpu_memory_used_ratio": {"enabled": False},
            "gpu_utilization": {"name": "gu"},
            "engines": {"enabled": False},
            "router_queue": {"enabled": False},
        }
    )
    assert keda_presets(presets) == {
        "gpu-utilization": Preset("gu", "mean GPU utilization per pod, percent (dcgm-exporter)"),
        "qps": Preset("requests_per_second", "requests per second per pod"),
    }
    with pytest.raises(InvalidMetadata, match=r"known: gpu-utilization, qps"):
        parse_trigger({"preset": "gpu-memory", "targetValue": "1"}, "ml", keda_presets(presets))


def trigger(aggregation: str = "sum") -> Trigger:
    return parse_trigger({"metricName": "q", "targetValue": "1", "aggregation": aggregation}, "ml", PRESETS)


NOW, MAX_AGE = 1000.0, 60.0


@pytest.mark.parametrize(
    ("points", "aggregation", "expected"),
    [
        pytest.param([(1.0, NOW), (2.0, NOW), (4.5, NOW)], "sum", 7.5, id="sum"),
        pytest.param([(1.0, NOW), (2.0, NOW), (4.5, NOW)], "avg", 2.5, id="avg"),
        pytest.param([(1.0, NOW), (2.0, NOW), (4.5, NOW)], "max", 4.5, id="max"),
        pytest.param([(1.0, NOW), (2.0, NOW), (4.5, NOW)], "min", 1.0, id="min"),
        pytest.param([(0.0, NOW)], "sum", 0.0, id="a-real-zero-is-served"),
        pytest.param([(math.nan, NOW), (3.0, NOW), (math.inf, NOW)], "avg", 3.0, id="non-finite-dropped"),
        pytest.param([(3.0, NOW - MAX_AGE)], "sum", 3.0, id="exactly-max-age-is-fresh"),
        pytest.param([(3.0, NOW - 500), (4.0, NOW - 1)], "sum", 7.0, id="newest-timestamp-counts"),
        pytest.param([(0.1, NOW)] * 10, "sum", 1.0, id="fsum-exact"),
    ],
)
def test_decide_value(points: list[tuple[float, float]], aggregation: str, expected: float) -> None:
    assert decide_value(points, trigger(aggregation), now=NOW, max_age=MAX_AGE) == expected


@pytest.mark.parametrize(
    ("points", "error", "message"),
    [
        pytest.param([], NoData, "no value for external metric 'q' in namespace 'ml'", id="empty"),
        pytest.param([(math.nan, NOW), (-math.inf, NOW)], NoData, "no value", id="only-non-finite"),
        pytest.param([(3.0, NOW - 61)], StaleData, "is 61s old (limit 60s)", id="stale"),
    ],
)
def test_decide_value_never_makes_up_a_zero(
    points: list[tuple[float, float]], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        decide_value(points, trigger(), now=NOW, max_age=MAX_AGE)


def test_error_codes() -> None:
    assert (NoData("x").code, StaleData("x").code, InvalidMetadata("x").code) == (
        "NOT_FOUND",
        "UNAVAILABLE",
        "INVALID_ARGUMENT",
    )


@pytest.mark.parametrize(
    ("value", "threshold", "active"),
    [
        pytest.param(0.0, 0.0, False, id="zero-at-default-threshold"),
        pytest.param(0.001, 0.0, True, id="anything-above-zero"),
        pytest.param(5.0, 5.0, False, id="equal-is-not-active-strict"),
        pytest.param(5.1, 5.0, True, id="above"),
        pytest.param(-1.0, -2.0, True, id="negative-threshold"),
    ],
)
def test_is_active(value: float, threshold: float, active: bool) -> None:
    assert is_active(value, threshold) is active


@pytest.mark.parametrize(
    ("value", "fields"),
    [
        pytest.param(0.0, (0, 0.0), id="zero-both-zero"),
        pytest.param(2.5, (3, 2.5), id="half-up"),
        pytest.param(2.4999, (2, 2.4999), id="round-down"),
        pytest.param(0.3, (0, 0.3), id="small-float-kept-int-zero"),
        pytest.param(-3.0, (0, -3.0), id="negative-int-clamped"),
        pytest.param(1e30, (INT64_MAX, 1e30), id="int-clamped-to-int64"),
        pytest.param(123456.789, (123457, 123456.789), id="large"),
    ],
)
def test_metric_value_fields(value: float, fields: tuple[int, float]) -> None:
    assert metric_value_fields(value) == fields


@pytest.mark.parametrize(
    ("target", "fields"),
    [
        pytest.param(80.0, (80, 80.0), id="whole"),
        pytest.param(1.5, (2, 1.5), id="half-up"),
        pytest.param(0.2, (1, 0.2), id="below-one-int-is-one-never-zero"),
        pytest.param(1e30, (INT64_MAX, 1e30), id="clamped"),
    ],
)
def test_target_fields(target: float, fields: tuple[int, float]) -> None:
    assert target_fields(target) == fields


@pytest.mark.parametrize(
    ("metric", "name"),
    [
        pytest.param("gpu_utilization", "gpuwarden-gpu_utilization", id="plain"),
        pytest.param("a.b:c%d", "gpuwarden-a-b-c-d", id="keda-normalized-characters"),
    ],
)
def test_metric_name_for(metric: str, name: str) -> None:
    assert metric_name_for(metric) == name


def test_trigger_kind_and_name() -> None:
    t = parse_trigger({"preset": "gpu-utilization", "targetValue": "1"}, "ml", PRESETS)
    assert (t.kind, t.metric_name) == ("custom", "gpuwarden-gpu_utilization")
    assert isinstance(t.route, CustomRoute) and t.route.resource == GroupResource("pods")
