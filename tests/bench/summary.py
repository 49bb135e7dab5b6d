"""The one table `make bench` ends with: every benchmark against its anchor or floor, and its goal.

Each benchmark prints its own detailed numbers; the reader of a whole run also needs the picture at once.
So a benchmark hands the few numbers it already compares (ours, the anchor's, the goal) to `record()`, and
`tests.bench.__main__` renders the rows collected in the run as plain text (printed) and as Markdown (for
the README). This module only keeps and formats rows: it measures nothing, prints nothing, reads no clock
and never fails a benchmark.

The ratio is always ours ÷ the anchor's figure, whichever way "better" points: the goal column says which
way that is. A benchmark with nothing to compare against records its headline number with anchor `—`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

NO_ANCHOR = "—"
"""The anchor of a row whose benchmark measures nothing to compare against (its headline number only)."""

HEADER = ("bench", "measured", "ours", "anchor", "anchor's", "ratio", "goal", "met")
LEGEND = (
    "ratio = ours ÷ anchor's figure (1/N: ours is N times smaller); anchor — = no anchor in this "
    "benchmark, its headline number only; met: yes / NO / unknown (goal not numeric, or not measured)"
)
EMPTY = "no benchmark recorded a summary row"


@dataclass(frozen=True)
class Row:
    """One line of the summary: what a benchmark measured, against what, and the goal it has."""

    bench: str
    """The benchmark module without `bench_` (what `python -m tests.bench NAME` selects)."""
    measured: str
    """What the number is, short: "HPA load, Prometheus queries/min"."""
    ours: float | None
    unit: str
    """Unit of `ours` and of `anchor_value` (the same for both): "ms", "MiB", "queries/min"."""
    anchor: str = NO_ANCHOR
    """What ours is compared with, measured in the same run ("prometheus-adapter v0.12.0")."""
    anchor_value: float | None = None
    goal: str = ""
    """The goal as stated in the docstring, README, docs or issue ("≤ 5 ms (issue 6)"); "" for none."""
    met: bool | None = None
    """Whether ours meets the goal; None when unknown (no goal, or one that is not a number)."""
    failed: str = ""
    """Set for a benchmark that raised: its error, and every number is absent."""

    @property
    def ratio(self) -> float | None:
        """Ours ÷ the anchor's figure; None without both numbers or with an anchor of 0."""
        if self.ours is None or self.anchor_value is None or self.anchor_value == 0:
            return None
        return self.ours / self.anchor_value


@dataclass
class Collector:
    """The rows one run of `make bench` records, in the order they were recorded."""

    rows: list[Row] = field(default_factory=list)

    def record(self, row: Row) -> None:
        self.rows.append(row)

    def benches(self) -> set[str]:
        return {r.bench for r in self.rows}


COLLECTOR = Collector()
"""The process-wide collector `record()` appends to; `tests.bench.__main__` renders it at the end."""


def record(
    bench: str,
    measured: str,
    ours: float | None,
    unit: str,
    *,
    anchor: str = NO_ANCHOR,
    anchor_value: float | None = None,
    goal: str = "",
    met: bool | None = None,
) -> None:
    """Add one row to the run's summary (see `Row` for the fields)."""
    COLLECTOR.record(Row(bench, measured, ours, unit, anchor, anchor_value, goal, met))


def record_failure(bench: str, error: str) -> None:
    """Add the row of a benchmark that raised (its other rows, recorded before the error, stay)."""
    COLLECTOR.record(Row(bench, "failed", None, "", failed=error))


def format_value(value: float | None, unit: str = "") -> str:
    """A number as the table shows it: thousands separated, about three significant digits."""
    if value is None or math.isnan(value):
        return "—"
    magnitude = abs(value)
    if value == 0 or magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}" if unit else text


def format_ratio(ratio: float | None) -> str:
    """Ours ÷ anchor: "1.21x", "0.62x", and "1/571" once ours is less than a tenth of the anchor."""
    if ratio is None or math.isnan(ratio):
        return "—"
    if math.isinf(ratio):
        return "∞"
    if ratio == 0:
        return "0x"
    if ratio < 0.1:
        return f"1/{1 / ratio:,.0f}"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    return f"{ratio:.2f}x"


