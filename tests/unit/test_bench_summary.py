"""The `make bench` summary table (tests/bench/summary.py): number and ratio formatting, goal met / not met /
unknown, failed benchmarks, the empty run, and the plain-text and Markdown renderings."""

from __future__ import annotations

import math
import re

import pytest

from tests.bench.summary import (
    EMPTY,
    HEADER,
    NO_ANCHOR,
    BenchRun,
    Collector,
    Row,
    cells,
    decode_runs,
    encode_runs,
    format_met,
    format_ratio,
    format_value,
    machine_line,
    merge_runs,
    one_line,
    render_all,
    render_markdown,
    render_text,
)


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        pytest.param(None, "ms", "—", id="absent"),
        pytest.param(math.nan, "ms", "—", id="nan"),
        pytest.param(0.0, "queries/min", "0 queries/min", id="zero"),
        pytest.param(0.52, "ms", "0.52 ms", id="below-one"),
        pytest.param(0.054, "ms", "0.054 ms", id="small"),
        pytest.param(1.213, "ms", "1.21 ms", id="units"),
        pytest.param(12.44, "ms", "12.4 ms", id="tens"),
        pytest.param(112.4, "MiB", "112 MiB", id="hundreds"),
        pytest.param(8002.0, "queries/min", "8,002 queries/min", id="thousands"),
        pytest.param(-5.7, "ms", "-5.70 ms", id="negative"),
        pytest.param(3.0, "", "3.00", id="no-unit"),
    ],
)
def test_format_value(value: float | None, unit: str, expected: str) -> None:
    assert format_value(value, unit) == expected


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        pytest.param(None, "—", id="absent"),
        pytest.param(math.nan, "—", id="nan"),
        pytest.param(0.0, "0x", id="zero"),
        pytest.param(14 / 8002, "1/572", id="far-below-as-fraction"),
        pytest.param(0.1, "0.10x", id="tenth"),
        pytest.param(0.62, "0.62x", id="below-one"),
        pytest.param(1.21, "1.21x", id="above-one"),
        pytest.param(367.0, "367x", id="hundreds"),
        pytest.param(math.inf, "∞", id="infinite"),
    ],
)
def test_format_ratio(ratio: float | None, expected: str) -> None:
    assert format_ratio(ratio) == expected


@pytest.mark.parametrize(
    ("ours", "anchor_value", "expected"),
    [
        pytest.param(52.1, 83.9, 52.1 / 83.9, id="ours-over-anchor"),
        pytest.param(14.0, 8002.0, 14.0 / 8002.0, id="smaller-is-below-one"),
        pytest.param(None, 83.9, None, id="no-ours"),
        pytest.param(52.1, None, None, id="no-anchor"),
        pytest.param(52.1, 0.0, None, id="anchor-zero"),
    ],
)
def test_ratio_is_ours_over_anchor(
    ours: float | None, anchor_value: float | None, expected: float | None
) -> None:
    row = Row("b", "m", ours, "ms", "anchor", anchor_value)
    assert row.ratio == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param(Row("b", "m", 1.0, "ms", goal="≤ 5 ms", met=True), "yes", id="met"),
        pytest.param(Row("b", "m", 9.0, "ms", goal="≤ 5 ms", met=False), "NO", id="not-met"),
        pytest.param(Row("b", "m", 9.0, "ms", goal="well inside 30 s", met=None), "unknown", id="unknown"),
        pytest.param(Row("b", "m", 9.0, "ms"), "—", id="no-goal"),
        pytest.param(Row("b", "failed", None, "", failed="RuntimeError()"), "failed", id="failed"),
    ],
)
def test_format_met(row: Row, expected: str) -> None:
    assert format_met(row) == expected


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param(
            Row("extender", "e2e stream: pods/s", 52.1, "pods/s", "null extender", 83.9, "≥ 90 %", False),
            ("extender", "e2e stream: pods/s", "52.1 pods/s", "null extender", "83.9 pods/s", "0.62x",
             "≥ 90 %", "NO"),
            id="against-anchor",
        ),
        pytest.param(
            Row("simulator", "scrape", 812.0, "ms"),
            ("simulator", "scrape", "812 ms", NO_ANCHOR, "—", "—", "—", "—"),
            id="no-anchor",
        ),
        pytest.param(
            Row("keda", "failed", None, "", failed="RuntimeError('kedaclient\n  missing')"),
            ("keda", "failed: RuntimeError('kedaclient missing')", "—", "—", "—", "—", "—", "failed"),
            id="failed-on-one-line",
        ),
    ],
)  # fmt: skip
def test_cells(row: Row, expected: tuple[str, ...]) -> None:
    assert cells(row) == expected
    assert len(cells(row)) == len(HEADER)


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("a\n  b\tc", 120, "a b c", id="whitespace-collapsed"),
        pytest.param("abcdef", 6, "abcdef", id="fits"),
        pytest.param("abcdefg", 6, "abcde…", id="cut"),
    ],
)
def test_one_line(text: str, limit: int, expected: str) -> None:
    assert one_line(text, limit) == expected


