"""From what the run recorded to the four report figures: the queries, lanes and markers behind each plot.

Why it exists: `plots.py` draws plain data and `queries.py` fetches series; this module knows which series,
Events and placement snapshot make each figure of *this* demo — which HPA to plot, which nodes to show on the
quarantine timeline (the ones the scenario talks about plus any that carried XIDs or our taint), which pods
make the preemption chart — and turns Kubernetes Events into markers on the right lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuwarden.kube import JsonObject
from harness.demo import plots, queries
from harness.demo import scenario as sc

TAINT_COLOUR = "#8B1A1A"
XID_COLOURS = {13: plots.AMBER, 31: plots.AMBER, 43: plots.AMBER, 45: plots.AMBER}
SIGNAL_BARS = (  # (query, bar text, colour): fabric/NVLink signals drawn like the XIDs, top half
    (queries.FABRIC_MANAGER_FAILED, "Fabric Manager failure", plots.PALETTE[2]),
    (queries.NVLINK_ERRORS, "NVLink errors", plots.PALETTE[4]),
)
QUARANTINE_EVENTS = ("GPUQuarantined", "GPUQuarantineReleased", "QuarantineBreakerOpen", "GPUDrainStarted")
PREEMPTION_EVENTS = ("Preempted", "PreemptionThrottled", "NominationCleared", "GPUPreempting")
MARKERS = {
    "GPUQuarantined": ("v", plots.RED),
    "GPUQuarantineReleased": ("^", plots.PALETTE[1]),
    "GPUDrainStarted": ("s", plots.PALETTE[5]),
    "Preempted": ("X", plots.RED),
    "PreemptionThrottled": ("v", plots.AMBER),
    "NominationCleared": ("D", plots.PALETTE[4]),
    "GPUPreempting": ("P", plots.PALETTE[2]),
}


@dataclass(frozen=True)
class Context:
    """What every figure needs: the run's time base and step starts, and where to write."""

    out: Path
    t0: float
    t_end: float
    """Both unix times; `steps` are (name, seconds since t0)."""
    steps: list[tuple[str, float]]
    reader: queries.RangeReader
    events: list[JsonObject]
    scenario: sc.DemoScenario


