"""The node agent's pure cores: reconcile (actual vs recorded GPUs) and the admission guess, as tables."""

from __future__ import annotations

import pytest

from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_REQUESTED as REQUESTED_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE as SOURCE_ANNOTATION
from gpuwarden.wellknown import NUMA_NODE as NUMA_ANNOTATION
from gpuwarden.wellknown import parse_gpu_ids as parse_ids
from nodeagent.admission import Candidate, candidate, prefer
from nodeagent.reconcile import Allocation, Outcome, PodRecord, decide, pod_record

NUMA = {"0": 0, "1": 0, "2": 1, "3": 1}


def pod(name: str, recorded: str | None, source: str = "", requested: str | None = None) -> PodRecord:
    return PodRecord("ns", name, f"uid-{name}", parse_ids(recorded), source, parse_ids(requested))


@pytest.mark.parametrize(
    ("pods", "allocs", "expect"),
    [
        pytest.param(
            [pod("a", "0,1")], [Allocation("ns", "a", ("1", "0"))],
            [("a", Outcome.HONOURED, {SOURCE_ANNOTATION: "kubelet"})],
            id="honoured-only-marks-the-source",
        ),
        pytest.param(
            [pod("a", "0,1")], [Allocation("ns", "a", ("2", "3"))],
            [("a", Outcome.OVERRIDDEN, {SOURCE_ANNOTATION: "kubelet", GPU_IDS_ANNOTATION: "2,3",
                                         NUMA_ANNOTATION: "1", REQUESTED_ANNOTATION: "0,1"})],
            id="overridden-writes-actual-keeps-requested",
        ),
        pytest.param(
            [pod("a", None)], [Allocation("ns", "a", ("3",))],
            [("a", Outcome.UNRECORDED, {SOURCE_ANNOTATION: "kubelet", GPU_IDS_ANNOTATION: "3",
                                         NUMA_ANNOTATION: "1"})],
            id="bound-by-another-scheduler-becomes-exact",
        ),
        pytest.param(
            [pod("a", "2,3", source="kubelet", requested="0,1")], [Allocation("ns", "a", ("2", "3"))],
            [], id="already-reconciled-is-left-alone",
        ),
        pytest.param(
            [pod("a", "0", source="kubelet")], [Allocation("ns", "a", ("3",))],
            [("a", Outcome.UNRECORDED, {SOURCE_ANNOTATION: "kubelet", GPU_IDS_ANNOTATION: "3",
                                         NUMA_ANNOTATION: "1"})],
            id="our-own-stale-write-is-corrected",
        ),
        pytest.param([], [Allocation("ns", "ghost", ("0",))], [], id="pod-unknown-to-the-watch-is-skipped"),
        pytest.param([pod("a", "0")], [Allocation("ns", "a", ())], [], id="no-devices-nothing-to-do"),
        pytest.param(
            [pod("a", "10,2")], [Allocation("ns", "a", ("10", "9"))],
            [("a", Outcome.OVERRIDDEN, {SOURCE_ANNOTATION: "kubelet", GPU_IDS_ANNOTATION: "9,10",
                                         REQUESTED_ANNOTATION: "2,10"})],
            id="numeric-order-and-unknown-numa-omitted",
        ),
    ],
)  # fmt: skip
def test_decide(
    pods: list[PodRecord], allocs: list[Allocation], expect: list[tuple[str, Outcome, dict]]
) -> None:  # type: ignore[type-arg]
    plan = decide(pods, allocs, NUMA)
    got = [(a.name, a.outcome, dict(a.annotations)) for a in plan.assignments]
    assert got == expect


def test_overridden_assignment_carries_an_event_note_and_only_our_annotations() -> None:
    (a,) = decide([pod("a", "0,1")], [Allocation("ns", "a", ("2", "3"))], NUMA).assignments
    assert "2,3" in a.event_note and "0,1" in a.event_note
    assert set(a.patch()["metadata"]) == {"annotations"}
    assert all(k.startswith("gpuwarden.io/") for k in a.patch()["metadata"]["annotations"])


def test_unknown_pod_is_reported_as_skipped() -> None:
    plan = decide([], [Allocation("ns", "ghost", ("0",))], NUMA)
    assert plan.skipped == (("ns/ghost", "not in the pod watch yet"),)


def test_pod_record_reads_our_annotations() -> None:
    obj = {"metadata": {"namespace": "n", "name": "p", "uid": "u", "annotations": {
        GPU_IDS_ANNOTATION: "3, 1", SOURCE_ANNOTATION: "kubelet", REQUESTED_ANNOTATION: "0,1"}}}  # fmt: skip
    rec = pod_record(obj)
    assert (rec.recorded, rec.source, rec.requested) == (("1", "3"), "kubelet", ("0", "1"))
    assert parse_ids("") is None and parse_ids(None) is None


