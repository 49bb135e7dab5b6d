"""Query building and the series registry, with prometheus-adapter's own test cases ported as data.

- `TestBuildSelector` / `TestBuildExternalSelector` (pkg/naming/metrics_query_test.go): the resource-converter
  mock there maps a resource to a label of the same name and namespaces to `namespaces`; here those labels
  are passed explicitly. The `extraGroupBy` cases are omitted: they exist only for metrics.k8s.io.
- The series-registry cases (pkg/custom-provider/series_registry_test.go) run prometheus-adapter's
  `DefaultConfig(1m, "kube_")` rules over its test series. Group-resources are normalized to today's groups
  (`deployments.apps`, `ingresses.networking.k8s.io`) where the Go test's RESTMapper used `extensions`.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapter import naming, queries, registry
from adapter.resources import GroupResource, parse
from adapter.selectors import EVERYTHING
from adapter.selectors import parse as parse_selector
from gpuwarden.config.metric_rules import DiscoveryRule


def compiled(metrics_query: str, *, external: bool = False, **extra: Any) -> naming.CompiledRule:
    rule = DiscoveryRule.model_validate({"seriesQuery": "x", "metricsQuery": metrics_query, **extra})
    return naming.compile_rule(rule, 0, external=external)


@pytest.mark.parametrize(
    ("template", "namespace", "selector", "names", "expected"),
    [
        pytest.param("series <<.Series>>", "", "", ["bar"], "series foo", id="series"),
        pytest.param(
            "<<.LabelMatchers>>", "", "", ["bar", "baz"], 'resource=~"bar|baz"', id="multiple-matchers"
        ),
        pytest.param("<<.LabelMatchers>>", "", "", ["bar"], 'resource="bar"', id="single-matcher"),
        pytest.param(
            "<<.LabelMatchers>>",
            "",
            "metric1=value1",
            ["bar"],
            'metric1="value1",resource="bar"',
            id="matchers-with-metric-selector",
        ),
        pytest.param(
            '<<index .LabelValuesByName "resource">>', "", "", ["bar"], "bar", id="single-values-by-name"
        ),
        pytest.param(
            '<<index .LabelValuesByName "resource">>',
            "",
            "",
            ["bar", "baz"],
            "bar|baz",
            id="multiple-values-by-name",
        ),
        pytest.param(
            '<<index .LabelValuesByName "namespaces">> <<index .LabelValuesByName "resource">>',
            "default",
            "",
            ["bar", "baz"],
            "default bar|baz",
            id="values-by-name-with-namespace",
        ),
        pytest.param("<<.GroupBy>>", "", "", None, "resource", id="single-group-by"),
        pytest.param("<<.GroupBySlice>>", "", "", None, "[resource]", id="single-group-by-slice"),
        pytest.param(
            "<<.LabelMatchers>>", "ns", "", None, 'namespaces="ns",resource!=""', id="all-objects-cache-mode"
        ),
    ],
)
def test_build_selector(
    template: str, namespace: str, selector: str, names: list[str] | None, expected: str
) -> None:
    rule = compiled(template)
    query = queries.build_object_query(
        rule, "foo", "resource", "namespaces", namespace, parse_selector(selector), names
    )
    assert query == expected


@pytest.mark.parametrize(
    ("template", "namespace", "selector", "expected"),
    [
        pytest.param("series <<.Series>>", "", "", "series foo", id="series"),
        pytest.param("<<.GroupBy>>|<<.GroupBySlice>>", "", "", "|[]", id="group-by-is-empty-for-external"),
        pytest.param(
            '<<index .LabelValuesByName "namespaces">> <<.GroupBySlice>>',
            "default",
            "",
            "default []",
            id="namespaced-values-by-name",
        ),
        pytest.param("<<.LabelMatchers>>", "", "foo=bar", 'foo="bar"', id="single-matcher"),
        pytest.param(
            "<<.LabelMatchers>>", "default", "foo=bar", 'foo="bar",namespaces="default"', id="with-namespace"
        ),
        pytest.param(
            "<<.LabelMatchers>>",
            "",
            "foo=bar,qux in (bar,baz)",
            'foo="bar",qux=~"bar|baz"',
            id="multiple-matchers",
        ),
        pytest.param("<<.LabelValuesByName>>", "", "foo=bar", "map[foo:bar]", id="values-by-name-map"),
        pytest.param(
            "<<.LabelValuesByName>>", "", "foo in (bar,baz)", "map[foo:bar|baz]", id="values-by-name-multi"
        ),
    ],
)
def test_build_external_selector(template: str, namespace: str, selector: str, expected: str) -> None:
    rule = compiled(template, external=True)
    assert (
        queries.build_external_query(rule, "foo", "namespaces", namespace, parse_selector(selector))
        == expected
    )


def test_batch_of_namespaces_is_one_literal_regex_grouped_by_namespace() -> None:
    rule = compiled("sum(x{<<.LabelMatchers>>}) by (<<.GroupBy>>) <<.GroupBySlice>>")
    assert queries.batchable(rule)
    query = queries.build_object_query(rule, "x", "pod", "namespace", ["a", "b.c"], EVERYTHING, None)
    assert query == 'sum(x{namespace=~"a|b\\\\.c",pod!=""}) by (namespace,pod) [namespace pod]'
    assert not queries.batchable(compiled("sum(x{<<.LabelMatchers>>}) by (pod)"))


def test_external_not_namespaced_skips_the_namespace_matcher() -> None:
    rule = compiled("<<.LabelMatchers>>", external=True, resources={"namespaced": False})
    assert (
        queries.build_external_query(rule, "foo", "namespaces", "default", parse_selector("a=b")) == 'a="b"'
    )


def test_namespaced_query_without_namespace_label_is_a_query_error() -> None:
    with pytest.raises(queries.QueryError, match="no label maps to namespaces"):
        queries.build_object_query(
            compiled("<<.LabelMatchers>>"), "foo", "pod", None, "ns", EVERYTHING, ["a"]
        )


def test_empty_template_output_is_an_error() -> None:
    with pytest.raises(queries.QueryError, match="empty query"):
        queries.build_object_query(compiled("<<.Series>>"), "", "pod", None, "", EVERYTHING, ["a"])


# --- prometheus-adapter DefaultConfig(1m, "kube_") and series_registry_test.go -------------------------

CONTAINER_QUERY = '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
NORMAL_QUERY = '{kube_namespace!="",__name__!~"^container_.*"}'
CONTAINER_RES = {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}


def default_config() -> list[naming.CompiledRule]:
    rate = 'sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[1m])) by (<<.GroupBy>>)'
    rules = [
        {
            "seriesQuery": CONTAINER_QUERY,
            "resources": CONTAINER_RES,
            "name": {"matches": "^container_(.*)_seconds_total$"},
            "metricsQuery": rate,
        },
        {
            "seriesQuery": CONTAINER_QUERY,
            "seriesFilters": [{"isNot": "^container_.*_seconds_total$"}],
            "resources": CONTAINER_RES,
            "name": {"matches": "^container_(.*)_total$"},
            "metricsQuery": rate,
        },
        {
            "seriesQuery": CONTAINER_QUERY,
            "seriesFilters": [{"isNot": "^container_.*_total$"}],
            "resources": CONTAINER_RES,
            "name": {"matches": "^container_(.*)$"},
            "metricsQuery": 'sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)',
        },
        {
            "seriesQuery": NORMAL_QUERY,
            "seriesFilters": [{"isNot": ".*_total$"}],
            "resources": {"template": "kube_<<.Resource>>"},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        },
        {
            "seriesQuery": NORMAL_QUERY,
            "seriesFilters": [{"isNot": ".*_seconds_total"}],
            "name": {"matches": "^(.*)_total$"},
            "resources": {"template": "kube_<<.Resource>>"},
            "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
        },
        {
            "seriesQuery": NORMAL_QUERY,
            "name": {"matches": "^(.*)_seconds_total$"},
            "resources": {"template": "kube_<<.Resource>>"},
            "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
        },
    ]
    return naming.compile_rules([DiscoveryRule.model_validate(r) for r in rules], external=False)


def series(name: str, **labels: str) -> dict[str, str]:
    return {"__name__": name, **labels}


SERIES = {
    CONTAINER_QUERY: [
        series("container_some_time_seconds_total", pod="somepod", namespace="somens", container="somecont"),
        series("container_some_count_total", pod="somepod", namespace="somens", container="somecont"),
        series("container_some_usage", pod="somepod", namespace="somens", container="somecont"),
    ],
    NORMAL_QUERY: [
        series("node_gigawatts", kube_node="somenode"),
        series("service_proxy_packets", kube_service="somesvc", kube_namespace="somens"),
        series(
            "ingress_hits_total",
            kube_ingress="someingress",
            kube_service="somesvc",
            kube_pod="backend1",
            kube_namespace="somens",
        ),
        series(
            "ingress_hits_total",
            kube_ingress="someingress",
            kube_service="somesvc",
            kube_pod="backend2",
            kube_namespace="somens",
        ),
        series("volume_claims_total", kube_persistentvolume="somepv"),
        series("work_queue_wait_seconds_total", kube_deployment="somedep", kube_namespace="somens"),
        series("node_fan_seconds_total", kube_node="somenode"),
    ],
}


@pytest.fixture(scope="module")
def default_registry() -> registry.Registry:
    return registry.build_registry(default_config(), [], SERIES)


def query_for(
    reg: registry.Registry, resource: str, metric: str, namespace: str, selector: str, *names: str
) -> str:
    entry = reg.custom[(parse(resource), metric)]
    return queries.build_object_query(
        entry.rule,
        entry.series,
        entry.resource_label,
        entry.namespace_label,
        namespace,
        parse_selector(selector),
        list(names),
    )


@pytest.mark.parametrize(
    ("resource", "metric", "namespace", "selector", "names", "expected"),
    [
        pytest.param(
            "pods",
            "some_usage",
            "somens",
            "",
            ["somepod1", "somepod2"],
            'sum(container_some_usage{namespace="somens",pod=~"somepod1|somepod2",container!="POD"}) '
            "by (pod)",
            id="container-gauge-multiple-names",
        ),
        pytest.param(
            "pods",
            "some_count",
            "somens",
            "",
            ["somepod1", "somepod2"],
            'sum(rate(container_some_count_total{namespace="somens",pod=~"somepod1|somepod2",'
            'container!="POD"}[1m])) by (pod)',
            id="container-counter",
        ),
        pytest.param(
            "pods",
            "some_time",
            "somens",
            "",
            ["somepod1", "somepod2"],
            'sum(rate(container_some_time_seconds_total{namespace="somens",pod=~"somepod1|somepod2",'
            'container!="POD"}[1m])) by (pod)',
            id="container-seconds-counter",
        ),
        pytest.param(
            "service",
            "ingress_hits",
            "somens",
            "",
            ["somesvc"],
            'sum(rate(ingress_hits_total{kube_namespace="somens",kube_service="somesvc"}[1m])) '
            "by (kube_service)",
            id="namespaced-counter-service",
        ),
        pytest.param(
            "service",
            "ingress_hits",
            "somens",
            "param1=value1",
            ["somesvc"],
            'sum(rate(ingress_hits_total{param1="value1",kube_namespace="somens",kube_service="somesvc"}'
            "[1m])) by (kube_service)",
            id="namespaced-counter-with-metric-selector",
        ),
        pytest.param(
            "ingress.extensions",
            "ingress_hits",
            "somens",
            "",
            ["someingress"],
            'sum(rate(ingress_hits_total{kube_namespace="somens",kube_ingress="someingress"}[1m])) '
            "by (kube_ingress)",
            id="namespaced-counter-ingress-legacy-group",
        ),
        pytest.param(
            "pod",
            "ingress_hits",
            "somens",
            "",
            ["somepod"],
            'sum(rate(ingress_hits_total{kube_namespace="somens",kube_pod="somepod"}[1m])) by (kube_pod)',
            id="namespaced-counter-pod-singular",
        ),
        pytest.param(
            "service",
            "service_proxy_packets",
            "somens",
            "",
            ["somesvc"],
            'sum(service_proxy_packets{kube_namespace="somens",kube_service="somesvc"}) by (kube_service)',
            id="namespaced-gauge",
        ),
        pytest.param(
            "deployment.extensions",
            "work_queue_wait",
            "somens",
            "",
            ["somedep"],
            'sum(rate(work_queue_wait_seconds_total{kube_namespace="somens",kube_deployment="somedep"}'
            "[1m])) by (kube_deployment)",
            id="namespaced-seconds-counter",
        ),
        pytest.param(
            "node",
            "node_gigawatts",
            "",
            "",
            ["somenode"],
            'sum(node_gigawatts{kube_node="somenode"}) by (kube_node)',
            id="root-gauge",
        ),
        pytest.param(
            "persistentvolume",
            "volume_claims",
            "",
            "",
            ["somepv"],
            'sum(rate(volume_claims_total{kube_persistentvolume="somepv"}[1m])) by (kube_persistentvolume)',
            id="root-counter",
        ),
        pytest.param(
            "node",
            "node_fan",
            "",
            "",
            ["somenode"],
            'sum(rate(node_fan_seconds_total{kube_node="somenode"}[1m])) by (kube_node)',
            id="root-seconds-counter",
        ),
    ],
)
def test_series_registry_queries(
    default_registry: registry.Registry,
    resource: str,
    metric: str,
    namespace: str,
    selector: str,
    names: list[str],
    expected: str,
) -> None:
    assert query_for(default_registry, resource, metric, namespace, selector, *names) == expected


def test_series_registry_lists_all_17_metrics(default_registry: registry.Registry) -> None:
    listed = {(str(gr), metric, e.namespaced) for (gr, metric), e in default_registry.custom.items()}
    assert listed == {
        ("pods", "some_count", True),
        ("namespaces", "some_count", False),
        ("pods", "some_time", True),
        ("namespaces", "some_time", False),
        ("pods", "some_usage", True),
        ("namespaces", "some_usage", False),
        ("services", "ingress_hits", True),
        ("ingresses.networking.k8s.io", "ingress_hits", True),
        ("pods", "ingress_hits", True),
        ("namespaces", "ingress_hits", False),
        ("services", "service_proxy_packets", True),
        ("namespaces", "service_proxy_packets", False),
        ("deployments.apps", "work_queue_wait", True),
        ("namespaces", "work_queue_wait", False),
        ("nodes", "node_gigawatts", False),
        ("persistentvolumes", "volume_claims", False),
        ("nodes", "node_fan", False),
    }


def test_registry_is_empty_before_the_first_discovery() -> None:
    assert registry.build_registry(default_config(), [], {}).custom == {}


def test_pods_without_namespace_label_are_not_registered() -> None:
    rule = compiled("<<.Series>>", resources={"template": "<<.Resource>>"})
    reg = registry.build_registry([rule], [], {"x": [series("m", pod="p")]})
    assert reg.custom == {}
    assert any("no namespace label" in n for n in reg.notes)


def test_first_rule_wins_on_conflicts_and_says_so() -> None:
    first = naming.compile_rule(
        DiscoveryRule.model_validate(
            {"seriesQuery": "x", "metricsQuery": "a", "resources": {"template": "<<.Resource>>"}}
        ),
        0,
        external=False,
    )
    second = naming.compile_rule(
        DiscoveryRule.model_validate(
            {"seriesQuery": "x", "metricsQuery": "b", "resources": {"template": "<<.Resource>>"}}
        ),
        1,
        external=False,
    )
    reg = registry.build_registry([first, second], [], {"x": [series("m", node="n")]})
    assert reg.custom[(GroupResource("nodes"), "m")].rule is first
    assert any("rules[0] won" in n for n in reg.notes)


def test_external_registry_and_resource_list() -> None:
    rule = compiled(
        "q",
        external=True,
        seriesQuery="y",
        name={"matches": "^(.*)_total$", "as": "${1}_per_second"},
        resources={"overrides": {"namespace": {"resource": "namespace"}}},
    )
    reg = registry.build_registry([], [rule], {"y": [series("jobs_total", namespace="a"), series("other")]})
    assert list(reg.external) == ["jobs_per_second"]
    assert reg.external["jobs_per_second"].namespace_label == "namespace"
    assert reg.external_resources() == [("jobs_per_second", True, "ExternalMetricValueList")]


@pytest.mark.parametrize(
    ("query", "name"),
    [
        pytest.param("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL", id="bare-name"),
        pytest.param('http_requests_total{pod!=""}', "http_requests_total", id="name-with-matchers"),
        pytest.param('{__name__=~"^container_.*"}', None, id="regex-name"),
        pytest.param("up or down", None, id="expression"),
    ],
)
def test_single_metric_series_queries_use_the_labels_endpoint(query: str, name: str | None) -> None:
    assert registry.single_metric(query) == name


@pytest.mark.parametrize(
    ("query", "names"),
    [
        pytest.param("DCGM_FI_DEV_GPU_UTIL", ["DCGM_FI_DEV_GPU_UTIL"], id="bare-name"),
        pytest.param('a{pod!=""}', ["a"], id="name-with-matchers"),
        pytest.param('{__name__=~"a|b_c:d"}', ["a", "b_c:d"], id="alternatives"),
        pytest.param('{ __name__ =~ "^a|b$" }', ["a", "b"], id="anchored"),
        pytest.param('{__name__=~"a|a"}', ["a"], id="duplicates"),
        pytest.param('{__name__=~"a.*"}', None, id="pattern"),
        pytest.param('{__name__=~"a|b",pod!=""}', None, id="more-matchers"),
        pytest.param('{__name__!~"a|b"}', None, id="negative"),
    ],
)
def test_metric_names_that_label_names_suffice_for(query: str, names: list[str] | None) -> None:
    assert registry.metric_names(query) == names


def test_one_rule_naming_two_series_as_one_metric_says_nothing_when_its_query_names_them_itself() -> None:
    res = {"template": "<<.Resource>>"}
    quiet = compiled(
        "avg(a{<<.LabelMatchers>>} or b{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        name={"as": "m"},
        resources=res,
    )
    found = {"x": [series("a", node="n"), series("b", node="n")]}
    reg = registry.build_registry([quiet], [], found)
    assert list(reg.custom) == [(GroupResource("nodes"), "m")] and reg.notes == ()
    loud = compiled("avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)", name={"as": "m"}, resources=res)
    reg = registry.build_registry([loud], [], found)
    assert any("from b ignored" in n for n in reg.notes)


def test_distinct_series_strips_label_values() -> None:
    found = registry.distinct_series([series("a", pod="1"), series("a", pod="2"), series("a", node="x")])
    assert found == [("a", frozenset({"pod"})), ("a", frozenset({"node"}))]
