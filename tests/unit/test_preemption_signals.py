"""Reading the scheduler's preemption signals: workload identity (exact and from a name), the victim's
DisruptionTarget, and the `Preempted` Event in both API shapes (golden files captured from the testbed's
kube-scheduler v1.35 by tests/e2e with GPUWARDEN_CAPTURE_DIR set)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from controller.preemption.signals import (
    PreemptedEvent,
    Workload,
    parse_preempted,
    parse_time,
    pod_meta,
    preempted_at,
    terminating_by_preemption,
    workload_from_name,
    workload_of,
)

GOLDEN = Path(__file__).parent / "golden"


def golden(*parts: str) -> dict[str, Any]:
    return json.loads(GOLDEN.joinpath(*parts).read_text())  # type: ignore[no-any-return]


def pod(
    name: str, owners: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "ownerReferences": owners or [], "labels": labels or {}}
    }


def owner(kind: str, name: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": controller}


@pytest.mark.parametrize(
    ("obj", "expect"),
    [
        pytest.param(pod("solo"), Workload("ml", "solo", "Pod"), id="bare-pod-is-its-own-workload"),
        pytest.param(
            pod(
                "web-5d4f8b9c7-x2x7k",
                [owner("ReplicaSet", "web-5d4f8b9c7")],
                {"pod-template-hash": "5d4f8b9c7"},
            ),
            Workload("ml", "web", "Deployment"),
            id="replicaset-of-a-deployment-folds-into-it",
        ),
        pytest.param(
            pod("rs-abcde", [owner("ReplicaSet", "rs")]),
            Workload("ml", "rs", "ReplicaSet"),
            id="bare-replicaset-stays",
        ),
        pytest.param(pod("train-q8zrw", [owner("Job", "train")]), Workload("ml", "train", "Job"), id="job"),
        pytest.param(
            pod("db-0", [owner("StatefulSet", "db")]), Workload("ml", "db", "StatefulSet"), id="sts"
        ),
        pytest.param(
            pod("x-1", [owner("Foo", "other", controller=False), owner("LeaderWorkerSet", "lws")]),
            Workload("ml", "lws", "LeaderWorkerSet"),
            id="the-controller-owner-wins",
        ),
        pytest.param(
            pod("x-1", [owner("Foo", "only", controller=False)]),
            Workload("ml", "only", "Foo"),
            id="first-owner",
        ),
    ],
)
def test_workload_of(obj: dict[str, Any], expect: Workload) -> None:
    assert workload_of(obj) == expect


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        pytest.param("web-5d4f8b9c7-x2x7k", "web", id="deployment-pod"),
        pytest.param("train-q8zrw", "train", id="job-pod"),
        pytest.param("indexed-job-3-q8zrw", "indexed-job-3", id="indexed-job-pod"),
        pytest.param("db-0", "db", id="statefulset-pod"),
        pytest.param("solo", "solo", id="bare-pod"),
        pytest.param("low-a", "low-a", id="short-suffix-is-not-generated"),
    ],
)
def test_workload_from_name_agrees_with_owners(name: str, expect: str) -> None:
    assert workload_from_name("ml", name) == Workload("ml", expect)


def test_workload_key_ignores_kind() -> None:
    assert Workload("ml", "web", "Deployment") == Workload("ml", "web", "Deployment?")
    assert Workload("ml", "web").key == "ml/web" and str(Workload("ml", "web", "Job")) == "Job ml/web"


def condition(
    status: str = "True", reason: str = "PreemptionByScheduler", at: str = "2026-01-01T00:00:05Z"
) -> dict[str, Any]:
    return {"type": "DisruptionTarget", "status": status, "reason": reason, "lastTransitionTime": at}


def with_conditions(*conds: dict[str, Any], deleting: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "v", "namespace": "ml"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:06Z"
    return {"metadata": meta, "status": {"conditions": list(conds)}}


@pytest.mark.parametrize(
    ("obj", "at", "terminating"),
    [
        pytest.param(with_conditions(condition()), parse_time("2026-01-01T00:00:05Z"), True, id="preempted"),
        pytest.param(
            with_conditions(condition(), deleting=False),
            parse_time("2026-01-01T00:00:05Z"),
            False,
            id="marked-not-yet-deleted",
        ),
        pytest.param(with_conditions(condition(reason="EvictionByEvictionAPI")), None, False, id="evicted"),
        pytest.param(with_conditions(condition(reason="DeletionByTaintManager")), None, False, id="taint"),
        pytest.param(with_conditions(condition(status="False")), None, False, id="condition-false"),
        pytest.param(
            with_conditions(condition(reason="EvictionByEvictionAPI"), condition()),
            None,
            False,
            id="first-decides",
        ),
        pytest.param(with_conditions(condition(at="")), 0.0, True, id="time-unknown"),
        pytest.param(with_conditions(), None, False, id="no-condition"),
    ],
)
def test_preempted_at(obj: dict[str, Any], at: float | None, terminating: bool) -> None:
    assert preempted_at(obj) == at
    assert terminating_by_preemption(obj) is terminating


def test_real_terminating_victim() -> None:
    victim = golden("nominations", "pod_victim_terminating.json")
    assert terminating_by_preemption(victim)
    meta = pod_meta(victim)
    assert meta.workload == Workload(meta.namespace, "low-a") and meta.priority == 100 and meta.node


@pytest.mark.parametrize("shape", ["event_preempted_events_v1.json", "event_preempted_core_v1.json"])
def test_parse_real_preempted_event(shape: str) -> None:
    event = golden("preemption", shape)
    parsed = parse_preempted(event)
    ns = "test-preempted-event-observed-and-spent-07065"
    assert parsed == PreemptedEvent(
        event_uid="dc1bad5a-bb8f-4ad9-a7a6-a7862d514c08",
        victim_uid="6aaedeee-68ec-4911-8270-59f847102c06",
        victim_namespace=ns,
        victim_name="low-a",
        preemptor_uid="e60a8243-7b38-48e3-a75e-4ed6981ee648",
        preemptor_namespace=ns,
        preemptor_name="high-1",
        node="pre-94931-0e71-a",
        at=parse_time("2026-11-29T13:52:19.303683Z"),
    )


def _edit(path: str, value: Any) -> dict[str, Any]:
    event = copy.deepcopy(golden("preemption", "event_preempted_events_v1.json"))
    *parents, last = path.split(".")
    target = event
    for key in parents:
        target = target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return event


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(_edit("reason", "Scheduled"), id="other-reason"),
        pytest.param(_edit("regarding.kind", "Node"), id="victim-not-a-pod"),
        pytest.param(_edit("note", "preempted, somehow"), id="note-without-preemptor"),
    ],
)
def test_events_that_are_not_preemptions(event: dict[str, Any]) -> None:
    assert parse_preempted(event) is None


def test_event_times_fall_back_to_older_fields() -> None:
    event = _edit("eventTime", None)
    assert parse_preempted(event).at == parse_time("2026-11-29T13:52:19Z")  # type: ignore[union-attr]
    event = _edit("related", None)
    parsed = parse_preempted(event)
    assert (
        parsed is not None
        and parsed.preemptor_name == ""
        and parsed.preemptor_namespace == parsed.victim_namespace
    )
