"""The demo report: `index.html` with the verdict, every expected outcome, the plots, Events and timeline.

Why it exists: the terminal scrolls away; the report is what a user keeps, links to, or pastes into the
README. It is a plain folder (HTML + PNG, no JavaScript, no external assets) so it opens from disk anywhere.
Plot data comes from the demo's Prometheus (range queries, see `queries.py`) and the API's Events; the GPU map
from placement snapshots taken after each step.
"""

from __future__ import annotations

import asyncio
import html
import time
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.kube import EVENTS, JsonObject, KubeClient
from harness.demo import figures, plots
from harness.demo.observer import ClusterView, gpu_ids, is_bound, our_taint, workload_of
from harness.demo.queries import RangeReader
from harness.demo.scenario import DemoScenario
from harness.demo.timeline import Timeline

REPORTED_EVENTS = (
    *figures.QUARANTINE_EVENTS,
    *figures.PREEMPTION_EVENTS,
    "GPUPodEvicted",
    "GPUDrainDone",
    "GPUPreemptionNotPossible",
)


@dataclass(frozen=True)
class Placement:
    """Which pod holds which GPU, and which nodes are quarantined, at one moment."""

    cells: tuple[plots.GpuCell, ...]
    quarantined: dict[str, str]

    @classmethod
    def snapshot(cls, view: ClusterView) -> Placement:
        cells = [
            plots.GpuCell(p["spec"]["nodeName"], g, workload_of(p), p["metadata"]["name"])
            for p in view.pods.objects()
            if is_bound(p)
            for g in gpu_ids(p)
        ]
        quarantined = {
            n["metadata"]["name"]: str(t.get("value", ""))
            for n in view.nodes.objects()
            if (t := our_taint(n)) is not None
        }
        return cls(tuple(cells), quarantined)


@dataclass
class RunRecord:
    scenario: DemoScenario
    timeline: Timeline
    placements: dict[str, Placement]
    timings: dict[str, float]
    prometheus_url: str
    kube: KubeClient


def _figures(record: RunRecord, out: Path, events: list[JsonObject]) -> list[tuple[Path, str]]:
    t = record.timeline
    t0 = t.wall_start
    now = time.time()
    steps = [(name, start) for name, start, _ in t.step_spans()]
    # a few seconds of margin on the right so markers of the last moments stay visible
    reader = RangeReader(record.prometheus_url, t0, now)
    ctx = figures.Context(out, t0, now + 5, steps, reader, events, record.scenario)
    made: list[tuple[Path, str]] = []
    made += figures.autoscaling_figures(ctx)
    made.append(
        (
            figures.quarantine_figure(ctx),
            "One row per node the scenario touched. Hatched: the XIDs, Fabric Manager failures and NVLink "
            "errors DCGM reports; solid: our taint. Markers: GPUQuarantined / GPUQuarantineReleased and "
            "GPUDrainStarted Events.",
        )
    )
    if record.placements:
        step, placement = max(record.placements.items(), key=lambda kv: len(kv[1].cells))
        pools = {n: p for p, spec in record.scenario.fleet.pools.items() for n in spec.nodes}
        notes = {n: f"[pool {p}]" for n, p in pools.items()}
        notes.update({n: f"quarantined ({r})" for n, r in placement.quarantined.items()})
        path = figures.numa_figure(out, record.scenario, step, placement.cells, notes)
        made.append(
            (
                path,
                "Each cell is a GPU; cells are grouped by NUMA node. A multi-GPU pod placed by the "
                "extender sits inside one NUMA block (labels: pod name suffix).",
            )
        )
    preemptions = figures.preemption_figure(ctx, figures.workload_colours(record.scenario))
    if preemptions is not None:
        made.append(
            (
                preemptions,
                "One row per pod, highest priority first. Bars: bound to a node (text); hatched: "
                "terminating or nominated. Markers: Preempted Events (the scheduler's, and the controller's "
                "GPU preemption's), the controller's PreemptionThrottled, NominationCleared and "
                "GPUPreempting Events.",
            )
        )
    return made


def _regarding(event: JsonObject) -> str:
    regarding = event.get("regarding") or {}
    return f"{regarding.get('kind', '')} {regarding.get('namespace', '') or ''}/{regarding.get('name', '')}"


