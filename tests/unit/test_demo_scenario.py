"""The demo scenario file: the default parses, mistakes are all reported with their field, faults fan out."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter import engines
from adapter.naming import compile_rules
from gpuwarden.config.root import Config
from gpuwarden.errors import ConfigError
from harness.demo import manifests
from harness.demo.scenario import (
    DEFAULT_SCENARIO,
    DemoScenario,
    Expect,
    Faults,
    load_demo_scenario,
    parse_demo_scenario,
)
from harness.demo.stack import ENGINE_KV, ENGINE_WAITING, deep_merge, gpuwarden_config
from harness.simulator.exposition import ROUTER_QUEUE

MINIMAL: dict[str, Any] = {
    "name": "t",
    "fleet": {"nodes": 4, "pools": {"batch": {"nodes": ["gpu-node-03"]}}},
    "priority_classes": {"low": 1},
    "steps": [
        {
            "name": "one",
            "title": "a step",
            "do": [{"deploy": {"name": "w", "gpus": 2, "pool": "batch", "priority_class": "low"}}],
            "expect": [{"running": {"workload": "w", "count": 1}, "hold": 3}],
        }
    ],
}


def test_the_default_scenario_parses_and_tells_the_whole_story() -> None:
    scenario = load_demo_scenario()
    assert scenario.name == "default"
    assert len(scenario.fleet.node_names()) == 16 and scenario.fleet.gpus_per_node == 8
    keys = {e.key for s in scenario.steps for e in s.expect}
    assert {
        "replicas",
        "hpa_metrics",
        "series_follow_pods",
        "numa_aligned",
        "quarantined",
        "not_quarantined",
        "xid_seen",
        "preempted",
        "throttled",
        "nomination_cleared",
        "released",
        "signal_state",
        "drained",
        "gpu_preempting",
        "top_pods",
        "parked_at_zero",
    } <= keys
    assert DEFAULT_SCENARIO.is_file()


def _story(scenario: DemoScenario, name: str) -> list[tuple[str, Any]]:
    """The expectations about one workload, in order: (key, min replicas or the metrics it names)."""
    return [
        (e.key, getattr(e.body, "min", None) or tuple(getattr(e.body, "metrics", ())) or None)
        for s in scenario.steps
        for e in s.expect
        if getattr(e.body, "name", getattr(e.body, "workload", None)) == name
    ]


def test_the_default_scenario_parks_wakes_and_parks_again_an_hpa_with_min_zero_on_an_external_metric() -> (
    None
):
    scenario = load_demo_scenario()
    zero = {
        a.deploy.name: a.deploy
        for s in scenario.steps
        for a in s.do
        if a.deploy and a.deploy.hpa and a.deploy.hpa.min == 0
    }
    assert set(zero) == {"llm-burst", "vllm"}
    burst = zero["llm-burst"]
    assert burst.replicas >= 1  # the HPA, not the manifest, takes it to zero first
    assert burst.hpa is not None and burst.hpa.gateway_requests_per_second is not None
    story = _story(scenario, burst.name)
    parked, woken = ("parked_at_zero", None), ("replicas", 3)
    assert story[0] == parked and woken in story and story[-1] == parked
    assert story.index(woken) < len(story) - 1


def test_the_default_scenario_parks_a_vllm_deployment_wakes_it_on_the_router_and_sizes_it_on_the_engine() -> (
    None
):
    scenario = load_demo_scenario()
    (vllm,) = [a.deploy for s in scenario.steps for a in s.do if a.deploy and a.deploy.engine == "vllm"]
    assert vllm.replicas >= 1 and vllm.hpa is not None and vllm.hpa.min == 0
    assert set(vllm.hpa.external_targets) == {
        "router_queue_depth",
        "vllm_workload_queue_depth",
        "vllm_workload_kv_cache_usage",
    }
    story = _story(scenario, vllm.name)
    parked = ("parked_at_zero", None)
    woken = ("rescaled", ("router_queue_depth",))
    sized = ("rescaled", ("vllm_workload_queue_depth", "vllm_workload_kv_cache_usage"))
    assert story[0] == parked and story[-1] == parked
    assert story.index(parked) < story.index(woken) < len(story) - 1
    assert sized in story and ("replicas", 4) in story


def test_a_scale_to_zero_hpa_on_the_gateway_rate_parses() -> None:
    doc = _with("steps.0.do.0.deploy.hpa", {"min": 0, "max": 4, "gateway_requests_per_second": 20})
    hpa = parse_demo_scenario(doc).steps[0].do[0].deploy.hpa  # type: ignore[union-attr]
    assert hpa is not None and (hpa.min, hpa.gateway_requests_per_second) == (0, 20)


def test_the_demo_config_with_the_default_scenario_merged_is_a_valid_gpuwarden_config() -> None:
    doc = gpuwarden_config(
        kubeconfig=Path("k"), prometheus_url="http://127.0.0.1:9", adapter_port=1, extender_port=2,
        tls=(Path("c"), Path("k")),
    )  # fmt: skip
    config = Config.model_validate(deep_merge(doc, load_demo_scenario().config))
    assert config.drain.enabled and config.preemption.make_room.enabled
    # the boot-flap step runs inside the grace, the fabric step outside it (examples/demo/default.yaml)
    assert config.health.signals.boot_grace_seconds == 90
    # the External metric the scale-to-zero HPA reads is what the adapter's rule makes of the gateway series
    rule, *engine = compile_rules(config.adapter.external_rules, external=True)
    assert rule.metric_name(manifests.GATEWAY_SERIES) == manifests.GATEWAY_METRIC
    assert rule.accepts(manifests.GATEWAY_SERIES) and rule.namespaced
    # the engine's workload sums are discovered from the router's gauge, which exists at zero replicas
    names = [r.metric_name(manifests.ROUTER_METRIC) for r in engine if r.accepts(manifests.ROUTER_METRIC)]
    assert names == [manifests.ENGINE_QUEUE_METRIC, manifests.ENGINE_KV_METRIC]
    assert manifests.ROUTER_METRIC == ROUTER_QUEUE == config.adapter.presets.router_queue.name
    vllm = {m.quantity: m.series for m in engines.catalog(["vllm"])}
    assert (vllm["queue_depth"][0], vllm["kv_cache_usage"][0]) == (ENGINE_WAITING, ENGINE_KV)


def test_a_minimal_scenario_parses() -> None:
    scenario = parse_demo_scenario(MINIMAL)
    expect = scenario.steps[0].expect[0]
    assert expect.key == "running" and expect.hold == 3 and expect.within is None


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL)
    target: Any = doc
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        pytest.param(_with("steps.0.name", "Bad Name"), "steps[0].name", "pattern", id="step-name"),
        pytest.param(
            _with("steps.0.do.0", {"sleep": 1, "cordon": "x"}),
            "steps[0].do[0]",
            "exactly one",
            id="two-actions",
        ),
        pytest.param(
            _with("steps.0.expect.0", {"hold": 1}), "steps[0].expect[0]", "exactly one", id="no-outcome"
        ),
        pytest.param(
            _with("steps.0.do.0", {"deploy": {"name": "w", "gpu": 1}}),
            "steps[0].do[0].deploy.gpu",
            "Extra inputs",
            id="unknown-key",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.hpa", {"min": 0, "max": 4, "router_queue_depth": 10}),
            "steps[0].do[0].deploy",
            "router_queue_depth need `engine: vllm`",
            id="engine-metric-without-an-engine",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.engine", "vllm"),
            "steps[0].do[0].deploy",
            "`engine` needs `qps`",
            id="engine-without-qps",
        ),
        pytest.param(
            _with("steps.0.do", [{"deploy": {"name": n, "qps": 0, "engine": "vllm"}} for n in ("a", "b")]),
            "steps[0].do[1].deploy.engine",
            "already has the engine Deployment 'a'",
            id="two-engine-deployments-in-one-namespace",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.pool", "nope"),
            "steps[0].do[0].deploy.pool",
            "unknown pool",
            id="unknown-pool",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.priority_class", "vip"),
            "steps[0].do[0].deploy.priority_class",
            "unknown",
            id="unknown-priority-class",
        ),
        pytest.param(
            _with("fleet.pools.batch.nodes", ["gpu-node-99"]),
            "fleet.pools.batch.nodes",
            "unknown node",
            id="pool-node",
        ),
        pytest.param(
            _with("steps.0.do.0", {"fault": {"kind": "xid", "nodes": ["gpu-node-00"], "gpus": [1]}}),
            "steps[0].do[0].fault[0].code",
            "Field required",
            id="fault-validated-by-simulator-schema",
        ),
        pytest.param(
            _with(
                "steps.0.do.0",
                {
                    "fault": {
                        "kind": "xid",
                        "code": 79,
                        "nodes": ["gpu-node-00"],
                        "gpus": [1],
                        "gpus_of": {"workload": "w"},
                    }
                },
            ),
            "steps[0].do[0].fault",
            "not both",
            id="fault-gpus-twice",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.prefer_nodes", ["gpu-node-42"]),
            "steps[0].do[0].deploy.prefer_nodes",
            "unknown node",
            id="preferred-node",
        ),
        pytest.param(
            _with("steps.0.do.0", {"fault": {"kind": "xid", "code": 79, "nodes": ["gpu-node-77"]}}),
            "steps[0].do[0].fault.nodes",
            "unknown node",
            id="fault-node",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.hpa", {"min": 0, "max": 4, "gpu_utilization": 70}),
            "steps[0].do[0].deploy.hpa",
            "drop gpu_utilization or set min >= 1",
            id="zero-on-a-pods-metric",
        ),
        pytest.param(
            _with(
                "steps.0.do.0.deploy.hpa",
                {"min": 0, "max": 4, "requests_per_second": 5, "gateway_requests_per_second": 20},
            ),
            "steps[0].do[0].deploy.hpa",
            "drop requests_per_second",
            id="zero-beside-a-pods-metric",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.hpa", {"min": 1, "max": 4}),
            "steps[0].do[0].deploy.hpa",
            "at least one metric",
            id="hpa-without-metrics",
        ),
        pytest.param(
            _with("steps.0.do.0.deploy.hpa", {"min": 5, "max": 4, "gateway_requests_per_second": 20}),
            "steps[0].do[0].deploy.hpa",
            "above max",
            id="hpa-min-above-max",
        ),
    ],
)
def test_mistakes_name_their_field(doc: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_demo_scenario(doc)
    problems = dict(err.value.problems)
    assert field in problems, problems
    assert fragment in problems[field]


def test_every_problem_is_reported_at_once() -> None:
    doc = _with("steps.0.do.0.deploy.pool", "nope")
    doc["steps"].append(copy.deepcopy(doc["steps"][0]))
    with pytest.raises(ConfigError) as err:
        parse_demo_scenario(doc)
    fields = [f for f, _ in err.value.problems]
    assert "steps[1].name" in fields  # duplicate step name
    assert fields.count("steps[0].do[0].deploy.pool") == 1 and "steps[1].do[0].deploy.pool" in fields


def test_faults_fan_out_over_nodes_and_gpus() -> None:
    faults = Faults.model_validate(
        {"kind": "xid", "code": 13, "count": 2, "nodes": ["a", "b"], "gpus": [0, 7]}
    )
    assert faults.expand() == [
        {"kind": "xid", "code": 13, "count": 2, "node": n, "gpu": g} for n in ("a", "b") for g in (0, 7)
    ]
    whole_node = Faults.model_validate({"kind": "exporter_down", "nodes": ["a"]})
    assert whole_node.expand() == [{"kind": "exporter_down", "node": "a"}]


def test_faults_on_the_gpus_a_workload_holds_take_them_per_node_when_injected() -> None:
    faults = Faults.model_validate(
        {"kind": "xid", "code": 79, "nodes": ["a", "b"], "gpus_of": {"workload": "w", "namespace": "t"}}
    )
    assert faults.expand({"a": [2], "b": [4, 5]}) == [
        {"kind": "xid", "code": 79, "node": "a", "gpu": 2},
        {"kind": "xid", "code": 79, "node": "b", "gpu": 4},
        {"kind": "xid", "code": 79, "node": "b", "gpu": 5},
    ]
    assert "gpus_of" not in faults.expand({"a": [2]})[0]


def test_expect_body_and_key() -> None:
    e = Expect.model_validate({"quarantined": {"node": "n", "reason": "xid-79"}, "within": 5})
    assert e.key == "quarantined"
    assert e.body.model_dump(exclude_none=True) == {"node": "n", "reason": "xid-79"}


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_demo_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_demo_scenario(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_demo_scenario(listed)
