"""Wire-format tests for gpuwarden.promtypes: golden Prometheus answers in, typed results out."""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.promtypes import (
    HISTOGRAM_SKIPPED_WARNING,
    Matrix,
    ResponseShapeError,
    Sample,
    Scalar,
    Series,
    String,
    Vector,
    format_seconds,
    parse_query_data,
    parse_series_data,
    parse_string_list,
    parse_value,
    sample_hook,
)

GOLDEN = Path(__file__).parent / "golden" / "prometheus"
T0 = 1795939200.0
NODE1 = {"Hostname": "node-1", "__name__": "DCGM_FI_DEV_GPU_UTIL"}


def golden(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_bytes())
    return body


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0.0),
        ("12.5", 12.5),
        ("-3", -3.0),
        ("1e+06", 1e6),
        ("NaN", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
    ],
    ids=["zero", "decimal", "negative", "exponent", "nan", "plus-inf", "minus-inf"],
)
def test_parse_value(raw: str, expected: float) -> None:
    assert same(parse_value(raw), expected)


@pytest.mark.parametrize(
    "raw",
    [1.5, None, "abc", "", "nan", "infinity", "-inf"],
    ids=["json-number", "null", "word", "empty", "lowercase-nan", "infinity", "lowercase-inf"],
)
def test_parse_value_rejects_what_prometheus_never_sends(raw: object) -> None:
    with pytest.raises(ResponseShapeError):
        parse_value(raw)


def test_golden_vector_with_nan_and_infinities() -> None:
    result = parse_query_data(golden("vector_special_values")["data"], [])
    assert isinstance(result, Vector)
    by_gpu = {s.labels["gpu"]: s for s in result.samples}
    assert by_gpu["0"] == Sample(NODE1 | {"UUID": "GPU-0a", "gpu": "0"}, T0 + 30, 25.0)
    assert math.isnan(by_gpu["1"].value)
    assert by_gpu["2"].value == math.inf
    assert by_gpu["3"].value == -math.inf
    assert {s.timestamp for s in result.samples} == {T0 + 30}


@pytest.mark.parametrize("name", ["matrix_range", "matrix_instant_range_selector"])
def test_golden_matrix(name: str) -> None:
    result = parse_query_data(golden(name)["data"], [])
    assert result == Matrix(
        [
            Series(
                NODE1 | {"UUID": "GPU-0a", "gpu": "0"},
                [(T0, 0.0), (T0 + 15, 12.5), (T0 + 30, 25.0), (T0 + 45, 37.5), (T0 + 60, 50.0)],
            )
        ]
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("scalar", Scalar(T0, 2.5)),
        ("string", String(T0, "hello")),
        ("vector_empty", Vector([])),
    ],
    ids=["scalar", "string", "empty-vector"],
)
def test_golden_other_result_types(name: str, expected: object) -> None:
    assert parse_query_data(golden(name)["data"], []) == expected


def test_warnings_are_kept() -> None:
    body = golden("vector_with_warnings")
    result = parse_query_data(body["data"], list(body["warnings"]))
    assert result.warnings == ["partial response: store 10.0.0.7:10901 is unavailable"]


def test_native_histogram_samples_are_skipped_with_a_warning() -> None:
    result = parse_query_data(golden("vector_native_histogram")["data"], [])
    assert isinstance(result, Vector)
    assert [s.labels["__name__"] for s in result.samples] == ["up"]
    assert result.warnings == [HISTOGRAM_SKIPPED_WARNING]


def test_golden_series_labels_and_values() -> None:
    series = parse_series_data(golden("series")["data"])
    assert [s["UUID"] for s in series] == ["GPU-0a", "GPU-1b", "GPU-2c", "GPU-3d"]
    assert parse_string_list(golden("labels")["data"]) == ["Hostname", "UUID", "__name__", "gpu"]
    assert parse_string_list(golden("label_values")["data"]) == ["GPU-0a", "GPU-1b", "GPU-2c", "GPU-3d"]


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"resultType": "histogram", "result": []},
        {"resultType": "vector", "result": {"metric": {}}},
        {"resultType": "vector", "result": [{"metric": {}, "value": [T0]}]},
        {"resultType": "vector", "result": [{"metric": {}, "value": ["now", "1"]}]},
        {"resultType": "vector", "result": [{"metric": {"gpu": 0}, "value": [T0, "1"]}]},
        {"resultType": "vector", "result": [{"metric": {}, "value": [T0, 1]}]},
        {"resultType": "matrix", "result": [{"metric": {}, "values": "none"}]},
        {"resultType": "scalar", "result": [True, "1"]},
        {"resultType": "string", "result": [T0, 7]},
    ],
    ids=[
        "data-not-object",
        "unknown-result-type",
        "result-not-list",
        "value-not-pair",
        "timestamp-not-number",
        "label-not-string",
        "value-not-string",
        "values-not-list",
        "timestamp-bool",
        "string-not-string",
    ],
)
def test_malformed_query_data(data: object) -> None:
    with pytest.raises(ResponseShapeError):
        parse_query_data(data, [])
    # decoded with the client's sample hook, the same data is rejected the same way
    with pytest.raises(ResponseShapeError):
        parse_query_data(json.loads(json.dumps(data), object_hook=sample_hook), [])


QUERY_ANSWERS = sorted(p.stem for p in GOLDEN.glob("*.json") if '"resultType"' in p.read_text())


@pytest.mark.parametrize("name", QUERY_ANSWERS)
def test_the_sample_hook_decodes_every_answer_as_the_plain_decoder(name: str) -> None:
    text = (GOLDEN / f"{name}.json").read_bytes()
    plain, hooked = json.loads(text), json.loads(text, object_hook=sample_hook)
    expected = parse_query_data(plain["data"], list(plain.get("warnings", [])))
    got = parse_query_data(hooked["data"], list(hooked.get("warnings", [])))
    assert repr(got) == repr(expected)  # repr: NaN values compare unequal


def test_the_sample_hook_interns_label_values() -> None:
    held = sys.intern("".join(["pod-", "7d9f"]))  # as the adapter's label index holds a pod name
    body = json.dumps(
        {"resultType": "vector", "result": [{"metric": {"pod": "pod-7d9f"}, "value": [T0, "1"]}]}
    )
    result = parse_query_data(json.loads(body, object_hook=sample_hook), [])
    assert isinstance(result, Vector)
    assert result.samples == [Sample({"pod": "pod-7d9f"}, T0, 1.0)]
    assert result.samples[0].labels["pod"] is held


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (T0, "1795939200.000"),
        (0.25, "0.250"),
        (timedelta(seconds=15), "15.000"),
        (datetime(2026, 1, 1, tzinfo=UTC), "1767225600.000"),
    ],
    ids=["unix", "fraction", "timedelta", "aware-datetime"],
)
def test_format_seconds(value: float | datetime | timedelta, expected: str) -> None:
    assert format_seconds(value) == expected


def test_format_seconds_rejects_naive_datetime() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_seconds(datetime(2026, 1, 1))
