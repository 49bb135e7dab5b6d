"""Many external-metric selectors answered from one query: which templates allow it, and the selection.

Why: an external metric's answer depends on the request's `labelSelector` (it goes into
`<<.LabelMatchers>>`, as in prometheus-adapter), so a cache keyed by selector made one query per distinct
selector — 1,000 ScaledObjects (or HPAs) with a selector each were 3,255 queries/min in the 2026-12-03 KEDA
bench. When the rule's `metricsQuery` has a shape whose answer for any selector can be computed exactly
from one answer without the selector, every selector shares one cached query per (metric, namespace) and
is answered here, in memory. Two ways, decided from the template alone (`shape_of`) and the selector's keys
(`plan`):

- pick: the template keeps every label the selector reads — no outer aggregation
  (`<<.Series>>{<<.LabelMatchers>>}`, `rate(...[2m])`), or an outer aggregation `by` static labels that
  include all of the selector's keys (`avg(...) by (app)` with `app=x`). Each output series is made of input
  series that agree on those labels, so keeping the output series the selector matches is the same as
  matching the input series first — for any aggregation (sum, count, avg, max, min, stddev, stdvar, group).
- fold: an outer `sum` or `count` whose `by` list ends with `<<.GroupBy>>` (empty for external metrics, as
  in prometheus-adapter): the shared query also groups by the selector's keys, and the groups a selector
  matches are added up per the template's static `by` labels. Exact because the groups partition the
  series and sums/counts add up; equal to Prometheus' own sum up to floating-point rounding.

Anything else — another aggregation over labels the selector reads, `without`, `topk`/`quantile`, binary
operators, `offset`, subqueries, `.LabelValuesByName`, `.GroupBySlice`, `index`/`len` — keeps the query per
selector. The test is syntactic and deliberately narrow: a template not recognised here is never shared.

Selection follows PromQL's matcher semantics, not apimachinery's: a missing label reads as "" (so `!=`,
`notin` and `!key` match series without the label, as the per-selector matchers do). `>`/`<` never get here
(PromQL has no matcher for them: the request is a 400 first). Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adapter import promql
from adapter.gotemplate import Template
from adapter.selectors import Requirement, Selector
from gpuwarden.promtypes import Sample

SERIES, MATCHERS, GROUP_BY = "\x00series\x00", "\x00matchers\x00", "\x00groupby\x00"
"""What the recognised fields render as while the shape is read: text no PromQL contains."""

RANGE_FUNCTIONS = (
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
)
"""Functions of one range vector that answer per series, keeping its labels (but `__name__`)."""
INSTANT_FUNCTIONS = ("abs", "ceil", "floor", "sqrt", "exp", "ln", "log2", "log10")
"""Functions of one instant vector that answer per series, keeping its labels (but `__name__`)."""
AGGREGATIONS = ("sum", "count", "avg", "max", "min", "stddev", "stdvar", "group")
"""Aggregations without a parameter: a `by` group's value depends only on the series in the group."""
FOLDABLE = ("sum", "count")
"""Aggregations whose value over a union of disjoint groups is the sum of the groups' values."""

_VECTOR = re.escape(SERIES) + r"\s*\{\s*" + re.escape(MATCHERS) + r"\s*\}"
_DURATION = r"(?:[0-9]+(?:ms|[smhdwy]))+"
_INNER = (
    rf"(?:{_VECTOR}"
    rf"|(?:{'|'.join(RANGE_FUNCTIONS)})\s*\(\s*{_VECTOR}\s*\[\s*{_DURATION}\s*\]\s*\)"
    rf"|(?:{'|'.join(INSTANT_FUNCTIONS)})\s*\(\s*{_VECTOR}\s*\))"
)
_AGG = rf"(?P<agg>{'|'.join(AGGREGATIONS)})"
_PER_SERIES = re.compile(rf"^\s*{_INNER}\s*\Z")
_BY_AFTER = re.compile(rf"^\s*{_AGG}\s*\(\s*{_INNER}\s*\)\s*(?:by\s*\((?P<by>[^()]*)\))?\s*\Z")
_BY_BEFORE = re.compile(rf"^\s*{_AGG}\s*by\s*\((?P<by>[^()]*)\)\s*\(\s*{_INNER}\s*\)\s*\Z")


@dataclass(frozen=True)
class Shape:
    """What a shareable `metricsQuery` template does to its series."""

    aggregation: str | None
    """The outer aggregation; None: the template answers per series."""
    by: tuple[str, ...] = ()
    """The static labels of the outer `by`."""
    group_by_field: bool = False
    """The outer `by` list ends with `<<.GroupBy>>`."""


