"""Label selectors: apimachinery's grammar, matching semantics, PromQL matchers (prometheus-adapter's table,
with literal values) and the LabelSelector echoed in MetricValue.selector; plus PromQL literal escaping."""

from __future__ import annotations

import pytest

from adapter import promql, selectors
from adapter.selectors import SelectorError, parse


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param("", "", id="empty-is-everything"),
        pytest.param("app=llm", "app=llm", id="equals"),
        pytest.param("app == llm", "app==llm", id="double-equals-spaces"),
        pytest.param("app!=llm", "app!=llm", id="not-equals"),
        pytest.param("tier in (b, a, a)", "tier in (a,b)", id="in-sorted-deduped"),
        pytest.param("tier notin (x)", "tier notin (x)", id="notin"),
        pytest.param("canary", "canary", id="exists"),
        pytest.param("!canary", "!canary", id="does-not-exist"),
        pytest.param("replicas>3", "replicas>3", id="gt"),
        pytest.param("replicas < 5", "replicas<5", id="lt-spaces"),
        pytest.param("replicas<-1", None, id="negative-is-not-a-label-value"),
        pytest.param("app.kubernetes.io/name=llm", "app.kubernetes.io/name=llm", id="prefixed-key"),
        pytest.param("a=", "a=", id="empty-value"),
        pytest.param("x in (a,)", "x in (,a)", id="trailing-comma-is-empty-value"),
        pytest.param("z=1,a=2,!m", "a=2,!m,z=1", id="sorted-by-key"),
        pytest.param(" app\t=\nllm ", "app=llm", id="whitespace"),
        pytest.param("in=x", None, id="keyword-as-key-rejected"),
        pytest.param("x=in", "x=in", id="keyword-as-value"),
    ],
)
def test_parse_canonical_form(text: str, canonical: str | None) -> None:
    if canonical is None:
        with pytest.raises(SelectorError):
            parse(text)
    else:
        assert str(parse(text)) == canonical


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a in ()", "values set can't be empty", id="empty-set"),
        pytest.param("a in (b", "expected: ',', ')' or a label value", id="unclosed-set"),
        pytest.param("a in b", "expected: '('", id="in-without-parens"),
        pytest.param("=b", "found '=', expected: identifier", id="missing-key"),
        pytest.param("a b", "expected: one of =, ==, !=, in, notin, >, <", id="missing-operator"),
        pytest.param("a>x", "must be an integer", id="gt-non-integer"),
        pytest.param("a,", "found 'end of string', expected: identifier", id="dangling-comma"),
        pytest.param("a=b=c", "expected: ',' or end of string", id="two-operators"),
        pytest.param("a=-b", "invalid label value '-b'", id="bad-value"),
        pytest.param("a=" + "v" * 64, "63 characters or less", id="value-too-long"),
        pytest.param("A/b=c", "prefix must be a DNS subdomain", id="bad-prefix"),
        pytest.param("-a=b", "invalid label key '-a'", id="bad-key"),
        pytest.param('a="b"', "invalid label value", id="quotes-are-not-grammar"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match="invalid selector") as info:
        parse(text)
    assert message in str(info.value)