ROWS = [
    Row("adapter_upstream", "queries/min", 14.0, "queries/min", "upstream", 8002.0, "≥ 500x fewer", True),
    Row("node_agent", "idle RSS", 72.0, "MiB", goal="≤ 40 MiB", met=False),
    Row("drain", "failed", None, "", failed="ValueError('x')"),
]  # fmt: skip


def test_empty_run_says_so() -> None:
    assert render_text([]) == EMPTY
    assert render_markdown([], ["heading"]) == f"heading\n\n{EMPTY}\n"


def test_text_table_is_aligned() -> None:
    header, rule, *body, legend = render_text(ROWS).splitlines()
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    assert len(spans) == len(HEADER)
    for line in (header, *body):  # two spaces between columns, at the same place on every line
        assert all(line[end : end + 2] == "  " for _, end in spans[:-1]), line
    ours_end = spans[2][1]
    assert all(line[ours_end - 1] != " " for line in body)  # numbers right-aligned
    assert "1/572" in body[0] and body[0].endswith("yes")
    assert body[1].endswith("NO")
    assert "failed: ValueError('x')" in body[2] and body[2].endswith("failed")
    assert legend.startswith("ratio = ours ÷ anchor")


def test_markdown_table() -> None:
    text = render_markdown([*ROWS, Row("x", "a | b", 1.0, "ms")], ["`make bench` summary, 2026-12-03"])
    lines = text.splitlines()
    assert lines[0] == "`make bench` summary, 2026-12-03"
    assert lines[1] == ""
    assert lines[2] == "| " + " | ".join(HEADER) + " |"
    assert lines[3] == "| --- | --- | --- | --- | --- | --- | --- | --- |"
    assert lines[4] == (
        "| adapter_upstream | queries/min | 14.0 queries/min | upstream | 8,002 queries/min | 1/572 "
        "| ≥ 500x fewer | yes |"
    )
    assert lines[7] == "| x | a \\| b | 1.00 ms | — | — | — | — | — |"
    assert text.endswith("\n") and lines[-1].startswith("ratio = ours ÷ anchor")


def test_collector_keeps_order_and_names_benches() -> None:
    collector = Collector()
    for row in ROWS:
        collector.record(row)
    assert collector.rows == ROWS
    assert collector.benches() == {"adapter_upstream", "node_agent", "drain"}


@pytest.mark.parametrize(
    ("cpus", "memory", "expected"),
    [
        pytest.param(2, 24 * 2**30, "2026-12-03 14:05 UTC, x86_64, 2 CPUs, 24.0 GiB", id="known"),
        pytest.param(None, None, "2026-12-03 14:05 UTC, x86_64, ? CPUs, memory unknown", id="unknown"),
    ],
)
def test_machine_line(cpus: int | None, memory: int | None, expected: str) -> None:
    assert machine_line("2026-12-03 14:05 UTC", "x86_64", cpus, memory) == expected


def test_runs_keep_every_benchmarks_latest_rows() -> None:
    old_drain = Row("drain", "pass p50", 40.0, "ms")
    old_extender = Row("extender", "pods/s", 52.0, "pods/s", "null extender", 84.0, "≥ 90 %", False)
    first = merge_runs({}, [old_drain, old_extender], "2026-12-01 10:00 UTC, x86_64, 2 CPUs, 23.5 GiB")
    new_extender = Row("extender", "pods/s", 70.0, "pods/s", "null extender", 80.0, "≥ 90 %", True)
    failed = Row("keda", "failed", None, "", failed="boom")
    second = merge_runs(first, [new_extender, failed], "2026-12-03 15:00 UTC, x86_64, 2 CPUs, 23.5 GiB")
    assert list(second) == ["drain", "extender", "keda"]
    assert second["drain"] == first["drain"]  # not run again: kept as measured
    assert second["extender"] == BenchRun("2026-12-03 15:00 UTC, x86_64, 2 CPUs, 23.5 GiB", (new_extender,))
    assert decode_runs(encode_runs(second)) == second
    text = render_all(second, "title")
    assert "- drain: 2026-12-01 10:00 UTC" in text and "- extender: 2026-12-03 15:00 UTC" in text
    assert "| extender | pods/s | 70.0 pods/s |" in text and "52.0" not in text and "failed: boom" in text


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[]", '{"x": 1}', '{"x": {"measured_at": "d", "rows": [{"bench": "x"}]}}'],
)
def test_unreadable_runs_are_dropped(text: str) -> None:
    assert decode_runs(text) == {}
