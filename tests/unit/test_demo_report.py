"""The demo report's pure parts: spans from 0/1 series, the timeline's verdict, PNGs and the HTML page."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from harness.demo import figures, plots, queries
from harness.demo.figures import event_time
from harness.demo.queries import Series, intervals
from harness.demo.report import RunRecord, _html
from harness.demo.scenario import load_demo_scenario
from harness.demo.timeline import Timeline


@pytest.mark.parametrize(
    ("points", "spans"),
    [
        pytest.param([], [], id="empty"),
        pytest.param([(0, 1), (1, 1), (2, 1)], [(0, 2)], id="one"),
        pytest.param([(0, 1), (1, 0), (2, 1)], [(0, 0), (2, 2)], id="zero-splits"),
        pytest.param([(0, 1), (1, 1), (10, 1), (11, 1)], [(0, 1), (10, 11)], id="gap-splits"),
    ],
)
def test_intervals(points: list[tuple[float, float]], spans: list[tuple[float, float]]) -> None:
    assert intervals(points) == spans


def test_timeline_passes_only_when_something_was_checked_and_all_passed() -> None:
    t = Timeline(stream=io.StringIO())
    assert not t.passed
    t.phase("step", step="one")
    t.outcome("a", True, "seen", 1.0)
    assert t.passed
    t.outcome("b", False, "not seen", 2.0)
    assert not t.passed
    assert [name for name, _, _ in t.step_spans()] == ["one"]
    out = t.stream.getvalue()  # type: ignore[attr-defined]
    assert "ok  a: seen" in out and "FAIL b: not seen" in out


def test_event_time_is_when_the_event_first_happened() -> None:
    e = {"eventTime": "2026-01-01T00:00:10.000000Z", "series": {"lastObservedTime": "2026-01-01T00:05:00Z"}}
    created = {"metadata": {"creationTimestamp": "2026-01-01T00:00:20Z"}}
    assert event_time(created) - event_time(e) == pytest.approx(10.0)
    assert event_time({}) == 0.0


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plots_render(tmp_path: Path) -> None:
    t0 = 1_000.0
    ramp = [(t0 + i, float(min(8, 2 + i // 10))) for i in range(120)]
    flat = [(t0 + i, 60.0) for i in range(120)]
    a = plots.autoscaling(
        tmp_path / "a.png", title="t", t0=t0, steps=[("one", 5.0), ("two", 60.0)], desired=ramp, current=ramp,
        bounds=(2, 8), metrics={"gpu_utilization": (flat, 70.0)}, dcgm_utilization=flat, offered_qps=flat,
    )  # fmt: skip
    lanes = [
        plots.Lane("n0", [plots.Bar(t0 + 10, t0 + 50, plots.RED, "///", "XID 79", "top"),
                          plots.Bar(t0 + 12, t0 + 90, "#8B1A1A", "", "taint xid-79", "bottom")]),
        plots.Lane("n1", []),
    ]  # fmt: skip
    b = plots.lanes_chart(
        tmp_path / "b.png", title="t", t0=t0, window=(t0, t0 + 120), steps=[("one", 5.0)], lanes=lanes,
        markers=[plots.Marker(t0 + 12, "n0", "GPUQuarantined")], legend=[("taint", "#8B1A1A", "")],
    )  # fmt: skip
    c = plots.numa_map(
        tmp_path / "c.png", title="t", nodes=["n0", "n1"], gpus_per_node=8,
        numa_of={g: g // 4 for g in range(8)},
        cells=[plots.GpuCell("n0", g, "train", "train-worker-0") for g in range(4)],
        node_notes={"n1": "quarantined (xid-79)"}, colours={"train": plots.PALETTE[0]},
    )  # fmt: skip
    for path in (a, b, c):
        width, height = png_size(path)
        assert width > 500 and height > 200, (path, width, height)


def test_html_lists_every_outcome_and_escapes_text(tmp_path: Path) -> None:
    t = Timeline(stream=io.StringIO())
    t.phase("step", step="inference")
    t.outcome("replicas(name=llm)", True, "HPA desired 8 <ok>", 3.0)
    t.outcome("quarantined(node=n0)", False, "taint None", 30.0)
    scenario = load_demo_scenario()
    record = RunRecord(scenario, t, {}, {"bring_up_s": 20.0}, "http://127.0.0.1:1", kube=None)  # type: ignore[arg-type]
    page = _html(record, [(tmp_path / "quarantine.png", "caption")], [])
    assert "FAILED: 1/2 expected outcomes observed" in page
    assert "HPA desired 8 &lt;ok&gt;" in page and "NOT observed" in page
    assert "<img src='quarantine.png'" in page and "bring up 20s" in page


class FakeReader:
    """Range answers by query, as `queries.RangeReader.range` returns them."""

    def __init__(self, answers: dict[str, list[Series]]) -> None:
        self.answers = answers

    def range(self, query: str) -> list[Series]:
        return self.answers.get(query, [])


def test_quarantine_figure_draws_fabric_and_nvlink_signals_beside_xids_and_taints(tmp_path: Path) -> None:
    t0 = 1_000.0
    held = [(t0 + i, 8.0) for i in range(10, 30)]
    reader = FakeReader(
        {
            queries.FABRIC_MANAGER_FAILED: [Series({"Hostname": "gpu-node-03"}, held)],
            queries.NVLINK_ERRORS: [Series({"Hostname": "gpu-node-01"}, held)],
            queries.QUARANTINED: [Series({"node": "gpu-node-03", "reason": "fabric-manager"}, held[3:])],
        }
    )
    steps = [("one", 0.0)]
    ctx = figures.Context(tmp_path, t0, t0 + 60, steps, reader, [], load_demo_scenario())  # type: ignore[arg-type]
    bars, legend = figures.signal_bars(ctx)
    assert {n: [b.text for b in bs] for n, bs in bars.items()} == {
        "gpu-node-03": ["Fabric Manager failure"],
        "gpu-node-01": ["NVLink errors"],
    }
    assert [entry[0] for entry in legend] == ["Fabric Manager failure in DCGM", "NVLink errors in DCGM"]
    path = figures.quarantine_figure(ctx)
    width, height = png_size(path)
    assert width > 500 and height > 200


def test_each_hpa_of_the_default_scenario_gets_a_figure_and_the_parked_one_says_scale_to_zero(
    tmp_path: Path,
) -> None:
    t0 = 1_000.0
    parked = [(t0 + i, float(3 if 40 <= i < 70 else 0)) for i in range(120)]
    reader = FakeReader(
        {
            queries.hpa_replicas("inference", "llm-burst"): [Series({"kind": "desired"}, parked)],
            queries.offered_qps("inference", "llm-burst"): [
                Series({}, [(t, 50.0 if v else 0.0) for t, v in parked])
            ],
        }
    )
    ctx = figures.Context(tmp_path, t0, t0 + 120, [("one", 0.0)], reader, [], load_demo_scenario())  # type: ignore[arg-type]
    made = {path.name: caption for path, caption in figures.autoscaling_figures(ctx)}
    assert set(made) == {"autoscaling-llm-serve.png", "autoscaling-llm-burst.png", "autoscaling-vllm.png"}
    assert made["autoscaling-llm-burst.png"].startswith(
        "Scale to zero without KEDA: an HPA with minReplicas 0"
    )
    assert made["autoscaling-vllm.png"].startswith("Scale to zero on a serving engine")
    assert "minReplicas 0" not in made["autoscaling-llm-serve.png"]
    width, height = png_size(tmp_path / "autoscaling-llm-burst.png")
    assert width > 500 and height > 200


def test_a_workload_figure_spans_the_steps_that_involve_it(tmp_path: Path) -> None:
    scenario = load_demo_scenario()
    steps = [(s.name, 10.0 * i) for i, s in enumerate(scenario.steps)]  # step i starts at 10 i s
    index = {name: i for i, (name, _) in enumerate(steps)}
    t0, end = 1_000.0, 1_000.0 + 10 * len(steps) + 30
    ctx = figures.Context(tmp_path, t0, end, steps, FakeReader({}), [], scenario)  # type: ignore[arg-type]
    burst = figures.workload_window(ctx, "inference", "llm-burst")
    # from 10 s before scale-to-zero to 15 s into the step after park-again (it is seen staying parked)
    assert burst == (t0 + 10 * index["scale-to-zero"] - 10, t0 + 10 * (index["park-again"] + 1) + 15)
    serve = figures.workload_window(ctx, "inference", "llm-serve")
    assert serve == (t0 + 10 * index["inference"] - 10, end)  # its last step (recovery) is the run's last
    assert figures.workload_window(ctx, "inference", "nobody") == (t0, end)


@pytest.mark.parametrize(
    ("points", "broken_after"),
    [
        pytest.param([(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)], [], id="continuous"),
        pytest.param([(0.0, 1.0), (1.0, 1.0), (9.0, 2.0), (10.0, 2.0)], [1.0], id="gap"),
        pytest.param([], [], id="empty"),
    ],
)
def test_lines_break_where_readings_stop(
    points: list[tuple[float, float]], broken_after: list[float]
) -> None:
    out = plots.break_gaps(points)
    nans = [i for i, (_, v) in enumerate(out) if v != v]
    assert [out[i - 1][0] for i in nans] == broken_after
    assert [p for p in out if p[1] == p[1]] == points
