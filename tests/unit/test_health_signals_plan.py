"""`plan_quarantine` with the graded signals, pass after pass: quarantine after the debounce, degrade without
a taint, observe as a metric only, nothing inside the boot grace, a stalled exporter is unknown, and the
`GPUDegraded` condition patch. One row per scenario: the node as it is each pass, what each pass plans."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.health.act import condition_patch, node_patch
from controller.health.decide import plan_quarantine
from controller.health.degrade import REASON_DEGRADED, decode_mark, plan_degraded
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import TAINT_KEY, ConditionState, FleetSnapshot, NodeState, Streak, Taint
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.wellknown import DEGRADATION
from gpuwarden.wellknown import GPU_DEGRADED_CONDITION as DEGRADED_CONDITION
from tests.unit.test_health_fixtures import NOW, node, quarantined

INTERVAL = 10.0


def run(passes: list[list[NodeState]], *, signals: dict[str, Any] | None = None,
        prometheus_ok: list[bool] | None = None, **policy: Any) -> list[HealthPlan]:  # fmt: skip
    """HealthPlan each pass in turn, carrying the debounce streaks as the loop does."""
    pol = HealthPolicy(signals=SignalsConfig.model_validate(signals or {}), **policy)
    streaks: dict[str, Streak] = {}
    plans = []
    for i, nodes in enumerate(passes):
        ok = True if prometheus_ok is None else prometheus_ok[i]
        now = NOW + i * INTERVAL
        snap = FleetSnapshot(now, tuple(nodes), prometheus_ok=ok, prometheus_error="" if ok else "down",
                             streaks=streaks)  # fmt: skip
        plan = plan_quarantine(snap, pol, now)
        streaks = plan.streaks
        plans.append(plan)
    return plans


def summary(plan: HealthPlan) -> set[str]:
    return {f"{a.kind}:{a.reason}" for a in plan.actions} | {f"skip:{s.reason}" for s in plan.skips}


def gpu0(**fields: Any) -> NodeState:
    return node(per_gpu={0: fields})


FM_DOWN = gpu0(fabric_manager_status=4)
HOT = gpu0(clock_event_reasons=0x40)
BRAKE = gpu0(clock_event_reasons=0x80)
SLOW = gpu0(clock_event_reasons=0x08)
NVLINK_BURST = gpu0(nvlink_error_rate=5000.0)
SWITCH = replace(node(), nvswitch_fatal=(12,))
BOOTING = {"ready_since": NOW - 60}
QUIET = node()
DEBOUNCE = "skip:signal-debouncing"


@dataclass
class Row:
    id: str
    passes: list[list[NodeState]]
    expect: list[set[str]]  # per pass: the plan's summary for node n1
    signals: dict[str, Any] = field(default_factory=dict)
    prometheus_ok: list[bool] | None = None


ROWS = [
    Row("fabric-manager-down-quarantines-on-the-third-pass", [[FM_DOWN]] * 3,
        [{DEBOUNCE}, {DEBOUNCE}, {"quarantine:fabric-manager"}]),
    Row("fabric-manager-flap-never-confirms", [[FM_DOWN], [FM_DOWN], [QUIET], [FM_DOWN], [FM_DOWN]],
        [{DEBOUNCE}, {DEBOUNCE}, set(), {DEBOUNCE}, {DEBOUNCE}]),
    Row("nvlink-burst-inside-boot-grace-does-nothing", [[replace(NVLINK_BURST, **BOOTING)]] * 4,
        [{"skip:boot-grace"}] * 4),
    Row("nvlink-burst-after-boot-grace-quarantines", [[NVLINK_BURST]] * 3,
        [{DEBOUNCE}, {DEBOUNCE}, {"quarantine:nvlink-errors"}]),
    Row("thermal-clock-event-degrades-only", [[HOT]] * 4,
        [{DEBOUNCE}, {DEBOUNCE}, {"degrade:hw-thermal"}, {"degrade:hw-thermal"}]),
    Row("power-brake-degrades", [[BRAKE]] * 3, [{DEBOUNCE}, {DEBOUNCE}, {"degrade:power-brake"}]),
    Row("hw-slowdown-as-observe-is-a-metric-only", [[SLOW]] * 3,
        [{DEBOUNCE}, {DEBOUNCE}, {"skip:signal-observed"}], signals={"hw_slowdown": {"action": "observe"}}),
    Row("pcie-replay-regraded-to-quarantine", [[gpu0(pcie_replay_rate=1.0)]] * 2,
        [{DEBOUNCE}, {"quarantine:pcie-replay"}],
        signals={"pcie_replay": {"action": "quarantine", "consecutive": 2}}),
    Row("nvswitch-fatal-sxid-quarantines-after-two", [[SWITCH]] * 2,
        [{DEBOUNCE}, {"quarantine:nvswitch-fatal"}]),
    Row("prometheus-down-pauses-the-debounce", [[FM_DOWN], [FM_DOWN], [FM_DOWN], [FM_DOWN]],
        [{DEBOUNCE}, {DEBOUNCE}, {"skip:prometheus-unavailable"}, {"quarantine:fabric-manager"}],
        prometheus_ok=[True, True, False, True]),
    Row("stalled-exporter-is-unknown-never-healthy",
        [[gpu0(stalled=True, fabric_manager_status=4)]] * 4, [{"skip:telemetry-stalled"}] * 4),
    Row("degrade-clears-when-the-signal-is-gone",
        [[replace(QUIET, degraded=ConditionState("True", REASON_DEGRADED, "x"))]],
        [{"clear-degraded:signals-cleared"}]),
    Row("degraded-node-that-becomes-unknown-keeps-its-condition",
        [[replace(node(telemetry=False), degraded=ConditionState("True", REASON_DEGRADED, "x"))]],
        [{"skip:telemetry-unknown"}]),
    Row("excluded-node-is-never-degraded",
        [[node(excluded=True, per_gpu={0: {"clock_event_reasons": 0x40}})]] * 3,
        [{"skip:excluded"}] * 3),
    Row("signal-off-is-not-read", [[HOT]] * 3, [set()] * 3, signals={"hw_thermal": {"action": "off"}}),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_signal_passes(row: Row) -> None:
    plans = run(row.passes, signals=row.signals, prometheus_ok=row.prometheus_ok)
    assert [summary(p) for p in plans] == row.expect


def test_signal_quarantine_is_a_normal_quarantine() -> None:
    plan = run([[FM_DOWN]] * 3)[-1]
    (q,) = plan.actions_of("quarantine")
    assert q.add_taint == Taint(TAINT_KEY, "fabric-manager", "NoSchedule")
    assert q.record is not None and q.record.reason_class == "hw_link"
    assert [(e.reason, e.gpu) for e in q.record.evidence] == [("fabric-manager", "GPU-n1-0")]
    assert q.record.evidence[0].first_seen == NOW  # the streak's start, not the confirming pass
    assert "3 consecutive passes" in q.message


def test_degrade_writes_the_condition_and_an_event_but_no_taint() -> None:
    (d,) = run([[HOT]] * 3)[-1].actions
    assert d.kind == "degrade" and d.add_taint is None and d.record is None
    assert d.condition is not None and d.condition.type == DEGRADED_CONDITION and d.condition.status == "True"
    assert d.condition.message == "degraded by gpuwarden: hw-thermal on GPU-n1-0"
    assert d.event is not None and d.event.reason == "GPUDegraded" and d.event.type == "Warning"
    assert d.event.name == f"n1.gpudegraded.{int(NOW + 2 * INTERVAL):x}"  # named after the change's time
    current = {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}
    # On the Node object only the mark that owes the Event (written before the condition): no taint.
    assert node_patch(current, d) == {"metadata": {"annotations": {DEGRADATION: d.degradation}}}
    mark = decode_mark(d.degradation)
    assert mark is not None and mark.condition == d.condition and mark.event("n1") == d.event
    wall = datetime(2026, 12, 2, tzinfo=UTC)
    patch = condition_patch(
        {"status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]}}, d.condition, wall
    )
    assert patch is not None
    (cond,) = patch["status"]["conditions"]
    assert cond["type"] == "GPUDegraded" and cond["status"] == "True" and cond["reason"] == REASON_DEGRADED


def test_degrade_is_idempotent_while_the_set_is_unchanged() -> None:
    plans = run([[HOT]] * 3)
    msg = plans[-1].actions[0].condition.message  # type: ignore[union-attr]
    already = replace(HOT, degraded=ConditionState("True", REASON_DEGRADED, msg))
    later = run([[already]] * 4)
    assert summary(later[-1]) == set()
    assert [a.kind for p in later for a in p.actions] == []  # not cleared while it debounces again


def test_quarantined_by_a_signal_keeps_its_evidence_while_the_streak_restarts() -> None:
    n = quarantined(reason="fabric-manager", xid=None, per_gpu={0: {"fabric_manager_status": 4}})
    plans = run([[n]] * 3)  # a restarted controller: no streaks
    still = "skip:still-faulty"
    assert [summary(p) for p in plans] == [{DEBOUNCE, still}, {DEBOUNCE, still}, {still}]


def test_plan_degraded_lists_each_signal_once_sorted() -> None:
    n = gpu0(clock_event_reasons=0xC0)
    plan = run([[n]] * 3)[-1]
    (d,) = plan.actions_of("degrade")
    assert d.condition is not None
    assert d.condition.message == "degraded by gpuwarden: hw-thermal on GPU-n1-0, power-brake on GPU-n1-0"
    assert plan_degraded(QUIET, (), now=NOW) is None  # never degraded, nothing to clear


def test_quarantined_node_that_stalls_is_not_released() -> None:
    n = quarantined(healthy_since=NOW - 7200, per_gpu={0: {"stalled": True}})
    plan = run([[n]])[0]
    assert summary(plan) == {"skip:telemetry-stalled"}
    assert plan.stalled_gpus == 1


def test_signal_quarantines_count_against_the_breaker() -> None:
    fleet = [node(f"n{i}", per_gpu={0: {"fabric_manager_status": 4}}) for i in range(5)]
    plan = run([fleet], signals={"fabric_manager": {"consecutive": 1}}, breaker_max_absolute=3)[0]
    assert len(plan.actions_of("quarantine")) == 3
    assert len(plan.skips_of("breaker-open")) == 2
    assert plan.breaker.after.open


def test_expected_gpus_label_is_the_baseline() -> None:
    seven = node(gpus=7, capacity=7, labels={"gpuwarden.io/expected-gpus": "8"})
    plan = run([[seven]], gpu_missing_grace=None)[0]
    (skip,) = plan.skips_of("not-quarantining")
    assert "label gpuwarden.io/expected-gpus 8 GPUs, DCGM reports 7" in skip.message
    assert summary(run([[node(gpus=7, capacity=7)]], gpu_missing_grace=None)[0]) == set()  # capacity agrees


def test_signal_statuses_for_metrics() -> None:
    plans = run([[replace(gpu0(nvlink_error_rate=500.0, clock_event_reasons=0x40), **BOOTING)]])
    assert {(s.signal, s.state) for s in plans[0].signals} == {("nvlink_errors", "boot-grace"),
                                                             ("hw_thermal", "boot-grace")}  # fmt: skip
    plans = run([[HOT]] * 3)
    assert [(s.signal, s.action, s.state) for s in plans[-1].signals] == [
        ("hw_thermal", "degrade", "confirmed")
    ]