def _esc(value: object) -> str:
    return html.escape(str(value))


def _html(record: RunRecord, images: list[tuple[Path, str]], events: list[JsonObject]) -> str:
    t = record.timeline
    passed = t.passed
    verdict = "PASSED" if passed else "FAILED"
    n_ok = sum(o.passed for o in t.outcomes)
    timings = ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.0f}s" for k, v in record.timings.items()
    )
    rows = "".join(
        f"<tr class={'ok' if o.passed else 'bad'}><td>{_esc(o.step)}</td>"
        f"<td><code>{_esc(o.expectation)}</code></td>"
        f"<td>{'observed' if o.passed else 'NOT observed'}</td><td>{_esc(o.detail)}</td>"
        f"<td>{o.took:.0f}s</td></tr>"
        for o in t.outcomes
    )
    figs = "".join(
        f"<figure><img src='{_esc(p.name)}' alt='{_esc(p.stem)}'><figcaption>{_esc(c)}</figcaption></figure>"
        for p, c in images
    )
    ev_rows = "".join(
        f"<tr><td>{figures.event_time(e) - t.wall_start:.0f}s</td><td>{_esc(e.get('reason'))}</td>"
        f"<td>{_esc(_regarding(e))}</td><td>{_esc(e.get('reportingController') or '')}</td>"
        f"<td>{_esc(str(e.get('note', ''))[:300])}</td></tr>"
        for e in sorted(events, key=figures.event_time)
    )
    lines = "\n".join(f"[{e.t:6.1f}s] {e.kind:6} {_esc(e.text)}" for e in t.entries)
    steps = "".join(f"<li><b>{_esc(s.name)}</b>: {_esc(s.title)}</li>" for s in record.scenario.steps)
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>gpuwarden demo report: {_esc(record.scenario.name)} {verdict}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;width:100%;font-size:13px}}td,th{{border:1px solid #ddd;padding:4px 6px;
vertical-align:top;text-align:left}}tr.ok td:nth-child(3){{color:#2a7a2a;font-weight:bold}}
tr.bad td{{background:#fbeaea}}tr.bad td:nth-child(3){{color:#b00;font-weight:bold}}
.verdict{{font-size:1.4em;font-weight:bold;color:{"#2a7a2a" if passed else "#b00"}}}
figure{{margin:1.5em 0}}img{{max-width:100%;border:1px solid #eee}}figcaption{{font-size:13px;color:#555}}
pre{{background:#f7f7f7;padding:1em;font-size:12px;overflow-x:auto}}</style></head><body>
<h1>gpuwarden demo: {_esc(record.scenario.name)}</h1>
<p class="verdict">{verdict}: {n_ok}/{len(t.outcomes)} expected outcomes observed</p>
<p>{_esc(record.scenario.description)}</p>
<p>Run started {time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t.wall_start))}; {timings}.
Fleet: {record.scenario.fleet.nodes} kwok nodes x {record.scenario.fleet.gpus_per_node} GPUs,
{record.scenario.fleet.numa_nodes} NUMA nodes each. Logs and configs: <code>run/</code>.</p>
<h2>Steps</h2><ol>{steps}</ol>
<h2>Expected outcomes</h2><table><tr><th>step</th><th>expectation</th><th>result</th><th>what was seen</th>
<th>took</th></tr>{rows}</table>
<h2>Plots</h2>{figs}
<h2>Kubernetes Events</h2><table><tr><th>t</th><th>reason</th><th>regarding</th><th>by</th><th>note</th></tr>
{ev_rows}</table>
<h2>Timeline</h2><pre>{lines}</pre></body></html>
"""


async def write_report(record: RunRecord, out: Path) -> Path:
    """Query, plot and write `out/index.html`; returns its path."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    items = (await record.kube.list_objects(EVENTS)).items
    events = [e for e in items if e.get("reason") in REPORTED_EVENTS]
    images = await asyncio.to_thread(_figures, record, out, events)
    index = out / "index.html"
    await asyncio.to_thread(index.write_text, _html(record, images, events), encoding="utf-8")
    return index
