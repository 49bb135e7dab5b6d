"""Good/bad pairs for every config section, loaded through the real loader (file → validate → problems).

Each bad row names the field the problem must be reported at and a fragment of the message (the fix hint),
so a regression in either the check or its wording fails here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuwarden.config import Config, load_config
from gpuwarden.errors import ConfigError


def load_text(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_config(path, env={})


def problems_for(tmp_path: Path, text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    return caught.value.problems


GOOD = [
    pytest.param("", lambda c: c.health.dry_run is False, id="empty-file-is-defaults"),
    pytest.param("health:\n", lambda c: c.health.breaker.max_percent == 10, id="empty-section-is-defaults"),
    pytest.param(
        "health:\n  breaker:\n  xid:\n",
        lambda c: c.health.breaker.max_absolute == 3 and c.health.xid.source == "auto",
        id="empty-nested-section-is-defaults",
    ),
    pytest.param(
        "preemption:\n  global_budget:\n",
        lambda c: c.preemption.global_budget is None,
        id="empty-nullable-section-is-null",
    ),
    pytest.param(
        "prometheus: {url: 'http://mimir:8080/prometheus', timeout_seconds: 5}",
        lambda c: str(c.prometheus.url) == "http://mimir:8080/prometheus",
        id="prometheus-url-with-prefix",
    ),
    pytest.param(
        "kubernetes: {qps: 20, burst: 20, leader_election: {lease_duration_seconds: 30}}",
        lambda c: c.kubernetes.leader_election.lease_duration_seconds == 30,
        id="kubernetes-rates",
    ),
    pytest.param(
        "adapter: {presets: {gpu_utilization: {source: DCGM_FI_PROF_GR_ENGINE_ACTIVE}}}",
        lambda c: c.adapter.presets.gpu_utilization.source == "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        id="adapter-preset-source",
    ),
    pytest.param(
        "adapter: {presets: {dcgm_pod_label: exported_pod, dcgm_namespace_label: exported_namespace}}",
        lambda c: c.adapter.presets.dcgm_pod_label == "exported_pod",
        id="adapter-exported-labels",
    ),
    pytest.param(
        "adapter: {tls: {cert_file: /a.crt, key_file: /a.key}, insecure_port: 8080}",
        lambda c: c.adapter.insecure_port == 8080,
        id="adapter-tls-and-insecure-port",
    ),
    pytest.param(
        """\
        adapter:
          rules:
          - seriesQuery: '{__name__=~"^container_.*_seconds_total$"}'
            seriesFilters: [{isNot: '^container_cpu_.*'}]
            resources: {template: '<<.Group>>_<<.Resource>>', overrides: {node: {resource: node}}}
            name: {matches: '^container_(.*)_seconds_total$', as: '${1}_per_second'}
            metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
        """,
        lambda c: c.adapter.rules[0].name.as_ == "${1}_per_second",
        id="adapter-rule-prometheus-adapter-shape",
    ),
    pytest.param(
        """\
        adapter:
          externalRules:
          - seriesQuery: 'queue_depth{queue!=""}'
            resources: {namespaced: false}
            name: {matches: '^(?P<what>queue)_depth$', as: '${what}_len'}
            metricsQuery: '<<index .LabelValuesByName "queue">> <<range .GroupBySlice>><<.>><<end>>'
        """,
        lambda c: c.adapter.external_rules[0].resources.namespaced is False,
        id="adapter-external-rule-named-group-and-template-funcs",
    ),
    pytest.param(
        "health: {xid: {overrides: {109: {quarantine: false}, 13: {class: hw_mem, escalate_after: 2}}}}",
        lambda c: c.health.xid.overrides[13].escalate_after == 2,
        id="health-xid-overrides",
    ),
    pytest.param(
        "health: {taint_effects: {hw_pcie: NoExecute}, breaker: {max_absolute: 0, max_percent: 5}}",
        lambda c: c.health.taint_effects.hw_pcie == "NoExecute",
        id="health-taint-and-breaker",
    ),
    pytest.param(
        'health: {node_labels: [node], label_matchers: \'cluster="a", job=~"dcgm.*"\'}',
        lambda c: c.health.node_labels == ["node"],
        id="health-relabelled-node",
    ),
    pytest.param(
        "nominations: {ttl_seconds: 120, escalation: {enabled: true, evict_after_seconds: 600}}",
        lambda c: c.nominations.escalation.enabled,
        id="nominations-escalation",
    ),
    pytest.param(
        "preemption: {global_budget: null, workload_budget: {max_victims: 2, window_seconds: 60}}",
        lambda c: c.preemption.global_budget is None and c.preemption.workload_budget is not None,
        id="preemption-budgets",
    ),
    pytest.param(
        "extender: {path_prefix: '', default_policy: prefer-numa, tls: {cert_file: /c, key_file: /k}}",
        lambda c: c.extender.default_policy == "prefer-numa",
        id="extender-policy",
    ),
    pytest.param(
        "extender: {claim_ttl_seconds: 20, events: false}",
        lambda c: c.extender.claim_ttl_seconds == 20 and not c.extender.events,
        id="extender-claim-ttl-and-events",
    ),
    pytest.param(
        "health: {subquery_step_seconds: 30, breaker: {configmap_name: gw-breaker}}",
        lambda c: c.health.subquery_step_seconds == 30 and c.health.breaker.configmap_name == "gw-breaker",
        id="health-step-and-breaker-configmap",
    ),
    pytest.param(
        "preemption: {event_interval_seconds: 300, backoff: {burst_seconds: 10}}",
        lambda c: c.preemption.event_interval_seconds == 300 and c.preemption.backoff.burst_seconds == 10,
        id="preemption-event-interval-and-burst",
    ),
    pytest.param(
        "logging: {level: DEBUG, loggers: {aiohttp.access: WARNING}}",
        lambda c: c.logging.level == "debug" and c.logging.loggers["aiohttp.access"] == "warning",
        id="logging-case-insensitive",
    ),
]


@pytest.mark.parametrize(("text", "check"), GOOD)
def test_good_config_loads(tmp_path: Path, text: str, check: object) -> None:
    config = load_text(tmp_path, text)
    assert callable(check) and check(config)


BAD = [
    # (yaml, field reported, message fragment)
    ("prometheus: {url: 'prom:9090'}", "prometheus.url", "e.g. http://prometheus:9090"),
    ("prometheus: {timeout_seconds: 0}", "prometheus.timeout_seconds", "must be > 0, got 0"),
    ("prometheus: {headers: [a]}", "prometheus.headers", "expected a mapping"),
    ("kubernetes: {qps: 100, burst: 10}", "kubernetes.burst", "must be at least qps (100)"),
    ("kubernetes: {namespace: Prod}", "kubernetes.namespace", "not a valid Kubernetes name"),
    ("kubernetes: {gpu_resource_name: 'nvidia com/gpu'}", "kubernetes.gpu_resource_name", "qualified name"),
    (
        "kubernetes: {leader_election: {renew_deadline_seconds: 15}}",
        "kubernetes.leader_election.renew_deadline_seconds",
        "less than lease_duration_seconds",
    ),
    ("kubernetes: {list_page_size: true}", "kubernetes.list_page_size", "expected a number, got true"),
    ("adapter: {secure_port: 0}", "adapter.secure_port", "must be >= 1, got 0"),
    ("adapter: {secure_port: 6443, insecure_port: 6443}", "adapter.insecure_port", "must differ"),
    ("adapter: {tls: {cert_file: /a.crt}}", "adapter.tls.key_file", "must be set together"),
    ("adapter: {cache: {mode: always}}", "adapter.cache.mode", "'cache' or 'per_request'"),
    ("adapter: {cache: {max_age_seconds: 10}}", "adapter.cache.max_age_seconds", "greater than refresh"),
    (
        "adapter: {relist_interval_seconds: 600, metrics_max_age_seconds: 60}",
        "adapter.metrics_max_age_seconds",
        "max age must not be less than relist interval",
    ),
    (
        "adapter: {presets: {requests_per_second: {name: gpu_utilization}}}",
        "adapter.presets.requests_per_second.name",
        "already served by preset gpu_utilization",
    ),
    (
        "adapter: {presets: {gpu_utilization: {name: 'gpu-util'}}}",
        "adapter.presets.gpu_utilization.name",
        "metric",
    ),
    ("adapter: {presets: {dcgm_pod_label: 'exported pod'}}", "adapter.presets.dcgm_pod_label", "label name"),
    ("adapter: {rules: [{metricsQuery: x}]}", "adapter.rules[0].seriesQuery", "required, but missing"),
    ("adapter: {rules: [{seriesQuery: x}]}", "adapter.rules[0].metricsQuery", "required, but missing"),
    (
        "adapter: {rules: [{seriesquery: x, seriesQuery: x, metricsQuery: y}]}",
        "adapter.rules[0].seriesquery",
        "'seriesQuery'",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, seriesFilters: [{}]}]}",
        "adapter.rules[0].seriesFilters[0]",
        "must have either an `is` or `isNot`",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, seriesFilters: [{is: '('}]}]}",
        "adapter.rules[0].seriesFilters[0].is",
        "invalid regular expression",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, name: {matches: '(a)(b)'}}]}",
        "adapter.rules[0].name.as",
        "must specify an 'as' value",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, name: {matches: '(a)', as: '$1_total'}}]}",
        "adapter.rules[0].name.as",
        "write ${1}_total",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, name: {matches: '(a)', as: '$2'}}]}",
        "adapter.rules[0].name.as",
        "only 1 capture groups",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, resources: {template: '<<.Group>>'}}]}",
        "adapter.rules[0].resources.template",
        "must include at least `<<.Resource>>`",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers}) by (x)'}]}",
        "adapter.rules[0].metricsQuery",
        "unbalanced",
    ),
    (
        "adapter: {externalRules: [{seriesQuery: x, metricsQuery: '<<.Namespace>>'}]}",
        "adapter.externalRules[0].metricsQuery",
        "unknown template field .Namespace",
    ),
    (
        "adapter: {rules: [{seriesQuery: x, metricsQuery: y, resources: {overrides: {pod: {group: ''}}}}]}",
        "adapter.rules[0].resources.overrides.pod.resource",
        "required",
    ),
    ("health: {dry_run: perhaps}", "health.dry_run", "expected true or false, got 'perhaps'"),
    ("health: {node_labels: []}", "health.node_labels", "at least 1 item"),
    ("health: {node_labels: [Hostname, Hostname]}", "health.node_labels", "twice"),
    ("health: {label_matchers: '{cluster=\"a\"}'}", "health.label_matchers", "no braces"),
    ("health: {loop_interval_seconds: -1}", "health.loop_interval_seconds", "must be > 0, got -1"),
    ("health: {xid: {overrides: {79: {}}}}", "health.xid.overrides[79]", "empty override"),
    ("health: {xid: {overrides: {0: {quarantine: true}}}}", "health.xid.overrides[0]", "invalid key"),
    ("health: {xid: {overrides: {13: {class: hardware}}}}", "health.xid.overrides[13].class", "'hw_mem'"),
    ("health: {xid: {source: dcgm}}", "health.xid.source", "'auto', 'gauge' or 'count'"),
    ("health: {ecc: {retired_pages_max: 0}}", "health.ecc.retired_pages_max", "must be >= 1"),
    ("health: {taint_effects: {hw_mem: Evict}}", "health.taint_effects.hw_mem", "'NoExecute'"),
    ("health: {taint_effects: {memory: NoExecute}}", "health.taint_effects.memory", "valid keys here: app"),
    ("health: {breaker: {max_percent: 101}}", "health.breaker.max_percent", "must be <= 100, got 101"),
    ("health: {breaker: {max_percent: 0, max_absolute: 0}}", "health.breaker.max_absolute", "dry_run"),
    ("health: {breaker: {max_new_per_window: 0}}", "health.breaker.max_new_per_window", "must be >= 1"),
    ("health: {breaker: {window_seconds: 30}}", "health.breaker.window_seconds", "must be >= 60"),
    ("extender: {warm_gpu_counts: [0, 2]}", "extender.warm_gpu_counts", "[0]: GPUs per pod are 1-256"),
    ("nominations: {ttl_seconds: 10}", "nominations.ttl_seconds", "must be >= 30"),
    (
        "nominations: {escalation: {evict_after_seconds: 100}}",
        "nominations.escalation.evict_after_seconds",
        "greater than ttl_seconds",
    ),
    ("nominations: {namespaces: ['Team A']}", "nominations.namespaces[0]", "not a valid Kubernetes name"),
    ("preemption: {global_budget: {max_victims: 5}}", "preemption.global_budget.window_seconds", "required"),
    ("preemption: {backoff: {base_seconds: 7200}}", "preemption.backoff.base_seconds", "must not exceed"),
    ("preemption: {max_chain_depth: 0}", "preemption.max_chain_depth", "must be >= 1"),
    ("preemption: {exempt_min_priority: high}", "preemption.exempt_min_priority", "expected an integer"),
    ("extender: {path_prefix: gpuwarden/}", "extender.path_prefix", "start with '/'"),
    ("extender: {default_policy: numa}", "extender.default_policy", "'single-numa'"),
    ("extender: {claim_ttl_seconds: 2}", "extender.claim_ttl_seconds", "must be >= 5"),
    ("extender: {claim_ttl_seconds: 7200}", "extender.claim_ttl_seconds", "must be <= 3600"),
    ("health: {subquery_step_seconds: 0.5}", "health.subquery_step_seconds", "must be >= 1"),
    ("health: {breaker: {configmap_name: Breaker_CM}}", "health.breaker.configmap_name", "Breaker_CM"),
    ("preemption: {backoff: {burst_seconds: 0}}", "preemption.backoff.burst_seconds", "must be > 0"),
    (
        "preemption: {backoff: {base_seconds: 10, burst_seconds: 30}}",
        "preemption.backoff.burst_seconds",
        "must be less than base_seconds (10), got 30",
    ),
    (
        "preemption: {backoff: {base_seconds: 30}}",
        "preemption.backoff.burst_seconds",
        "must be less than base_seconds (30), got 30",
    ),
    ("preemption: {event_interval_seconds: -5}", "preemption.event_interval_seconds", "must be > 0"),
    ("extender: {scoring: {error_trend_penalty: 11}}", "extender.scoring.error_trend_penalty", "<= 10"),
    ("extender: {scoring: {fit_weight: 0, locality_weight: 0}}", "extender.scoring.fit_weight", "both be 0"),
    ("logging: {level: verbose}", "logging.level", "'debug', 'info', 'warning' or 'error'"),
    ("logging: {format: yaml}", "logging.format", "got 'yaml'"),
    ("metrics: {}", "metrics", "valid keys here: prometheus, kubernetes, adapter"),
    ("helth: {dry_run: true}", "helth", "did you mean 'health'?"),
]


@pytest.mark.parametrize(
    ("text", "field", "fragment"), BAD, ids=[f"{row[1]}:{i}" for i, row in enumerate(BAD)]
)
def test_bad_config_names_field_and_fix(tmp_path: Path, text: str, field: str, fragment: str) -> None:
    problems = problems_for(tmp_path, text)
    assert [f for f, _ in problems] == [field], problems
    assert fragment in problems[0][1], problems[0][1]


def test_models_are_frozen() -> None:
    config = Config()
    with pytest.raises(ValueError, match="frozen"):
        config.health.dry_run = True  # type: ignore[misc]


def test_prometheus_adapter_aliases_are_its_own_keys() -> None:
    """The YAML keys are prometheus-adapter's, so its config files load unchanged."""
    from gpuwarden.config.metric_rules import DiscoveryRule, NameMapping, PrometheusAdapterRules, RegexFilter

    def keys(model: type) -> set[str]:
        return {info.alias or name for name, info in model.model_fields.items()}  # type: ignore[attr-defined]

    assert keys(DiscoveryRule) == {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}
    assert keys(RegexFilter) == {"is", "isNot"}
    assert keys(NameMapping) == {"matches", "as"}
    assert keys(PrometheusAdapterRules) == {"rules", "externalRules", "resourceRules"}
