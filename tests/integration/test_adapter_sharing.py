"""Shared external-metric queries against a REAL Prometheus: the same answers as one query per selector.

Ten minutes of history ending at T (promtool backfill): a `jobs_waiting` gauge in two namespaces whose
series differ in which of `app` / `team` they carry, with NaN and ±Inf series and values that are not exact
in binary, and a `jobs_done_total` counter. For every recognised template and every selector (each
operator, labels no series has, the empty selector), the answer computed from the shared query
(`adapter.sharing`) must equal what Prometheus answers for the per-selector query — labels exactly, values
up to floating-point rounding, NaN for NaN — and the provider in cache mode must send one query for all.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from adapter import naming, queries, sharing
from adapter.cache import ValueCache
from adapter.provider import Cached, Provider
from adapter.registry import ExternalMetric, Registry
from adapter.routing import ExternalRoute
from adapter.selectors import EVERYTHING, parse
from adapter.selfmetrics import new_metrics
from gpuwarden.config.metric_rules import DiscoveryRule
from gpuwarden.config.root import Config
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import InstantResult, Sample, Vector
from harness.localprom import LocalPrometheus, backfill_openmetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

STEP, POINTS = 15, 41

# (namespace, labels, value): which labels a series has is the point
WAITING = [
    ("ml", 'app="a",team="red",queue="q1"', "0.1"),
    ("ml", 'app="a",team="blue",queue="q2"', "0.2"),
    ("ml", 'app="a",team="blue",queue="q2b"', "0.7"),
    ("ml", 'app="b",team="red",queue="q3"', "3.3"),
    ("ml", 'app="c",queue="q4"', "1e16"),
    ("ml", 'app="c",queue="q4b"', "1"),
    ("ml", 'team="red",queue="q5"', "16.25"),
    ("ml", 'app="n",queue="q6"', "NaN"),
    ("ml", 'app="n",team="red",queue="q6b"', "2"),
    ("ml", 'app="i",queue="q7"', "+Inf"),
    ("ml", 'app="i",queue="q8"', "-Inf"),
    ("ml", 'app="p",queue="q9"', "+Inf"),
    ("prod", 'app="a",team="red",queue="q1"', "1000"),
]

M = "<<.Series>>{<<.LabelMatchers>>}"
TEMPLATES = {
    "sum-groupby": ("jobs_waiting", f"sum({M}) by (<<.GroupBy>>)"),
    "count-groupby": ("jobs_waiting", f"count({M}) by (<<.GroupBy>>)"),
    "sum-by-team-groupby": ("jobs_waiting", f"sum by (team, <<.GroupBy>>) ({M})"),
    "sum-by-queue": ("jobs_waiting", f"sum({M}) by (queue)"),
    "avg-by-app": ("jobs_waiting", f"avg({M}) by (app)"),
    "max-by-app-team": ("jobs_waiting", f"max({M}) by (app, team)"),
    "stddev-by-app": ("jobs_waiting", f"stddev({M}) by (app)"),
    "series": ("jobs_waiting", M),
    "rate-sum-groupby": ("jobs_done_total", f"sum(rate({M}[2m])) by (<<.GroupBy>>)"),
    "rate-series": ("jobs_done_total", f"rate({M}[2m])"),
    "avg-groupby-not-shared": ("jobs_waiting", f"avg({M}) by (<<.GroupBy>>)"),
}
SELECTORS = [
    "",
    "app=a",
    "app==b",
    "app!=a",
    "app in (a,b)",
    "app notin (a,c)",
    "app in (,c)",
    "app=",
    "team",
    "!team",
    "team=red",
    "app=a,team=red",
    "team!=blue,app in (a,b,c)",
    "app=n",
    "app=i",
    "app in (i,p)",
    "app=zzz",
    "zone=x",
    "zone!=x",
    "!zone",
    "queue=q1",
    "queue in (q2,q2b,q5)",
]


def history(t_end: int) -> str:
    waiting, done = ["# TYPE jobs_waiting gauge"], ["# TYPE jobs_done counter"]
    for i in range(POINTS):
        ts = t_end - (POINTS - 1 - i) * STEP
        for ns, labels, value in WAITING:
            waiting.append(f'jobs_waiting{{namespace="{ns}",{labels}}} {value} {ts}')
        for n, (ns, labels, _) in enumerate(WAITING):
            done.append(f'jobs_done_total{{namespace="{ns}",{labels}}} {i * (n + 1) * 3} {ts}')
    return "\n".join(waiting + done) + "\n# EOF\n"


def compiled(template: str) -> naming.CompiledRule:
    rule = DiscoveryRule.model_validate(
        {
            "seriesQuery": "x",
            "metricsQuery": template,
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        }
    )
    return naming.compile_rule(rule, 0, external=True)


class Counting:
    """The real client, with the value queries it sent recorded."""

    def __init__(self, client: PrometheusClient) -> None:
        self.client = client
        self.sent: list[str] = []

    async def query(
        self,
        promql: str,
        time: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InstantResult:
        self.sent.append(promql)
        return await self.client.query(promql, time=time, timeout=timeout)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prom(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[PrometheusClient, float]]:
    workdir = tmp_path_factory.mktemp("sharing-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as server:
        config = Config.model_validate({"prometheus": {"url": server.url, "retries": 0}})
        client = PrometheusClient(config.prometheus, registry=CollectorRegistry())
        try:
            yield client, float(t_end)
        finally:
            await client.aclose()


def same(a: list[Sample], b: list[Sample]) -> bool:
    """Equal as sets of (labels, value), values up to rounding, NaN equal to NaN."""

    def key(s: Sample) -> list[tuple[str, str]]:
        return sorted(s.labels.items())

    if sorted(map(key, a)) != sorted(map(key, b)):
        return False
    for x, y in zip(sorted(a, key=key), sorted(b, key=key), strict=True):
        if not (
            math.isclose(x.value, y.value, rel_tol=1e-12) or (math.isnan(x.value) and math.isnan(y.value))
        ):
            return False
    return True


async def values(client: PrometheusClient, promql: str, at: float) -> list[Sample]:
    result = await client.query(promql, time=at)
    assert isinstance(result, Vector), promql
    return result.samples


@pytest.mark.parametrize("name", list(TEMPLATES))
async def test_shared_answers_equal_the_per_selector_queries(
    prom: tuple[PrometheusClient, float], name: str
) -> None:
    client, t = prom
    series, template = TEMPLATES[name]
    rule = compiled(template)
    shape = sharing.shape_of(rule.query)
    shared_answers: dict[tuple[str, ...], sharing.SeriesSet] = {}
    compared = 0
    for text in SELECTORS:
        selector = parse(text)
        how = sharing.plan(shape, selector)
        if how is None:
            continue
        if how.group_by not in shared_answers:
            shared = queries.build_external_query(rule, series, "namespace", "ml", EVERYTHING, how.group_by)
            shared_answers[how.group_by] = sharing.SeriesSet(await values(client, shared, t))
        own = await values(client, queries.build_external_query(rule, series, "namespace", "ml", selector), t)
        got = sharing.answer(shared_answers[how.group_by], selector, how)
        assert same(got, own), (text, got, own)
        compared += 1
    if name == "avg-groupby-not-shared":
        assert compared == 1  # the empty selector; every other one keeps its own query
    else:
        assert compared >= 3  # at least "" and the selectors on the labels the template keeps


async def test_folding_an_average_would_be_wrong(prom: tuple[PrometheusClient, float]) -> None:
    """Why avg/max/... over labels the selector reads keep a query per selector: on these data the sum of
    per-app averages is not the average over the apps' series."""
    client, t = prom
    rule = compiled(f"avg({M}) by (<<.GroupBy>>)")
    assert sharing.plan(sharing.shape_of(rule.query), parse("app in (a,b)")) is None
    selector = parse("app in (a,b)")
    shared = queries.build_external_query(rule, "jobs_waiting", "namespace", "ml", EVERYTHING, ("app",))
    folded = sharing.answer(
        sharing.SeriesSet(await values(client, shared, t)), selector, sharing.Plan(("app",), ())
    )
    own = await values(
        client, queries.build_external_query(rule, "jobs_waiting", "namespace", "ml", selector), t
    )
    assert not same(folded, own)


