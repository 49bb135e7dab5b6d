"""metrics.k8s.io pure parts: quantities, durations, the PromQL of kube-prometheus's `resourceRules` against
what prometheus-adapter sends, reading answers (missing data), field selectors, routes, config and
check-config. Values against a real Prometheus: tests/integration/test_adapter_resource_metrics.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from adapter import fieldselectors
from adapter.errors import BadRequest, NotFound
from adapter.naming import RuleError
from adapter.resource_provider import complete_pod
from adapter.resource_rules import (
    ALL_NAMESPACES,
    Scope,
    compile_resource_rules,
    read_usage,
    render_like_upstream,
    scope_queries,
)
from adapter.resource_wire import cpu_quantity, go_duration, memory_quantity
from adapter.routing import ResourceRoute, route
from gpuwarden import cli
from gpuwarden.config.loader import load_config
from gpuwarden.config.metric_rules import ResourceRules
from gpuwarden.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests/unit/golden/adapter/resource"
KUBE_PROMETHEUS = GOLDEN / "kube-prometheus-config.yaml"
API = "/apis/metrics.k8s.io/v1beta1"


def kube_prometheus() -> ResourceRules:
    rules = load_config(KUBE_PROMETHEUS, env={}).adapter.resource_rules
    assert rules is not None
    return rules


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- quantities ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "text"),
    [
        pytest.param(0.0, "0", id="zero"),
        pytest.param(0.007338891, "7338891n", id="metrics-server-example"),
        pytest.param(0.000043481, "43481n", id="sub-millicore-is-not-0"),
        pytest.param(0.005, "5m", id="whole-millicores-collapse"),
        pytest.param(0.0000015, "1500n", id="micro-not-exact-stays-n"),
        pytest.param(0.000002, "2u", id="whole-microcores"),
        pytest.param(1.0, "1", id="one-core"),
        pytest.param(1.5, "1500m", id="fractional-cores"),
        pytest.param(2000.0, "2k", id="thousands"),
        pytest.param(-0.3, "0", id="negative-clamped"),
    ],
)
def test_cpu_quantity_is_nanocores(cores: float, text: str) -> None:
    assert cpu_quantity(cores) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(0, "0", id="zero"),
        pytest.param(512, "512", id="below-1024"),
        pytest.param(1000, "1k", id="below-1024-decimal-si"),
        pytest.param(1024, "1Ki", id="one-ki"),
        pytest.param(1536, "1536", id="not-a-multiple-of-1024"),
        pytest.param(14868480, "14520Ki", id="metrics-server-example"),
        pytest.param(123456789, "123456789", id="plain-bytes"),
        pytest.param(2 * 2**30, "2Gi", id="gibibytes"),
        pytest.param(123456789.5, "123456790", id="fractional-rounded-to-bytes"),
    ],
)
def test_memory_quantity_is_binary_si_bytes(value: float, text: str) -> None:
    assert memory_quantity(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (30, "30s"),
        (120, "2m0s"),
        (300, "5m0s"),
        (3600, "1h0m0s"),
        (90.5, "1m30.5s"),
    ],
)
def test_window_is_a_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


# --- PromQL -------------------------------------------------------------------------------------------------


def test_kube_prometheus_renders_what_prometheus_adapter_sends() -> None:
    """The per-pod and per-node text prometheus-adapter logs for this config (kube-prometheus#2579, #1870)."""
    rules = compile_resource_rules(kube_prometheus())
    pod = render_like_upstream(rules.cpu, "pods", "default", ["php-apache-675bc649f5-tcb2w"])
    assert squeeze(pod) == squeeze(
        'sum by (pod,container) (irate(container_cpu_usage_seconds_total{namespace="default",'
        'pod="php-apache-675bc649f5-tcb2w",container!="",pod!=""}[120s]))'
    )
    node = render_like_upstream(rules.cpu, "nodes", "", ["k8s-n06", "k8s-n01"])
    assert squeeze(node).startswith(
        squeeze(
            'sum by (node) (1 - irate(node_cpu_seconds_total{mode="idle"}[60s]) * on(namespace, pod) '
            'group_left(node) (node_namespace_pod:kube_pod_info:{node=~"k8s-n06|k8s-n01"})) or'
        )
    )
    memory = render_like_upstream(rules.memory, "nodes", "", ["n1"])
    assert 'node_memory_MemTotal_bytes{job="node-exporter",instance="n1"}' in memory


def test_adapter_queries_for_kube_prometheus_golden() -> None:
    """What the adapter itself sends: every pod or every node at once, never a regex of names."""
    rules = compile_resource_rules(kube_prometheus())
    out = []
    for rule in (rules.cpu, rules.memory):
        for scope in (Scope("nodes"), Scope("pods", ALL_NAMESPACES), Scope("pods", "default")):
            value, stamps = scope_queries(rule, scope)
            out += [f"# {rule.name} {scope}", " ".join(value.split()), f"# timestamps: {stamps}"]
    text = "\n".join(out) + "\n"
    assert text == (GOLDEN / "kube-prometheus-queries.txt").read_text()
    assert "=~" not in text
    assert (rules.window("pods"), rules.window("nodes")) == (120, 240)


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        pytest.param({"instance": "node", "node": "node"}, "instance", id="instance-listed-first"),
        pytest.param({"node": "node", "instance": "node"}, "node", id="node-listed-first"),
    ],
)
def test_two_labels_for_nodes_first_listed_wins(overrides: dict[str, str], label: str) -> None:
    mapping = {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    mapping.update({k: {"resource": v} for k, v in overrides.items()})
    rule = {
        "containerQuery": "sum by (<<.GroupBy>>) (c{<<.LabelMatchers>>})",
        "nodeQuery": "sum by (<<.GroupBy>>) (n{<<.LabelMatchers>>})",
        "resources": {"overrides": mapping},
        "containerLabel": "container",
    }
    for _ in range(5):  # prometheus-adapter's Go map order would flip between runs
        rules = compile_resource_rules(ResourceRules.model_validate({"cpu": rule, "memory": rule}))
        assert rules.cpu.node_label == label


def test_rules_without_a_node_label_fail_at_start() -> None:
    rule = {
        "containerQuery": "sum by (<<.GroupBy>>) (c{<<.LabelMatchers>>})",
        "nodeQuery": "n",
        "resources": {"overrides": {"pod": {"resource": "pod"}}},
        "containerLabel": "container",
    }
    with pytest.raises(RuleError, match=r"resourceRules.cpu.resources: no label maps to namespace, node"):
        compile_resource_rules(ResourceRules.model_validate({"cpu": rule, "memory": rule}))


# --- reading answers ----------------------------------------------------------------------------------------

T = 1_800_000_000.0


@pytest.mark.parametrize(
    ("samples", "values"),
    [
        pytest.param(
            [({"namespace": "a", "pod": "p", "container": "c"}, 0.5)], {("a", "p"): {"c": 0.5}}, id="one"
        ),
        pytest.param(
            [({"namespace": "a", "pod": "p", "container": ""}, 9.0)], {}, id="phantom-empty-container"
        ),
        pytest.param([({"namespace": "a", "pod": "p", "container": "POD"}, 1.0)], {}, id="pause-container"),
        pytest.param([({"namespace": "a", "pod": "p"}, 1.0)], {}, id="no-container-label"),
        pytest.param([({"pod": "p", "container": "c"}, 1.0)], {}, id="no-namespace-label"),
        pytest.param([({"namespace": "a", "pod": "p", "container": "c"}, math.nan)], {}, id="nan-is-no-data"),
        pytest.param([({"namespace": "a", "pod": "p", "container": "c"}, math.inf)], {}, id="inf-is-no-data"),
        pytest.param(
            [({"namespace": "a", "pod": "p", "container": "c"}, -0.2)],
            {("a", "p"): {"c": 0.0}},
            id="negative-is-0",
        ),
    ],
)
def test_read_usage_drops_what_is_not_a_container(
    samples: list[tuple[dict[str, str], float]], values: dict[tuple[str, str], dict[str, float]]
) -> None:
    rules = compile_resource_rules(kube_prometheus())
    usage = read_usage(rules.cpu, Scope("pods", ALL_NAMESPACES), [(lb, v, T) for lb, v in samples], [])
    assert usage.values == values


def test_read_usage_takes_the_sample_time_of_each_object() -> None:
    rules = compile_resource_rules(kube_prometheus())
    values = [({"pod": "p", "container": "c"}, 1.0, T), ({"pod": "q", "container": "c"}, 1.0, T)]
    stamps = [({"pod": "p"}, T - 42, T), ({"pod": "other"}, T - 1, T)]
    usage = read_usage(rules.cpu, Scope("pods", "ns"), values, stamps)
    assert usage.times == {("ns", "p"): T - 42, ("ns", "q"): T}


@pytest.mark.parametrize(
    ("cpu", "memory", "containers"),
    [
        pytest.param({"a": 1.0}, {"a": 2.0}, ["a"], id="complete"),
        pytest.param({"b": 1.0, "a": 1.0}, {"a": 2.0, "b": 1.0}, ["a", "b"], id="sorted"),
        pytest.param({"a": 1.0, "b": 1.0}, {"a": 2.0}, None, id="container-without-memory"),
        pytest.param({"a": 1.0}, None, None, id="no-memory-at-all"),
        pytest.param(None, {"a": 1.0}, None, id="no-cpu-at-all"),
        pytest.param({}, {}, None, id="no-containers"),
    ],
)
def test_a_pod_is_served_only_with_every_container_complete(
    cpu: dict[str, float] | None, memory: dict[str, float] | None, containers: list[str] | None
) -> None:
    assert complete_pod(cpu, memory) == containers


# --- field selectors and routes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fields", "matches"),
    [
        pytest.param("", {"metadata.name": "a"}, True, id="empty"),
        pytest.param("metadata.name=a", {"metadata.name": "a"}, True, id="equal"),
        pytest.param("metadata.name==a", {"metadata.name": "b"}, False, id="double-equal"),
        pytest.param("metadata.name!=a", {"metadata.name": "b"}, True, id="not-equal"),
        pytest.param(
            "metadata.name=a,metadata.namespace=x",
            {"metadata.name": "a", "metadata.namespace": "y"},
            False,
            id="and",
        ),
        pytest.param("spec.nodeName=n", {"metadata.name": "a"}, False, id="unknown-field-is-empty"),
        pytest.param("spec.nodeName!=n", {"metadata.name": "a"}, True, id="unknown-field-not-equal"),
        pytest.param(r"metadata.name=a\,b", {"metadata.name": "a,b"}, True, id="escaped-comma"),
    ],
)
def test_field_selectors(text: str, fields: dict[str, str], matches: bool) -> None:
    assert fieldselectors.parse(text).matches(fields) is matches


