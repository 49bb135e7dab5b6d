"""Typed results of the Prometheus HTTP API (`/api/v1/query`, `/query_range`, `/series`, `/labels`).

Why this module exists: every consumer (metrics adapter, health observer, `gpuwarden plan`) must see the same
shapes — labels as `dict[str, str]`, timestamps as float seconds, values as floats with NaN and ±Inf parsed
explicitly from Prometheus' strings — instead of poking at JSON. Thanos Query, Mimir and VictoriaMetrics
answer in the same shapes, so nothing here is Prometheus-server specific.

What it must not do: no I/O, no error policy. A body that is not a valid API answer raises
`ResponseShapeError` (a `ValueError`); `gpuwarden.promclient` maps it to `PrometheusServerError`.
It also formats time and duration parameters the way the API parses them.
Native-histogram samples (no float `value`) are skipped with a warning appended to `warnings`, so a mixed
answer still yields its float samples.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeAlias

HISTOGRAM_SKIPPED_WARNING = "gpuwarden: native-histogram samples skipped (only float samples are supported)"

_SPECIAL_VALUES: dict[str, float] = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}


class ResponseShapeError(ValueError):
    """The body is JSON but not the shape the Prometheus HTTP API documents."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of an instant vector: a series' labels and its value at `timestamp` (unix seconds)."""

    labels: dict[str, str]
    timestamp: float
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range result: labels and (timestamp, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Vector:
    """`resultType: vector` — what most instant queries return."""

    samples: list[Sample]
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Scalar:
    """`resultType: scalar`, e.g. `scalar(...)` or a number literal."""

    timestamp: float
    value: float
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class String:
    """`resultType: string`, e.g. the query `"foo"`; rare, but the API allows it."""

    timestamp: float
    value: str
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Matrix:
    """`resultType: matrix` — every range query, and instant queries of a range selector (`up[5m]`)."""

    series: list[Series]
    warnings: list[str] = field(default_factory=list)


InstantResult: TypeAlias = Vector | Scalar | String | Matrix
TimeLike: TypeAlias = float | datetime
DurationLike: TypeAlias = float | timedelta


def format_seconds(value: TimeLike | DurationLike) -> str:
    """A time or duration parameter as Prometheus parses it: float seconds, millisecond precision."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware datetime or unix seconds")
        seconds = value.timestamp()
    else:
        seconds = float(value)
    return f"{seconds:.3f}"


def parse_value(raw: object) -> float:
    """Parse a Prometheus sample value; "NaN", "+Inf" and "-Inf" are mapped explicitly, never guessed."""
    if not isinstance(raw, str):
        raise ResponseShapeError(f"sample value must be a string, got {type(raw).__name__}")
    special = _SPECIAL_VALUES.get(raw)
    if special is not None:
        return special
    try:
        value = float(raw)
    except ValueError:
        raise ResponseShapeError(f"sample value {raw!r} is not a number") from None
    if math.isnan(value) or math.isinf(value):  # "nan", "infinity"... are not what Prometheus sends
        raise ResponseShapeError(f"sample value {raw!r} is not in Prometheus' format")
    return value


def _timestamp(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ResponseShapeError(f"timestamp must be a number, got {type(raw).__name__}")
    try:
        return float(raw)
    except OverflowError:  # an integer beyond a float's range
        raise ResponseShapeError("timestamp out of range") from None


def _labels(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ResponseShapeError("labels must be an object of strings")
    return raw


def _pair(raw: object) -> tuple[float, object]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise ResponseShapeError("a sample must be a [timestamp, value] pair")
    return _timestamp(raw[0]), raw[1]


def _items(raw: object, what: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ResponseShapeError(f"{what} must be a list of objects")
    return raw


def sample_hook(obj: dict[str, Any]) -> Any:
    """`json.loads` object_hook: a vector item becomes its `Sample` the moment it is decoded.

    Why: decoded whole, an answer for 10,000 pods is a 6.3 MiB tree of small objects (from a 0.9 MiB body)
    that lives until it is converted, and the allocator keeps the pages of the largest tree it ever held:
    the adapter's RSS grew by as much after its first cache refresh. Converted item by item, each item's
    dict, value pair and value string are freed while the next is decoded and their memory is reused at
    once. Label values are interned: an object name the adapter's label index holds is kept once.
    Anything not plainly a valid vector item is left as decoded, for `parse_query_data` to judge (its
    errors are unchanged).
    """
    metric = obj.get("metric")
    if type(metric) is not dict or len(obj) != 2:
        return obj
    pair = obj.get("value")
    if type(pair) is not list or len(pair) != 2:
        return obj
    try:
        timestamp, value = _timestamp(pair[0]), parse_value(pair[1])
        labels = {key: _intern(text) for key, text in metric.items()}
    except (ResponseShapeError, TypeError):  # TypeError: a label value that is not a string
        return obj
    return Sample(labels, timestamp, value)


_intern = sys.intern


def _vector(result: object, warnings: list[str]) -> Vector:
    samples: list[Sample] = []
    skipped = False
    if not isinstance(result, list) or not all(isinstance(item, dict | Sample) for item in result):
        raise ResponseShapeError("vector result must be a list of objects")
    for item in result:
        if isinstance(item, Sample):  # converted while decoding (`sample_hook`)
            samples.append(item)
            continue
        if "value" not in item and "histogram" in item:
            skipped = True
            continue
        ts, raw = _pair(item.get("value"))
        samples.append(Sample(_labels(item.get("metric", {})), ts, parse_value(raw)))
    if skipped:
        warnings.append(HISTOGRAM_SKIPPED_WARNING)
    return Vector(samples, warnings)


def _matrix(result: object, warnings: list[str]) -> Matrix:
    series: list[Series] = []
    skipped = False
    for item in _items(result, "matrix result"):
        if "values" not in item and "histograms" in item:
            skipped = True
            continue
        values = item.get("values")
        if not isinstance(values, list):
            raise ResponseShapeError("matrix series must have a list of values")
        points = []
        for pair in values:
            ts, raw = _pair(pair)
            points.append((ts, parse_value(raw)))
        series.append(Series(_labels(item.get("metric", {})), points))
        skipped = skipped or "histograms" in item
    if skipped:
        warnings.append(HISTOGRAM_SKIPPED_WARNING)
    return Matrix(series, warnings)


def parse_query_data(data: object, warnings: list[str]) -> InstantResult:
    """Turn the `data` of a successful `/query` or `/query_range` answer into a typed result."""
    if not isinstance(data, dict):
        raise ResponseShapeError("data must be an object")
    result_type = data.get("resultType")
    result = data.get("result")
    if result_type == "vector":
        return _vector(result, warnings)
    if result_type == "matrix":
        return _matrix(result, warnings)
    if result_type == "scalar":
        ts, raw = _pair(result)
        return Scalar(ts, parse_value(raw), warnings)
    if result_type == "string":
        ts, raw = _pair(result)
        if not isinstance(raw, str):
            raise ResponseShapeError("string result must hold a string")
        return String(ts, raw, warnings)
    raise ResponseShapeError(f"unknown resultType {result_type!r}")


def parse_series_data(data: object) -> list[dict[str, str]]:
    """The `data` of `/api/v1/series`: a list of label sets."""
    return [_labels(item) for item in _items(data, "series data")]


def parse_string_list(data: object) -> list[str]:
    """The `data` of `/api/v1/labels` and `/api/v1/label/<name>/values`: a list of strings."""
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise ResponseShapeError("data must be a list of strings")
    return data
