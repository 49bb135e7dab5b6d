"""Builds gpuwarden's Grafana dashboards (dashboards/*.json) from one place, so they share conventions.

Why a builder instead of hand-edited JSON: four dashboards and ~50 panels must agree on the datasource
variable, the uid/tag scheme, the grid layout and the PromQL idioms (dcgm-exporter's Hostname/hostname
label, the recording rules of rules/gpuwarden.rules.yaml). Run `python dashboards/build.py` after a change;
`--check` fails when a JSON file is out of date (the unit tests run it). deploy/generate.py then wraps the
JSON files in Grafana-sidecar ConfigMaps.

Conventions: every panel queries `${datasource}` (a datasource template variable, so the dashboards import
anywhere); uids are `gpuwarden-<topic>` and never change; every dashboard is tagged `gpuwarden`. Each panel
query is evaluated against a real Prometheus fed by the fleet simulator and gpuwarden's own /metrics in
tests/integration/test_dashboards_queries.py, and must return data.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
AWAITING_METRICS: dict[str, str] = {}
"""Self-metrics the dashboards and alerts use before the component exporting them exists. Their panels are
reported, not failed, by the live query test; a unit test fails once the code exports them (then drop them
here, and the live test checks their panels like every other)."""
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
GRID_WIDTH = 24


def by_node(selector: str) -> str:
    """`selector` with a `node` label copied from dcgm-exporter's Hostname (released) or hostname (main)."""
    return (
        f'label_replace(label_replace({selector}, "node", "$1", "Hostname", "(.+)"), '
        '"node", "$1", "hostname", "(.+)")'
    )


def per_gpu(selector: str, *, suffix: str = "", extra: str = "") -> str:
    """One series per GPU (node, gpu, UUID + `extra` labels), limited to the nodes chosen in `$node`."""
    return (
        f"max by (node, gpu, UUID{extra}) ({by_node(selector)}){suffix}"
        ' and on (node) node:dcgm_gpus:count{node=~"$node"}'
    )


def per_node(agg: str, selector: str) -> str:
    """`agg by (node)` of a DCGM series, limited to the nodes chosen in `$node`."""
    return f'{agg} by (node) ({by_node(selector)}) and on (node) node:dcgm_gpus:count{{node=~"$node"}}'


FM_STATUS = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"
RESOURCE_AGE = 'gpuwarden_adapter_served_value_age_seconds_bucket{api="resource"}'


def quantile(q: float, histogram: str, by: str = "", window: str = "$__rate_interval") -> str:
    labels = ", ".join(["le", *[b.strip() for b in by.split(",") if b.strip()]])
    return f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket[{window}])))"


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    targets: list[Target]
    kind: str = "timeseries"  # timeseries | stat | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    decimals: int | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)
    thresholds: list[tuple[float | None, str]] = field(default_factory=list)
    stack: bool = False


@dataclass
class Row:
    title: str


@dataclass
class Variable:
    name: str
    label: str
    query: str  # label_values(...) for a query variable
    multi: bool = True


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    tags: list[str]
    items: list[Panel | Row]
    variables: list[Variable] = field(default_factory=list)
    refresh: str = "30s"
    time_from: str = "now-3h"