async def test_the_provider_sends_one_query_for_every_selector(prom: tuple[PrometheusClient, float]) -> None:
    client, t = prom
    counting = Counting(client)
    rule = compiled(f"sum({M}) by (<<.GroupBy>>)")
    registry = Registry(external={"jobs": ExternalMetric("jobs", "jobs_waiting", rule, "namespace")})
    cache: ValueCache[Cached] = ValueCache(refresh_interval=15, max_age=60, idle_expiry=600, clock=lambda: t)
    kwargs: dict[str, Any] = {"metrics": new_metrics(None), "clock": lambda: t, "eval_time": lambda: t}
    cached = Provider(counting, lambda: registry, cache=cache, **kwargs)  # type: ignore[arg-type]
    direct = Provider(client, lambda: registry, **kwargs)
    app_selectors = [s for s in SELECTORS if s and all(r.key == "app" for r in parse(s).requirements)]
    for text in app_selectors:
        route = ExternalRoute("ml", "jobs", parse(text))
        _, ours = await cached.external_items(route)
        _, theirs = await direct.external_items(route)
        assert sorted(ours) == sorted(theirs) or all(
            math.isclose(a[1], b[1], rel_tol=1e-12) and a[0] == b[0]
            for a, b in zip(sorted(ours), sorted(theirs), strict=True)
        ), text
    assert counting.sent == ['sum(jobs_waiting{namespace="ml"}) by (app)']
    assert len(app_selectors) >= 8
