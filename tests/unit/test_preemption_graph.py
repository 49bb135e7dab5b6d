"""The preemption graph: merging the two signals, chain depths (in any arrival order), ping-pong, windows,
pruning, and the back-off fold (table)."""

from __future__ import annotations

import pytest

from controller.preemption.graph import (
    BackoffSpec,
    BackoffState,
    Preemption,
    PreemptionGraph,
    backoff_state,
    load,
)
from controller.preemption.signals import Workload

NOW = 1_700_000_000.0
A, B, C, D = (Workload("ns", n) for n in "abcd")


def graph() -> PreemptionGraph:
    return PreemptionGraph(horizon=600, chain_window=900, backoff=BackoffSpec())


def edge(
    victim_uid: str, victim: Workload, preemptor: Workload | None, at: float, node: str = "n1"
) -> Preemption:
    uid = f"uid-{preemptor.name}-{victim_uid}" if preemptor else ""
    return Preemption(victim_uid, victim, node, NOW + at, preemptor_uid=uid, preemptor=preemptor)


CHAIN = [edge("b1", B, A, 0), edge("c1", C, B, 10), edge("d1", D, C, 20)]


@pytest.mark.parametrize("order", ["in-order", "reversed", "middle-first"])
def test_chain_depths_do_not_depend_on_arrival_order(order: str) -> None:
    g = graph()
    records = {"in-order": CHAIN, "reversed": CHAIN[::-1], "middle-first": [CHAIN[1], CHAIN[2], CHAIN[0]]}[
        order
    ]
    for r in records:
        g.observe(r)
    assert g.depth_as_victim(D, NOW + 30) == 3
    assert g.depth_as_victim(C, NOW + 30) == 2
    assert g.depth_as_victim(A, NOW + 30) == 0
    assert g.depth_histogram() == {1: 1, 2: 1, 3: 1}


def test_condition_then_event_is_one_victim() -> None:
    g = graph()
    first = g.observe(edge("b1", B, None, 0))
    assert first is not None and first.new_victim and not first.preemptor_learned
    assert g.victims(NOW + 1, 300) == 1 and g.victims(NOW + 1, 300, workload=A) == 0
    assert g.observe(edge("b1", B, None, 0)) is None  # the condition again (relist)
    learned = g.observe(edge("b1", B, A, 0.4))
    assert learned is not None and not learned.new_victim and learned.preemptor_learned
    assert learned.record.at == NOW  # the earlier (condition) time is kept
    assert g.victims(NOW + 1, 300) == 1 and g.victims(NOW + 1, 300, workload=A) == 1
    assert g.observe(edge("b1", B, A, 0.4)) is None  # the Event again


def test_ping_pong_is_detected_and_queryable() -> None:
    g = graph()
    first = g.observe(edge("b1", B, A, 0))
    second = g.observe(edge("a1", A, B, 60))
    assert first is not None and not first.ping_pong
    assert second is not None and second.ping_pong
    assert g.preempted(A, B, NOW + 100) and g.preempted(B, A, NOW + 100)
    assert not g.preempted(A, C, NOW + 100)
    assert not g.preempted(A, B, NOW + 901)
    assert g.recent_preemptor("uid-a-b1", NOW + 100) and not g.recent_preemptor("b1", NOW + 100)


def test_windows_count_by_scope() -> None:
    g = graph()
    other = Workload("other-ns", "e")
    load(g, [edge("b1", B, A, 0), edge("b2", B, A, 100), edge("c1", C, other, 200)])
    assert g.victims(NOW + 250, 300) == 3
    assert g.victims(NOW + 250, 200) == 2
    assert g.victims(NOW + 250, 300, namespace="ns") == 2
    assert g.victims(NOW + 250, 300, namespace="other-ns") == 1
    assert g.victims(NOW + 250, 300, workload=A) == 2
    assert g.victims(NOW + 250, 300, workload=B) == 0


