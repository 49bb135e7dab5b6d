"""The report's PNG plots, drawn with matplotlib from plain data (series, spans, placements, events).

Why it exists: four pictures carry the demo's story better than any table — replicas following the metrics
the HPA read through our adapter, which nodes were quarantined when (and which XID storm was ignored), where
each GPU's pod sits in the NUMA layout, and who preempted whom. Functions take already-queried data and
write one PNG each, so they are testable without a cluster. The x axis is always "time since the demo
started" in mm:ss, the same clock as the terminal timeline.

What it must not do: query anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MultipleLocator

Points = list[tuple[float, float]]
Span = tuple[float, float]
PALETTE = ["#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860", "#DA8BC3"]
RED, AMBER, GREY = "#C44E52", "#E1A23B", "#8C8C8C"


@dataclass(frozen=True)
class Marker:
    """A point event on a lane: `kind` is Preempted, PreemptionThrottled, NominationCleared, ..."""

    t: float
    lane: str
    kind: str
    text: str = ""


@dataclass(frozen=True)
class Bar:
    """A span on a lane (unix times); `part` puts it in the whole row or its top or bottom half."""

    start: float
    end: float
    colour: str
    hatch: str = ""
    text: str = ""
    part: Literal["full", "top", "bottom"] = "full"


@dataclass(frozen=True)
class Lane:
    """One row of a Gantt-like chart."""

    name: str
    bars: list[Bar]


def _mmss(seconds: float, _pos: object = None) -> str:
    sign = "-" if seconds < 0 else ""
    m, s = divmod(abs(round(seconds)), 60)
    return f"{sign}{m}:{s:02d}"


def _time_axis(ax: Axes, steps: Sequence[tuple[str, float]], labels: bool, span: float) -> None:
    """mm:ss ticks every 10 s, 30 s, 1 min or 2 min, and a dotted line per step, numbered as in the report."""
    ax.xaxis.set_major_formatter(FuncFormatter(_mmss))
    ax.xaxis.set_major_locator(
        MultipleLocator(10 if span <= 120 else 30 if span <= 300 else 60 if span <= 720 else 120)
    )
    ax.grid(True, axis="both", alpha=0.25)
    lo, hi = ax.get_xlim()
    for i, (name, t) in enumerate(steps, 1):
        ax.axvline(t, color=GREY, lw=0.8, ls=":", zorder=0)
        if labels and lo <= t <= hi:
            ax.annotate(
                f"{i} {name}",
                (t, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2, 2 + 10 * (i % 2)),
                textcoords="offset points",
                fontsize=7.5,
                color="#444444",
                ha="left",
                va="bottom",
            )


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _xy(points: Points, t0: float) -> tuple[list[float], list[float]]:
    return [ts - t0 for ts, _ in points], [v for _, v in points]


def break_gaps(points: Points, gap: float = 2.5) -> Points:
    """The points with a NaN wherever no sample came for more than `gap` seconds, so a line breaks there
    instead of bridging a time without readings (an External average at zero replicas has none)."""
    out: Points = []
    for ts, value in points:
        if out and ts - out[-1][0] > gap:
            out.append((out[-1][0] + gap / 2, float("nan")))
        out.append((ts, value))
    return out


def autoscaling(
    path: Path,
    *,
    title: str,
    t0: float,
    steps: Sequence[tuple[str, float]],
    desired: Points,
    current: Points,
    bounds: tuple[int, int],
    metrics: dict[str, tuple[Points, float | None]],
    dcgm_utilization: Points,
    offered_qps: Points,
    external: frozenset[str] = frozenset(),
    window: tuple[float, float] | None = None,
) -> Path:
    """Replicas (with the offered load) above one panel per HPA metric: what the HPA read, and its target.

    Metrics named in `external` are External metrics: one value for the workload, read per replica.
    `window` (unix times) limits the time axis; default: everything given."""
    fig, grid = plt.subplots(
        1 + len(metrics), 1, figsize=(11, 2.6 + 2.2 * len(metrics)), sharex=True, squeeze=False
    )
    axes = grid[:, 0]  # one column; a 1-D array even when no metric was recorded (only the replicas panel)
    ax = axes[0]
    x, y = _xy(desired, t0)
    ax.step(x, y, where="post", color=PALETTE[0], lw=2.2, label="desired replicas (HPA)")
    x, y = _xy(current, t0)
    ax.step(x, y, where="post", color=PALETTE[0], lw=1, ls="--", alpha=0.7, label="current replicas")
    for bound, text in zip(bounds, ("minReplicas", "maxReplicas"), strict=True):
        ax.axhline(bound, color=GREY, lw=0.8, ls="--")
        ax.annotate(
            f"{text} {bound}",
            (0.002, bound),
            xycoords=("axes fraction", "data"),
            fontsize=7.5,
            color="#555555",
            va="bottom",
        )
    ax.set_ylim(0, bounds[1] + 1.5)
    ax.set_ylabel("replicas")
    twin = ax.twinx()
    x, y = _xy(offered_qps, t0)
    twin.fill_between(
        x, y, color=GREY, alpha=0.15, step="post", label="load offered at the gateway (QPS, right axis)"
    )
    twin.set_ylabel("workload QPS", color="#666666")
    twin.set_ylim(0, max([v for _, v in offered_qps] + [1]) * 1.25)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_title(title, fontsize=11, loc="left", pad=30)
    if window is not None:
        ax.set_xlim(window[0] - t0, window[1] - t0)  # shared by every panel
        span = window[1] - window[0]
    else:
        span = max((ts for ts, _ in desired), default=t0) - t0
    _time_axis(ax, steps, labels=True, span=span)
    for i, (name, (points, target)) in enumerate(metrics.items(), 1):
        ax = axes[i]
        x, y = _xy(break_gaps(points), t0)
        per = "External, per replica" if name in external else "average per pod"
        ax.plot(x, y, color=PALETTE[1 + i], lw=2, label=f"{name}: {per}, as the HPA read it")
        if name == "gpu_utilization" and dcgm_utilization:
            x, y = _xy(break_gaps(dcgm_utilization), t0)
            ax.plot(x, y, color="black", lw=0.8, alpha=0.6, label="DCGM_FI_DEV_GPU_UTIL average (Prometheus)")
        if target is not None:
            ax.axhline(target, color=RED, lw=1.2, ls="--", label=f"target {target:g}")
        ax.set_ylabel(name.replace("_", " "))
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
        _time_axis(ax, steps, labels=False, span=span)
    axes[-1].set_xlabel("time since the demo started (mm:ss)")
    return _save(fig, path)


def lanes_chart(
    path: Path,
    *,
    title: str,
    t0: float,
    window: tuple[float, float],
    steps: Sequence[tuple[str, float]],
    lanes: Sequence[Lane],
    markers: Sequence[Marker] = (),
    legend: Sequence[tuple[str, str, str]] = (),
    marker_styles: dict[str, tuple[str, str]] | None = None,
) -> Path:
    """A Gantt-like chart over `window` (unix times): one row per lane, top to bottom, bars and markers.

    `legend` entries are (label, colour, hatch); `marker_styles` maps a marker kind to (matplotlib marker,
    colour)."""
    styles = marker_styles or {}
    height = max(2.6, 0.45 * len(lanes) + 1.4)
    fig, ax = plt.subplots(figsize=(11, height))
    ax.set_xlim(window[0] - t0, window[1] - t0)
    span = window[1] - window[0]
    rows = {"full": (-0.36, 0.72), "top": (-0.38, 0.36), "bottom": (0.02, 0.36)}
    index = {lane.name: i for i, lane in enumerate(lanes)}
    for i, lane in enumerate(lanes):
        for bar in lane.bars:
            width = max(bar.end - bar.start, span / 400)
            y, h = rows[bar.part]
            ax.add_patch(
                Rectangle(
                    (bar.start - t0, i + y), width, h, facecolor=bar.colour, hatch=bar.hatch, lw=0.6,
                    edgecolor=bar.colour if bar.hatch else "white", alpha=0.55 if bar.hatch else 0.95,
                )
            )  # fmt: skip
            if bar.text and width > span * 0.06:
                ax.text(
                    bar.start - t0 + width / 2, i + y + h / 2, bar.text, ha="center", va="center",
                    fontsize=7, color="black" if bar.hatch else "white", clip_on=True,
                )  # fmt: skip
    seen: set[str] = set()
    for m in markers:
        if m.lane not in index:
            continue
        shape, colour = styles.get(m.kind, ("o", "black"))
        label = m.kind if m.kind not in seen else None
        ax.scatter([m.t - t0], [index[m.lane]], marker=shape, s=70, color=colour, edgecolor="black", lw=0.6,
                   zorder=5, label=label)  # fmt: skip
        seen.add(m.kind)
    ax.set_yticks(range(len(lanes)), [lane.name for lane in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time since the demo started (mm:ss)")
    ax.set_title(title, fontsize=11, loc="left", pad=30)
    _time_axis(ax, steps, labels=True, span=span)
    handles: list[object] = [
        Patch(facecolor=c, hatch=h, edgecolor=c, alpha=0.55 if h else 0.95, label=label)
        for label, c, h in legend
    ]
    handles += ax.get_legend_handles_labels()[0]
    if handles:
        below = 0.55 / (height * 0.77)  # just under the x label, in axes fractions
        columns = min(4, len(handles))
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -below), ncols=columns,
                  fontsize=8, frameon=False)  # fmt: skip
    return _save(fig, path)


@dataclass(frozen=True)
class GpuCell:
    """One GPU in the NUMA map: which pod of which workload holds it."""

    node: str
    gpu: int
    workload: str
    pod: str


def cell_label(cell: GpuCell) -> str:
    """What fits in a GPU cell: `worker 1` for training workers, else the pod's random suffix."""
    match = re.search(r"-worker-(\d+)$", cell.pod)
    return f"worker {match.group(1)}" if match else cell.pod.rsplit("-", 1)[-1][-5:]