LABELS = {"app": "llm", "tier": "gpu", "replicas": "4"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        pytest.param("", True, id="everything"),
        pytest.param("app=llm", True, id="eq"),
        pytest.param("app=web", False, id="eq-miss"),
        pytest.param("app!=web", True, id="neq"),
        pytest.param("missing!=x", True, id="neq-absent-label-matches"),
        pytest.param("tier in (gpu,cpu)", True, id="in"),
        pytest.param("missing in (x)", False, id="in-absent"),
        pytest.param("tier notin (gpu)", False, id="notin"),
        pytest.param("missing notin (x)", True, id="notin-absent"),
        pytest.param("app", True, id="exists"),
        pytest.param("!app", False, id="not-exists"),
        pytest.param("replicas>3", True, id="gt"),
        pytest.param("replicas<4", False, id="lt"),
        pytest.param("app>1", False, id="gt-non-numeric-label"),
        pytest.param("app=llm,tier=cpu", False, id="and"),
    ],
)
def test_matches(text: str, matches: bool) -> None:
    assert parse(text).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("text", "matchers"),
    [
        pytest.param("", [], id="everything"),
        pytest.param("metric1=value1", ['metric1="value1"'], id="eq"),
        pytest.param("a==b", ['a="b"'], id="double-eq"),
        pytest.param("a!=b", ['a!="b"'], id="neq"),
        pytest.param("foo=bar,qux in (bar,baz)", ['foo="bar"', 'qux=~"bar|baz"'], id="pa-multiple"),
        pytest.param("a in (x.y)", ['a=~"x\\\\.y"'], id="in-value-is-literal-not-regex"),
        pytest.param("a notin (b,c)", ['a!~"b|c"'], id="notin"),
        pytest.param("a", ['a!=""'], id="exists"),
        pytest.param("!a", ['a=""'], id="does-not-exist"),
    ],
)
def test_promql_matchers(text: str, matchers: list[str]) -> None:
    assert selectors.promql_matchers(parse(text)) == matchers


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a>1", "not supported by Prometheus", id="gt"),
        pytest.param("a<1", "not supported by Prometheus", id="lt"),
        pytest.param("app.kubernetes.io/name=x", "not a valid Prometheus label name", id="k8s-key"),
    ],
)
def test_promql_matchers_refuse_what_prometheus_cannot_express(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        selectors.promql_matchers(parse(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", None, id="empty-is-null"),
        pytest.param("code=200", {"matchLabels": {"code": "200"}}, id="match-labels"),
        pytest.param(
            "a!=b,c in (d),e,!f",
            {
                "matchExpressions": [
                    {"key": "a", "operator": "NotIn", "values": ["b"]},
                    {"key": "c", "operator": "In", "values": ["d"]},
                    {"key": "e", "operator": "Exists"},
                    {"key": "f", "operator": "DoesNotExist"},
                ]
            },
            id="expressions",
        ),
    ],
)
def test_to_label_selector(text: str, expected: object) -> None:
    assert selectors.to_label_selector(parse(text)) == expected


def test_values_by_label_joins_like_prometheus_adapter() -> None:
    assert selectors.values_by_label(parse("foo in (bar,baz),x=y")) == {"foo": "bar|baz", "x": "y"}


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        pytest.param("plain", '"plain"', id="plain"),
        pytest.param('a"b', '"a\\"b"', id="quote"),
        pytest.param("a\\b", '"a\\\\b"', id="backslash"),
        pytest.param("a\nb\tc", '"a\\nb\\tc"', id="newline-tab"),
        pytest.param("\x01", '"\\x01"', id="control"),
        pytest.param("日本", '"日本"', id="unicode-kept"),
        pytest.param("\u200b", '"\\u200b"', id="non-printable-unicode"),
        pytest.param('"} or vector(1) #', '"\\"} or vector(1) #"', id="injection-attempt"),
    ],
)
def test_quote(value: str, quoted: str) -> None:
    assert promql.quote(value) == quoted


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        pytest.param("a.b", "a\\.b", id="dot"),
        pytest.param("(x|y)*", "\\(x\\|y\\)\\*", id="group-alternation"),
        pytest.param("[^$]{2}+?", "\\[\\^\\$\\]\\{2\\}\\+\\?", id="classes-anchors"),
        pytest.param("a-b c#", "a-b c#", id="punctuation-re2-would-reject-escaped"),
    ],
)
def test_regex_escape(value: str, escaped: str) -> None:
    assert promql.regex_escape(value) == escaped


def test_names_matcher_one_and_many() -> None:
    assert promql.names_matcher("pod", ["a"]) == 'pod="a"'
    assert promql.names_matcher("pod", ["a.b", "c"]) == 'pod=~"a\\\\.b|c"'


def test_label_names_are_checked_not_escaped() -> None:
    with pytest.raises(promql.InvalidLabelName):
        promql.label_matcher('pod"} or', "=", "x")
