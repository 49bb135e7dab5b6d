"""Selectors sharing one external-metric query: which templates allow it, and the in-memory answers.

The expected answers are what the per-selector PromQL gives, computed by hand here (PromQL's matchers read a
missing label as ""; `sum` of a NaN is NaN); tests/integration/test_adapter_sharing.py compares both ways on
a real Prometheus.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from adapter import naming, queries, sharing
from adapter.cache import ValueCache
from adapter.errors import BadRequest
from adapter.gotemplate import compile_template
from adapter.provider import Cached, Provider
from adapter.registry import ExternalMetric, Registry
from adapter.routing import ExternalRoute
from adapter.selectors import EVERYTHING
from adapter.selectors import parse as parse_selector
from adapter.selfmetrics import new_metrics
from adapter.sharing import Plan, SeriesSet, Shape
from gpuwarden.config.metric_rules import DiscoveryRule
from gpuwarden.config.templatefields import QUERY_TEMPLATE_FIELDS
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import InstantResult, Sample, Vector

FIELDS = frozenset(QUERY_TEMPLATE_FIELDS)
M = "<<.Series>>{<<.LabelMatchers>>}"


@pytest.mark.parametrize(
    ("template", "shape"),
    [
        pytest.param(M, Shape(None), id="bare-series"),
        pytest.param(f"rate({M}[2m])", Shape(None), id="rate"),
        pytest.param(f"avg_over_time({M}[1m30s])", Shape(None), id="over-time"),
        pytest.param(f"abs({M})", Shape(None), id="instant-function"),
        pytest.param(f"sum({M}) by (<<.GroupBy>>)", Shape("sum", (), True), id="sum-by-groupby"),
        pytest.param(f"sum({M})", Shape("sum", (), False), id="sum-no-by"),
        pytest.param(f"sum({M}) by ()", Shape("sum", (), False), id="sum-by-nothing"),
        pytest.param(f"sum(rate({M}[5m])) by (queue)", Shape("sum", ("queue",), False), id="sum-rate-static"),
        pytest.param(
            f"sum by (namespace, <<.GroupBy>>) ({M})", Shape("sum", ("namespace",), True), id="by-before"
        ),
        pytest.param(f"count({M}) by (a,b,)", Shape("count", ("a", "b"), False), id="trailing-comma"),
        pytest.param(f"avg({M}) by (app)", Shape("avg", ("app",), False), id="avg-static"),
        pytest.param(f"max({M}) by (<<.GroupBy>>)", Shape("max", (), True), id="max-groupby"),
        pytest.param(
            f"  sum(\n  {M.replace('{', '{ ')}\n) by ( app )  ",
            Shape("sum", ("app",), False),
            id="whitespace",
        ),
        pytest.param(f"sum({M}) without (app)", None, id="without"),
        pytest.param(f"topk(3, {M})", None, id="topk"),
        pytest.param(f"quantile(0.9, {M}) by (app)", None, id="quantile"),
        pytest.param(f"sum({M}) by (<<.GroupBy>>) * 100", None, id="binary-operator"),
        pytest.param(f"sum({M} offset 5m)", None, id="offset"),
        pytest.param(f"sum(rate({M}[5m:1m]))", None, id="subquery"),
        pytest.param(f"sum({M}) / sum(other{{<<.LabelMatchers>>}})", None, id="two-selectors"),
        pytest.param(f'sum({M} and up{{job="x"}})', None, id="set-operator"),
        pytest.param(f"sum(rate({M}[5m])) by (<<.GroupBy>>, app)", None, id="groupby-not-last"),
        pytest.param(f"sum({M}) by (app, <<.GroupBySlice>>)", None, id="groupbyslice"),
        pytest.param('sum(<<.Series>>{<<.LabelMatchers>>,job="x"})', None, id="extra-matchers"),
        pytest.param(f'sum({M}) by (<<index .LabelValuesByName "app">>)', None, id="index-call"),
        pytest.param("<<.Series>>{<<.LabelMatchers>>} > <<len .LabelMatchers>>", None, id="len-call"),
        pytest.param("sum(<<.Series>>)", None, id="no-matchers"),
        pytest.param("sum(foo_<<.Series>>{<<.LabelMatchers>>})", None, id="series-prefixed"),
        pytest.param("SUM(<<.Series>>{<<.LabelMatchers>>})", None, id="upper-case-not-recognised"),
        pytest.param("scalar(sum(<<.Series>>{<<.LabelMatchers>>}))", None, id="scalar"),
    ],
)
def test_shape_of(template: str, shape: Shape | None) -> None:
    assert sharing.shape_of(compile_template(template, FIELDS)) == shape


@pytest.mark.parametrize(
    ("shape", "selector", "expected"),
    [
        pytest.param(None, "app=a", None, id="not-shareable"),
        pytest.param(Shape(None), "app=a,team!=b", Plan((), None), id="per-series-picks"),
        pytest.param(Shape("avg", ("app",)), "app in (a,b)", Plan((), None), id="keys-kept-any-aggregation"),
        pytest.param(Shape("max", ("app", "team")), "!team", Plan((), None), id="not-exists-on-kept-label"),
        pytest.param(Shape("avg", ("app",)), "", Plan((), None), id="empty-selector"),
        pytest.param(Shape("sum", (), True), "app=a", Plan(("app",), ()), id="sum-folds"),
        pytest.param(Shape("count", (), True), "app=a,team", Plan(("app", "team"), ()), id="count-folds"),
        pytest.param(
            Shape("sum", ("ns",), True), "ns=x,app=a", Plan(("app",), ("ns",)), id="fold-keeps-static-by"
        ),
        pytest.param(Shape("sum", (), False), "app=a", None, id="sum-without-groupby-field"),
        pytest.param(Shape("avg", (), True), "app=a", None, id="avg-cannot-fold"),
        pytest.param(Shape("max", ("team",), True), "app=a", None, id="max-cannot-fold"),
        pytest.param(Shape("sum", (), True), "", Plan((), None), id="empty-selector-picks"),
    ],
)
def test_plan(shape: Shape | None, selector: str, expected: Plan | None) -> None:
    assert sharing.plan(shape, parse_selector(selector)) == expected


T = 1787220000.0
NAN = math.nan


def sample(value: float, **labels: str) -> Sample:
    return Sample(dict(labels), T, value)


# per-app groups of `sum(x{namespace="ml"}) by (app, team)`, as the shared fold query would answer
GROUPS = [
    sample(1.0, app="a", team="red"),
    sample(2.0, app="a", team="blue"),
    sample(4.0, app="b", team="red"),
    sample(8.0, app="c"),  # series without a team label
    sample(16.0, team="red"),  # series without an app label
]


def answers(samples: list[Sample]) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in samples]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(
            "app=a", [({"app": "a", "team": "red"}, 1.0), ({"app": "a", "team": "blue"}, 2.0)], id="eq"
        ),
        pytest.param("app==b", [({"app": "b", "team": "red"}, 4.0)], id="double-eq"),
        pytest.param(
            "app!=a",
            [({"app": "b", "team": "red"}, 4.0), ({"app": "c"}, 8.0), ({"team": "red"}, 16.0)],
            id="neq-matches-missing",
        ),
        pytest.param(
            "app in (a,c)",
            [({"app": "a", "team": "red"}, 1.0), ({"app": "a", "team": "blue"}, 2.0), ({"app": "c"}, 8.0)],
            id="in",
        ),
        pytest.param(
            "app notin (a,b)", [({"app": "c"}, 8.0), ({"team": "red"}, 16.0)], id="notin-matches-missing"
        ),
        pytest.param(
            "team",
            [
                ({"app": "a", "team": "red"}, 1.0),
                ({"app": "a", "team": "blue"}, 2.0),
                ({"app": "b", "team": "red"}, 4.0),
                ({"team": "red"}, 16.0),
            ],
            id="exists",
        ),
        pytest.param("!team", [({"app": "c"}, 8.0)], id="not-exists"),
        pytest.param(
            "app in (,c)", [({"app": "c"}, 8.0), ({"team": "red"}, 16.0)], id="in-with-empty-is-missing"
        ),
        pytest.param("app=", [({"team": "red"}, 16.0)], id="eq-empty-is-missing"),
        pytest.param("app=a,team=blue", [({"app": "a", "team": "blue"}, 2.0)], id="and"),
        pytest.param("zone=x", [], id="label-no-series-has"),
        pytest.param("zone!=x", answers(GROUPS), id="neq-on-label-no-series-has"),
        pytest.param("!zone", answers(GROUPS), id="not-exists-on-label-no-series-has"),
        pytest.param("app=z", [], id="no-match"),
        pytest.param("", answers(GROUPS), id="everything"),
    ],
)
def test_pick_is_what_the_matchers_select(
    selector: str, expected: list[tuple[dict[str, str], float]]
) -> None:
    got = sharing.answer(SeriesSet(GROUPS), parse_selector(selector), Plan((), None))
    assert answers(got) == expected


@pytest.mark.parametrize(
    "selector", ["app=a", "app in (a,b)", "app in (a,)", "team=red,app!=b", "app", "zone=x"]
)
def test_the_index_finds_what_a_scan_finds(selector: str) -> None:
    parsed = parse_selector(selector)
    shared = SeriesSet(GROUPS)
    assert shared.matching(parsed) == [s for s in GROUPS if sharing.matches(parsed, s.labels)]
    assert shared.matching(parsed) == shared.matching(parsed)  # the index built by the first call agrees


@pytest.mark.parametrize(
    ("groups", "selector", "fold", "expected"),
    [
        pytest.param(GROUPS, "app=a", (), [({}, 3.0)], id="sum-of-one-app"),
        pytest.param(GROUPS, "app in (a,b)", (), [({}, 7.0)], id="sum-of-two-apps"),
        pytest.param(GROUPS, "app!=a", (), [({}, 28.0)], id="neq-counts-series-without-the-label"),
        pytest.param(GROUPS, "!app", (), [({}, 16.0)], id="not-exists"),
        pytest.param(GROUPS, "app=z", (), [], id="nothing-matches-no-sample-never-zero"),
        pytest.param([], "app=a", (), [], id="no-series"),
        pytest.param(GROUPS, "zone=x", (), [], id="label-no-series-has"),
        pytest.param(GROUPS, "!zone", (), [({}, 31.0)], id="not-exists-on-label-no-series-has"),
        pytest.param(
            GROUPS,
            "team=red",
            ("app",),
            [({"app": "a"}, 1.0), ({"app": "b"}, 4.0), ({}, 16.0)],
            id="fold-per-static-by-label-missing-label-is-its-own-group",
        ),
        pytest.param(
            [sample(1.0, app="a"), sample(NAN, app="a", team="x")],
            "app=a",
            (),
            [({}, NAN)],
            id="nan-poisons-the-sum-as-in-promql",
        ),
        pytest.param(
            [sample(math.inf, app="a"), sample(-math.inf, app="a", t="1")],
            "app=a",
            (),
            [({}, NAN)],
            id="inf-minus-inf-is-nan",
        ),
        pytest.param(
            [sample(math.inf, app="a"), sample(1.0, app="a", t="1")], "app=a", (), [({}, math.inf)], id="inf"
        ),
        pytest.param(
            [sample(0.1, app="a", t=str(i)) for i in range(10)],
            "app=a",
            (),
            [({}, 1.0)],
            id="sum-correctly-rounded",
        ),
    ],
)
def test_fold_is_the_sum_over_the_selected_series(
    groups: list[Sample], selector: str, fold: tuple[str, ...], expected: list[tuple[dict[str, str], float]]
) -> None:
    got = answers(sharing.answer(SeriesSet(groups), parse_selector(selector), Plan(("app",), fold)))
    assert [labels for labels, _ in got] == [labels for labels, _ in expected]
    for (_, value), (_, want) in zip(got, expected, strict=True):
        assert value == want or (math.isnan(value) and math.isnan(want))


def test_fold_keeps_the_newest_timestamp() -> None:
    got = sharing.answer(
        SeriesSet([Sample({"app": "a"}, T, 1.0), Sample({"app": "a", "t": "1"}, T + 1, 2.0)]),
        parse_selector("app=a"),
        Plan(("app",), ()),
    )
    assert [(s.labels, s.timestamp, s.value) for s in got] == [({}, T + 1, 3.0)]


def test_greater_than_has_no_promql_matcher() -> None:
    with pytest.raises(ValueError, match="no PromQL matcher"):
        sharing.matches(parse_selector("n>1"), {"n": "2"})


def compiled(metrics_query: str, **extra: Any) -> naming.CompiledRule:
    rule = DiscoveryRule.model_validate({"seriesQuery": "x", "metricsQuery": metrics_query, **extra})
    return naming.compile_rule(rule, 0, external=True)


@pytest.mark.parametrize(
    ("template", "group_by", "expected"),
    [
        pytest.param(
            f"sum({M}) by (<<.GroupBy>>)", (), 'sum(q{namespace="ml"}) by ()', id="per-selector-shape"
        ),
        pytest.param(
            f"sum({M}) by (<<.GroupBy>>)",
            ("app", "team"),
            'sum(q{namespace="ml"}) by (app,team)',
            id="grouped",
        ),
    ],
)
def test_shared_query_groups_by_the_selector_labels(
    template: str, group_by: tuple[str, ...], expected: str
) -> None:
    rule = compiled(template, resources={"overrides": {"namespace": {"resource": "namespace"}}})
    assert queries.build_external_query(rule, "q", "namespace", "ml", EVERYTHING, group_by) == expected


def test_shared_query_refuses_a_label_prometheus_cannot_name() -> None:
    rule = compiled(f"sum({M}) by (<<.GroupBy>>)")
    with pytest.raises(ValueError, match="not a valid Prometheus label name"):
        queries.build_external_query(rule, "q", None, "", EVERYTHING, ("app.kubernetes.io/name",))


# ---- the provider: how many queries N selectors cost -------------------------------------------------


class FakeProm:
    """Records every query; answers each with `samples` (what Prometheus would say is not the point here:
    the integration test compares values with a real Prometheus)."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        self.sent: list[str] = []

    async def query(
        self,
        promql: str,
        time: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InstantResult:
        self.sent.append(promql)
        return Vector(list(self.samples))


def provider(template: str, prom: FakeProm, *, cached: bool = True) -> tuple[Provider, ValueCache[Cached]]:
    rule = compiled(template, resources={"overrides": {"namespace": {"resource": "namespace"}}})
    registry = Registry(external={"q": ExternalMetric("q", "q", rule, "namespace")})
    cache: ValueCache[Cached] = ValueCache(refresh_interval=15, max_age=60, idle_expiry=600, clock=lambda: T)
    return (
        Provider(
            cast(PrometheusClient, prom),
            lambda: registry,
            metrics=new_metrics(CollectorRegistry()),
            cache=cache if cached else None,
            clock=lambda: T,
        ),
        cache,
    )


def route(selector: str) -> ExternalRoute:
    return ExternalRoute("ml", "q", parse_selector(selector))


APPS = [sample(float(i), app=f"app-{i}") for i in range(1000)]


async def test_a_thousand_selectors_cost_one_query_and_one_per_refresh() -> None:
    prom = FakeProm(APPS)
    p, cache = provider(f"sum({M}) by (<<.GroupBy>>)", prom)
    for i in range(1000):
        _, items = await p.external_items(route(f"app=app-{i}"))
        assert items == [({}, float(i), T)]
    assert prom.sent == ['sum(q{namespace="ml"}) by (app)']
    assert len(cache) == 1
    assert await cache.refresh_due(everything=True) == 1
    assert len(prom.sent) == 2


async def test_selectors_on_kept_labels_share_the_query_of_any_aggregation() -> None:
    prom = FakeProm(APPS)
    p, _ = provider(f"avg({M}) by (app)", prom)
    for i in range(100):
        _, items = await p.external_items(route(f"app in (app-{i},nope)"))
        assert items == [({"app": f"app-{i}"}, float(i), T)]
    _, items = await p.external_items(route("app notin (app-0)"))
    assert len(items) == 999
    assert prom.sent == ['avg(q{namespace="ml"}) by (app)']


@pytest.mark.parametrize(
    ("template", "cached"),
    [
        pytest.param(f"avg({M}) by (<<.GroupBy>>)", True, id="avg-over-the-selected-series"),
        pytest.param(f"max({M})", True, id="max-without-groupby"),
        pytest.param(f"sum({M}) by (<<.GroupBy>>)", False, id="cache-off"),
    ],
)
async def test_otherwise_each_selector_is_its_own_query(template: str, cached: bool) -> None:
    prom = FakeProm([sample(1.0)])
    p, _ = provider(template, prom, cached=cached)
    for i in range(10):
        await p.external_items(route(f"app=app-{i}"))
    assert len(prom.sent) == 10
    assert all(f'app="app-{i}"' in q for i, q in enumerate(prom.sent))


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        pytest.param("n>1", "labelSelector: operator in 'n>1' is not supported by Prometheus", id="gt"),
        pytest.param("app.kubernetes.io/name=x", "labelSelector: metric label selector key", id="dotted-key"),
    ],
)
async def test_a_selector_prometheus_cannot_express_is_still_a_bad_request(
    selector: str, message: str
) -> None:
    prom = FakeProm(APPS)
    p, cache = provider(f"sum({M}) by (<<.GroupBy>>)", prom)
    with pytest.raises(BadRequest, match=message):
        await p.external_items(route(selector))
    assert prom.sent == [] and len(cache) == 0