def numa_map(
    path: Path,
    *,
    title: str,
    nodes: Sequence[str],
    gpus_per_node: int,
    numa_of: dict[int, int],
    cells: Sequence[GpuCell],
    node_notes: dict[str, str],
    colours: dict[str, str],
) -> Path:
    """Nodes as rows, GPUs as columns grouped by NUMA node; cells coloured by workload, labelled by pod."""
    numas = sorted(set(numa_of.values()))
    gap = 0.5
    xs = {g: g + gap * numas.index(numa_of[g]) for g in range(gpus_per_node)}
    fig, ax = plt.subplots(figsize=(2.2 + 1.05 * (gpus_per_node + gap * len(numas)), 0.9 + 0.42 * len(nodes)))
    held = {(c.node, c.gpu): c for c in cells}
    for row, node in enumerate(nodes):
        bad = node_notes.get(node, "").startswith("quarantined")
        for g in range(gpus_per_node):
            cell = held.get((node, g))
            face = colours.get(cell.workload, GREY) if cell else "#F2F2F2"
            ax.add_patch(
                Rectangle(
                    (xs[g], row),
                    0.92,
                    0.84,
                    facecolor=face,
                    edgecolor=RED if bad else "#BBBBBB",
                    lw=1.4 if bad else 0.6,
                )
            )
            if cell:
                ax.text(
                    xs[g] + 0.46,
                    row + 0.44,
                    cell_label(cell),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white",
                )
    for numa in numas:
        members = [xs[g] for g in range(gpus_per_node) if numa_of[g] == numa]
        ax.text(
            (min(members) + max(members) + 0.92) / 2,
            -0.35,
            f"NUMA {numa}",
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xticks(
        [xs[g] + 0.46 for g in range(gpus_per_node)], [f"GPU {g}" for g in range(gpus_per_node)], fontsize=7.5
    )
    ax.xaxis.tick_top()
    labels = [f"{n}  {node_notes[n]}" if n in node_notes else n for n in nodes]
    ax.set_yticks([r + 0.42 for r in range(len(nodes))], labels, fontsize=8)
    for tick, node in zip(ax.get_yticklabels(), nodes, strict=True):
        if node_notes.get(node, "").startswith("quarantined"):
            tick.set_color(RED)
    ax.set_xlim(-0.2, max(xs.values()) + 1.1)
    ax.set_ylim(len(nodes) + 0.1, -0.7)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.workload] = counts.get(c.workload, 0) + 1
    handles = [
        Patch(facecolor=colours.get(w, GREY), label=f"{w} ({n} GPUs)") for w, n in sorted(counts.items())
    ]
    handles.append(Patch(facecolor="#F2F2F2", edgecolor="#BBBBBB", label="free"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncols=min(5, len(handles)),
        fontsize=8,
        frameon=False,
    )
    ax.set_title(title, fontsize=11, loc="left", pad=22)
    return _save(fig, path)
