"""Counter, Gauge, Histogram and the Prometheus text format, for the node agent, without prometheus_client.

Why it exists: importing prometheus_client costs ~3 MiB (its exposition module imports `http.server`,
`urllib.request` and `wsgiref` for servers and push gateways we never use), and the node agent's idle
goal is ≤ 40 MiB (issue 29). The agent needs a handful of labelled counters, gauges and histograms and one
`/metrics` page; this module gives exactly the subset of prometheus_client's API it uses (`labels`, `inc`,
`set`, `observe`, `time`, a registry with `get_sample_value`) and writes the same text, byte for byte
apart from the `_created` timestamps (`tests/unit/test_litemetrics.py` compares the two).

What it must not do: grow collectors, multiprocess mode, OpenMetrics or push support (use prometheus_client
for those, as the adapter and the controller do), or be shared between threads without a lock (the node
agent's metrics change on its event loop only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

CONTENT_TYPE_LATEST = "text/plain; version=1.0.0; charset=utf-8"
"""What prometheus_client (the pinned version) sends with the same text."""
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels
    value: float


def go_float(value: float) -> str:
    """A float as Prometheus (and prometheus_client's `floatToGoString`) writes it."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Registry:
    """The metrics of one process (or one test): registration order is exposition order."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []
        self._names: set[str] = set()

    def register(self, metric: _Metric) -> None:
        if metric.name in self._names:
            raise ValueError(f"Duplicated timeseries in Registry: {metric.name}")
        self._names.add(metric.name)
        self._metrics.append(metric)

    def metrics(self) -> list[_Metric]:
        return list(self._metrics)

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of one sample (as prometheus_client's `CollectorRegistry.get_sample_value`)."""
        wanted = labels or {}
        for metric in self._metrics:
            for sample in metric.samples():
                if sample.name == name and dict(sample.labels) == wanted:
                    return sample.value
        return None


class _Child:
    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()


class _Metric:
    kind = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: Registry | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}
        if not self.labelnames:
            self._children[()] = self._new_child()
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> _Child:
        return _Child()

    def _child(self, values: tuple[str, ...]) -> _Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new_child()
        return child

    def _labelled(self, values: Sequence[object]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(values)}")
        return tuple(str(v) for v in values)

    def samples(self) -> Iterator[Sample]:
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError

    def _lines(self, family: str, kind: str, samples: Iterator[Sample], created: list[Sample]) -> str:
        help_text = _escape_help(self.documentation)
        out = [f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n"]
        out += [_sample_line(s) for s in samples]
        if created:
            base = self.name.removesuffix("_total") if kind == "counter" else self.name
            out.append(f"# HELP {base}_created {help_text}\n# TYPE {base}_created gauge\n")
            out += [_sample_line(s) for s in created]
        return "".join(out)


def _sample_line(sample: Sample) -> str:
    labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels)
    return (
        f"{sample.name}{{{labels}}} {go_float(sample.value)}\n"
        if labels
        else (f"{sample.name} {go_float(sample.value)}\n")
    )


class _Bound:
    """One child of a metric, as `labels(...)` returns it."""

    def __init__(self, metric: _Metric, child: _Child) -> None:
        self._metric = metric
        self._child = child


class CounterChild(_Bound):
    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._child.value += amount


class Counter(_Metric):
    """A counter; `name` ends in `_total` (as all of ours do)."""

    kind = "counter"

    def labels(self, *values: object) -> CounterChild:
        return CounterChild(self, self._child(self._labelled(values)))

    def inc(self, amount: float = 1.0) -> None:
        CounterChild(self, self._children[()]).inc(amount)

    def samples(self) -> Iterator[Sample]:
        for values, child in self._children.items():
            labels = tuple(zip(self.labelnames, values, strict=True))
            yield Sample(self.name, labels, child.value)

    def _created(self) -> list[Sample]:
        base = self.name.removesuffix("_total")
        return [
            Sample(f"{base}_created", tuple(zip(self.labelnames, values, strict=True)), child.created)
            for values, child in self._children.items()
        ]

    def render(self) -> str:
        return self._lines(self.name, "counter", self.samples(), self._created())


class GaugeChild(_Bound):
    def set(self, value: float) -> None:
        self._child.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self._child.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._child.value -= amount


class Gauge(_Metric):
    kind = "gauge"

    def labels(self, *values: object) -> GaugeChild:
        return GaugeChild(self, self._child(self._labelled(values)))

    def set(self, value: float) -> None:
        GaugeChild(self, self._children[()]).set(value)

    def inc(self, amount: float = 1.0) -> None:
        GaugeChild(self, self._children[()]).inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        GaugeChild(self, self._children[()]).dec(amount)

    def samples(self) -> Iterator[Sample]:
        for values, child in self._children.items():
            yield Sample(self.name, tuple(zip(self.labelnames, values, strict=True)), child.value)

    def render(self) -> str:
        return self._lines(self.name, "gauge", self.samples(), [])


class _HistogramChild(_Child):
    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__()
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)


class HistogramChild(_Bound):
    def observe(self, amount: float) -> None:
        child = self._child
        assert isinstance(child, _HistogramChild)
        child.value += amount
        for i, bound in enumerate(child.bounds):
            if amount <= bound:
                child.counts[i] += 1
                break

    @contextmanager
    def time(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(max(time.perf_counter() - start, 0.0))


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: Registry | None = None,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        self.bounds = bounds if bounds[-1] == math.inf else (*bounds, math.inf)
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _Child:
        return _HistogramChild(self.bounds)

    def labels(self, *values: object) -> HistogramChild:
        return HistogramChild(self, self._child(self._labelled(values)))

    def observe(self, amount: float) -> None:
        HistogramChild(self, self._children[()]).observe(amount)

    def time(self) -> AbstractContextManager[None]:
        return HistogramChild(self, self._children[()]).time()

    def samples(self) -> Iterator[Sample]:
        for values, child in self._children.items():
            assert isinstance(child, _HistogramChild)
            labels = tuple(zip(self.labelnames, values, strict=True))
            cumulative = 0.0
            for bound, count in zip(child.bounds, child.counts, strict=True):
                cumulative += count
                yield Sample(f"{self.name}_bucket", (("le", go_float(bound)), *labels), cumulative)
            yield Sample(f"{self.name}_count", labels, cumulative)
            yield Sample(f"{self.name}_sum", labels, child.value)

    def render(self) -> str:
        created = [
            Sample(f"{self.name}_created", tuple(zip(self.labelnames, values, strict=True)), child.created)
            for values, child in self._children.items()
        ]
        return self._lines(self.name, "histogram", self.samples(), created)


def new_registry(component: str) -> Registry:
    """A fresh registry carrying `gpuwarden_build_info{version, python_version, component} 1`, as
    `gpuwarden.selfmetrics.new_registry` does for prometheus_client's."""
    import platform

    from gpuwarden import __version__

    registry = Registry()
    info = Gauge(
        "gpuwarden_build_info",
        "Build information; always 1.",
        ["version", "python_version", "component"],
        registry=registry,
    )
    info.labels(__version__, platform.python_version(), component).set(1)
    return registry


def generate_latest(registry: Registry) -> bytes:
    """The registry in the Prometheus text format (`CONTENT_TYPE_LATEST`)."""
    return "".join(metric.render() for metric in registry.metrics()).encode()