def test_prune_forgets_old_records_and_indexes() -> None:
    g = graph()
    load(g, CHAIN)
    g.prune(NOW + 915)  # horizon is max(600, chain window 900)
    assert len(g) == 1 and g.get("d1") is not None
    assert g.depth_as_victim(B, NOW + 915) == 0
    assert g.victims(NOW + 915, 10_000) == 1
    assert not g.preempted(A, B, NOW + 915)
    g.prune(NOW + 10_000)
    assert len(g) == 0 and g.records() == []
    assert g.backoff(C, "n1") is None


S = BackoffSpec(base=60, max=3600, reset=600, burst=30)


@pytest.mark.parametrize(
    ("times", "expect"),
    [
        pytest.param([], None, id="no-history"),
        pytest.param([0], BackoffState(1, 0, 0, 60), id="first-round-waits-base"),
        pytest.param([0, 5, 29], BackoffState(1, 0, 29, 60), id="burst-is-one-round"),
        pytest.param([0, 31], BackoffState(2, 31, 31, 151), id="after-the-burst-a-second-round-doubles"),
        pytest.param([0, 100, 300, 600], BackoffState(4, 600, 600, 1080), id="rounds-keep-doubling"),
        pytest.param(
            [0, 100, 300, 600, 1100, 2100, 4100, 7800],
            BackoffState(8, 7800, 7800, 11400),
            id="capped-at-max",
        ),
        pytest.param([0, 661], BackoffState(1, 661, 661, 721), id="reset-after-quiet-past-the-cooldown"),
        pytest.param([0, 659], BackoffState(2, 659, 659, 779), id="no-reset-just-before"),
    ],
)
def test_backoff_state(times: list[float], expect: BackoffState | None) -> None:
    assert backoff_state(times, S) == expect


def test_backoff_is_per_workload_and_node() -> None:
    g = graph()
    load(g, [edge("b1", B, A, 0, node="n1"), edge("b2", B, A, 40, node="n1"), edge("c1", C, A, 0, node="n2")])
    assert g.backoff(A, "n1") == BackoffState(2, NOW + 40, NOW + 40, NOW + 160)
    assert g.backoff(A, "n2") == BackoffState(1, NOW, NOW, NOW + 60)
    assert g.backoff(B, "n1") is None


def test_reservation_bridges_the_gap_before_the_signals() -> None:
    """The chain is seen while the scheduler's Events are still in flight (tests/e2e cascade)."""
    g = graph()
    g.reserve("uid-a", A, {"n1": [("b1", B.key)], "n2": [("c1", C.key)]}, NOW, depth=1)
    assert g.depth_as_victim(B, NOW + 0.1) == 1 and g.depth_as_victim(C, NOW + 0.1) == 1
    assert g.claimed_by("b1") == ("uid-a", A) and g.claimed_by("x") is None
    assert g.is_victim("b1", "uid-a") and not g.is_victim("b1", "uid-other")
    assert g.victims(NOW + 0.1, 300, workload=A) == 1  # the least it may take
    # the victim's DisruptionTarget arrives first; the observer links it through the reservation
    seen = g.observe(Preemption("b1", B, "n1", NOW + 0.2, preemptor_uid="uid-a", preemptor=A))
    assert seen is not None and seen.record.depth == 1
    assert g.depth_as_victim(C, NOW + 0.3) == 0, "the scheduler chose n1: c1 is no longer a possible victim"
    assert g.victims(NOW + 0.3, 300, workload=A) == 1  # recorded, nothing outstanding
    # the replacement of b1 preempts: its record is depth 2 even before A's own Event arrives
    g.reserve("uid-b", B, {"n3": [("c2", C.key)]}, NOW + 1, depth=2)
    assert g.depth_as_victim(C, NOW + 1.1) == 2
    g.prune(NOW + 40)
    assert g.depth_as_victim(C, NOW + 40) == 0 and len(g.reservations) == 0
