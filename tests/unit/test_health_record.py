"""The `gpuwarden.io/quarantine` annotation codec, the breaker state codec and Node parsing (pure parts)."""

from __future__ import annotations

import json

import pytest

from controller.health.observe import breaker_state, encode_breaker, node_state
from controller.health.snapshot import BreakerState, Taint
from gpuwarden.quarantine import Evidence, QuarantineRecord, decode

REC = QuarantineRecord(
    "quarantined",
    "xid-79",
    "hw_pcie",
    "NoSchedule",
    (Evidence("xid-79", "GPU-a", 79, 1.0, 1_700_000_000.0), Evidence("gpu-missing", "", None, 7.0, None)),
    quarantined_at=1_700_000_030.0,
    boot_id="b-1",
    suppressed=("x/y",),
)


def test_record_round_trips_and_is_stable() -> None:
    text = REC.encode()
    again, err = decode(text)
    assert err == "" and again == REC and again.encode() == text
    body = json.loads(text)
    assert body["gpus"] == ["GPU-a"] and body["xids"] == [79]
    assert body["first_seen"] == "2023-11-14T22:13:20Z" and body["quarantined_at"] == "2023-11-14T22:13:50Z"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{not json", id="not-json"),
        pytest.param("[]", id="not-object"),
        pytest.param('{"state": "maybe"}', id="bad-state"),
        pytest.param('{"state": "quarantined", "quarantined_at": "yesterday"}', id="bad-time"),
    ],
)
def test_unreadable_records_decode_to_none_with_a_reason(text: str) -> None:
    rec, err = decode(text)
    assert rec is None and err


def test_node_state_reads_what_the_decision_needs() -> None:
    obj = {
        "metadata": {"name": "n1", "labels": {"gpuwarden.io/exclude": "true"}, "annotations": {"a": "b"}},
        "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "nodeInfo": {"bootID": "boot-9"},
            "conditions": [{"type": "GPUHealthy", "status": "False", "reason": "GPUQuarantined"}],
        },
    }
    n = node_state(obj)
    assert n.name == "n1" and n.excluded and n.unschedulable and n.gpu_capacity == 8 and n.boot_id == "boot-9"
    assert n.taints == (Taint("k", "v", "NoSchedule"),) and n.gpus is None
    assert n.condition is not None and n.condition.status == "False"


def test_breaker_configmap_round_trip_and_reset() -> None:
    state = BreakerState(True, 1_700_000_000.0, None, "too many")
    cm = {
        "metadata": {"annotations": {"gpuwarden.io/reset": "now"}},
        "data": {"state": encode_breaker(state)},
    }
    got = breaker_state(cm)
    assert got.open and got.opened_at == state.opened_at and got.reason == "too many" and got.reset_requested
    assert breaker_state(None) == BreakerState()


def test_unreadable_breaker_state_stays_open() -> None:
    assert breaker_state({"data": {"state": "{oops"}}).open
