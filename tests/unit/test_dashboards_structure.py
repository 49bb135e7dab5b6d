"""Structural validation of dashboards/*.json: Grafana shape, stable uids, datasource variable, layout, and
that every metric a panel queries is one gpuwarden, dcgm-exporter, kube-state-metrics or our recording rules
actually produce. Whether each query returns data is tests/integration/test_dashboards_live.py's job.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
UIDS = {
    "gpu-autoscaling.json": "gpuwarden-autoscaling",
    "gpu-fleet-health.json": "gpuwarden-fleet-health",
    "scheduling-preemption.json": "gpuwarden-scheduling",
    "gpuwarden.json": "gpuwarden-overview",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "datasource"}
KUBE_STATE_METRICS = {
    "kube_horizontalpodautoscaler_info",
    "kube_horizontalpodautoscaler_spec_target_metric",
    "kube_horizontalpodautoscaler_spec_max_replicas",
    "kube_horizontalpodautoscaler_spec_min_replicas",
    "kube_horizontalpodautoscaler_status_condition",
    "kube_horizontalpodautoscaler_status_current_replicas",
    "kube_horizontalpodautoscaler_status_desired_replicas",
    "kube_node_status_capacity",
    "kube_node_spec_taint",
    "kube_pod_status_phase",
    "kube_pod_container_resource_requests",
    "kube_pod_owner",
    "kube_replicaset_owner",
}
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BUILD = load_builder()


def dashboards() -> dict[str, dict[str, Any]]:
    return {name: json.loads((DASHBOARDS / name).read_text()) for name in UIDS}


def targets(dash: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def code_metrics() -> set[str]:
    names: set[str] = set()
    for pkg in ("gpuwarden", "adapter", "controller", "nodeagent"):
        for path in (ROOT / pkg).rglob("*.py"):
            names |= {base(n) for n in re.findall(r'"(gpuwarden_[a-z0-9_]+)"', path.read_text())}
    return names


def dcgm_metrics() -> set[str]:
    text = (ROOT / "harness" / "simulator" / "exposition.py").read_text()
    return set(re.findall(r'Family\(\s*"([A-Za-z_]+)"', text))


def recorded() -> set[str]:
    rules = yaml.safe_load((ROOT / "rules" / "gpuwarden.rules.yaml").read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (quoted strings and `by (...)` label lists removed)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    tokens = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)
    return {t for t in tokens if t.startswith(("gpuwarden_", "DCGM_", "kube_")) or t.count(":") == 2}


def test_json_files_are_what_the_builder_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(DASHBOARDS / "build.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert set(BUILD.DASHBOARDS) == set(UIDS) == {p.name for p in DASHBOARDS.glob("*.json")}


@pytest.mark.parametrize("name", UIDS)
def test_dashboard_shape(name: str) -> None:
    dash = dashboards()[name]
    assert dash["uid"] == UIDS[name] and len(dash["uid"]) <= 40
    assert dash["title"].startswith("gpuwarden / ")
    assert "gpuwarden" in dash["tags"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert "id" not in dash, "a provisioned dashboard must not carry a database id"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE and var["definition"].startswith("label_values(")


def test_uids_and_titles_are_unique() -> None:
    all_dash = dashboards().values()
    assert len({d["uid"] for d in all_dash}) == len({d["title"] for d in all_dash}) == len(UIDS)


@pytest.mark.parametrize("name", UIDS)
def test_panels_use_the_datasource_variable_and_fit_the_grid(name: str) -> None:
    dash = dashboards()[name]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        covered = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "table"}
        assert panel["title"] and panel["datasource"] == DATASOURCE
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip()


@pytest.mark.parametrize("name", UIDS)
def test_queries_only_use_defined_variables_and_balance(name: str) -> None:
    dash = dashboards()[name]
    defined = {v["name"] for v in dash["templating"]["list"]} | GRAFANA_VARIABLES
    for panel, target in targets(dash):
        expr = target["expr"]
        used = set(re.findall(r"\$\{?(\w+)", re.sub(r'"\$1"', "", expr)))
        assert used <= defined, f"{panel['title']}: undefined {used - defined}"
        for open_, close in ("()", "{}", "[]"):
            assert expr.count(open_) == expr.count(close), f"{panel['title']}: unbalanced {open_}{close}"


@pytest.mark.parametrize("name", UIDS)
def test_every_metric_queried_exists_somewhere(name: str) -> None:
    known = (
        code_metrics()
        | dcgm_metrics()
        | recorded()
        | KUBE_STATE_METRICS
        | {base(m) for m in BUILD.AWAITING_METRICS}
    )
    for panel, target in targets(dashboards()[name]):
        for metric in metric_names(target["expr"]):
            assert metric in known or base(metric) in known, f"{panel['title']}: unknown metric {metric}"


def test_awaiting_metrics_are_not_exported_yet() -> None:
    """Once a component exports one of them, drop it from AWAITING_METRICS so its panels are checked live."""
    exported = code_metrics() & {base(m) for m in BUILD.AWAITING_METRICS}
    assert not exported, f"now exported, remove from dashboards/build.py AWAITING_METRICS: {sorted(exported)}"


def test_every_recording_rule_is_used_by_a_dashboard_or_an_alert() -> None:
    used: set[str] = set()
    for dash in dashboards().values():
        for _, target in targets(dash):
            used |= metric_names(target["expr"])
    rules_text = (ROOT / "rules" / "gpuwarden.rules.yaml").read_text()
    for name in recorded():
        assert name in used or rules_text.count(name) > 1, f"{name} is recorded but never read"


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (node) (rate(DCGM_FI_DEV_X{pod!="a_b"}[5m])) / on (node) node:dcgm_gpus:count{node=~"$node"}'
    )
    assert metric_names(expr) == {"DCGM_FI_DEV_X", "node:dcgm_gpus:count"}


def test_capability_mode_panels_read_the_labels_and_modes_the_controller_exports() -> None:
    """The overview's mode panels query gpuwarden_capability_mode by the labels controller.app registers and
    the mode values controller.modes can take: a renamed label or mode would leave the panels empty."""
    from typing import get_args

    from prometheus_client import CollectorRegistry

    from controller.app import register_modes
    from controller.modes import METRIC, Mode, capability_modes
    from gpuwarden.config.root import Config

    registry = CollectorRegistry()
    register_modes(registry, capability_modes(Config(), dry_run=None))
    (family,) = [f for f in registry.collect() if f.name == METRIC]
    exported = {name for sample in family.samples for name in sample.labels}
    panels = [p for p in dashboards()["gpuwarden.json"]["panels"] if "Capabilit" in p.get("title", "")]
    assert {p["title"] for p in panels} == {"Capability modes", "Capabilities acting"}
    for panel in panels:
        (target,) = panel["targets"]
        expr = target["expr"]
        assert METRIC in expr
        for group in re.findall(r"by \(([^)]*)\)", expr):
            assert {g.strip() for g in group.split(",")} <= exported, expr
        assert set(re.findall(r'mode="([a-z]+)"', expr)) <= set(get_args(Mode)), expr
    (table,) = [p for p in panels if p["type"] == "table"]
    assert "by (capability, mode)" in table["targets"][0]["expr"]
