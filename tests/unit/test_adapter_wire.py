"""Wire formats: canonical Quantity strings, RFC 3339 times, and every document against its golden JSON file.

Golden files live in tests/unit/golden/adapter/. Regenerate after an intended change with
`GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_adapter_wire.py` and review the diff.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from adapter import wire

GOLDEN = Path(__file__).parent / "golden" / "adapter"
T = 1787220000.0  # 2026-08-20T10:00:00Z


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(0, "0", id="zero"),
        pytest.param(-0.0, "0", id="negative-zero"),
        pytest.param(0.001, "1m", id="one-milli"),
        pytest.param(0.016, "16m", id="walkthrough-16m"),
        pytest.param(0.08, "80m", id="80m"),
        pytest.param(0.5, "500m", id="half"),
        pytest.param(1, "1", id="one"),
        pytest.param(1.08, "1080m", id="1.08"),
        pytest.param(1.5, "1500m", id="doc-comment-1.5"),
        pytest.param(10.5, "10500m", id="walkthrough-10.5"),
        pytest.param(73.5, "73500m", id="gpu-percent"),
        pytest.param(100, "100", id="hundred"),
        pytest.param(1234, "1234", id="1234"),
        pytest.param(1500, "1500", id="1500-not-1.5k"),
        pytest.param(3000, "3k", id="3k"),
        pytest.param(1e9, "1G", id="giga"),
        pytest.param(300e6, "300M", id="300M"),
        pytest.param(1e18, "1E", id="exa"),
        pytest.param(-1.5, "-1500m", id="negative"),
        pytest.param(0.0005, "1m", id="half-milli-rounds-up"),
        pytest.param(0.0004, "0", id="below-half-milli"),
        pytest.param(2.0004999, "2", id="rounds-to-whole"),
        pytest.param(27.833333333333332, "27833m", id="repeating-decimal"),
        pytest.param(1e30, "9223372036854775807", id="clamped-to-int64"),
        pytest.param(-1e30, "-9223372036854775807", id="clamped-negative"),
    ],
)
def test_format_quantity_is_canonical(value: float, expected: str) -> None:
    assert wire.format_quantity(value) == expected


@pytest.mark.parametrize(
    "value",
    [0, 1, 7, 10, 99, 100, 1000, 1500, 3000, 12000, 10**6, 2 * 10**9, 4096, 10**15, 2**53 - 1, 9 * 10**15],
)
@pytest.mark.parametrize("sign", [1, -1])
def test_integral_values_format_as_the_decimal_path_does(value: int, sign: int) -> None:
    number = float(sign * value)
    assert wire.format_quantity(number) == wire._format_decimal(number)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
def test_non_finite_values_have_no_quantity(value: float) -> None:
    with pytest.raises(ValueError, match="cannot be represented"):
        wire.format_quantity(value)


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        pytest.param(T, "2026-08-20T10:00:00Z", id="whole-second"),
        pytest.param(T + 0.999, "2026-08-20T10:00:00Z", id="fraction-truncated-like-go"),
        pytest.param(0, "1970-01-01T00:00:00Z", id="epoch"),
    ],
)
def test_format_time_rfc3339_utc(ts: float, expected: str) -> None:
    assert wire.format_time(ts) == expected


POD = wire.ObjectReference(kind="Pod", namespace="ml", name="llm-7d9f-abcde", apiVersion="v1")
SELECTOR: wire.LabelSelector = {"matchLabels": {"code": "200"}}

DOCUMENTS: dict[str, Any] = {
    "metric_value_list_v1beta1": wire.metric_value_list(
        "v1beta1", "gpu_utilization", None, [(POD, 73.5, T)], None
    ),
    "metric_value_list_v1beta2": wire.metric_value_list(
        "v1beta2", "gpu_utilization", None, [(POD, 73.5, T)], None
    ),
    "metric_value_list_v1beta1_window_selector": wire.metric_value_list(
        "v1beta1", "requests_per_second", SELECTOR, [(POD, 2.2, T)], 120
    ),
    "metric_value_list_v1beta2_window_selector": wire.metric_value_list(
        "v1beta2", "requests_per_second", SELECTOR, [(POD, 2.2, T)], 120
    ),
    "metric_value_list_empty": wire.metric_value_list("v1beta2", "gpu_utilization", None, [], None),
    "external_metric_value_list": wire.external_metric_value_list(
        "queue_depth", [({"queue": "a"}, 7, T), ({}, 0.25, T)], None
    ),
    "api_resource_list_custom": wire.api_resource_list(
        "custom.metrics.k8s.io/v1beta1",
        [
            ("pods/gpu_utilization", True, "MetricValueList"),
            ("namespaces/gpu_utilization", False, "MetricValueList"),
        ],
    ),
    "api_resource_list_empty": wire.api_resource_list("external.metrics.k8s.io/v1beta1", []),
    "api_group_list": wire.api_group_list(
        [(wire.CUSTOM_GROUP, wire.CUSTOM_VERSIONS), (wire.EXTERNAL_GROUP, wire.EXTERNAL_VERSIONS)]
    ),
    "api_group_custom": wire.api_group(wire.CUSTOM_GROUP, wire.CUSTOM_VERSIONS, top_level=True),
    "status_not_found": wire.status(404, "NotFound", "the server could not find the metric x for pods"),
    "status_unavailable_retry": wire.status(
        503, "ServiceUnavailable", "Prometheus is unavailable", retry_after=1
    ),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_document_matches_golden_file(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(DOCUMENTS[name], indent=2) + "\n"
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs; regenerate with GPUWARDEN_UPDATE_GOLDEN=1 if intended"


def test_v1beta2_item_matches_the_reference_shape() -> None:
    """metrics-api.md §1.5, v1beta2 constructed from struct tags (window omitted when not a rate)."""
    doc = wire.metric_value_list("v1beta2", "gpu_utilization", None, [(POD, 73.5, T)], 60)
    assert doc == {
        "kind": "MetricValueList",
        "apiVersion": "custom.metrics.k8s.io/v1beta2",
        "metadata": {},
        "items": [
            {
                "describedObject": POD,
                "metric": {"name": "gpu_utilization", "selector": None},
                "timestamp": "2026-08-20T10:00:00Z",
                "windowSeconds": 60,
                "value": "73500m",
            }
        ],
    }


def test_external_item_without_labels_has_null_metric_labels() -> None:
    doc = wire.external_metric_value_list("s", [({}, 0, T)], None)
    assert doc["items"][0]["metricLabels"] is None