def event_time(event: JsonObject) -> float:
    """Unix time an events.k8s.io/v1 Event first happened (eventTime, else the deprecated first timestamp,
    else creation); a repeated Event (a series) is drawn where it started."""
    raw = (
        event.get("eventTime")
        or event.get("deprecatedFirstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
    try:
        return datetime.fromisoformat(str(raw)).timestamp()
    except ValueError:
        return 0.0


def hpa_workloads(scenario: sc.DemoScenario) -> list[sc.Deploy]:
    return [
        a.deploy for s in scenario.steps for a in s.do if a.deploy is not None and a.deploy.hpa is not None
    ]


AUTOSCALING_CAPTION = (
    "Top: the HPA's desired replicas (and, in grey, the load offered at the gateway). Below: each metric as "
    "the HPA controller read it through the APIService and the gpuwarden adapter, with its target; the thin "
    "black line is the raw DCGM average in Prometheus."
)
SCALE_TO_ZERO_CAPTION = (
    "Scale to zero without KEDA: an HPA with minReplicas 0 whose only metric is External. Top: the HPA's "
    "desired replicas and, in grey, the requests per second the gateway receives for the workload - counted "
    "while no pod runs, which is what lets the HPA wake it. Below: that rate per replica as the HPA "
    "controller read it through external.metrics.k8s.io and the gpuwarden adapter (no reading while at zero "
    "replicas: there is nothing to divide by), with its target."
)

ENGINE_SCALE_TO_ZERO_CAPTION = (
    "Scale to zero on a serving engine: a vLLM-shaped Deployment whose HPA (minReplicas 0) reads only "
    "External metrics from the gpuwarden adapter. Top: the HPA's desired replicas and, in grey, the requests "
    "per second offered to the workload. Below, per replica as the HPA controller read them: the router's "
    "queue (requests it holds while no pod runs: what wakes the workload, then 0 once pods take them), the "
    "engines' waiting requests and their KV-cache use (each pod's vLLM series summed over the workload, 0 "
    "while no pod runs), each with its target. No reading while at zero replicas: nothing to divide by."
)


def _involves(step: sc.Step, namespace: str, name: str) -> bool:
    """The step acts on the workload or expects something of it (by name or workload, in its namespace)."""
    bodies = [getattr(a, a.key) for a in step.do] + [e.body for e in step.expect]
    return any(
        getattr(b, "namespace", None) == namespace
        and name in (getattr(b, "name", None), getattr(b, "workload", None))
        for b in bodies
    )


def workload_window(ctx: Context, namespace: str, name: str) -> tuple[float, float]:
    """Unix times a workload's figure spans: from 10 s before the first step involving it to 15 s into the
    step after the last one (so a Deployment parked at zero is seen staying there), or the end of the run."""
    starts = dict(ctx.steps)
    involved = [
        i for i, s in enumerate(ctx.scenario.steps) if s.name in starts and _involves(s, namespace, name)
    ]
    if not involved:
        return ctx.t0, ctx.t_end
    first = ctx.t0 + starts[ctx.scenario.steps[involved[0]].name] - 10
    after = ctx.scenario.steps[involved[-1] + 1 :]
    end = ctx.t0 + starts[after[0].name] + 15 if after and after[0].name in starts else ctx.t_end
    return first, min(end, ctx.t_end)


def autoscaling_figures(ctx: Context) -> list[tuple[Path, str]]:
    """One figure per HPA of the scenario, over the steps that involve its workload, with its caption."""
    out = []
    for d in hpa_workloads(ctx.scenario):
        assert d.hpa is not None
        replicas = {
            s.labels.get("kind"): s.points
            for s in ctx.reader.range(queries.hpa_replicas(d.namespace, d.name))
        }
        metrics: dict[str, tuple[plots.Points, float | None]] = {}
        for s in ctx.reader.range(queries.hpa_metric(d.namespace, d.name)):
            name = s.labels.get("metric", "")
            current, target = metrics.get(name, ([], None))
            if s.labels.get("kind") == "current":
                current = s.points
            else:
                target = s.points[-1][1]
            metrics[name] = (current, target)
        util = ctx.reader.range(queries.gpu_utilization(d.namespace, d.name))
        qps = ctx.reader.range(queries.offered_qps(d.namespace, d.name))
        zero = d.hpa.min == 0
        if zero and d.engine is not None:
            title = (
                f"HPA {d.namespace}/{d.name} ({d.engine}): minReplicas 0 on the router's queue and the "
                "engines' queue and KV cache (External, from the gpuwarden adapter): parked, woken, parked"
            )
            caption = ENGINE_SCALE_TO_ZERO_CAPTION
        elif zero:
            title = (
                f"HPA {d.namespace}/{d.name}: minReplicas 0 on the gateway's request rate (External, from "
                "the gpuwarden adapter): parked at zero, woken by traffic, parked again"
            )
            caption = SCALE_TO_ZERO_CAPTION
        else:
            title = (
                f"HPA {d.namespace}/{d.name}: replicas follow GPU utilization and QPS served by the "
                "gpuwarden adapter"
            )
            caption = AUTOSCALING_CAPTION
        path = plots.autoscaling(
            ctx.out / f"autoscaling-{d.name}.png",
            title=title,
            t0=ctx.t0,
            steps=ctx.steps,
            desired=replicas.get("desired", []),
            current=replicas.get("current", []),
            bounds=(d.hpa.min, d.hpa.max),
            metrics=dict(sorted(metrics.items())),
            dcgm_utilization=util[0].points if util else [],
            offered_qps=qps[0].points if qps else [],
            external=frozenset(sc.EXTERNAL_METRICS),
            window=workload_window(ctx, d.namespace, d.name),
        )
        out.append((path, caption))
    return out


def _scenario_nodes(scenario: sc.DemoScenario) -> set[str]:
    nodes: set[str] = set()
    for step in scenario.steps:
        for e in step.expect:
            body = e.body
            if isinstance(body, sc.Node):
                nodes.add(body.node)
            elif isinstance(body, sc.Nodes):
                nodes.update(body.nodes)
    return nodes


def signal_bars(ctx: Context) -> tuple[dict[str, list[plots.Bar]], list[tuple[str, str, str]]]:
    """Per node, when the fabric/NVLink signals held in DCGM (top half); and the legend entries used."""
    bars: dict[str, list[plots.Bar]] = {}
    legend = []
    for query, text, colour in SIGNAL_BARS:
        series = ctx.reader.range(query)
        for s in series:
            spans = queries.intervals(s.points)
            bars.setdefault(s.labels.get("Hostname", ""), []).extend(
                plots.Bar(a, b, colour, "\\\\", text, "top") for a, b in spans
            )
        if series:
            legend.append((f"{text} in DCGM", colour, "\\\\"))
    return bars, legend


def quarantine_figure(ctx: Context) -> Path:
    """Per node: the XIDs and fabric/NVLink signals DCGM reports (top half, hatched) and our taint (bottom
    half, solid)."""
    xids = {s.labels.get("Hostname", ""): s.points for s in ctx.reader.range(queries.XID_LAST)}
    signals, signal_legend = signal_bars(ctx)
    taints: dict[str, list[plots.Bar]] = {}
    for s in ctx.reader.range(queries.QUARANTINED):
        node, reason = s.labels.get("node", ""), s.labels.get("reason", "")
        taints.setdefault(node, []).extend(
            plots.Bar(a, b, TAINT_COLOUR, text=f"taint {reason}", part="bottom")
            for a, b in queries.intervals(s.points)
        )
    order = ctx.scenario.fleet.node_names()
    touched = _scenario_nodes(ctx.scenario) | set(xids) | set(taints) | set(signals)
    shown = sorted(touched, key=lambda n: (n not in order, n))
    lanes, legend_codes = [], set()
    for node in shown:
        by_code: dict[int, list[tuple[float, float]]] = {}
        for ts, value in xids.get(node, []):
            by_code.setdefault(int(value), []).append((ts, 1.0))
        bars = []
        for code, points in sorted(by_code.items()):
            legend_codes.add(code)
            colour = XID_COLOURS.get(code, plots.RED)
            bars += [
                plots.Bar(a, b, colour, "///", f"XID {code}", "top") for a, b in queries.intervals(points)
            ]
        lanes.append(plots.Lane(node, bars + signals.get(node, []) + taints.get(node, [])))
    markers = [
        plots.Marker(event_time(e), str(e["regarding"].get("name", "")), str(e["reason"]))
        for e in ctx.events
        if e.get("reason") in QUARANTINE_EVENTS
    ]
    legend = [
        (f"XID {c} in DCGM_FI_DEV_XID_ERRORS", XID_COLOURS.get(c, plots.RED), "///")
        for c in sorted(legend_codes)
    ]
    legend += signal_legend
    legend.append(("taint gpuwarden.io/gpu-unhealthy", TAINT_COLOUR, ""))
    first_step = ctx.steps[0][1] + ctx.t0 if ctx.steps else ctx.t0
    return plots.lanes_chart(
        ctx.out / "quarantine.png",
        title="Quarantine: hardware XIDs and fabric faults taint the node until it recovers; an XID 13 storm "
        "or a boot-time NVLink flap taints nothing",
        t0=ctx.t0, window=(first_step - 5, ctx.t_end), steps=ctx.steps, lanes=lanes, markers=markers,
        legend=legend, marker_styles=MARKERS,
    )  # fmt: skip


def preemption_namespaces(scenario: sc.DemoScenario) -> list[str]:
    names = {
        e.body.namespace
        for s in scenario.steps
        for e in s.expect
        if isinstance(e.body, sc.Preempted | sc.Throttled | sc.NominationCleared)
    }
    return sorted(names)


def preemption_figure(ctx: Context, colours: dict[str, str]) -> Path | None:
    """One lane per pod of the preemption namespaces, ordered by priority then first appearance."""
    namespaces = preemption_namespaces(ctx.scenario)
    if not namespaces:
        return None
    priority = {
        w.name: ctx.scenario.priority_classes.get(w.priority_class or "", 0)
        for s in ctx.scenario.steps
        for a in s.do
        if (w := a.deploy or a.job) is not None
    }
    bars: dict[str, list[plots.Bar]] = {}
    first: dict[str, tuple[int, float, str]] = {}

    def seen(pod: str, workload: str, at: float) -> None:
        first[pod] = min(first.get(pod, (0, 1e18, "")), (-priority.get(workload, 0), at, workload))

    for ns in namespaces:
        for s in ctx.reader.range(queries.pods_bound(ns)):
            pod, workload = s.labels.get("pod", ""), s.labels.get("workload", "")
            ending = s.labels.get("terminating") == "true"
            colour = colours.get(workload, plots.GREY)
            text = s.labels.get("node", "") + (" (terminating)" if ending else "")
            bars.setdefault(pod, []).extend(
                plots.Bar(a, b, colour, "///" if ending else "", text) for a, b in queries.intervals(s.points)
            )
            seen(pod, workload, s.points[0][0])
        for s in ctx.reader.range(queries.pods_nominated(ns)):
            pod, workload = s.labels.get("pod", ""), s.labels.get("workload", "")
            text = f"pending, nominated to {s.labels.get('node', '')}"
            bars.setdefault(pod, []).extend(
                plots.Bar(a, b, plots.GREY, "..", text) for a, b in queries.intervals(s.points)
            )
            seen(pod, workload, s.points[0][0])
    markers = []
    for e in ctx.events:
        pod = str(e["regarding"].get("name", ""))
        if e.get("reason") in PREEMPTION_EVENTS and e["regarding"].get("namespace") in namespaces:
            markers.append(plots.Marker(event_time(e), pod, str(e["reason"])))
            bars.setdefault(pod, [])
            seen(pod, next((w for w in priority if pod.startswith(f"{w}-")), ""), event_time(e))
    order = sorted(bars, key=lambda p: first.get(p, (0, 0.0, "")))
    lanes = [plots.Lane(pod, sorted(bars[pod], key=lambda b: b.start)) for pod in order]
    legend = [
        (f"{w} (priority {priority[w]})", colours.get(w, plots.GREY), "")
        for w in sorted({f[2] for f in first.values() if f[2] in priority}, key=lambda w: -priority[w])
    ]
    legend += [
        ("terminating (victim with a finalizer)", plots.GREY, "///"),
        ("pending, nominated", plots.GREY, ".."),
    ]
    start = min((f[1] for f in first.values()), default=ctx.t0) - 10
    return plots.lanes_chart(
        ctx.out / "preemptions.png",
        title="Preemptions: who preempted whom, what the throttle refused, which nomination was cleared",
        t0=ctx.t0, window=(start, ctx.t_end), steps=ctx.steps, lanes=lanes, markers=markers, legend=legend,
        marker_styles=MARKERS,
    )  # fmt: skip


def workload_colours(scenario: sc.DemoScenario) -> dict[str, str]:
    names: list[str] = []
    for s in scenario.steps:
        for a in s.do:
            w = a.deploy or a.job
            if w is not None and w.name not in names:
                names.append(w.name)
    return {name: plots.PALETTE[i % len(plots.PALETTE)] for i, name in enumerate(names)}


def numa_figure(
    out: Path, scenario: sc.DemoScenario, step: str, cells: Sequence[plots.GpuCell], notes: dict[str, str]
) -> Path:
    fleet = scenario.fleet
    return plots.numa_map(
        out / "numa-map.png",
        title=f"GPUs per NUMA node and the pods holding them (after step '{step}')",
        nodes=fleet.node_names(),
        gpus_per_node=fleet.gpus_per_node,
        numa_of={g: fleet.numa_of(g) for g in range(fleet.gpus_per_node)},
        cells=cells,
        node_notes=notes,
        colours=workload_colours(scenario),
    )