def format_met(row: Row) -> str:
    if row.failed:
        return "failed"
    if not row.goal:
        return "—"
    if row.met is None:
        return "unknown"
    return "yes" if row.met else "NO"


def one_line(text: str, limit: int = 120) -> str:
    """`text` on one line (whitespace runs collapsed), cut to `limit` characters with "…"."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def cells(row: Row) -> tuple[str, ...]:
    """The row's cells, in `HEADER` order."""
    if row.failed:
        return (row.bench, f"failed: {one_line(row.failed)}", "—", "—", "—", "—", "—", "failed")
    return (
        row.bench,
        row.measured,
        format_value(row.ours, row.unit),
        row.anchor or NO_ANCHOR,
        format_value(row.anchor_value, row.unit),
        format_ratio(row.ratio),
        row.goal or "—",
        format_met(row),
    )


def render_text(rows: Sequence[Row]) -> str:
    """One aligned plain-text table (numbers right-aligned), with the legend under it."""
    if not rows:
        return EMPTY
    table = [HEADER, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    numeric = {2, 4, 5}
    out = []
    for k, line in enumerate(table):
        parts = [
            c.rjust(w) if i in numeric and k else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(parts).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join([*out, LEGEND])


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def render_markdown(rows: Sequence[Row], heading: Iterable[str] = ()) -> str:
    """A Markdown table for the README, under `heading` lines (date and machine), with the legend."""
    lines = list(heading)
    if lines:
        lines.append("")
    if not rows:
        return "\n".join([*lines, EMPTY]) + "\n"
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("| " + " | ".join("---" for _ in HEADER) + " |")
    lines += ["| " + " | ".join(_escape(c) for c in cells(r)) + " |" for r in rows]
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


def machine_line(date: str, arch: str, cpus: int | None, memory_bytes: int | None) -> str:
    """When and where a summary was measured: "2026-12-03 14:05 UTC, x86_64, 2 CPUs, 23.4 GiB"."""
    memory = f"{memory_bytes / 2**30:.1f} GiB" if memory_bytes else "memory unknown"
    return f"{date}, {arch}, {cpus if cpus else '?'} CPUs, {memory}"


@dataclass(frozen=True)
class BenchRun:
    """One benchmark's rows from its latest run, with when and where they were measured."""

    measured_at: str
    """`machine_line()`: date, architecture, CPUs, memory."""
    rows: tuple[Row, ...]


def merge_runs(
    previous: Mapping[str, BenchRun], rows: Sequence[Row], measured_at: str
) -> dict[str, BenchRun]:
    """The latest run of every benchmark: this run's rows replace the earlier rows of the benchmarks it ran,
    the others are kept as they were measured (so `python -m tests.bench drain` does not empty the table)."""
    out = dict(previous)
    for bench in dict.fromkeys(r.bench for r in rows):
        out[bench] = BenchRun(measured_at, tuple(r for r in rows if r.bench == bench))
    return dict(sorted(out.items()))


def encode_runs(runs: Mapping[str, BenchRun]) -> str:
    return json.dumps(
        {b: {"measured_at": r.measured_at, "rows": [asdict(x) for x in r.rows]} for b, r in runs.items()},
        indent=1,
    )


def decode_runs(text: str) -> dict[str, BenchRun]:
    """The stored runs; unreadable text or rows are dropped (a summary is never a reason to fail)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    names = {f.name for f in fields(Row)}
    out: dict[str, BenchRun] = {}
    for bench, run in doc.items() if isinstance(doc, dict) else ():
        try:
            rows = tuple(Row(**{k: v for k, v in x.items() if k in names}) for x in run["rows"])
            out[str(bench)] = BenchRun(str(run["measured_at"]), rows)
        except (KeyError, TypeError, AttributeError):
            continue
    return out


def render_all(runs: Mapping[str, BenchRun], title: str) -> str:
    """The whole picture: every benchmark's latest rows in one table, with when each was measured."""
    rows: list[Any] = [r for run in runs.values() for r in run.rows]
    dates = [f"- {bench}: {run.measured_at}" for bench, run in runs.items()]
    return render_markdown(rows, [title, "", "Each benchmark's rows come from its latest run:", *dates])