def cand(name: str, created: str, recorded: str, started: bool = False) -> Candidate:
    ids = parse_ids(recorded)
    assert ids is not None
    return Candidate("ns", name, created, ids, started)


@pytest.mark.parametrize(
    ("cands", "allocated", "available", "must", "size", "want_ids", "want_pod"),
    [
        pytest.param([cand("a", "t1", "GPU-2,GPU-3")], {}, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"], [], 2,
                     ("GPU-2", "GPU-3"), "a", id="the-only-pending-pod"),
        pytest.param([cand("b", "t2", "GPU-0,GPU-1"), cand("a", "t1", "GPU-2,GPU-3")], {},
                     ["GPU-0", "GPU-1", "GPU-2", "GPU-3"], [], 2, ("GPU-2", "GPU-3"), "a",
                     id="oldest-first-as-the-kubelet-admits"),
        pytest.param([cand("a", "t1", "GPU-2,GPU-3", started=True), cand("b", "t2", "GPU-0,GPU-1")], {},
                     ["GPU-0", "GPU-1"], [], 2, ("GPU-0", "GPU-1"), "b", id="started-pods-are-admitted"),
        pytest.param([cand("a", "t1", "GPU-2,GPU-3"), cand("b", "t2", "GPU-0,GPU-1")],
                     {("ns", "a"): ("GPU-2", "GPU-3")}, ["GPU-0", "GPU-1"], [], 2, ("GPU-0", "GPU-1"), "b",
                     id="fully-allocated-pods-are-admitted"),
        pytest.param([cand("a", "t1", "GPU-0,GPU-1,GPU-2")], {("ns", "a"): ("GPU-0",)},
                     ["GPU-1", "GPU-2", "GPU-3"], [], 2, ("GPU-1", "GPU-2"), "a",
                     id="second-container-gets-the-rest"),
        pytest.param([cand("a", "t1", "GPU-2,GPU-3")], {}, ["GPU-0", "GPU-1", "GPU-3"], [], 2, (), None,
                     id="recorded-gpu-taken-no-preference-never-a-guess"),
        pytest.param([cand("four", "t1", "GPU-0,GPU-1,GPU-2,GPU-3"), cand("two", "t1", "GPU-4,GPU-5")], {},
                     [f"GPU-{i}" for i in range(8)], [], 2, ("GPU-4", "GPU-5"), "two",
                     id="same-second-tie-goes-to-the-exact-size"),
        pytest.param([cand("a", "t1", "GPU-0,GPU-1"), cand("b", "t2", "GPU-2,GPU-3")], {},
                     ["GPU-1", "GPU-2", "GPU-3"], [], 2, ("GPU-2", "GPU-3"), "b",
                     id="an-older-pod-that-cannot-fit-is-not-the-one-admitted"),
        pytest.param([], {}, ["GPU-0"], [], 1, (), None, id="nobody-pending"),
        pytest.param([cand("a", "t1", "GPU-1,GPU-2")], {}, ["GPU-0", "GPU-1", "GPU-2"], ["GPU-2"], 2,
                     ("GPU-2", "GPU-1"), "a", id="must-include-kept"),
    ],
)  # fmt: skip
def test_prefer(cands, allocated, available, must, size, want_ids, want_pod) -> None:  # type: ignore[no-untyped-def]
    pref = prefer(cands, allocated, available, must, size)
    assert pref.ids == want_ids
    assert (pref.pod[1] if pref.pod else None) == want_pod
    assert set(pref.ids) <= set(available)  # never prefers a device the kubelet did not offer


def test_candidate_from_pod_objects() -> None:
    base = {"metadata": {"namespace": "n", "name": "p", "creationTimestamp": "2026-12-01T00:00:00Z"}}
    assert candidate(base, None) is None
    c = candidate(base, ("0",))
    assert c is not None and not c.started
    running = {**base, "status": {"containerStatuses": [{"state": {"running": {}}}]}}
    assert candidate(running, ("0",)).started  # type: ignore[union-attr]
    waiting = {**base, "status": {"containerStatuses": [{"state": {"waiting": {"reason": "x"}}}]}}
    assert not candidate(waiting, ("0",)).started  # type: ignore[union-attr]
    done = {**base, "status": {"phase": "Succeeded"}}
    assert candidate(done, ("0",)) is None
