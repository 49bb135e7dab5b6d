"""`gpuwarden.litemetrics` writes what prometheus_client writes: the same operations on both, the same text
(the `_created` timestamps aside), and the same sample values through `get_sample_value`."""

from __future__ import annotations

import math
import re
from typing import Any

import prometheus_client as pc
import pytest

from gpuwarden import litemetrics as lm


def exercise(mod: Any, registry: Any) -> None:
    """The shapes the node agent uses: labelled and plain counters, gauges, histograms, odd text."""
    c = mod.Counter(
        "t_calls_total", 'Calls, by "outcome".\nSecond line \\ backslash.', ["outcome"], registry=registry
    )
    c.labels("ok").inc()
    c.labels("ok").inc(2)
    c.labels('we"ird\\\n').inc(0.5)
    c.labels("never")
    plain = mod.Counter("t_plain_total", "Plain.", registry=registry)
    plain.inc()
    g = mod.Gauge("t_devices", "Devices by health.", ["health"], registry=registry)
    g.labels("Healthy").set(7)
    g.labels("Unhealthy").set(1e9)
    mod.Gauge("t_empty", "No children yet.", ["x"], registry=registry)
    lone = mod.Gauge("t_lone", "A plain gauge.", registry=registry)
    lone.set(0.25)
    h = mod.Histogram("t_seconds", "Durations.", ["method"], buckets=(0.001, 0.01, 1, 2.5), registry=registry)
    for v in (0.0005, 0.001, 0.02, 3.0, 1e-9):
        h.labels("Allocate").observe(v)
    hp = mod.Histogram("t_pass_seconds", "A plain histogram.", buckets=(0.1, math.inf), registry=registry)
    with hp.time():
        pass
    hp.observe(5)


def without_created(text: str) -> str:
    return re.sub(r"(_created(\{[^}]*\})?) [0-9.e+]+\n", r"\1 T\n", text)


def test_same_text_as_prometheus_client() -> None:
    ours, theirs = lm.Registry(), pc.CollectorRegistry()
    exercise(lm, ours)
    exercise(pc, theirs)
    # the pass histogram's one `time()` sample differs in value; its bucket is the same (< 0.1 s)
    mine = re.sub(
        r"(t_pass_seconds_sum) [0-9.e+-]+", r"\1 S", without_created(lm.generate_latest(ours).decode())
    )
    want = re.sub(
        r"(t_pass_seconds_sum) [0-9.e+-]+", r"\1 S", without_created(pc.generate_latest(theirs).decode())
    )
    assert mine == want
    assert lm.CONTENT_TYPE_LATEST == pc.CONTENT_TYPE_LATEST


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("t_calls_total", {"outcome": "ok"}),
        ("t_calls_total", {"outcome": "never"}),
        ("t_plain_total", None),
        ("t_devices", {"health": "Unhealthy"}),
        ("t_seconds_bucket", {"method": "Allocate", "le": "0.01"}),
        ("t_seconds_count", {"method": "Allocate"}),
        ("t_seconds_sum", {"method": "Allocate"}),
        ("t_devices", {"health": "missing"}),
    ],
)
def test_same_sample_values(name: str, labels: dict[str, str] | None) -> None:
    ours, theirs = lm.Registry(), pc.CollectorRegistry()
    exercise(lm, ours)
    exercise(pc, theirs)
    assert ours.get_sample_value(name, labels) == theirs.get_sample_value(name, labels)


@pytest.mark.parametrize(
    "value", [0.0, 1.0, 0.5, 1e-9, 123456.0, 1234567.0, 1e9, 2.5e21, math.inf, -math.inf]
)
def test_go_float(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    assert lm.go_float(value) == floatToGoString(value)


def test_duplicate_names_and_wrong_label_counts_are_errors() -> None:
    registry = lm.Registry()
    lm.Counter("t_total", "x", registry=registry)
    with pytest.raises(ValueError):
        lm.Counter("t_total", "x", registry=registry)
    with pytest.raises(ValueError):
        lm.Gauge("t_g", "x", ["a"], registry=registry).labels("1", "2")
    with pytest.raises(ValueError):
        lm.Counter("t2_total", "x", registry=registry).inc(-1)
