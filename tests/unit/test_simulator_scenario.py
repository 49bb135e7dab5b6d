"""Scenario file validation: durations, defaults, and every error naming its field (all reported at once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.errors import ConfigError
from harness.simulator.scenario import load_scenario, parse_duration, parse_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param(90, 90, id="int-seconds"),
        pytest.param(1.5, 1.5, id="float-seconds"),
        pytest.param("42", 42.0, id="numeric-string"),
        pytest.param("250ms", 0.25, id="ms"),
        pytest.param("90s", 90.0, id="s"),
        pytest.param("5m", 300.0, id="m"),
        pytest.param("1h30m", 5400.0, id="h-and-m"),
        pytest.param("1m30s", 90.0, id="m-and-s"),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m5", "1d"], ids=["empty", "words", "unit-first", "days"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_defaults_make_a_small_fleet() -> None:
    s = parse_scenario({})
    assert (s.fleet.nodes, s.fleet.gpus_per_node, s.fleet.numa_nodes) == (4, 8, 2)
    assert s.fleet.node_names()[:2] == ["gpu-node-000", "gpu-node-001"]
    assert s.exporter.hostname_label == "Hostname"
    assert s.exporter.xid_count_window == 300.0


def _fault(**kw: Any) -> dict[str, Any]:
    return {"kind": "xid", "node": "gpu-node-000", "gpu": 0, "code": 79, **kw}


@pytest.mark.parametrize(
    ("doc", "field", "message"),
    [
        pytest.param({"fleet": {"nodez": 3}}, "fleet.nodez", "Extra inputs", id="unknown-key"),
        pytest.param({"fleet": {"nodes": 0}}, "fleet.nodes", "greater than or equal to 1", id="zero-nodes"),
        pytest.param(
            {"fleet": {"node_name_pattern": "node"}}, "fleet.node_name_pattern", "{index}", id="no-index"
        ),
        pytest.param(
            {"fleet": {"node_name_pattern": "N-{index}"}},
            "fleet.node_name_pattern",
            "not a valid",
            id="bad-dns-name",
        ),
        pytest.param(
            {"fleet": {"node_name_pattern": "n-{idx}"}},
            "fleet.node_name_pattern",
            "only {index}",
            id="unknown-placeholder",
        ),
        pytest.param(
            {"exporter": {"hostname_label": "host"}},
            "exporter.hostname_label",
            "'Hostname'",
            id="hostname-label",
        ),
        pytest.param(
            {"exporter": {"metrics": ["DCGM_FI_DEV_NOPE"]}},
            "exporter.metrics[0]",
            "Input should be",
            id="unknown-metric",
        ),
        pytest.param({"exporter": {"tick": "soon"}}, "exporter.tick", "not a duration", id="bad-tick"),
        pytest.param(
            {"faults": [_fault(code=0)]}, "faults[0].code", "greater than or equal to 1", id="xid-code-0"
        ),
        pytest.param(
            {"faults": [_fault(kind="meteor")]},
            "faults[0]",
            "does not match any of the expected tags",
            id="unknown-kind",
        ),
        pytest.param(
            {"faults": [{"kind": "exporter_down", "node": "gpu-node-000", "gpu": 1}]},
            "faults[0].gpu",
            "Extra inputs",
            id="exporter-down-has-no-gpu",
        ),
        pytest.param(
            {"faults": [_fault(node="gpu-node-999")]}, "faults[0].node", "unknown node", id="unknown-node"
        ),
        pytest.param({"faults": [_fault(gpu=8)]}, "faults[0].gpu", "does not exist", id="gpu-out-of-range"),
        pytest.param({"faults": [_fault(at="later")]}, "faults[0].at", "not a duration", id="bad-at"),
        pytest.param({"workloads": [{"name": "Web"}]}, "workloads[0].name", "DNS label", id="workload-name"),
        pytest.param(
            {"workloads": [{"name": "w", "load": [{"at": 60, "qps": 1}, {"at": 30, "qps": 2}]}]},
            "workloads[0].load",
            "increasing",
            id="load-not-increasing",
        ),
        pytest.param(
            {"workloads": [{"name": "w", "load": []}]}, "workloads[0].load", "at least 1", id="load-empty"
        ),
        pytest.param(
            {"workloads": [{"name": "w", "load": [{"at": 0, "qps": -1}]}]},
            "workloads[0].load[0].qps",
            "greater than or equal to 0",
            id="negative-qps",
        ),
        pytest.param(
            {"workloads": [{"name": "w", "load": [{"at": 0, "qps": 1}, {"at": 600, "qps": 2}], "loop": 60}]},
            "workloads[0].loop",
            "last load point",
            id="loop-too-short",
        ),
        pytest.param(
            {"workloads": [{"name": "w"}, {"name": "w"}]},
            "workloads[1].name",
            "duplicate",
            id="duplicate-workload",
        ),
        pytest.param(
            {"workloads": [{"name": "w", "gpus_per_pod": 16}]},
            "workloads[0].gpus_per_pod",
            "gpus_per_node",
            id="pod-bigger-than-node",
        ),
        pytest.param(
            {"workloads": [{"name": "w", "replicas": 33}]},
            "workloads[0].replicas",
            "does not fit",
            id="replicas-do-not-fit",
        ),
        pytest.param(
            {
                "fleet": {"nodes": 2, "gpus_per_node": 4},
                "workloads": [
                    {"name": "a", "replicas": 2, "gpus_per_pod": 3},
                    {"name": "b", "gpus_per_pod": 2},
                ],
            },
            "workloads[1].replicas",
            "does not fit",
            id="fragmented-fleet",
        ),
    ],
)
def test_errors_name_the_field(doc: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(doc)
    fields = dict(caught.value.problems)
    assert field in fields, caught.value.problems
    assert message in fields[field]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario({"fleet": {"nodes": 0, "gpus_per_node": 0}, "exporter": {"bogus": 1}})
    assert {f for f, _ in caught.value.problems} == {"fleet.nodes", "fleet.gpus_per_node", "exporter.bogus"}


def test_cross_checks_are_reported_together() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario({"faults": [_fault(node="nope"), _fault(gpu=99)]})
    assert [f for f, _ in caught.value.problems] == ["faults[0].node", "faults[1].gpu"]


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        pytest.param(None, "(file)", "cannot read", id="missing-file"),
        pytest.param("fleet: [", "(file)", "not valid YAML", id="bad-yaml"),
        pytest.param("- 1\n- 2\n", "(top level)", "expected a mapping", id="not-a-mapping"),
        pytest.param("fleet:\n  nodes: many\n", "fleet.nodes", "valid integer", id="bad-value"),
    ],
)
def test_load_scenario_errors(tmp_path: Path, content: str | None, field: str, message: str) -> None:
    path = tmp_path / "scenario.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    (got_field, got_message), *_ = caught.value.problems
    assert got_field == field
    assert message in got_message


def test_empty_file_is_the_default_scenario(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_scenario(path) == parse_scenario({})


@pytest.mark.parametrize("name", ["small.yaml", "demo.yaml", "fleet-5000.yaml", "shared.yaml"])
def test_example_scenarios_are_valid(name: str) -> None:
    scenario = load_scenario(EXAMPLES / name)
    assert scenario.fleet.nodes >= 4


def test_demo_scenario_shape() -> None:
    demo = load_scenario(EXAMPLES / "demo.yaml")
    assert (demo.fleet.nodes, demo.fleet.gpus_per_node, demo.fleet.numa_nodes) == (16, 8, 2)