@pytest.mark.parametrize("text", ["metadata.name", "=a", "a=b,", "a=b\\", "a=b\\q", "a=b=c"])
def test_bad_field_selectors(text: str) -> None:
    with pytest.raises(fieldselectors.FieldSelectorError):
        fieldselectors.parse(text)


@pytest.mark.parametrize(
    ("path", "kind", "namespace", "name", "template"),
    [
        pytest.param(f"{API}/nodes", "nodes", "", "", "resource_nodes", id="nodes"),
        pytest.param(f"{API}/nodes/n-1.example", "nodes", "", "n-1.example", "resource_node", id="node"),
        pytest.param(f"{API}/pods", "pods", "", "", "resource_pods", id="all-pods"),
        pytest.param(f"{API}/namespaces/ml/pods", "pods", "ml", "", "resource_namespace_pods", id="ns-pods"),
        pytest.param(f"{API}/namespaces/ml/pods/llm-0", "pods", "ml", "llm-0", "resource_pod", id="pod"),
    ],
)
def test_resource_routes(path: str, kind: str, namespace: str, name: str, template: str) -> None:
    target = route(path, {"labelSelector": "app=x", "fieldSelector": "metadata.name=y"})
    assert isinstance(target, ResourceRoute)
    assert (target.kind, target.namespace, target.name, target.template) == (kind, namespace, name, template)
    assert str(target.label_selector) == "app=x" and target.field_selector