def _templating(variables: list[Variable]) -> dict[str, Any]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "regex": "",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "includeAll": False,
            "multi": False,
            "options": [],
        }
    ]
    for var in variables:
        out.append(
            {
                "name": var.name,
                "label": var.label,
                "type": "query",
                "datasource": DATASOURCE,
                "definition": var.query,
                "query": {
                    "qryType": 1,
                    "query": var.query,
                    "refId": "PrometheusVariableQueryEditor-VariableQuery",
                },
                "refresh": 2,
                "regex": "",
                "sort": 1,
                "hide": 0,
                "includeAll": True,
                "allValue": ".*",
                "multi": var.multi,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "options": [],
            }
        )
    return {"list": out}


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"color": color, "value": value} for value, color in (panel.thresholds or [(None, "green")])
    ]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "mappings": panel.mappings,
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    options: dict[str, Any]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options = {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
                "calcs": ["lastNotNull"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        }
    else:  # table
        options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    body: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "datasource": DATASOURCE,
                "refId": chr(ord("A") + i),
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "range": not (t.instant or panel.kind == "table"),
                "instant": t.instant or panel.kind == "table",
                "format": "table" if panel.kind == "table" else "time_series",
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if panel.kind == "table":
        body["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ]
    return body


def render(dash: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard JSON; panels flow left to right on the 24-column grid, rows start a new line."""
    panels: list[dict[str, Any]] = []
    x = y = row_height = 0
    for pid, item in enumerate(dash.items, start=1):
        if isinstance(item, Row):
            if x:
                y, x, row_height = y + row_height, 0, 0
            panels.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": item.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            y += 1
            continue
        if x + item.width > GRID_WIDTH:
            y, x, row_height = y + row_height, 0, 0
        panels.append(_panel_json(item, pid, x, y))
        x += item.width
        row_height = max(row_height, item.height)
    return {
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description,
        "tags": dash.tags,
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": dash.time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "refresh": dash.refresh,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "gpuwarden dashboards",
                "type": "dashboards",
                "tags": ["gpuwarden"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
            }
        ],
        "templating": _templating(dash.variables),
        "panels": panels,
    }


# ----------------------------------------------------------------------------------------------- dashboards
NS = 'namespace=~"$namespace"'
HPA = f'{NS}, horizontalpodautoscaler=~"$hpa"'
HPA_WORKLOAD = (
    "max by (namespace, horizontalpodautoscaler, workload) (label_replace("
    f'kube_horizontalpodautoscaler_info{{{HPA}}}, "workload", "$1", "scaletargetref_name", "(.*)"))'
)
QPS_METRICS = '"requests_per_second|http_requests_per_second"'


def per_hpa(workload_metric: str, target_matcher: str) -> str:
    """`workload_metric` of each HPA's scale target, for the HPAs whose target metric matches (several HPAs
    may share a target workload, so the HPA side is the "many" side of the join)."""
    return (
        f"{HPA_WORKLOAD} * on (namespace, workload) group_left () {workload_metric}"
        " and on (namespace, horizontalpodautoscaler) "
        f"kube_horizontalpodautoscaler_spec_target_metric{{{target_matcher}}}"
    )


OPEN_CLOSED = [
    {
        "type": "value",
        "options": {"0": {"text": "closed", "color": "green"}, "1": {"text": "OPEN", "color": "red"}},
    }
]


def autoscaling() -> Dashboard:
    return Dashboard(
        uid="gpuwarden-autoscaling",
        title="gpuwarden / GPU autoscaling",
        description="Per HPA: desired and current replicas against the GPU-utilization or QPS metric and its "
        "target, as served by gpuwarden's adapter.",
        tags=["gpuwarden", "gpu", "autoscaling"],
        variables=[
            Variable("namespace", "Namespace", "label_values(kube_horizontalpodautoscaler_info, namespace)"),
            Variable(
                "hpa",
                "HPA",
                'label_values(kube_horizontalpodautoscaler_info{namespace=~"$namespace"}, '
                "horizontalpodautoscaler)",
            ),
        ],
        items=[
            Row("Replicas"),
            Panel(
                "Desired vs current replicas",
                [
                    Target(
                        f"max by (namespace, horizontalpodautoscaler) "
                        f"(kube_horizontalpodautoscaler_status_desired_replicas{{{HPA}}})",
                        "{{horizontalpodautoscaler}} desired",
                    ),
                    Target(
                        f"max by (namespace, horizontalpodautoscaler) "
                        f"(kube_horizontalpodautoscaler_status_current_replicas{{{HPA}}})",
                        "{{horizontalpodautoscaler}} current",
                    ),
                    Target(
                        f"max by (namespace, horizontalpodautoscaler) "
                        f"(kube_horizontalpodautoscaler_spec_max_replicas{{{HPA}}})",
                        "{{horizontalpodautoscaler}} max",
                    ),
                    Target(
                        f"max by (namespace, horizontalpodautoscaler) "
                        f"(kube_horizontalpodautoscaler_spec_min_replicas{{{HPA}}})",
                        "{{horizontalpodautoscaler}} min",
                    ),
                ],
                description="From kube-state-metrics. Desired above current: the HPA is scaling up (or pods "
                "are pending on GPUs); desired at max: the metric is above target at full size.",
                width=16,
            ),
            Panel(
                "HPA conditions",
                [
                    Target(
                        f"max by (horizontalpodautoscaler, condition) "
                        f'(kube_horizontalpodautoscaler_status_condition{{{HPA}, status="true"}})'
                    )
                ],
                kind="table",
                description="AbleToScale, ScalingActive (false: the metric cannot be fetched, see the "
                "HPAMetricsUnavailable alert) and ScalingLimited (true: pinned at min or max); 1 = true.",
                width=8,
            ),
            Row("Metric against target"),
            Panel(
                "GPU utilization vs target",
                [
                    Target(
                        per_hpa(
                            "namespace_workload:dcgm_gpu_utilization:avg", 'metric_name="gpu_utilization"'
                        ),
                        "{{horizontalpodautoscaler}} ({{workload}})",
                    ),
                    Target(
                        "max by (namespace, horizontalpodautoscaler) "
                        "(kube_horizontalpodautoscaler_spec_target_metric"
                        f'{{{HPA}, metric_name="gpu_utilization"}})',
                        "{{horizontalpodautoscaler}} target",
                    ),
                ],
                unit="percent",
                description="Mean GPU utilization of the HPA's target workload (the value an HPA with a Pods "
                "metric on gpu_utilization averages; recording rule "
                "namespace_workload:dcgm_gpu_utilization:avg) "
                "and the HPA's target.",
            ),
            Panel(
                "QPS per pod vs target",
                [
                    Target(
                        per_hpa("namespace_workload:http_requests:avg_rate2m", f"metric_name=~{QPS_METRICS}"),
                        "{{horizontalpodautoscaler}} ({{workload}})",
                    ),
                    Target(
                        "max by (namespace, horizontalpodautoscaler) "
                        "(kube_horizontalpodautoscaler_spec_target_metric"
                        f"{{{HPA}, metric_name=~{QPS_METRICS}}})",
                        "{{horizontalpodautoscaler}} target",
                    ),
                ],
                unit="reqps",
                description="Requests per second per pod of the target workload (2 min rate, as the "
                "requests_per_second preset serves it) and the HPA's per-replica target.",
            ),
            Row("Pods"),
            Panel(
                "GPU utilization per pod",
                [Target(f"namespace_pod:dcgm_gpu_utilization:avg{{{NS}}}", "{{namespace}}/{{pod}}")],
                unit="percent",
                width=6,
            ),
            Panel(
                "GPU memory used per pod (fullest GPU)",
                [Target(f"namespace_pod:dcgm_fb_used:max_ratio{{{NS}}}", "{{namespace}}/{{pod}}")],
                unit="percentunit",
                width=6,
            ),
            Panel(
                "QPS per pod",
                [Target(f"namespace_pod:http_requests:rate2m{{{NS}}}", "{{namespace}}/{{pod}}")],
                unit="reqps",
                width=6,
            ),
            Panel(
                "QPS per workload (total)",
                [Target(f"namespace_workload:http_requests:rate2m{{{NS}}}", "{{namespace}}/{{workload}}")],
                unit="reqps",
                width=6,
                description="What an External metric on the namespace's or workload's total QPS sees.",
            ),
            Row("Metrics API"),
            Panel(
                "Metric values served",
                [
                    Target(
                        "sum by (api) (rate(gpuwarden_adapter_items_served_total[$__rate_interval]))",
                        "{{api}}",
                    )
                ],
                unit="ops",
                description="Values the adapter returned to the HPA controller (and other callers), per API.",
            ),
            Panel(
                "Metrics API errors",
                [
                    Target(
                        "sum by (route, code) "
                        '(rate(gpuwarden_adapter_requests_total{code=~"4..|5.."}[$__rate_interval]))',
                        "{{code}} {{route}}",
                    )
                ],
                unit="reqps",
                description="404: the metric or object has no data; 503: the cached value is stale or "
                "Prometheus is unavailable (the HPA keeps its replica count).",
            ),
        ],
    )


def fleet_health() -> Dashboard:
    return Dashboard(
        uid="gpuwarden-fleet-health",
        title="gpuwarden / GPU fleet health",
        description="XID and ECC errors by node and GPU, GPU telemetry coverage, quarantined nodes and the "
        "quarantine circuit breaker.",
        tags=["gpuwarden", "gpu", "health"],
        variables=[Variable("node", "Node", "label_values(node:dcgm_gpus:count, node)")],
        items=[
            Row("Fleet"),
            Panel("GPUs reporting", [Target("cluster:dcgm_gpus:count")], kind="stat", width=4, height=4),
            Panel(
                "GPUs allocated to pods",
                [Target("cluster:dcgm_gpus_allocated:count")],
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Fleet GPU utilization",
                [Target("cluster:dcgm_gpu_utilization:avg")],
                kind="stat",
                unit="percent",
                width=4,
                height=4,
            ),
            Panel(
                "Quarantined nodes",
                [Target("sum(max by (reason) (gpuwarden_health_quarantined_nodes))")],
                kind="stat",
                width=4,
                height=4,
                thresholds=[(None, "green"), (1, "orange")],
            ),
            Panel(
                "Quarantine breaker",
                [Target("max(gpuwarden_health_breaker_open)")],
                kind="stat",
                width=4,
                height=4,
                mappings=OPEN_CLOSED,
                description="Open: more nodes failed at once than health.breaker allows; no new quarantines.",
            ),
            Panel(
                "Nodes with unknown telemetry",
                [Target("max(gpuwarden_health_unknown_nodes)")],
                kind="stat",
                width=4,
                height=4,
                thresholds=[(None, "green"), (1, "orange")],
                description="GPU nodes the last quarantine pass could not judge (missing or stale DCGM "
                "data): never quarantined, never released.",
            ),
            Row("Errors by node and GPU"),
            Panel(
                "Last XID per GPU",
                [Target(per_gpu("DCGM_FI_DEV_XID_ERRORS", extra=", err_code, err_msg"))],
                kind="table",
                description="DCGM_FI_DEV_XID_ERRORS is the last XID a GPU reported and sticks until a GPU "
                "reset; only GPUs that ever had one appear.",
            ),
            Panel(
                "Uncorrectable ECC errors (volatile DBE)",
                [Target(per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", suffix=" > 0"))],
                kind="table",
                description="Not in dcgm-exporter's default CSV: empty unless enabled.",
            ),
            Panel(
                "Rows remapped after uncorrectable errors",
                [Target(per_gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", suffix=" > 0"))],
                kind="table",
                width=8,
            ),
            Panel(
                "Row-remap failures",
                [Target(per_gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE", suffix=" > 0"))],
                kind="table",
                width=8,
                description="The GPU ran out of spare rows: DCGM fails it.",
            ),
            Panel(
                "Single-bit ECC error rate per node",
                [
                    Target(
                        per_node("sum", "rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[$__rate_interval])"), "{{node}}"
                    )
                ],
                unit="cps",
                width=8,
                description="Corrected errors; a rising trend lowers the extender's score for the node.",
            ),
            Row("Fabric and degradation"),
            Panel(
                "Signals holding, by signal and state",
                [
                    Target(
                        "max by (signal, action, state) (gpuwarden_health_signals)",
                        "{{signal}} {{action}} {{state}}",
                    )
                ],
                stack=True,
                description="GPUs (or nodes, for NVSwitch and admission signals) where a graded signal held "
                "at the last pass: confirmed (acted on per its action), debouncing (not yet `consecutive` "
                "passes), boot-grace (ignored after a reboot).",
            ),
            Panel(
                "Degraded nodes (GPUDegraded) by signal",
                [Target("max by (signal) (gpuwarden_health_degraded_nodes)", "{{signal}}")],
                stack=True,
                description="Nodes with condition GPUDegraded=True: slower, not broken; no taint.",
            ),
            Panel(
                "NVLink domains (cliques) by state",
                [
                    Target(
                        "max by (domain, state, published) (gpuwarden_health_nvlink_domains)",
                        "{{domain}} {{state}}",
                    )
                ],
                kind="table",
                description="Trays per NVLink domain (nvidia.com/gpu.clique) at the last pass: state is this "
                "pass's verdict (healthy, degraded, failed, unknown); published is what the members carry "
                "(label gpuwarden.io/nvlink-domain-health, condition NVLinkDomainHealthy) once the verdict "
                "held domains.health.consecutive passes. Multi-node schedulers avoid a published domain.",
            ),
            Panel(
                "Stalled GPUs (fresh samples, frozen values)",
                [Target("max(gpuwarden_health_stalled_gpus)", "stalled")],
                thresholds=[(None, "green"), (1, "orange")],
                description="Their nodes are unknown: never quarantined or released on frozen data.",
            ),
            Panel(
                "Fabric Manager not Success",
                [Target(per_gpu(f"({FM_STATUS} != 3 and {FM_STATUS} != 0)"))],
                kind="table",
                description="dcgmFabricManagerStatus_t: 1 not started, 2 in progress, 4 failure, 5 "
                "unrecognized, 6 NVML too old (0 not supported and 3 success are left out).",
            ),
            Panel(
                "NVLink errors per second, worst GPU per node",
                [
                    Target(
                        per_node(
                            "max", "rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[$__rate_interval])"
                        ),
                        "{{node}}",
                    )
                ],
                unit="cps",
                description="CRC flit errors; gpuwarden sums the four NVLink error counters (100/s counts).",
            ),
            Panel(
                "PCIe replays per minute, worst GPU per node",
                [
                    Target(
                        per_node("max", "rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[$__rate_interval]) * 60"),
                        "{{node}}",
                    )
                ],
                description="8 per minute degrades the node (health.signals.pcie_replay).",
            ),
            Row("Telemetry coverage"),
            Panel(
                "GPUs reporting vs GPU capacity",
                [
                    Target('node:dcgm_gpus:count{node=~"$node"}', "{{node}} reporting"),
                    Target(
                        'max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu", node=~"$node"})',
                        "{{node}} capacity",
                    ),
                ],
                description="Physical GPUs reporting to DCGM against the node's nvidia.com/gpu capacity. On "
                "whole-GPU nodes fewer reporting means the exporter is down or a GPU fell off the bus (alert "
                "GPUTelemetryMissing: fewer than in the last 6 hours). On time-sliced and MIG nodes the "
                "capacity counts replicas or MIG instances, so it is higher by design.",
            ),
            Panel(
                "Freshness of DCGM data at the last quarantine pass",
                [Target("max(gpuwarden_health_telemetry_age_seconds)", "newest sample age")],
                unit="s",
            ),
            Panel(
                "GPU utilization by node",
                [Target('node:dcgm_gpu_utilization:avg{node=~"$node"}', "{{node}}")],
                unit="percent",
            ),
            Panel(
                "Hottest GPU per node",
                [Target(per_node("max", "DCGM_FI_DEV_GPU_TEMP"), "{{node}}")],
                unit="celsius",
            ),
            Row("Quarantine"),
            Panel(
                "Quarantined nodes by reason",
                [Target("max by (reason) (gpuwarden_health_quarantined_nodes)", "{{reason}}")],
                stack=True,
            ),
            Panel(
                "Nodes tainted gpuwarden.io/gpu-unhealthy",
                [
                    Target(
                        "max by (node, value, effect) "
                        '(kube_node_spec_taint{key="gpuwarden.io/gpu-unhealthy", node=~"$node"})'
                    )
                ],
                kind="table",
                description="From kube-state-metrics; `value` is the reason.",
            ),
            Panel(
                "Quarantine actions",
                [
                    Target(
                        "sum by (kind, reason, dry_run) "
                        "(increase(gpuwarden_health_actions_total[$__rate_interval]))",
                        "{{kind}} {{reason}} dry_run={{dry_run}}",
                    )
                ],
                kind="timeseries",
                stack=True,
            ),
            Panel(
                "Nodes skipped by the last pass",
                [Target("max by (reason) (gpuwarden_health_skipped_nodes)", "{{reason}}")],
                description="Deliberately left alone: excluded, not ours, telemetry unknown, breaker "
                "open, ...",
            ),
            Row("Drain"),
            Panel(
                "Drain evictions by outcome",
                [
                    Target(
                        "sum by (outcome) (increase(gpuwarden_drain_evictions_total[$__rate_interval]))",
                        "{{outcome}}",
                    )
                ],
                stack=True,
                width=8,
                description="evicted: moved off a quarantined GPU; blocked: a PodDisruptionBudget refused "
                "(429, retried); deleted: a rule's delete_after passed; dry_run: would have been evicted.",
            ),
            Panel(
                "Pods that cannot be moved",
                [Target("max(gpuwarden_drain_blocked_pods)", "blocked")],
                width=8,
                thresholds=[(None, "green"), (1, "orange")],
                description="Pods on failed GPUs held by a PDB or by the drain gate at the last pass.",
            ),
            Panel(
                "Drain gate closed",
                [Target("sum(increase(gpuwarden_drain_gate_closed_total[$__rate_interval]))", "passes held")],
                width=8,
                description="Passes in which the gate held a drain: max draining nodes, eviction rate, "
                "capacity floor, or pause (the GPUDrainGateClosed Events say which).",
            ),
        ],
    )


PREEMPT_WINDOW = "$__rate_interval"


def scheduling() -> Dashboard:
    return Dashboard(
        uid="gpuwarden-scheduling",
        title="gpuwarden / scheduling & preemption",
        description="Topology-aware placement by the scheduler extender (NUMA alignment, filter results, "
        "latency), preemptions and their chains, throttled preempt decisions, cleared nominations, and idle "
        "GPUs (pods holding GPUs they do not use).",
        tags=["gpuwarden", "gpu", "scheduling"],
        items=[
            Row("Placements"),
            Panel(
                "GPU pods bound, by alignment",
                [
                    Target(
                        "sum by (alignment) "
                        "(increase(gpuwarden_extender_placements_total[$__rate_interval]))",
                        "{{alignment}}",
                    )
                ],
                stack=True,
                description="single: one GPU; nvlink / pcie / numa: the GPU set shares that domain; "
                "cross-numa: split across NUMA nodes.",
            ),
            Panel(
                "NUMA-aligned share of placements (1h)",
                [
                    Target(
                        "sum(increase(gpuwarden_extender_placements_total"
                        '{alignment!~"cross-numa|unknown"}[1h])) '
                        "/ sum(increase(gpuwarden_extender_placements_total[1h]))"
                    )
                ],
                kind="stat",
                unit="percentunit",
                width=6,
                thresholds=[(None, "red"), (0.9, "orange"), (0.99, "green")],
            ),
            Panel(
                "Pending pods requesting GPUs",
                [
                    Target(
                        'sum(max by (namespace, pod) (kube_pod_status_phase{phase="Pending"}) '
                        "* on (namespace, pod) "
                        "(max by (namespace, pod) "
                        '(kube_pod_container_resource_requests{resource="nvidia_com_gpu"}) > 0))'
                    )
                ],
                kind="stat",
                width=6,
            ),
            Panel(
                "Filter: candidate nodes by result",
                [
                    Target(
                        "sum by (result) (rate(gpuwarden_extender_filter_nodes_total[$__rate_interval]))",
                        "{{result}}",
                    )
                ],
                unit="ops",
                description="failed: no GPU set fits now (preemption may help); unresolvable: never fits.",
            ),
            Panel(
                "Extender latency p99 by verb",
                [Target(quantile(0.99, "gpuwarden_extender_request_duration_seconds", "verb"), "{{verb}}")],
                unit="s",
                description="kube-scheduler's extender timeout is 5 s; with ignorable: false a slow extender "
                "stalls GPU scheduling.",
            ),
            Panel(
                "Extender requests by verb and outcome",
                [
                    Target(
                        "sum by (verb, outcome) (rate(gpuwarden_extender_requests_total[$__rate_interval]))",
                        "{{verb}} {{outcome}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Bind conflicts",
                [
                    Target(
                        "sum by (kind) (increase(gpuwarden_extender_bind_conflicts_total[$__rate_interval]))",
                        "{{kind}}",
                    )
                ],
                width=6,
                description="pod_changed: retried; gpu_claimed: another replica claimed the GPUs first.",
            ),
            Panel(
                "Extender model",
                [
                    Target("max(gpuwarden_extender_model_nodes)", "nodes"),
                    Target("min(gpuwarden_extender_model_synced)", "synced"),
                ],
                kind="stat",
                width=6,
            ),
            Panel(
                "Bind time by step, p99",
                [Target(quantile(0.99, "gpuwarden_extender_bind_phase_seconds", "phase"), "{{phase}}")],
                unit="s",
                description="claim: writing the GPU claim on the pod; verify: until it is known to be the "
                "only claim on its GPUs (the pod watch, or a LIST); binding: creating the Binding. Seconds "
                "here with normal API latency mean the API server is overloaded.",
            ),
            Panel(
                "GPU sets checked on the node, by outcome",
                [
                    Target(
                        f"sum by (outcome) (increase(gpuwarden_node_assignments_total[{PREEMPT_WINDOW}]))",
                        "{{outcome}}",
                    )
                ],
                stack=True,
                description="The node agent compares the GPUs the kubelet gave each pod (PodResources) with "
                "the set gpuwarden recorded: honoured = the same; overridden = the kubelet chose others (the "
                "actual set is then written on the pod); unrecorded = bound without a recorded set.",
            ),
            Row("Preemption"),
            Panel(
                "Preemption victims",
                [Target(f"sum(increase(gpuwarden_preemptions_observed_total[{PREEMPT_WINDOW}]))", "victims")],
                description="Pods preempted by kube-scheduler (its Preempted events).",
                width=8,
            ),
            Panel(
                "Preemption chain depth",
                [
                    Target(quantile(0.5, "gpuwarden_preemption_chain_depth"), "p50"),
                    Target(quantile(0.99, "gpuwarden_preemption_chain_depth"), "p99"),
                ],
                description="1: a plain preemption; 2+: the preemptor (or its workload) was itself a recent "
                "victim. Deeper than preemption.max_chain_depth is a cascade.",
                width=8,
            ),
            Panel(
                "Throttled preempt decisions by reason",
                [
                    Target(
                        f"sum by (reason) (increase(gpuwarden_preemption_throttled_total[{PREEMPT_WINDOW}]))",
                        "{{reason}}",
                    )
                ],
                stack=True,
                width=8,
            ),
            Panel(
                "Preempt verb answers by outcome",
                [
                    Target(
                        "sum by (outcome, dry_run) "
                        f"(increase(gpuwarden_preemption_decisions_total[{PREEMPT_WINDOW}]))",
                        "{{outcome}} dry_run={{dry_run}}",
                    )
                ],
                stack=True,
                description="passed: candidates unchanged; narrowed: some nodes dropped; vetoed: none left.",
            ),
            Panel(
                "Victims remembered by the throttle, by chain depth",
                [Target("max by (depth) (gpuwarden_preemption_window_records)", "depth {{depth}}")],
                stack=True,
                description="The sliding window budgets and chains are computed from (0: preemptor not "
                "known yet).",
            ),
            Row("Tenants"),
            Panel(
                "GPUs by tenant: held vs guaranteed",
                [
                    Target(
                        'max by (tenant, kind) (gpuwarden_tenant_gpus{kind=~"held|guaranteed"})',
                        "{{tenant}} {{kind}}",
                    )
                ],
                description="With a cross-tenant rule (preemption.tenants): GPUs each tenant holds (bound, "
                "not terminating) against its guaranteed share (config, or its ResourceQuotas). Held above "
                "guaranteed is what over-share lets other tenants reclaim.",
            ),
            Panel(
                "GPUs other tenants may preempt now",
                [Target('max by (tenant) (gpuwarden_tenant_gpus{kind="preemptable"})', "{{tenant}}")],
                stack=True,
                description="any: everything held; within-tenant: 0; over-share: held beyond the share.",
            ),
            Row("Nominations"),
            Panel(
                "Nominations cleared by reason",
                [
                    Target(
                        "sum by (reason, dry_run) "
                        f"(increase(gpuwarden_nominations_cleared_total[{PREEMPT_WINDOW}]))",
                        "{{reason}} dry_run={{dry_run}}",
                    )
                ],
                stack=True,
                width=8,
            ),
            Panel(
                "Pending nominations by state",
                [Target("max by (state) (gpuwarden_nominations)", "{{state}}")],
                stack=True,
                width=8,
                description="Stale states (node-gone, node-quarantined, ttl-expired, ...) are cleared in the "
                "pass that finds them; held states (fresh, victim-terminating, ...) wait.",
            ),
            Panel(
                "Oldest nomination",
                [Target("max(gpuwarden_nominations_oldest_age_seconds)", "age")],
                unit="s",
                width=8,
                thresholds=[(None, "green"), (300, "orange"), (900, "red")],
            ),
            Row("Idle GPUs"),
            Panel(
                "Idle GPU-hours by namespace, last 24 h",
                [
                    Target(
                        "sum by (pod_namespace) "
                        "(sum_over_time((max by (pod_namespace) (gpuwarden_idle_gpus))[24h:30s])) / 120",
                        "{{pod_namespace}}",
                    )
                ],
                stack=True,
                width=8,
                description="GPU-hours held by idle pods (every GPU under idle.threshold_percent for "
                "idle.window_seconds) in the 24 hours before each point, sampled every 30 s.",
            ),
            Panel(
                "Idle GPUs by namespace",
                [Target("max by (pod_namespace) (gpuwarden_idle_gpus)", "{{pod_namespace}}")],
                stack=True,
                width=8,
                description="GPUs held by idle pods at the idle loop's last pass (acknowledged ones too); "
                "the pods carry gpuwarden.io/idle-since.",
            ),
            Panel(
                "GPU pods by idle state",
                [Target("max by (state) (gpuwarden_idle_pods)", "{{state}}")],
                stack=True,
                width=8,
                description="idle, acknowledged (idle, gpuwarden.io/idle-ack-until holds any action), busy, "
                "unknown (missing or partial data: never idle), young, excluded.",
            ),
        ],
    )


def gpuwarden_itself() -> Dashboard:
    return Dashboard(
        uid="gpuwarden-overview",
        title="gpuwarden / gpuwarden itself",
        description="The adapter (latency, cache freshness, Prometheus load), the controller's loops, "
        "Kubernetes API traffic and leader election.",
        tags=["gpuwarden"],
        items=[
            Row("Build"),
            Panel(
                "Running versions",
                [Target("count by (component, version) (gpuwarden_build_info)")],
                kind="table",
                width=8,
                height=5,
            ),
            Panel(
                "Adapter ready",
                [Target("min(gpuwarden_adapter_ready)")],
                kind="stat",
                width=4,
                height=5,
                mappings=[
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "discovering", "color": "orange"},
                            "1": {"text": "ready", "color": "green"},
                        },
                    }
                ],
            ),
            Panel(
                "Metrics discovered",
                [Target("max by (api) (gpuwarden_adapter_discovered_metrics)", "{{api}}")],
                kind="stat",
                width=6,
                height=5,
            ),
            Panel(
                "Leader",
                [Target("max by (lease) (gpuwarden_leader)", "{{lease}}")],
                kind="stat",
                width=6,
                height=5,
                mappings=[
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "none", "color": "red"},
                            "1": {"text": "held", "color": "green"},
                        },
                    }
                ],
            ),
            Panel(
                "Capability modes",
                [Target("count by (capability, mode) (gpuwarden_capability_mode == 1)")],
                kind="table",
                width=16,
                height=7,
                description="What each controller capability does, per gpuwarden_capability_mode (Value: "
                "replicas reporting it). off: not running; observe: plans, logs, emits [dry-run] Events and "
                'counts (the dry_run="true" series), writes nothing else; act: writes. A fresh Helm install '
                "observes; `helm upgrade --reuse-values --set mode=act` acts (per capability: "
                "controller.capabilities.<name>.mode). One capability in two modes: replicas running two "
                "configurations, e.g. mid-upgrade.",
            ),
            Panel(
                "Capabilities acting",
                [
                    Target(
                        "count(count by (capability) "
                        '(gpuwarden_capability_mode{mode="act"} == 1)) or vector(0)'
                    )
                ],
                kind="stat",
                width=8,
                height=7,
                thresholds=[(None, "blue"), (1, "green")],
                description="Capabilities that write (mode act) on at least one replica; 0: the install only "
                "observes (blue).",
            ),
            Row("Adapter"),
            Panel(
                "Requests by route and code",
                [
                    Target(
                        "sum by (route, code) (rate(gpuwarden_adapter_requests_total[$__rate_interval]))",
                        "{{code}} {{route}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Request latency by route",
                [
                    Target(
                        quantile(0.5, "gpuwarden_adapter_request_duration_seconds", "route"), "p50 {{route}}"
                    ),
                    Target(
                        quantile(0.99, "gpuwarden_adapter_request_duration_seconds", "route"), "p99 {{route}}"
                    ),
                ],
                unit="s",
            ),
            Panel(
                "Cache: oldest entry age",
                [
                    Target(
                        "max by (instance, api) (gpuwarden_adapter_cache_oldest_age_seconds)",
                        "{{instance}} {{api}}",
                    )
                ],
                unit="s",
                width=8,
                description="Refreshed every adapter.cache.refresh_interval_seconds; answers older than "
                "max_age_seconds are refused (alert GPUWardenAdapterStaleData).",
                thresholds=[(None, "green"), (60, "red")],
            ),
            Panel(
                "Cache entries",
                [Target("sum by (api) (gpuwarden_adapter_cache_entries)", "{{api}}")],
                width=8,
            ),
            Panel(
                "Age of values served (p90)",
                [Target(quantile(0.9, "gpuwarden_adapter_served_value_age_seconds", "api"), "{{api}}")],
                unit="s",
                width=8,
                description="Now minus the Prometheus sample's timestamp, per value served.",
            ),
            Panel(
                "Adapter → Prometheus queries by outcome",
                [
                    Target(
                        "sum by (purpose, outcome) "
                        "(rate(gpuwarden_adapter_prometheus_queries_total[$__rate_interval]))",
                        "{{purpose}} {{outcome}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Adapter → Prometheus latency p99",
                [
                    Target(
                        quantile(0.99, "gpuwarden_adapter_prometheus_query_duration_seconds", "purpose"),
                        "{{purpose}}",
                    )
                ],
                unit="s",
            ),
            Panel(
                "metrics.k8s.io requests (kubectl top, HPA cpu/memory, VPA)",
                [
                    Target(
                        'sum by (route, code) (rate(gpuwarden_adapter_requests_total{route=~"resource_.*"}'
                        "[$__rate_interval]))",
                        "{{code}} {{route}}",
                    )
                ],
                unit="reqps",
                description="Served from adapter.resourceRules (deploy/overlays/resource-metrics). 503s mean "
                "Prometheus is unavailable: kubectl top errors and HPAs hold their scale.",
            ),
            Panel(
                "metrics.k8s.io freshness (now - timestamp)",
                [
                    Target(
                        f"histogram_quantile(0.5, sum by (le) (rate({RESOURCE_AGE}[$__rate_interval])))",
                        "p50",
                    ),
                    Target(
                        f"histogram_quantile(0.99, sum by (le) (rate({RESOURCE_AGE}[$__rate_interval])))",
                        "p99",
                    ),
                ],
                unit="s",
                description="Age of the newest raw sample behind each NodeMetrics/PodMetrics served "
                "(metrics-server's metric_freshness). Above a few scrape intervals: the cAdvisor or "
                "node-exporter scrape is lagging.",
                thresholds=[(None, "green"), (60, "red")],
            ),
            Row("Controller loops"),
            Panel(
                "Quarantine pass duration p99 by stage",
                [Target(quantile(0.99, "gpuwarden_health_loop_duration_seconds", "stage"), "{{stage}}")],
                unit="s",
                width=8,
            ),
            Panel(
                "Fault to taint (detection latency)",
                [
                    Target(quantile(0.5, "gpuwarden_health_detection_latency_seconds", window="1h"), "p50"),
                    Target(quantile(0.9, "gpuwarden_health_detection_latency_seconds", window="1h"), "p90"),
                ],
                unit="s",
                width=8,
                description="From a fault's first sample in Prometheus to the taint being written.",
            ),
            Panel(
                "Time since the last quarantine pass",
                [Target("time() - max(gpuwarden_health_last_pass_timestamp_seconds)")],
                kind="stat",
                unit="s",
                width=4,
                thresholds=[(None, "green"), (120, "orange"), (300, "red")],
            ),
            Panel(
                "Quarantine pass: Prometheus",
                [
                    Target("min(gpuwarden_health_prometheus_up)", "reachable"),
                    Target("max(gpuwarden_health_prometheus_queries)", "queries per pass"),
                ],
                kind="stat",
                width=4,
            ),
            Panel(
                "Failed API writes",
                [
                    Target(
                        "sum by (kind) (increase(gpuwarden_health_write_failures_total[$__rate_interval]))",
                        "{{kind}}",
                    )
                ],
                width=12,
                description="Quarantine writes that failed and are retried on the next pass.",
            ),
            Panel(
                "Transient failures by component and cause",
                [
                    Target(
                        "sum by (component, cause) "
                        "(increase(gpuwarden_transient_failures_total[$__rate_interval]))",
                        "{{component}} {{cause}}",
                    )
                ],
                width=12,
                description="Expected, retried failures (API unreachable, 429, 5xx, watch expiry, conflicts, "
                "Prometheus down) in the pass scheduler, leader election and the informers; each episode is "
                "logged once at warning. A steady rate: the API server or Prometheus is struggling.",
            ),
            Row("Kubernetes and Prometheus clients"),
            Panel(
                "Kubernetes API requests by verb, resource and outcome",
                [
                    Target(
                        "sum by (verb, resource, outcome) "
                        "(rate(gpuwarden_kube_requests_total[$__rate_interval]))",
                        "{{verb}} {{resource}} {{outcome}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Prometheus requests by endpoint and outcome",
                [
                    Target(
                        "sum by (job, endpoint, outcome) "
                        "(rate(gpuwarden_prometheus_requests_total[$__rate_interval]))",
                        "{{job}} {{endpoint}} {{outcome}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Leader transitions",
                [
                    Target(
                        "sum by (lease) (increase(gpuwarden_leader_transitions_total[1h]))",
                        "{{lease}}",
                    )
                ],
                description="More than a few per hour: the controller keeps losing its lease (API latency, "
                "CPU throttling).",
            ),
            Panel(
                "Prometheus request latency p99",
                [
                    Target(
                        quantile(0.99, "gpuwarden_prometheus_request_duration_seconds", "job, endpoint"),
                        "{{job}} {{endpoint}}",
                    )
                ],
                unit="s",
            ),
        ],
    )


DASHBOARDS = {
    "gpu-autoscaling.json": autoscaling,
    "gpu-fleet-health.json": fleet_health,
    "scheduling-preemption.json": scheduling,
    "gpuwarden.json": gpuwarden_itself,
}


def dump(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a JSON file differs from the builder")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = dump(render(build()))
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
