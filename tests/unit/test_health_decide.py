"""Table-driven tests of `plan_quarantine`: one row per scenario — snapshot in, expected plan and reasons."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.health.catalog import load_catalog
from controller.health.decide import plan_quarantine
from controller.health.plan import HealthPlan
from controller.health.policy import HealthPolicy
from controller.health.snapshot import (
    BreakerState,
    ConditionState,
    FleetSnapshot,
    NodeState,
    Taint,
    XidObservation,
)
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from tests.unit.test_health_fixtures import NOW, node, quarantined, record


def x(code: int, *, recent: bool = True, count: int = 1, first_seen: float = NOW - 20.0) -> XidObservation:
    return XidObservation(code, recent, count, first_seen)


def fleet(n: int, prefix: str = "f", **per_node: Any) -> list[NodeState]:
    return [node(f"{prefix}{i:02d}", **per_node) for i in range(n)]


@dataclass
class Row:
    id: str
    nodes: list[NodeState]
    expect: dict[str, set[str]]  # node -> {"<action kind>:<reason>" | "skip:<reason>"}; others: nothing
    policy: dict[str, Any] = field(default_factory=dict)
    prometheus_ok: bool = True
    breaker: BreakerState = field(default_factory=BreakerState)
    breaker_open: bool | None = None
    event: str | None = None  # breaker event reason expected


def one(code: int, **kw: Any) -> NodeState:
    return node("n1", per_gpu={0: {"xids": (x(code, **kw),)}})


HW_XIDS = [48, 64, 74, 79, 95, 119, 120, 140]
APP_XIDS = [13, 31, 43, 45, 68]
B = "breaker-open"

ROWS: list[Row] = [
    *[Row(f"app-xid-{c}-never-quarantines", [one(c)], {"n1": {"skip:not-quarantining"}}) for c in APP_XIDS],
    Row("xid-45-burst-of-500-never-escalates", [one(45, count=500)], {"n1": {"skip:not-quarantining"}}),
    Row("xid-13-repeated-on-one-gpu-stays-app", [one(13, count=50)], {"n1": {"skip:not-quarantining"}}),
    *[Row(f"hw-xid-{c}-quarantines", [one(c)], {"n1": {f"quarantine:xid-{c}"}}) for c in HW_XIDS],
    Row("xid-79-sticky-from-old-episode-is-not-an-event", [one(79, recent=False)], {}),
    Row("unknown-xid-999-reported-not-quarantined", [one(999)], {"n1": {"skip:not-quarantining"}}),
    Row("xid-32-escalates-at-3-on-one-gpu", [one(32, count=3)], {"n1": {"quarantine:xid-32"}}),
    Row("xid-32-twice-stays-below-escalation", [one(32, count=2)], {"n1": {"skip:not-quarantining"}}),
    Row(
        "xid-94-escalates-even-when-not-recent",
        [one(94, count=3, recent=False)],
        {"n1": {"quarantine:xid-94"}},
    ),
    Row(
        "xid-13-escalation-opt-in-by-override",
        [one(13, count=2)],
        {"n1": {"quarantine:xid-13"}},
        policy={"catalog": load_catalog({13: {"escalate_after": 2}})},
    ),
    Row(
        "xid-109-override-to-non-fatal",
        [one(109)],
        {"n1": {"skip:not-quarantining"}},
        policy={"catalog": load_catalog({109: {"quarantine": False}})},
    ),
    Row(
        "app-and-hw-xid-on-one-node-quarantines-for-hw",
        [node("n1", per_gpu={0: {"xids": (x(13), x(79))}})],
        {"n1": {"quarantine:xid-79"}},
    ),
    Row(
        "ecc-dbe-increase-quarantines",
        [node(per_gpu={2: {"dbe_volatile": 1, "dbe_volatile_increase": 1}})],
        {"n1": {"quarantine:ecc-dbe"}},
    ),
    Row(
        "ecc-dbe-old-nonzero-counter-no-increase-is-quiet",
        [node(per_gpu={2: {"dbe_volatile": 4, "dbe_volatile_increase": 0}})],
        {},
    ),
    Row(
        "retired-pages-at-dcgm-limit-63",
        [node(per_gpu={1: {"retired_sbe": 60, "retired_dbe": 3}})],
        {"n1": {"quarantine:retired-pages"}},
    ),
    Row("retired-pages-62-below-limit", [node(per_gpu={1: {"retired_sbe": 60, "retired_dbe": 2}})], {}),
    Row(
        "retired-dbe-over-soft-limit-and-growing",
        [node(per_gpu={1: {"retired_dbe": 16, "retired_dbe_increase_week": 2}})],
        {"n1": {"quarantine:retired-dbe"}},
    ),
    Row(
        "retired-dbe-over-soft-limit-but-flat",
        [node(per_gpu={1: {"retired_dbe": 16, "retired_dbe_increase_week": 0}})],
        {},
    ),
    Row(
        "retired-pending-reported-only",
        [node(per_gpu={1: {"retired_pending": 1}})],
        {"n1": {"skip:not-quarantining"}},
    ),
    Row(
        "uncorrectable-remapped-rows-at-512",
        [node(per_gpu={1: {"uncorrectable_remapped_rows": 512}})],
        {"n1": {"quarantine:uncorrectable-remapped-rows"}},
    ),
    Row("uncorrectable-remapped-rows-511", [node(per_gpu={1: {"uncorrectable_remapped_rows": 511}})], {}),
    Row(
        "row-remap-failure-quarantines",
        [node(per_gpu={1: {"row_remap_failure": 1}})],
        {"n1": {"quarantine:row-remap-failure"}},
    ),
    Row("sbe-rate-without-threshold-is-quiet", [node(per_gpu={1: {"sbe_volatile_rate": 50.0}})], {}),
    Row(
        "sbe-rate-over-configured-threshold",
        [node(per_gpu={1: {"sbe_volatile_rate": 50.0}})],
        {"n1": {"quarantine:sbe-rate"}},
        policy={"sbe_rate_per_hour": 36000.0},
    ),
    Row(
        "recovery-action-node-reboot-quarantines",
        [node(per_gpu={3: {"recovery_action": 2}})],
        {"n1": {"quarantine:recovery-action"}},
    ),
    Row("recovery-action-none-is-quiet", [node(per_gpu={3: {"recovery_action": 0}})], {}),
    Row("gpu-missing-7-of-8-quarantines", [node(gpus=7, capacity=8)], {"n1": {"quarantine:gpu-missing"}}),
    Row(
        "gpu-stale-while-others-fresh-is-missing",
        [node(per_gpu={5: {"age": 900.0}})],
        {"n1": {"quarantine:gpu-missing"}},
    ),
    Row(
        "gpu-missing-within-grace-waits",
        [node(per_gpu={5: {"age": 300.0}})],
        {"n1": {"skip:not-quarantining"}},
        policy={"gpu_missing_grace": 600.0},
    ),
    Row(
        "gpu-missing-check-disabled",
        [node(gpus=7, capacity=8)],
        {"n1": {"skip:not-quarantining"}},
        policy={"gpu_missing_grace": None},
    ),
    Row(
        "unknown-xid-quarantines-when-configured",
        [one(999)],
        {"n1": {"quarantine:xid-999"}},
        policy={"quarantine_unknown_xid": True},
    ),
    Row(
        "prometheus-down-adds-nothing",
        [one(79)],
        {"n1": {"skip:prometheus-unavailable"}},
        prometheus_ok=False,
    ),
    Row(
        "prometheus-down-removes-nothing",
        [quarantined(healthy_since=NOW - 7200, per_gpu={0: {"xid_last": 0}}, boot_id="boot-2")],
        {"n1": {"skip:prometheus-unavailable"}},
        prometheus_ok=False,
    ),
    Row("exporter-down-no-series-is-unknown", [node(telemetry=False)], {"n1": {"skip:telemetry-unknown"}}),
    Row(
        "exporter-stale-is-unknown",
        [node(age=600.0, per_gpu={0: {"xids": (x(79),)}})],
        {"n1": {"skip:telemetry-unknown"}},
    ),
    Row(
        "quarantined-and-stale-not-released",
        [quarantined(healthy_since=NOW - 7200, age=600.0, boot_id="boot-2")],
        {"n1": {"skip:telemetry-unknown"}},
    ),
    Row(
        "breaker-at-limit-admits-all",
        fleet(3, per_gpu={0: {"xids": (x(79),)}}) + fleet(17, "h"),
        {f"f{i:02d}": {"quarantine:xid-79"} for i in range(3)},
        breaker_open=False,
    ),
    Row(
        "breaker-one-over-limit-opens",
        fleet(4, per_gpu={0: {"xids": (x(79),)}}) + fleet(16, "h"),
        {**{f"f{i:02d}": {"quarantine:xid-79"} for i in range(3)}, "f03": {f"skip:{B}"}},
        breaker_open=True,
        event="QuarantineBreakerOpen",
    ),
    Row(
        "breaker-percent-of-fleet-wins-over-absolute",
        fleet(10, per_gpu={0: {"xids": (x(79),)}}) + fleet(90, "h"),
        {f"f{i:02d}": {"quarantine:xid-79"} for i in range(10)},
        policy={"breaker_max_new_per_window": 100},
        breaker_open=False,
    ),
    Row(
        "breaker-counts-existing-quarantines",
        [
            quarantined("q1", at=NOW - 7200),
            quarantined("q2", at=NOW - 7200),
            *fleet(2, per_gpu={0: {"xids": (x(79),)}}),
        ],
        {
            "q1": {"update-record:healthy-period-started"},
            "q2": {"update-record:healthy-period-started"},
            "f00": {"quarantine:xid-79"},
            "f01": {f"skip:{B}"},
        },
        breaker_open=True,
        event="QuarantineBreakerOpen",
    ),
    Row(
        "breaker-new-per-window-limit",
        [quarantined("q1", at=NOW - 60), *fleet(2, per_gpu={0: {"xids": (x(79),)}})],
        {"q1": {"update-record:healthy-period-started"}, "f00": {"quarantine:xid-79"}, "f01": {f"skip:{B}"}},
        policy={"breaker_max_absolute": 50, "breaker_max_new_per_window": 2},
        breaker_open=True,
        event="QuarantineBreakerOpen",
    ),
    Row(
        "breaker-open-stays-open-during-hold",
        fleet(1, per_gpu={0: {"xids": (x(79),)}}),
        {"f00": {f"skip:{B}"}},
        breaker=BreakerState(True, NOW - 600, NOW - 300, "trip"),
        breaker_open=True,
    ),
    Row(
        "breaker-closes-after-hold-and-admits",
        fleet(1, per_gpu={0: {"xids": (x(79),)}}),
        {"f00": {"quarantine:xid-79"}},
        breaker=BreakerState(True, NOW - 9000, NOW - 1800, "trip"),
        breaker_open=False,
        event="QuarantineBreakerClosed",
    ),
    Row(
        "breaker-operator-reset-closes",
        fleet(1, per_gpu={0: {"xids": (x(79),)}}),
        {"f00": {"quarantine:xid-79"}},
        breaker=BreakerState(True, NOW - 60, None, "trip", reset_requested=True),
        breaker_open=False,
        event="QuarantineBreakerClosed",
    ),
    Row(
        "breaker-open-still-releases",
        [
            quarantined(healthy_since=NOW - 7200, boot_id="boot-2"),
            *fleet(1, per_gpu={0: {"xids": (x(79),)}}),
        ],
        {"n1": {"release:healthy-period"}, "f00": {f"skip:{B}"}},
        breaker=BreakerState(True, NOW - 60, None, "trip"),
        breaker_open=True,
    ),
    Row(
        "healthy-period-starts",
        [quarantined(reason="xid-48", xid=48, per_gpu={0: {"xid_last": 0}})],
        {"n1": {"update-record:healthy-period-started"}},
    ),
    Row(
        "healthy-period-not-elapsed",
        [quarantined(healthy_since=NOW - 60, per_gpu={0: {"xid_last": 0}})],
        {"n1": {"skip:healthy-period-not-elapsed"}},
    ),
    Row(
        "release-reset-class-after-healthy-period-and-xid-reset",
        [quarantined(reason="xid-48", xid=48, healthy_since=NOW - 1800, per_gpu={0: {"xid_last": 0}})],
        {"n1": {"release:healthy-period"}},
    ),
    Row(
        "no-release-while-sticky-xid-not-reset",
        [quarantined(reason="xid-48", xid=48, healthy_since=NOW - 7200, per_gpu={0: {"xid_last": 48}})],
        {"n1": {"skip:recovery-pending"}},
    ),
    Row(
        "release-reset-class-after-reboot-even-if-sticky",
        [
            quarantined(
                reason="xid-48",
                xid=48,
                healthy_since=NOW - 7200,
                boot_id="boot-2",
                per_gpu={0: {"xid_last": 48}},
            )
        ],
        {"n1": {"release:healthy-period"}},
    ),
    Row(
        "xid-79-needs-reboot-even-when-gauge-gone",
        [quarantined(healthy_since=NOW - 7200)],
        {"n1": {"skip:recovery-pending"}},
    ),
    Row(
        "xid-79-released-after-reboot",
        [quarantined(healthy_since=NOW - 7200, boot_id="boot-2")],
        {"n1": {"release:healthy-period"}},
    ),
    Row(
        "evidence-returns-restarts-healthy-period",
        [quarantined(healthy_since=NOW - 600, per_gpu={0: {"xids": (x(79),)}})],
        {"n1": {"update-record:evidence-changed"}},
    ),
    Row(
        "new-evidence-on-quarantined-node-recorded",
        [quarantined(per_gpu={0: {"xids": (x(79),)}, 4: {"row_remap_failure": 1}})],
        {"n1": {"update-record:evidence-changed"}},
    ),
    Row(
        "operator-release-now-lifts-at-once",
        [quarantined(release=True, per_gpu={0: {"xids": (x(79),)}})],
        {"n1": {"release:operator-annotation"}},
    ),
    Row(
        "operator-release-now-works-with-prometheus-down",
        [quarantined(release=True)],
        {"n1": {"release:operator-annotation"}},
        prometheus_ok=False,
    ),
    Row(
        "manual-untaint-respected",
        [node(rec=record(), per_gpu={0: {"xids": (x(79),)}})],
        {"n1": {"release:operator-untaint"}},
    ),
    Row(
        "dismissed-evidence-not-retainted",
        [
            node(
                rec=record(state="released", suppressed=("xid-79/GPU-n1-0",), released_at=NOW - 10),
                per_gpu={0: {"xids": (x(79, first_seen=NOW - 40),)}},
            )
        ],
        {"n1": {"skip:dismissed-by-operator"}},
    ),
    Row(
        "new-occurrence-after-dismissal-quarantines",
        [
            node(
                rec=record(state="released", suppressed=("xid-79/GPU-n1-0",), released_at=NOW - 600),
                per_gpu={0: {"xids": (x(79, first_seen=NOW - 30),)}},
            )
        ],
        {"n1": {"quarantine:xid-79"}},
    ),
    Row(
        "dismissed-evidence-cleared-forgets-record",
        [
            node(
                rec=record(
                    state="released", suppressed=("row-remap-failure/GPU-n1-0",), released_at=NOW - 600
                )
            )
        ],
        {"n1": {"update-record:dismissed-evidence-cleared"}},
    ),
    Row(
        "excluded-node-never-touched",
        [node(excluded=True, per_gpu={0: {"xids": (x(79),)}})],
        {"n1": {"skip:excluded"}},
    ),
    Row(
        "excluded-quarantined-node-not-released",
        [quarantined(excluded=True, release=True)],
        {"n1": {"skip:excluded"}},
    ),
    Row(
        "our-taint-without-record-adopted",
        [
            node(
                taints=(Taint(TAINT_KEY, "xid-48", "NoSchedule"),),
                condition=ConditionState("False", "GPUQuarantined"),
            )
        ],
        {"n1": {"update-record:healthy-period-started"}},
    ),
    Row(
        "condition-drift-repaired-on-quarantined-node",
        [replace(quarantined(per_gpu={0: {"xids": (x(79),)}}), condition=None)],
        {"n1": {"set-condition:condition-drift", "skip:still-faulty"}},
    ),
    Row("dry-run-plans-the-same", [one(79)], {"n1": {"quarantine:xid-79"}}, policy={"dry_run": True}),
]


def run(row: Row) -> HealthPlan:
    snap = FleetSnapshot(
        NOW,
        tuple(row.nodes),
        prometheus_ok=row.prometheus_ok,
        prometheus_error="" if row.prometheus_ok else "connection refused",
        breaker=row.breaker,
    )
    return plan_quarantine(snap, HealthPolicy(**row.policy), NOW)


def outcome(plan: HealthPlan) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for a in plan.actions:
        got.setdefault(a.node, set()).add(f"{a.kind}:{a.reason}")
    for s in plan.skips:
        got.setdefault(s.node, set()).add(f"skip:{s.reason}")
    return got


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_plan(row: Row) -> None:
    plan = run(row)
    assert outcome(plan) == row.expect
    for a in plan.actions:
        assert a.reason and a.message, a
        for t in (a.add_taint, a.remove_taint):
            assert t is None or t.key == TAINT_KEY  # only ever our taint
    for s in plan.skips:
        assert s.reason and s.message, s
    if row.breaker_open is not None:
        assert plan.breaker.after.open is row.breaker_open
    assert (plan.breaker.event.reason if plan.breaker.event else None) == row.event


def test_row_count() -> None:
    assert len(ROWS) >= 40


def test_quarantine_action_carries_taint_record_condition_event() -> None:
    plan = run(Row("x", [one(79)], {}))
    (a,) = plan.actions
    assert a.add_taint == Taint(TAINT_KEY, "xid-79", "NoSchedule")
    assert a.condition is not None and a.condition.status == "False"
    assert a.event is not None and a.event.reason == "GPUQuarantined" and "GPU-n1-0" in a.event.note
    assert a.record is not None and a.record.quarantined_at == NOW and a.record.boot_id == "boot-1"
    assert [e.xid for e in a.record.evidence] == [79]
    assert a.first_seen == NOW - 20.0


def test_no_execute_is_opt_in_per_class() -> None:
    effects = dict.fromkeys(["hw_pcie"], "NoExecute")
    plan = plan_quarantine(FleetSnapshot(NOW, (one(79),)), HealthPolicy(taint_effects=effects), NOW)
    assert plan.actions[0].add_taint == Taint(TAINT_KEY, "xid-79", "NoExecute")


def test_others_taints_and_cordon_are_left_alone() -> None:
    theirs = Taint("example.com/maintenance", "", "NoSchedule")
    n = replace(one(79), taints=(theirs,), unschedulable=True)
    (a,) = plan_quarantine(FleetSnapshot(NOW, (n,)), HealthPolicy(), NOW).actions
    assert a.add_taint is not None and a.add_taint.key == TAINT_KEY and a.remove_taint is None


def test_dry_run_plan_equals_live_plan() -> None:
    nodes = (one(79), quarantined("q1", healthy_since=NOW - 7200, boot_id="boot-2"))
    live = plan_quarantine(FleetSnapshot(NOW, nodes), HealthPolicy(), NOW)
    dry = plan_quarantine(FleetSnapshot(NOW, nodes), HealthPolicy(dry_run=True), NOW)
    assert dry.dry_run and not live.dry_run
    assert dry.actions == live.actions and dry.skips == live.skips


def test_manual_untaint_dismisses_the_evidence() -> None:
    plan = run(Row("x", [node(rec=record(), per_gpu={0: {"xids": (x(79),)}})], {}))
    rec = plan.actions[0].record
    assert rec is not None and rec.state == "released" and rec.suppressed == ("xid-79/GPU-n1-0",)
    assert plan.actions[0].remove_taint is None


def test_release_now_removes_request_and_record() -> None:
    plan = run(Row("x", [quarantined(release=True)], {}))
    (a,) = plan.actions
    assert a.remove_release_request and a.remove_taint is not None
    assert a.record is not None and a.record.released_by == "operator-annotation"


def test_healthy_release_removes_record() -> None:
    plan = run(Row("x", [quarantined(healthy_since=NOW - 7200, boot_id="boot-2")], {}))
    (a,) = plan.actions
    # The record stays (released, Event pending) until the Event exists; then it is removed.
    assert a.record is not None and a.record.state == "released" and a.record.event_pending
    assert a.remove_record_after_event and a.event is not None and a.event.name
    assert a.event.reason == "GPUQuarantineReleased"


def test_unreadable_record_is_reported_not_fatal() -> None:
    n = replace(one(79), annotations={RECORD_ANNOTATION: "{not json"})
    plan = plan_quarantine(FleetSnapshot(NOW, (n,)), HealthPolicy(), NOW)
    assert outcome(plan) == {"n1": {"skip:unreadable-record", "quarantine:xid-79"}}


def test_healthy_period_started_record_is_decodable() -> None:
    plan = run(Row("x", [quarantined(per_gpu={0: {"xid_last": 0}})], {}))
    rec = plan.actions[0].record
    assert rec is not None
    again, err = decode(rec.encode())
    assert err == "" and again == rec and again.healthy_since == NOW