@pytest.mark.parametrize(
    ("path", "error"),
    [
        (f"{API}/namespaces/ML/pods", BadRequest),
        (f"{API}/nodes/%2A", BadRequest),
        (f"{API}/namespaces/ml/nodes", NotFound),
        (f"{API}/services", NotFound),
    ],
)
def test_bad_resource_routes(path: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        route(path, {})


# --- config -------------------------------------------------------------------------------------------------


def test_kube_prometheus_config_is_accepted_unchanged_as_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", str(KUBE_PROMETHEUS)]) == 0
    assert "resource metrics (metrics.k8s.io)" in capsys.readouterr().out
    rules = kube_prometheus()
    assert rules.window == "5m" and rules.memory is not None
    assert list(rules.memory.resources.overrides) == ["instance", "namespace", "pod"]


def test_rules_file_brings_its_resource_rules(tmp_path: Path) -> None:
    (tmp_path / "pa.yaml").write_text(KUBE_PROMETHEUS.read_text())
    (tmp_path / "config.yaml").write_text("adapter:\n  rules_file: pa.yaml\n")
    assert load_config(tmp_path / "config.yaml", env={}).adapter.resource_rules is not None
    (tmp_path / "both.yaml").write_text(
        "adapter:\n  rules_file: pa.yaml\n  resourceRules:\n"
        + "\n".join("    " + line for line in KUBE_PROMETHEUS.read_text().splitlines()[1:])
    )
    with pytest.raises(ConfigError, match="set both here and in rules_file"):
        load_config(tmp_path / "both.yaml", env={})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(("memory", None), "adapter.resourceRules.memory: required", id="memory-missing"),
        pytest.param(("window", "5 minutes"), "is not a Prometheus duration", id="bad-window"),
        pytest.param(("cpu.containerLabel", None), "cpu.containerLabel: required", id="no-container-label"),
        pytest.param(("cpu.nodeQuery", "x <<.Nope>>"), "unknown template field .Nope", id="unknown-field"),
        pytest.param(("cpu.nodeQuery", "x <<if .GroupBy>>y<<end>>"), "unsupported action", id="if-action"),
    ],
)
def test_check_config_judges_resource_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, object], message: str
) -> None:
    import yaml

    data = yaml.safe_load(KUBE_PROMETHEUS.read_text())
    node = data["resourceRules"]
    *parents, last = change[0].split(".")
    for key in parents:
        node = node[key]
    if change[1] is None:
        del node[last]
    else:
        node[last] = change[1]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["check-config", str(path)]) == 1
    assert message in capsys.readouterr().err