@dataclass(frozen=True)
class Plan:
    """How one selector is answered from a shared query."""

    group_by: tuple[str, ...]
    """Labels rendered into `<<.GroupBy>>` of the shared query (the cache keys it with them)."""
    fold: tuple[str, ...] | None
    """None: pick the matching series as they are; else add them up per these labels."""


def _by_list(text: str | None) -> tuple[tuple[str, ...], bool] | None:
    """(static labels, ends with GroupBy) of a `by (...)` list; None if it is anything else."""
    if text is None or not text.strip():
        return (), False
    items = [item.strip() for item in text.split(",")]
    if items[-1] == "" and len(items) > 1:
        items.pop()  # PromQL allows one trailing comma
    group_by = items[-1] == GROUP_BY
    if group_by:
        items.pop()
    if any(not promql.LABEL_NAME.match(item) for item in items):
        return None
    return tuple(items), group_by


@functools.lru_cache(maxsize=256)
def shape_of(template: Template) -> Shape | None:
    """The shape of `template` if selectors may share its query, else None (one query per selector)."""
    if template.calls() or template.mentions("LabelValuesByName") or template.mentions("GroupBySlice"):
        return None
    text = template.render({"Series": SERIES, "LabelMatchers": MATCHERS, "GroupBy": GROUP_BY})
    if _PER_SERIES.match(text):
        return Shape(None)
    m = _BY_AFTER.match(text) or _BY_BEFORE.match(text)
    if m is None:
        return None
    by = _by_list(m.group("by"))
    if by is None:
        return None
    return Shape(m.group("agg"), by[0], by[1])


def plan(shape: Shape | None, selector: Selector) -> Plan | None:
    """How `selector` is answered from a query shared with other selectors; None: by a query of its own."""
    if shape is None:
        return None
    keys = {req.key for req in selector.requirements}
    if shape.aggregation is None or keys <= set(shape.by):
        return Plan((), None)
    if shape.aggregation in FOLDABLE and shape.group_by_field:
        return Plan(tuple(sorted(keys - set(shape.by))), shape.by)
    return None


def requirement_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    """What the requirement's PromQL matcher (`selectors.promql_matchers`) says: a missing label is ""."""
    value = labels.get(req.key, "")
    if req.op in ("=", "==", "in"):
        return value in req.values
    if req.op in ("!=", "notin"):
        return value not in req.values
    if req.op == "exists":
        return value != ""
    if req.op == "!":
        return value == ""
    raise ValueError(f"{req} has no PromQL matcher")


def matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    return all(requirement_matches(req, labels) for req in selector.requirements)


class SeriesSet:
    """One shared answer, with a by-value index per label that selectors look up (built on first use), so
    a selector `app=x` costs its own series, not the whole namespace's."""

    __slots__ = ("_index", "samples")

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.samples = list(samples)
        self._index: dict[str, dict[str, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def _positions(self, key: str) -> dict[str, list[int]]:
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = {}
            for i, s in enumerate(self.samples):
                value = s.labels.get(key)
                if value:
                    index.setdefault(value, []).append(i)
        return index

    def matching(self, selector: Selector) -> list[Sample]:
        """The samples `selector` matches, in answer order."""
        candidates = self.samples
        for req in selector.requirements:
            if req.op in ("=", "==", "in") and "" not in req.values:
                index = self._positions(req.key)
                positions = sorted({i for v in req.values for i in index.get(v, ())})
                candidates = [self.samples[i] for i in positions]
                break
        return [s for s in candidates if matches(selector, s.labels)]


def total(values: Sequence[float]) -> float:
    """The sum, correctly rounded when finite; NaN and ±Inf propagate as in PromQL (Inf + -Inf is NaN)."""
    if all(math.isfinite(v) for v in values):
        return math.fsum(values)
    return sum(values, 0.0)


def answer(shared: SeriesSet, selector: Selector, how: Plan) -> list[Sample]:
    """What the template would answer for `selector`, from the shared query's answer."""
    picked = shared.matching(selector)
    if how.fold is None:
        return picked
    groups: dict[tuple[str, ...], list[Sample]] = {}
    for s in picked:
        groups.setdefault(tuple(s.labels.get(label, "") for label in how.fold), []).append(s)
    out: list[Sample] = []
    for key, members in groups.items():
        labels = {label: value for label, value in zip(how.fold, key, strict=True) if value}
        out.append(Sample(labels, max(m.timestamp for m in members), total([m.value for m in members])))
    return out
