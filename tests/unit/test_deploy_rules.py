"""The alerting contract of rules/gpuwarden.rules.yaml, and its PrometheusRule copy in deploy/.

promtool (rules/test.sh) proves what each alert does; these tests prove the things promtool cannot see:
every alert carries severity, summary, description and a runbook_url whose anchor exists in
docs/runbooks.md; every alert has a must-not-fire-yet step and an exact-labels step in the promtool tests;
the hardware-XID list equals the controller's catalog; the generated PrometheusRule matches the plain file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules" / "gpuwarden.rules.yaml"
RULE_TESTS = sorted((ROOT / "rules" / "tests").glob("*.test.yaml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/gpuwarden/gpuwarden/blob/main/docs/runbooks.md#"
SEVERITIES = {"critical", "warning", "info"}
# What issue 8 asks the rules to cover, and the alert that does it.
REQUIRED = {
    "GPU hardware XID": "GPUHardwareXid",
    "ECC DBE": "GPUEccDoubleBitErrors",
    "row-remap failure": "GPURowRemapFailure",
    "node quarantined": "GPUNodeQuarantined",
    "quarantine breaker open": "GPUQuarantineBreakerOpen",
    "DCGM exporter down": "DCGMExporterDown",
    "GPU series missing": "GPUTelemetryMissing",
    "preemption cascade": "GPUPreemptionCascade",
    "stale nominations": "GPUStaleNominations",
    "adapter down": "GPUWardenAdapterDown",
    "adapter serving stale data": "GPUWardenAdapterStaleData",
    "HPA unable to fetch metrics": "HPAMetricsUnavailable",
    "controller not leading": "GPUWardenControllerNotLeading",
}


def groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text())["groups"])


def alerts() -> list[dict[str, Any]]:
    return [r for g in groups() for r in g["rules"] if "alert" in r]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower-case, punctuation dropped, spaces to dashes."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_issue_8_alerts_exist() -> None:
    names = {a["alert"] for a in alerts()}
    assert set(REQUIRED.values()) <= names
    assert len(names) == len(alerts()), "duplicate alert names"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_has_severity_summary_description_runbook(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    ann = alert["annotations"]
    assert ann["summary"].strip() and len(ann["summary"]) < 120
    assert len(ann["description"].split()) >= 10
    assert ann["runbook_url"] == RUNBOOK_BASE + alert["alert"].lower()
    assert alert["alert"].lower() in anchors(RUNBOOKS.read_text()), (
        f"docs/runbooks.md lacks ## {alert['alert']}"
    )


def test_recording_rules_follow_the_naming_convention() -> None:
    for group in groups():
        for rule in group["rules"]:
            if "record" in rule:
                assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def _steps() -> dict[str, list[tuple[float, list[dict[str, Any]]]]]:
    out: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {}
    unit = {"s": 1, "m": 60, "h": 3600}
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for step in test.get("alert_rule_test", []):
                t = step["eval_time"]
                seconds = float(t[:-1]) * unit[t[-1]]
                out.setdefault(step["alertname"], []).append((seconds, step.get("exp_alerts") or []))
    return out


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_must_not_fire_yet_and_an_exact_labels_step(alert: dict[str, Any]) -> None:
    steps = _steps().get(alert["alert"], [])
    firing = [(t, exp) for t, exp in steps if exp]
    assert firing, f"no promtool step where {alert['alert']} fires"
    first_firing = min(t for t, _ in firing)
    assert any(t < first_firing and not exp for t, exp in steps), "no must-not-fire-yet step before it fires"
    for _, expected in firing:
        for exp in expected:
            labels = exp["exp_labels"]
            assert labels["alertname"] == alert["alert"] and labels["severity"] == alert["labels"]["severity"]
            assert set(exp["exp_annotations"]) == set(alert["annotations"]), "annotations not all checked"


def test_hardware_xid_list_equals_the_controller_catalog() -> None:
    catalog = yaml.safe_load((ROOT / "controller" / "data" / "xid_catalog.yaml").read_text())["xids"]
    quarantined = {int(code) for code, entry in catalog.items() if entry.get("quarantine")}
    (xid,) = [a for a in alerts() if a["alert"] == "GPUHardwareXid"]
    in_rule = {int(c) for c in re.findall(r"DCGM_FI_DEV_XID_ERRORS == (\d+)", xid["expr"])}
    assert in_rule == quarantined


def test_prometheusrule_is_the_rules_file_unchanged() -> None:
    generated = yaml.safe_load(
        (ROOT / "deploy" / "overlays" / "monitoring" / "prometheusrule.yaml").read_text()
    )
    assert generated["apiVersion"] == "monitoring.coreos.com/v1" and generated["kind"] == "PrometheusRule"
    assert generated["spec"] == yaml.safe_load(RULES.read_text())


def test_generated_deploy_files_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------ recording rules from the configured labels
def _generate() -> Any:
    """deploy/generate.py as a module (a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("deploy_generate", ROOT / "deploy" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _promtool() -> str:
    import shutil

    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool missing: run `make prometheus`", pytrace=False)
    return path


# A GPU Operator dcgm-exporter scraped with honor_labels: false: `pod`/`namespace` name the exporter's own
# pod, the pod holding each GPU arrives as exported_pod/exported_namespace.
_OPERATOR = 'Hostname="n1",namespace="gpu-operator",pod="dcgm-exporter-x"'
_HELD = 'exported_namespace="ml",exported_pod="infer-1"'
_EXPORTED_SERIES = """
rule_files: [rules.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",@OP@,@HELD@}'
        values: '40x10'
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",@OP@,@HELD@}'
        values: '80x10'
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",@OP@}'
        values: '99x10'
      - series: 'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",@OP@,@HELD@}'
        values: '20x10'
      - series: 'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",@OP@,@HELD@}'
        values: '60x10'
    promql_expr_test:
      - expr: namespace_pod:dcgm_gpu_utilization:avg
        eval_time: 1m
        exp_samples:
          - labels: 'namespace_pod:dcgm_gpu_utilization:avg{namespace="ml",pod="infer-1"}'
            value: 60
      - expr: namespace_pod:dcgm_fb_used:max_ratio
        eval_time: 1m
        exp_samples:
          - labels: 'namespace_pod:dcgm_fb_used:max_ratio{namespace="ml",pod="infer-1"}'
            value: 0.25
      - expr: cluster:dcgm_gpus_allocated:count
        eval_time: 1m
        exp_samples:
          - labels: 'cluster:dcgm_gpus_allocated:count'
            value: 2
""".replace("@OP@", _OPERATOR).replace("@HELD@", _HELD)


def test_the_default_labels_render_the_rules_file_byte_for_byte() -> None:
    gen = _generate()
    template = gen.RULES_TEMPLATE.read_text(encoding="utf-8")
    assert gen.render_rules(template, "pod", "namespace") == RULES.read_text(encoding="utf-8")
    assert "DCGM_POD_LABEL" not in RULES.read_text() and "DCGM_NAMESPACE_LABEL" not in RULES.read_text()


@pytest.mark.parametrize(
    ("labels", "honoured"),
    [(("exported_pod", "exported_namespace"), True), (("pod", "namespace"), False)],
    ids=["rendered-for-exported-labels", "default-render-misreads-them"],
)
def test_rules_rendered_for_exported_labels_record_the_gpu_holding_pod(
    tmp_path: Path, labels: tuple[str, str], honoured: bool
) -> None:
    """promtool on GPU Operator-shaped series: the render for exported_pod records the pod holding the GPU;
    the default render (what a verbatim copy shipped before) records the exporter's own pod instead."""
    gen = _generate()
    rules = gen.render_rules(gen.RULES_TEMPLATE.read_text(encoding="utf-8"), *labels)
    (tmp_path / "rules.yaml").write_text(rules)
    (tmp_path / "test.yaml").write_text(_EXPORTED_SERIES)
    check = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "rules.yaml")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run([_promtool(), "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert (done.returncode == 0) is honoured, done.stdout + done.stderr
    if not honoured:
        assert 'pod="dcgm-exporter-x"' in done.stdout + done.stderr


@pytest.mark.parametrize("labels", [("exported pod", "namespace"), ("pod", "1ns"), ("pod", "")])
def test_render_refuses_what_is_not_a_label_name(labels: tuple[str, str]) -> None:
    gen = _generate()
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        gen.render_rules(gen.RULES_TEMPLATE.read_text(encoding="utf-8"), *labels)


def test_rules_for_prints_the_prometheusrule_for_other_labels() -> None:
    gen_py = str(ROOT / "deploy" / "generate.py")
    done = subprocess.run([sys.executable, gen_py, "--rules-for", "exported_pod", "exported_namespace"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rule = yaml.safe_load(done.stdout)
    assert rule["kind"] == "PrometheusRule"
    (util,) = [r for g in rule["spec"]["groups"] for r in g["rules"]
               if r.get("record") == "namespace_pod:dcgm_gpu_utilization:avg"]  # fmt: skip
    assert 'DCGM_FI_DEV_GPU_UTIL{exported_pod!=""}' in util["expr"]
    bad = subprocess.run([sys.executable, gen_py, "--rules-for", "exported-pod", "ns"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and "'exported-pod'" in bad.stderr
