"""The chart's PrometheusRule follows gpuwarden's configured dcgm-exporter labels (`helm template` only).

rules/gpuwarden.rules.tmpl.yaml is the one rule text; deploy/generate.py renders it for the kustomize tree and
rules/ (promtool-tested), the chart renders it at install time from config.adapter.presets.dcgm_pod_label /
dcgm_namespace_label. Both renderers must agree: the defaults give rules/gpuwarden.rules.yaml, a changed label
gives what render_rules gives for it, and a name PromQL cannot hold is refused naming the key.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_helm_chart import CHART, helm, template

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules" / "gpuwarden.rules.yaml"


def _render_rules(pod: str, namespace: str) -> str:
    spec = importlib.util.spec_from_file_location("deploy_generate", ROOT / "deploy" / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return str(gen.render_rules(gen.RULES_TEMPLATE.read_text(encoding="utf-8"), pod, namespace))


def _chart_groups(*sets: str) -> list[Any]:
    objects = template(["monitoring.prometheusRule.enabled=true", *sets])
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return list(rule["spec"]["groups"])


def test_default_values_render_the_promtool_tested_rules() -> None:
    assert _chart_groups() == yaml.safe_load(RULES.read_text())["groups"]


@pytest.mark.parametrize(
    ("pod", "namespace"), [("exported_pod", "exported_namespace"), ("k8s_pod", "namespace")]
)
def test_a_changed_label_setting_changes_the_rules_with_it(pod: str, namespace: str) -> None:
    groups = _chart_groups(
        f"config.adapter.presets.dcgm_pod_label={pod}",
        f"config.adapter.presets.dcgm_namespace_label={namespace}",
    )
    assert groups == yaml.safe_load(_render_rules(pod, namespace))["groups"]
    assert groups != yaml.safe_load(RULES.read_text())["groups"]
    records = {r.get("record"): r for g in groups for r in g["rules"]}
    util = records["namespace_pod:dcgm_gpu_utilization:avg"]
    assert f'DCGM_FI_DEV_GPU_UTIL{{{pod}!=""}}' in util["expr"]
    assert f'"pod", "$1", "{pod}", "(.+)"' in util["expr"]


def test_a_label_promql_cannot_hold_is_refused_with_its_key() -> None:
    done = helm("template", "gpuwarden", str(CHART), "--set", "monitoring.prometheusRule.enabled=true",
                "--set", "config.adapter.presets.dcgm_namespace_label=exported-namespace")  # fmt: skip
    assert done.returncode != 0
    assert "config.adapter.presets.dcgm_namespace_label" in done.stderr
    assert "exported-namespace" in done.stderr
