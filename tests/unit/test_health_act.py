"""The pure parts of act.py: the Node merge patch and the GPUHealthy status patch, from the Node as read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from controller.health.act import condition_patch, disruption_changes, node_patch
from controller.health.plan import Action, ConditionUpdate
from controller.health.snapshot import Taint
from gpuwarden.quarantine import QuarantineRecord
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY

OURS = {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}
THEIRS = {"key": "example.com/maintenance", "effect": "NoSchedule"}
REC = QuarantineRecord("quarantined", "xid-79", quarantined_at=1.0)
Q = Action("quarantine", "n1", "xid-79", "m", add_taint=Taint(TAINT_KEY, "xid-79", "NoSchedule"), record=REC)
R = Action("release", "n1", "healthy-period", "m", remove_taint=Taint(TAINT_KEY, "xid-79", "NoSchedule"),
           remove_record=True, remove_release_request=True)  # fmt: skip


def node(taints: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": "n1", "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"taints": taints} if taints is not None else {}}  # fmt: skip


@pytest.mark.parametrize(
    ("current", "action", "expected"),
    [
        pytest.param(
            node(),
            Q,
            {
                "spec": {"taints": [OURS]},
                "metadata": {"annotations": {"gpuwarden.io/quarantine": REC.encode()}},
            },
            id="quarantine-fresh-node",
        ),
        pytest.param(
            node([THEIRS]),
            Q,
            {
                "spec": {"taints": [THEIRS, OURS]},
                "metadata": {"annotations": {"gpuwarden.io/quarantine": REC.encode()}},
            },
            id="quarantine-keeps-their-taint",
        ),
        pytest.param(
            node([THEIRS, OURS], {"gpuwarden.io/quarantine": REC.encode()}),
            Q,
            None,
            id="quarantine-idempotent",
        ),
        pytest.param(
            node([THEIRS, OURS], {"gpuwarden.io/quarantine": "x", "gpuwarden.io/release": "now"}),
            R,
            {
                "spec": {"taints": [THEIRS]},
                "metadata": {"annotations": {"gpuwarden.io/quarantine": None, "gpuwarden.io/release": None}},
            },
            id="release-removes-only-ours",
        ),
        pytest.param(node([OURS]), R, {"spec": {"taints": None}}, id="release-last-taint"),
        pytest.param(node([THEIRS]), R, None, id="release-already-gone"),
        pytest.param(node(labels={"gpuwarden.io/exclude": "true"}), Q, None, id="excluded-since-plan"),
    ],
)
def test_node_patch(current: dict[str, Any], action: Action, expected: dict[str, Any] | None) -> None:
    assert node_patch(current, action) == expected


DND, HOLD = "karpenter.sh/do-not-disrupt", "gpuwarden.io/disruption-hold"
OURS_HELD = {DND: "true", HOLD: "quarantine"}


@pytest.mark.parametrize(
    ("annotations", "quarantined", "hold", "expected"),
    [
        pytest.param({}, True, True, OURS_HELD, id="quarantined-held"),
        pytest.param(OURS_HELD, True, True, {}, id="held-already"),
        pytest.param({DND: "true"}, True, True, {}, id="operators-hold-not-marked-as-ours"),
        pytest.param({DND: "5m"}, True, True, {}, id="operators-duration-kept"),
        pytest.param({}, True, False, {}, id="switch-off-writes-nothing"),
        pytest.param(OURS_HELD, False, True, {DND: None, HOLD: None}, id="released-lifts-ours"),
        pytest.param(OURS_HELD, True, False, {DND: None, HOLD: None}, id="switch-turned-off-lifts-ours"),
        pytest.param({DND: "true"}, False, True, {}, id="released-keeps-operators"),
        pytest.param(
            {DND: "5m", HOLD: "quarantine"}, False, True, {HOLD: None}, id="changed-by-operator-kept"
        ),
        pytest.param({}, False, True, {}, id="healthy-nothing"),
    ],
)
def test_disruption_changes(
    annotations: dict[str, str], quarantined: bool, hold: bool, expected: dict[str, str | None]
) -> None:
    assert disruption_changes(annotations, quarantined=quarantined, hold=hold) == expected


def test_node_patch_holds_a_quarantined_node_and_lifts_the_hold_with_the_taint() -> None:
    held = node_patch(node(), Q, hold_disruption=True)
    assert held is not None
    assert held["metadata"]["annotations"] == {"gpuwarden.io/quarantine": REC.encode(), **OURS_HELD}
    released = node_patch(
        node([OURS], {"gpuwarden.io/quarantine": "x", **OURS_HELD}), R, hold_disruption=True
    )
    assert released == {
        "spec": {"taints": None},
        "metadata": {"annotations": {"gpuwarden.io/quarantine": None, DND: None, HOLD: None}},
    }
    # a pass that only rewrites the record of a quarantined node adds the hold it lacked
    update = Action("update-record", "n1", "xid-79", "m", record=REC)
    assert node_patch(
        node([OURS], {"gpuwarden.io/quarantine": REC.encode()}), update, hold_disruption=True
    ) == {"metadata": {"annotations": OURS_HELD}}
    assert node_patch(node(), Q) == node_patch(node(), Q, hold_disruption=False)  # default: no hold


WALL = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
DOWN = ConditionUpdate("False", "GPUQuarantined", "xid-79")


def with_condition(status: str, reason: str = "GPUQuarantined", message: str = "xid-79") -> dict[str, Any]:
    cond = {"type": "GPUHealthy", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2025-01-01T00:00:00Z"}  # fmt: skip
    return {"status": {"conditions": [{"type": "Ready", "status": "True"}, cond]}}


def test_condition_added_with_transition_time() -> None:
    patch = condition_patch({"status": {}}, DOWN, WALL)
    assert patch is not None
    (cond,) = patch["status"]["conditions"]
    assert cond["status"] == "False" and cond["lastTransitionTime"] == "2026-01-02T03:04:05Z"


def test_condition_unchanged_means_no_write() -> None:
    assert condition_patch(with_condition("False"), DOWN, WALL) is None


def test_condition_reason_change_keeps_transition_time() -> None:
    patch = condition_patch(with_condition("False", message="xid-48"), DOWN, WALL)
    assert (
        patch is not None and patch["status"]["conditions"][0]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    )


def test_condition_flip_moves_transition_time() -> None:
    patch = condition_patch(with_condition("True", "QuarantineReleased"), DOWN, WALL)
    assert (
        patch is not None and patch["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    )


def test_after_event_patch_keeps_evidence_added_since_the_plan() -> None:
    """The pending mark is cleared on the record as read now, never by writing back the plan's copy."""
    from controller.health.act import after_event_patch
    from gpuwarden.quarantine import Evidence, decode

    pending = QuarantineRecord("quarantined", "xid-79", quarantined_at=100.0, event_pending=True)
    grown = pending.with_(evidence=(Evidence("xid-79", "GPU-1"), Evidence("xid-48", "GPU-2")))
    finish = Action(
        "finish-event", "n1", "quarantine-event-pending", "m", after_event=pending.with_(event_pending=False)
    )
    body = after_event_patch(node(annotations={"gpuwarden.io/quarantine": grown.encode()}), finish)
    assert body is not None
    written, _ = decode(body["metadata"]["annotations"]["gpuwarden.io/quarantine"])
    assert written == grown.with_(event_pending=False)
    newer = pending.with_(quarantined_at=200.0)  # a new quarantine since: not ours to touch
    assert after_event_patch(node(annotations={"gpuwarden.io/quarantine": newer.encode()}), finish) is None
