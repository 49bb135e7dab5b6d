"""Building the PromQL of one request (or one cache refresh) from a compiled rule.

Why a stage of its own: this is where outside input meets PromQL. The template arguments are prometheus-
adapter's — `Series`, `LabelMatchers` (metric-selector matchers, then the namespace matcher, then the
resource matcher, comma-joined), `LabelValuesByName`, `GroupBy`, `GroupBySlice` — so existing `metricsQuery`
templates render the same text, but every value is quoted and regex-escaped by `adapter.promql`.

Two shapes for object metrics: with `names` (per-request mode, `pod=~"a|b"` as prometheus-adapter sends),
or with `names=None` (cache mode: every object of the resource in the namespace, `pod!=""`, one query per
(metric, namespace) however many HPAs ask). Pure functions; errors are `QueryError` (a rule that cannot
serve this resource: 404 upstream) or `selectors.SelectorError` (a bad metricLabelSelector: 400).
"""

from __future__ import annotations

from collections.abc import Sequence

from adapter import promql, selectors
from adapter.gotemplate import Value
from adapter.naming import CompiledRule

ALL_OBJECTS_REGEX = ".+"


class QueryError(ValueError):
    """The rule cannot produce a query for this request (e.g. no label names the resource)."""


def _render(rule: CompiledRule, args: dict[str, Value]) -> str:
    text = rule.query.render(args)
    if not text.strip():
        raise QueryError(f"{rule.where}: empty query produced by metrics query template")
    return text


def _namespace_matcher(
    rule: CompiledRule,
    label: str | None,
    namespace: str | list[str],
    exprs: list[str],
    values: dict[str, str],
) -> None:
    if label is None:
        raise QueryError(
            f"{rule.where}: no label maps to namespaces, cannot restrict to namespace {namespace!r}"
        )
    namespaces = [namespace] if isinstance(namespace, str) else namespace
    exprs.append(promql.names_matcher(label, namespaces))
    values[label] = "|".join(namespaces)


def batchable(rule: CompiledRule) -> bool:
    """Whether one query may serve several namespaces: the template must group by `<<.GroupBy>>`."""
    return rule.query.mentions("GroupBy") or rule.query.mentions("GroupBySlice")


def build_object_query(
    rule: CompiledRule,
    series: str,
    resource_label: str,
    namespace_label: str | None,
    namespace: str | list[str],
    metric_selector: selectors.Selector,
    names: Sequence[str] | None,
) -> str:
    """PromQL for `series` of the objects named by `resource_label` (`names`, or all when None).

    `namespace` is "" for root-scoped objects (nodes, namespaces); otherwise `namespace_label` must be known.
    A list of namespaces (a cache batch) is matched with one literal regex and grouped by namespace too
    (`GroupBy` = `<namespace label>,<resource label>`); only for rules where `batchable()` holds.
    """
    exprs = selectors.promql_matchers(metric_selector)
    values = selectors.values_by_label(metric_selector)
    res_label = promql.check_label_name(resource_label)
    if namespace and namespace_label != res_label:
        _namespace_matcher(rule, namespace_label, namespace, exprs, values)
    if names is None:
        exprs.append(promql.label_matcher(res_label, "!=", ""))
        values[res_label] = ALL_OBJECTS_REGEX
    else:
        if not names:
            raise QueryError("no resource names requested")
        exprs.append(promql.names_matcher(res_label, list(names)))
        values[res_label] = "|".join(names)
    group_by = [res_label]
    if isinstance(namespace, list) and namespace_label is not None:
        group_by.insert(0, promql.check_label_name(namespace_label))
    return _render(
        rule,
        {
            "Series": series,
            "LabelMatchers": ",".join(exprs),
            "LabelValuesByName": values,
            "GroupBy": ",".join(group_by),
            "GroupBySlice": group_by,
        },
    )


def build_external_query(
    rule: CompiledRule,
    series: str,
    namespace_label: str | None,
    namespace: str,
    metric_selector: selectors.Selector,
    group_by: Sequence[str] = (),
) -> str:
    """PromQL for external metric `series`; the namespace matcher is added unless `namespaced: false`.

    `GroupBy` is empty, as prometheus-adapter renders it for external metrics, unless `group_by` names
    labels: the query shared by several selectors (`adapter.sharing`) groups by the labels they read.
    """
    labels = [promql.check_label_name(label) for label in group_by]
    exprs = selectors.promql_matchers(metric_selector)
    values = selectors.values_by_label(metric_selector)
    if namespace and rule.namespaced:
        _namespace_matcher(rule, namespace_label, namespace, exprs, values)
    return _render(
        rule,
        {
            "Series": series,
            "LabelMatchers": ",".join(exprs),
            "LabelValuesByName": values,
            "GroupBy": ",".join(labels),
            "GroupBySlice": labels,
        },
    )
