"""Self-metrics of the quarantine loop: snapshot gauges follow the last pass; stale label sets vanish."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot
from gpuwarden.config.health_signals import SignalsConfig
from tests.unit.test_health_fixtures import NOW, node, quarantined


def test_pass_metrics() -> None:
    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    nodes = (quarantined("q1"), node("u1", telemetry=False), node("a", per_gpu={0: {"xids": (79,)}}))
    snap = FleetSnapshot(NOW, nodes, queries=10)
    plan = plan_quarantine(snap, HealthPolicy(), NOW)
    m.observe_pass(snap, plan)
    assert reg.get_sample_value("gpuwarden_health_quarantined_nodes", {"reason": "xid-79"}) == 1.0
    assert reg.get_sample_value("gpuwarden_health_skipped_nodes", {"reason": "telemetry-unknown"}) == 1.0
    assert reg.get_sample_value("gpuwarden_health_unknown_nodes") == 1.0
    assert reg.get_sample_value("gpuwarden_health_prometheus_queries") == 10.0
    assert reg.get_sample_value("gpuwarden_health_telemetry_age_seconds") == 5.0
    labels = {"kind": "quarantine", "reason": "xid-79", "dry_run": "false"}
    assert reg.get_sample_value("gpuwarden_health_actions_total", labels) == 1.0
    assert reg.get_sample_value("gpuwarden_health_breaker_open") == 0.0
    m.observe_pass(FleetSnapshot(NOW, ()), plan_quarantine(FleetSnapshot(NOW, ()), HealthPolicy(), NOW))
    assert reg.get_sample_value("gpuwarden_health_quarantined_nodes", {"reason": "xid-79"}) is None
    assert reg.get_sample_value("gpuwarden_health_skipped_nodes", {"reason": "telemetry-unknown"}) is None


def test_breaker_trip_is_counted_once() -> None:
    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    nodes = tuple(node(f"n{i}", per_gpu={0: {"xids": (79,)}}) for i in range(5))
    plan = plan_quarantine(FleetSnapshot(NOW, nodes), HealthPolicy(), NOW)
    m.observe_pass(FleetSnapshot(NOW, nodes), plan)
    assert reg.get_sample_value("gpuwarden_health_breaker_open") == 1.0
    assert reg.get_sample_value("gpuwarden_health_breaker_trips_total") == 1.0


def test_signal_metrics_follow_the_last_pass() -> None:
    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    policy = HealthPolicy(signals=SignalsConfig.model_validate({"hw_thermal": {"consecutive": 1}}))
    hot = node("hot", per_gpu={0: {"clock_event_reasons": 0x40}, 1: {"clock_event_reasons": 0x40}})
    booting = replace(node("boot", per_gpu={0: {"nvlink_error_rate": 900.0}}), ready_since=NOW - 30)
    stalled = node("st", per_gpu={2: {"stalled": True}})
    snap = FleetSnapshot(NOW, (hot, booting, stalled))
    m.observe_pass(snap, plan_quarantine(snap, policy, NOW))
    confirmed = {"signal": "hw_thermal", "action": "degrade", "state": "confirmed"}
    assert reg.get_sample_value("gpuwarden_health_signals", confirmed) == 2.0  # two GPUs
    grace = {"signal": "nvlink_errors", "action": "", "state": "boot-grace"}
    assert reg.get_sample_value("gpuwarden_health_signals", grace) == 1.0
    assert reg.get_sample_value("gpuwarden_health_degraded_nodes", {"signal": "hw_thermal"}) == 1.0
    assert reg.get_sample_value("gpuwarden_health_stalled_gpus") == 1.0
    assert reg.get_sample_value("gpuwarden_health_unknown_nodes") == 1.0
    quiet = FleetSnapshot(NOW, (node("hot"),))
    m.observe_pass(quiet, plan_quarantine(quiet, policy, NOW))
    assert reg.get_sample_value("gpuwarden_health_signals", confirmed) is None
    assert reg.get_sample_value("gpuwarden_health_degraded_nodes", {"signal": "hw_thermal"}) is None
    assert reg.get_sample_value("gpuwarden_health_stalled_gpus") == 0.0


def test_quarantined_devices_follow_our_listed_rules() -> None:
    from controller.health.snapshot import OwnedRule
    from gpuwarden.quarantine import DeviceRef

    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    rules = tuple(
        OwnedRule(f"r{i}", "n1", DeviceRef("gpu.nvidia.com", "n1", f"gpu-{i}"), "xid-79", effect)
        for i, effect in enumerate(("NoSchedule", "NoSchedule", "None"))
    )
    snap = FleetSnapshot(NOW, (), device_rules="served", owned_rules=rules)
    m.observe_pass(snap, plan_quarantine(snap, HealthPolicy(), NOW))
    sample = "gpuwarden_health_quarantined_devices"
    assert reg.get_sample_value(sample, {"reason": "xid-79", "effect": "NoSchedule"}) == 2.0
    assert reg.get_sample_value(sample, {"reason": "xid-79", "effect": "None"}) == 1.0
    m.observe_pass(FleetSnapshot(NOW, ()), plan_quarantine(FleetSnapshot(NOW, ()), HealthPolicy(), NOW))
    assert reg.get_sample_value(sample, {"reason": "xid-79", "effect": "NoSchedule"}) is None
