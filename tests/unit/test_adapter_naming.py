"""Compiled rules: the Go-template subset, `as` expansion, series filters, label/resource mapping, presets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from adapter import naming, presets, queries
from adapter.gotemplate import TemplateError, compile_template
from adapter.resources import GroupResource
from gpuwarden.config.adapter import Presets
from gpuwarden.config.metric_rules import DiscoveryRule
from gpuwarden.config.templatefields import QUERY_TEMPLATE_FIELDS

FIELDS = frozenset(QUERY_TEMPLATE_FIELDS)
ARGS: dict[str, Any] = {
    "Series": "foo",
    "LabelMatchers": 'a="b"',
    "LabelValuesByName": {"pod": "p1|p2", "namespace": "ns"},
    "GroupBy": "pod",
    "GroupBySlice": ["pod", "extra"],
}


@pytest.mark.parametrize(
    ("source", "rendered"),
    [
        pytest.param(
            "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)", 'sum(foo{a="b"}) by (pod)', id="fields"
        ),
        pytest.param("<< .Series >>", "foo", id="spaces-inside-delimiters"),
        pytest.param('<<index .LabelValuesByName "pod">>', "p1|p2", id="index-map"),
        pytest.param('<<index .LabelValuesByName "missing">>', "", id="index-missing-key"),
        pytest.param("<<.LabelValuesByName.namespace>>", "ns", id="map-field"),
        pytest.param("<<index .GroupBySlice 1>>", "extra", id="index-slice"),
        pytest.param("<<.GroupBySlice>>", "[pod extra]", id="slice-prints-like-go"),
        pytest.param("<<.LabelValuesByName>>", "map[namespace:ns pod:p1|p2]", id="map-prints-sorted"),
        pytest.param("<<len .GroupBySlice>>", "2", id="len"),
        pytest.param("a  <<- .Series ->>  b", "afoob", id="trim-markers"),
        pytest.param("x<</* comment */>>y", "xy", id="comment"),
        pytest.param("no actions", "no actions", id="plain-text"),
    ],
)
def test_template_render(source: str, rendered: str) -> None:
    assert compile_template(source, FIELDS).render(ARGS) == rendered


@pytest.mark.parametrize(
    ("source", "message"),
    [
        pytest.param("<<if .Series>>x<<end>>", "unsupported action", id="if"),
        pytest.param("<<range .GroupBySlice>><<.>><<end>>", "unsupported action", id="range"),
        pytest.param('<<printf "%s" .Series>>', "unsupported action", id="printf"),
        pytest.param("<<.Series | len>>", "unsupported action", id="pipeline"),
        pytest.param("<<.Nope>>", "unknown field .Nope", id="unknown-field"),
        pytest.param("<<.Series", "stray delimiter", id="unclosed"),
        pytest.param("<<>>", "empty action", id="empty"),
    ],
)
def test_template_rejects_what_it_cannot_render_faithfully(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(message)):
        compile_template(source, FIELDS)


@pytest.mark.parametrize(
    ("pattern", "template", "name", "expected"),
    [
        pytest.param(".*", "$0", "foo_total", "foo_total", id="whole-match"),
        pytest.param("^(.*)_total$", "$1", "foo_total", "foo", id="group-1"),
        pytest.param("^(.*)_total$", "${1}_per_second", "foo_total", "foo_per_second", id="braced"),
        pytest.param(
            "^(.*)_total$", "$1_per_second", "foo_total", "", id="go-reads-$1_per_second-as-one-name"
        ),
        pytest.param("^(?P<base>.*)_total$", "${base}_rate", "foo_total", "foo_rate", id="named"),
        pytest.param("^(.*)$", "$$1", "foo", "$1", id="escaped-dollar"),
        pytest.param("^(.*)$", "$9", "foo", "", id="unknown-group-is-empty"),
    ],
)
def test_go_expand(pattern: str, template: str, name: str, expected: str) -> None:
    match = re.search(pattern, name)
    assert match is not None
    assert naming.go_expand(template, match) == expected


def rule(**raw: Any) -> naming.CompiledRule:
    return naming.compile_rule(
        DiscoveryRule.model_validate({"seriesQuery": "x", "metricsQuery": "q", **raw}), 0, external=False
    )


@pytest.mark.parametrize(
    ("filters", "matches", "name", "accepted"),
    [
        pytest.param([{"is": "^my_.*"}], "", "my_label", True, id="is-match"),
        pytest.param([{"is": "^my_.*"}], "", "your_label", False, id="is-miss"),
        pytest.param([{"isNot": "^my_.*"}], "", "my_label", False, id="isnot-match"),
        pytest.param([{"isNot": "^my_.*"}], "", "your_label", True, id="isnot-miss"),
        pytest.param([], "^(.*)_total$", "x_count", False, id="name-matches-is-an-implicit-filter"),
        pytest.param(
            [{"isNot": "_seconds_total$"}], "^(.*)_total$", "x_seconds_total", False, id="all-must-agree"
        ),
    ],
)
def test_series_filters(filters: list[dict[str, str]], matches: str, name: str, accepted: bool) -> None:
    compiled = rule(seriesFilters=filters, name={"matches": matches} if matches else {})
    assert compiled.accepts(name) is accepted


@pytest.mark.parametrize(
    ("resources", "label", "resource"),
    [
        pytest.param({"template": "<<.Resource>>"}, "pod", GroupResource("pods"), id="template-core"),
        pytest.param(
            {"template": "<<.Resource>>"}, "job", GroupResource("jobs", "batch"), id="template-grouped"
        ),
        pytest.param({"template": "<<.Resource>>"}, "instance", None, id="template-unknown-resource"),
        pytest.param(
            {"template": "kube_<<.Group>>_<<.Resource>>"},
            "kube_apps_deployment",
            GroupResource("deployments", "apps"),
            id="template-with-group",
        ),
        pytest.param(
            {"template": "kube_<<.Group>>_<<.Resource>>"},
            "kube_batch_deployment",
            None,
            id="template-group-mismatch",
        ),
        pytest.param(
            {"overrides": {"exported_pod": {"resource": "pod"}}},
            "exported_pod",
            GroupResource("pods"),
            id="override",
        ),
        pytest.param(
            {"overrides": {"Hostname": {"resource": "nodes"}}}, "hostname", None, id="override-exact-case"
        ),
    ],
)
def test_resource_for_label(resources: dict[str, Any], label: str, resource: GroupResource | None) -> None:
    assert rule(resources=resources).resources.resource_for_label(label) == resource


def test_label_for_resource_prefers_overrides_then_template() -> None:
    converter = rule(
        resources={"template": "kube_<<.Resource>>", "overrides": {"ns": {"resource": "namespace"}}}
    )
    assert converter.resources.label_for(GroupResource("namespaces")) == "ns"
    assert converter.resources.label_for(GroupResource("pods")) == "kube_pod"
    assert rule().resources.label_for(GroupResource("pods")) is None


@pytest.mark.parametrize(
    ("query", "window"),
    [
        pytest.param("sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)", 120, id="rate-2m"),
        pytest.param("sum(irate(x[30s])) + sum(increase(y[1m30s]))", 90, id="longest-wins"),
        pytest.param("avg(<<.Series>>{<<.LabelMatchers>>})", None, id="gauge"),
        pytest.param("max_over_time(x[5m])", None, id="over-time-is-not-a-rate"),
    ],
)
def test_rate_window_seconds(query: str, window: int | None) -> None:
    assert naming.rate_window_seconds(query) == window


def test_compile_rules_reports_every_problem_at_once() -> None:
    bad = [
        DiscoveryRule.model_validate({"seriesQuery": "x", "metricsQuery": q})
        for q in ("<<if .Series>>x<<end>>", '<<printf "%s" .Series>>')
    ]
    with pytest.raises(naming.RuleError) as info:
        naming.compile_rules(bad, external=False)
    assert "rules[0]" in str(info.value) and "rules[1]" in str(info.value)


def preset_queries(cfg: dict[str, Any]) -> dict[str, str]:
    rules = presets.preset_rules(Presets.model_validate(cfg), 120)
    return {r.name.as_: r.metrics_query for r in rules}


def test_presets_default_queries() -> None:
    fresh = "(<<.Series>>{<<.LabelMatchers>>} and timestamp(<<.Series>>{<<.LabelMatchers>>}) > time() - 120)"
    util = (
        "(DCGM_FI_DEV_GPU_UTIL{<<.LabelMatchers>>} and "
        "timestamp(DCGM_FI_DEV_GPU_UTIL{<<.LabelMatchers>>}) > time() - 120)"
    )
    mig = (
        '(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!="",<<.LabelMatchers>>} and '
        'timestamp(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!="",<<.LabelMatchers>>}) > time() - 120)'
    )
    assert preset_queries({"engines": {"enabled": False}}) == {
        # one value per device (GPU or MIG instance; per-pod copies of one device collapse), then the mean
        "gpu_utilization": "avg by (<<.GroupBy>>) (max by (<<.GroupBy>>,Hostname,hostname,gpu,UUID,GPU_I_ID) "
        f"({util} or ({mig} * 100)))",
        # ignoring(pod_uid): dcgm-exporter's per-process FB_USED carries it, the FB_FREE copies do not
        "gpu_memory_used_ratio": f"max({fresh} / ignoring(pod_uid) ({fresh} + ignoring(pod_uid) "
        "DCGM_FI_DEV_FB_FREE{<<.LabelMatchers>>})) by (<<.GroupBy>>)",
        "requests_per_second": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[120s])) by (<<.GroupBy>>)",
    }


def test_gpu_utilization_preset_discovers_whole_gpu_and_mig_fields() -> None:
    (rule,) = [
        r for r in presets.preset_rules(Presets.model_validate({}), 120) if r.name.as_ == "gpu_utilization"
    ]
    util = naming.compile_rule(rule, 0, external=False)
    assert util.series_query == '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE"}'
    assert util.metric_name("DCGM_FI_DEV_GPU_UTIL") == util.metric_name("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert util.metric_name("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == "gpu_utilization"
    assert not util.accepts("DCGM_FI_PROF_SM_ACTIVE")
    assert not util.query.mentions("Series")  # names its fields itself: either discovered series serves
    assert queries.batchable(util)  # still one grouped query per (preset, namespace) in cache mode


def test_presets_switch_source_labels_and_disable() -> None:
    cfg = {
        "dcgm_pod_label": "exported_pod",
        "dcgm_namespace_label": "exported_namespace",
        "gpu_utilization": {"source": "DCGM_FI_PROF_GR_ENGINE_ACTIVE"},
        "gpu_memory_used_ratio": {"enabled": False},
        "requests_per_second": {"name": "qps", "series": "app_requests_total", "rate_window_seconds": 60},
        "engines": {"enabled": False},
    }
    rules = {r.name.as_: r for r in presets.preset_rules(Presets.model_validate(cfg), 120)}
    assert set(rules) == {"gpu_utilization", "qps"}
    util = naming.compile_rule(rules["gpu_utilization"], 0, external=False)
    assert util.series_query == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    assert util.query.source.endswith("> time() - 120) * 100))")
    assert "GPU_I_ID!=" not in util.query.source  # every device, whole or MIG, from the one field
    assert util.resources.resource_for_label("exported_pod") == GroupResource("pods")
    assert util.resources.resource_for_label("exported_namespace") == GroupResource("namespaces")
    assert util.resources.resource_for_label("hostname") == GroupResource("nodes")
    qps = naming.compile_rule(rules["qps"], 1, external=False)
    assert qps.metric_name("app_requests_total") == "qps"
    assert qps.window_seconds == 60
