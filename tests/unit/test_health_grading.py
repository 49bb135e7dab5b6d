"""Table tests of the graded signals: thresholds per signal, PCIe-only GPUs, boot grace, stall, debounce."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.health.debounce import advance, confirmed, streak_key
from controller.health.grading import gpu_hits, grade_fleet, in_boot_grace, node_hits, stalled
from controller.health.snapshot import GpuTelemetry, NodeState, Streak
from gpuwarden.config.health_signals import SignalsConfig
from tests.unit.test_health_fixtures import NOW, gpu, node

CFG = SignalsConfig()


def g(**kw: Any) -> GpuTelemetry:
    return gpu("n1", 0, **kw)


@pytest.mark.parametrize(
    ("fields", "cfg", "expected"),
    [
        # NVLink: rate threshold; a PCIe-only GPU has no NVLink series (None) and is never flagged.
        pytest.param({}, {}, [], id="pcie-only-gpu-no-nvlink-series-never-flagged"),
        pytest.param({"nvlink_error_rate": 0.0}, {}, [], id="nvlink-quiet"),
        pytest.param({"nvlink_error_rate": 99.0}, {}, [], id="nvlink-below-100-per-s"),
        pytest.param({"nvlink_error_rate": 100.0}, {}, ["nvlink_errors"], id="nvlink-at-threshold"),
        pytest.param({"nvlink_error_rate": 5.0}, {"nvlink_errors": {"errors_per_second": 1}},
                     ["nvlink_errors"], id="nvlink-threshold-configurable"),
        pytest.param({"nvlink_error_rate": 500.0}, {"nvlink_errors": {"action": "off"}}, [],
                     id="nvlink-off"),
        # Fabric Manager status
        pytest.param({"fabric_manager_status": 3}, {}, [], id="fm-success"),
        pytest.param({"fabric_manager_status": 0}, {}, [], id="fm-not-supported-pcie-only"),
        pytest.param({"fabric_manager_status": 1}, {}, [], id="fm-not-started-gb200-default-ok"),
        pytest.param({"fabric_manager_status": 2}, {}, [], id="fm-in-progress-training"),
        pytest.param({"fabric_manager_status": 4}, {}, ["fabric_manager"], id="fm-failure"),
        pytest.param({"fabric_manager_status": 1}, {"fabric_manager": {"failing_statuses": ["failure",
                     "not_started"]}}, ["fabric_manager"], id="fm-not-started-counts-on-hgx-opt-in"),
        # Fabric health mask: bit by bit, a healthy mask is non-zero
        pytest.param({"fabric_health_mask": 0x1AA}, {}, [], id="fabric-healthy-nonzero-mask"),
        pytest.param({"fabric_health_mask": 0x1A6}, {}, ["fabric_health"], id="fabric-route-recovery"),
        pytest.param({"fabric_health_mask": 0x1A9}, {"fabric_health": {"ignore_faults": ["degraded_bw"]}},
                     [], id="fabric-degraded-bw-ignored-by-config"),
        # PCIe replay: per-second rate compared per minute
        pytest.param({"pcie_replay_rate": 0.1}, {}, [], id="pcie-6-per-min-below-8"),
        pytest.param({"pcie_replay_rate": 0.2}, {}, ["pcie_replay"], id="pcie-12-per-min"),
        # Clock events, bit by bit; idle / power cap / boost are normal operation
        pytest.param({"clock_event_reasons": 0x1 | 0x4 | 0x10}, {}, [], id="clock-idle-cap-boost-normal"),
        pytest.param({"clock_event_reasons": 0x8}, {}, ["hw_slowdown"], id="clock-hw-slowdown"),
        pytest.param({"clock_event_reasons": 0x40}, {}, ["hw_thermal"], id="clock-hw-thermal"),
        pytest.param({"clock_event_reasons": 0x20}, {}, ["sw_thermal"], id="clock-sw-thermal"),
        pytest.param({"clock_event_reasons": 0x80}, {}, ["power_brake"], id="clock-power-brake"),
        pytest.param({"clock_event_reasons": 0xC8}, {}, ["hw_slowdown", "hw_thermal", "power_brake"],
                     id="clock-three-bits-three-signals"),
        pytest.param({"clock_event_reasons": 0x80}, {"power_brake": {"action": "off"}}, [], id="brake-off"),
        # Thermal margin
        pytest.param({"thermal_margin": 5.0}, {}, [], id="margin-5c"),
        pytest.param({"thermal_margin": 0.0}, {}, [], id="margin-0c-not-below-0"),
        pytest.param({"thermal_margin": -2.0}, {}, ["thermal_margin"], id="margin-negative"),
        pytest.param({"thermal_margin": 3.0}, {"thermal_margin": {"min_celsius": 5}}, ["thermal_margin"],
                     id="margin-threshold-configurable"),
    ],
)  # fmt: skip
def test_gpu_hits(fields: dict[str, Any], cfg: dict[str, Any], expected: list[str]) -> None:
    hits = gpu_hits(g(**fields), SignalsConfig.model_validate(cfg))
    assert sorted(h.signal for h in hits) == sorted(expected)
    assert all(h.gpu == "GPU-n1-0" for h in hits)


def test_hit_explains_itself() -> None:
    (hit,) = gpu_hits(g(fabric_manager_status=4, fabric_manager_error=12), CFG)
    assert hit.why == "Fabric Manager status failure, error code 12"
    assert hit.reason == "fabric-manager"
    (mask,) = gpu_hits(g(fabric_health_mask=0x1A6), CFG)
    assert "route_recovery" in mask.why and "0x1a6" in mask.why


@pytest.mark.parametrize(
    ("node_fields", "cfg", "expected"),
    [
        pytest.param({"nvswitch_fatal": (12,)}, {}, ["nvswitch_fatal"], id="fatal-sxid"),
        pytest.param({"nvswitch_non_fatal": (20034,)}, {}, ["nvswitch_non_fatal"], id="non-fatal-sxid"),
        pytest.param({"admission_failures": 4}, {}, [], id="4-admission-failures-below-5"),
        pytest.param({"admission_failures": 5}, {}, ["admission_failures"], id="5-admission-failures"),
        pytest.param({"admission_failures": None}, {}, [], id="admission-not-read"),
        pytest.param({"nvswitch_fatal": (12,)}, {"nvswitch_fatal": {"action": "off"}}, [], id="sxid-off"),
    ],
)  # fmt: skip
def test_node_level_hits(node_fields: dict[str, Any], cfg: dict[str, Any], expected: list[str]) -> None:
    n = replace(node(), **node_fields)
    hits = node_hits(n, list(n.gpus or ()), SignalsConfig.model_validate(cfg))
    assert [h.signal for h in hits] == expected
    assert all(h.gpu == "" for h in hits)


@pytest.mark.parametrize(
    ("ready_age", "grace", "inside"),
    [
        pytest.param(None, 600, False, id="no-ready-condition"),
        pytest.param(60.0, 600, True, id="rebooted-1-min-ago"),
        pytest.param(599.0, 600, True, id="just-inside"),
        pytest.param(600.0, 600, False, id="grace-over"),
        pytest.param(60.0, 30, False, id="short-grace"),
    ],
)
def test_boot_grace(ready_age: float | None, grace: float, inside: bool) -> None:
    n = replace(node(), ready_since=None if ready_age is None else NOW - ready_age)
    assert in_boot_grace(n, SignalsConfig(boot_grace_seconds=grace), NOW) is inside


@pytest.mark.parametrize(
    ("stalled_gpus", "limit", "expected"),
    [
        pytest.param((), 1, (), id="none-stalled"),
        pytest.param((3,), 1, ("GPU-n1-3",), id="one-stalled-gpu-makes-the-node-unknown"),
        pytest.param((3,), 2, (), id="one-below-a-limit-of-two"),
        pytest.param((1, 3), 2, ("GPU-n1-1", "GPU-n1-3"), id="two-at-a-limit-of-two"),
        pytest.param((1, 3), 0, (), id="detection-off"),
    ],
)
def test_stalled(stalled_gpus: tuple[int, ...], limit: int, expected: tuple[str, ...]) -> None:
    n = node(per_gpu={i: {"stalled": True} for i in stalled_gpus})
    assert stalled(n, SignalsConfig(stall_unknown_count=limit)) == expected


# --- debounce -------------------------------------------------------------------------------------------

K = streak_key("n1", "hw_thermal", "GPU-n1-0")
K2 = streak_key("n2", "hw_thermal", "GPU-n2-0")


@pytest.mark.parametrize(
    ("previous", "held", "evaluated", "expected"),
    [
        pytest.param({}, [K], {"n1"}, {K: Streak(1, NOW)}, id="first-pass-starts-a-streak"),
        pytest.param({K: Streak(2, NOW - 20)}, [K], {"n1"}, {K: Streak(3, NOW - 20)}, id="extends"),
        pytest.param({K: Streak(2, NOW - 20)}, [], {"n1"}, {}, id="a-quiet-pass-breaks-the-run"),
        pytest.param({K: Streak(2, NOW - 20)}, [], set(), {K: Streak(2, NOW - 20)},
                     id="unknown-node-keeps-its-streak"),
        pytest.param({K: Streak(2, NOW - 20), K2: Streak(5, NOW - 50)}, [K], {"n1", "n2"},
                     {K: Streak(3, NOW - 20)}, id="per-node-independent"),
    ],
)  # fmt: skip
def test_advance(
    previous: dict[str, Streak], held: list[str], evaluated: set[str], expected: dict[str, Streak]
) -> None:
    assert advance(previous, held, evaluated, NOW) == expected


@pytest.mark.parametrize(
    ("streak", "needed", "ok"),
    [(None, 1, False), (Streak(1, NOW), 1, True), (Streak(2, NOW), 3, False), (Streak(3, NOW), 3, True)],
)
def test_confirmed(streak: Streak | None, needed: int, ok: bool) -> None:
    assert confirmed(streak, needed) is ok


def _pass(n: NodeState, previous: dict[str, Streak], now: float, cfg: SignalsConfig = CFG) -> Any:
    return grade_fleet({n.name: (n, list(n.gpus or ()))}, cfg, previous, now)


def test_three_consecutive_passes_confirm_and_a_gap_restarts() -> None:
    hot = node(per_gpu={0: {"clock_event_reasons": 0x40}})
    cool = node()
    streaks: dict[str, Streak] = {}
    states = []
    for i, n in enumerate([hot, hot, cool, hot, hot, hot]):
        r = _pass(n, streaks, NOW + 10 * i)
        streaks = r.streaks
        states.append([(x.hit.signal, x.count, x.confirmed) for x in r.graded.get("n1", ())])
    assert states == [
        [("hw_thermal", 1, False)],
        [("hw_thermal", 2, False)],
        [],
        [("hw_thermal", 1, False)],
        [("hw_thermal", 2, False)],
        [("hw_thermal", 3, True)],
    ]


def test_boot_grace_silences_and_restarts_the_streak() -> None:
    burst = {0: {"nvlink_error_rate": 5000.0}}
    booting = replace(node(per_gpu={0: dict(burst[0])}), ready_since=NOW - 60)
    streaks = {streak_key("n1", "nvlink_errors", "GPU-n1-0"): Streak(2, NOW - 20)}
    r = _pass(booting, streaks, NOW)
    assert r.graded == {}
    assert [h.signal for h in r.in_grace["n1"]] == ["nvlink_errors"]
    assert r.streaks == {}  # the run before the reboot does not count towards the debounce


def test_boot_grace_only_for_signals_that_ask_for_it() -> None:
    n = replace(node(), ready_since=NOW - 60, admission_failures=9)
    r = _pass(n, {}, NOW)
    assert [x.hit.signal for x in r.graded["n1"]] == ["admission_failures"]  # boot_grace: false by default
    assert r.graded["n1"][0].confirmed  # consecutive: 1


def test_consecutive_is_per_signal() -> None:
    n = node(per_gpu={0: {"clock_event_reasons": 0x80, "fabric_manager_status": 4}})
    cfg = SignalsConfig.model_validate(
        {"power_brake": {"consecutive": 1}, "fabric_manager": {"consecutive": 4}}
    )
    r = _pass(n, {}, NOW, cfg)
    assert {(x.hit.signal, x.confirmed, x.needed) for x in r.graded["n1"]} == {
        ("power_brake", True, 1),
        ("fabric_manager", False, 4),
    }
