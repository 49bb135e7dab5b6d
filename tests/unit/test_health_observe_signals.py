"""The pure parts of observe for the graded signals: boot time from the Ready condition, our GPUDegraded
condition, allocatable, admission failures from failed pods, NVSwitch SXids joined per node."""

from __future__ import annotations

from typing import Any

import pytest

from controller.health.observe import admission_failures, join, node_state, ready_since
from controller.health.signal_queries import read_nvswitch
from controller.health.snapshot import BreakerState, ConditionState, Streak
from controller.health.telemetry import Telemetry
from gpuwarden.promtypes import Sample

T0 = "2026-12-02T06:00:00Z"
T0_S = 1796191200.0


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param([], None, id="no-conditions"),
        pytest.param([{"type": "Ready", "status": "True", "lastTransitionTime": T0}], T0_S, id="ready"),
        pytest.param([{"type": "Ready", "status": "False", "lastTransitionTime": T0}], None, id="not-ready"),
        pytest.param([{"type": "Ready", "status": "True"}], None, id="no-transition-time"),
        pytest.param([{"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}], None,
                     id="unreadable-time"),
        pytest.param([{"type": "MemoryPressure", "status": "True", "lastTransitionTime": T0}], None,
                     id="other-condition"),
    ],
)  # fmt: skip
def test_ready_since(conditions: list[dict[str, Any]], expected: float | None) -> None:
    assert ready_since(conditions) == expected


def test_node_state_reads_the_signal_inputs() -> None:
    obj = {
        "metadata": {"name": "n1"},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "7"},
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": T0},
                {"type": "GPUDegraded", "status": "True", "reason": "R", "message": "m"},
            ],
        },
    }
    n = node_state(obj)
    assert (n.gpu_capacity, n.gpu_allocatable, n.ready_since) == (8, 7, T0_S)
    assert n.degraded == ConditionState("True", "R", "m")
    assert node_state({"metadata": {"name": "n2"}}).gpu_allocatable is None


def pod(node: str, reason: str, created: str = T0, phase: str = "Failed") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "creationTimestamp": created},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "reason": reason},
    }


def test_admission_failures_counts_matching_reasons_within_the_window() -> None:
    pods = [
        pod("a", "UnexpectedAdmissionError"),
        pod("a", "UnexpectedAdmissionError"),
        pod("a", "OutOfnvidia.com/gpu"),
        pod("a", "Evicted"),  # not an admission failure
        pod("a", "UnexpectedAdmissionError", created="2026-12-02T05:00:00Z"),  # before the window
        pod("b", "UnexpectedAdmissionError"),
        {"metadata": {}, "spec": {}, "status": {"reason": "UnexpectedAdmissionError"}},  # never bound
        pod("c", "UnexpectedAdmissionError", created="garbage"),
    ]
    reasons = ["UnexpectedAdmissionError", "OutOfnvidia.com/gpu"]
    assert admission_failures(pods, reasons, since=T0_S - 600) == {"a": 3, "b": 1}


def test_join_attaches_switches_admission_and_streaks() -> None:
    nodes = [node_state({"metadata": {"name": n}}) for n in ("a", "b")]
    tel = Telemetry(newest={"a": 1.0, "b": 1.0}, nvswitch={"a": ((12,), (20034,))})
    streaks = {"a/hw_thermal/GPU-1": Streak(2, 1.0)}
    snap = join(nodes, tel, now=2.0, breaker=BreakerState(), streaks=streaks, admission={"a": 4})
    a, b = snap.nodes
    assert (a.nvswitch_fatal, a.nvswitch_non_fatal, a.admission_failures) == ((12,), (20034,), 4)
    assert (b.nvswitch_fatal, b.admission_failures) == ((), 0)
    assert snap.streaks == streaks
    unread = join(nodes, tel, now=2.0, breaker=BreakerState())
    assert unread.nodes[0].admission_failures is None  # not read is not zero


def test_read_nvswitch_groups_by_node() -> None:
    fatal, nonfatal = "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS"
    samples = [
        Sample({"__name__": fatal, "Hostname": "a", "nvswitch": "0"}, 0.0, 12.0),
        Sample({"__name__": fatal, "Hostname": "a", "nvswitch": "3"}, 0.0, 12.0),
        Sample({"__name__": nonfatal, "hostname": "b", "nvswitch": "1"}, 0.0, 20034.0),
        Sample({"__name__": fatal, "nvswitch": "1"}, 0.0, 99.0),  # no node label: not attributable
    ]
    got = read_nvswitch(samples, lambda labels: labels.get("Hostname") or labels.get("hostname") or "")
    assert got == {"a": ((12,), ()), "b": ((), (20034,))}
