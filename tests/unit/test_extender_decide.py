"""Scenario tables for the extender's pure decisions: filter verdicts, chosen GPU sets, scores.

One row per scenario: the cluster (nodes + pods), the incoming pod, the expected outcome and the reason.
Node "n" is a 2 NUMA x 4 GPU node (NVLink pairs, two PCIe switches per NUMA node) unless a row says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.gpus.fit import (
    Settings,
    choose_gpus,
    filter_nodes,
    score_nodes,
)
from controller.gpus.objects import pod_info
from tests.unit.extender_support import RESOURCE, model, node, nrt, pod, quarantine_record, topology

NOW = 1_700_000_000.0
S = Settings(fleet_max_numa_gpus=4)


@dataclass
class Case:
    id: str
    incoming: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=lambda: [node("n")])
    nrts: list[dict[str, Any]] = field(default_factory=list)
    ids: tuple[str, ...] | None = None  # expected set on "n"; None = rejected
    alignment: str = ""
    reason: str = ""  # expected rejection reason (substring match on the full text)
    resolvable: bool = False
    settings: Settings = S


CASES = [
    # --- NUMA alignment and fragmentation ----------------------------------------------------------
    Case("4gpu-empty-node-one-numa", pod("x", 4), ids=("0", "1", "2", "3"), alignment="numa"),
    Case(
        "4gpu-numa-split-rejected",
        pod("x", 4),
        pods=[pod("a", 2, node="n", ids="0,1"), pod("b", 1, node="n", ids="4")],
        reason="fragmented: 5 free, largest NUMA node has 3 (NUMA0: 2 free, NUMA1: 3 free; "
        "4 requested with policy single-numa)",
        resolvable=False,
    ),
    Case(
        "4gpu-takes-the-free-numa-node",
        pod("x", 4),
        pods=[pod("a", 2, node="n", ids="0,1")],
        ids=("4", "5", "6", "7"),
        alignment="numa",
    ),
    Case(
        "2gpu-tightest-numa-node",
        pod("x", 2),
        pods=[pod("a", 2, node="n", ids="0,1"), pod("b", 1, node="n", ids="4")],
        ids=("2", "3"),
        alignment="nvlink",
    ),
    Case(
        "1gpu-uses-lone-gpu-before-splitting-a-pair",
        pod("x", 1),
        pods=[pod("a", 2, node="n", ids="0,1"), pod("b", 1, node="n", ids="4")],
        ids=("5",),
        alignment="single",
    ),
    Case(
        "2gpu-keeps-nvlink-pair",
        pod("x", 2),
        pods=[pod("a", 1, node="n", ids="0")],
        ids=("2", "3"),
        alignment="nvlink",
    ),
    Case(
        "8gpu-whole-node-spans-fewest-numa-nodes",
        pod("x", 8),
        ids=tuple(str(i) for i in range(8)),
        alignment="whole-numa",
    ),
    Case(
        "8gpu-one-gpu-busy",
        pod("x", 8),
        pods=[pod("a", 1, node="n", ids="7")],
        reason="no 8 free GPUs on 2 NUMA nodes (NUMA0: 4 free, NUMA1: 3 free)",
        resolvable=True,
    ),
    Case(
        "4gpu-small-numa-nodes-unresolvable",
        pod("x", 4),
        nodes=[node("n", topo=topology(4, 2)), node("big")],
        reason="at most 2 healthy GPUs per NUMA node (0: 2, 1: 2, 2: 2, 3: 2); "
        "4 requested with policy single-numa",
    ),
    Case(
        "4gpu-fleet-has-only-small-numa-nodes",
        pod("x", 4),
        nodes=[node("n", topo=topology(4, 2))],
        ids=("0", "1", "2", "3"),
        alignment="whole-numa",
        settings=Settings(fleet_max_numa_gpus=2),
    ),
    Case(
        "6gpu-over-fleet-max-needs-two-numa-nodes",
        pod("x", 6),
        nodes=[node("n", 12, topo=topology(3, 4))],
        pods=[pod("a", 6, node="n", ids="0,1,4,5,8,9")],
        resolvable=False,
        reason="fragmented: 6 free, the 2 fullest NUMA nodes have 4 (NUMA0: 2 free, NUMA1: 2 free, "
        "NUMA2: 2 free; 6 requested with policy single-numa)",
    ),
    Case(
        "6gpu-over-fleet-max-spans-two",
        pod("x", 6),
        nodes=[node("n", 12, topo=topology(3, 4))],
        pods=[pod("a", 2, node="n", ids="0,1")],
        ids=("2", "3", "4", "5", "6", "7"),
        alignment="whole-numa",
    ),
    # --- policies ----------------------------------------------------------------------------------
    Case(
        "prefer-numa-spreads-when-it-must",
        pod("x", 4, policy="prefer-numa"),
        pods=[pod("a", 2, node="n", ids="0,1"), pod("b", 1, node="n", ids="4")],
        ids=("2", "5", "6", "7"),
        alignment="cross-numa",
    ),
    Case(
        "prefer-numa-aligned-when-possible",
        pod("x", 4, policy="prefer-numa"),
        pods=[pod("a", 1, node="n", ids="0")],
        ids=("4", "5", "6", "7"),
        alignment="numa",
    ),
    Case(
        "none-policy-counts-only",
        pod("x", 5, policy="none"),
        pods=[pod("a", 3, node="n", ids="0,1,4")],
        ids=("2", "3", "5", "6", "7"),
        alignment="cross-numa",
    ),
    Case(
        "policy-annotation-case-insensitive",
        pod("x", 2, policy=" Single-PCIe "),
        ids=("0", "1"),
        alignment="nvlink",
    ),
    Case(
        "single-pcie-tightest-switch",
        pod("x", 2, policy="single-pcie"),
        pods=[pod("a", 1, node="n", ids="0")],
        ids=("2", "3"),
        alignment="nvlink",
    ),
    Case(
        "single-pcie-too-big-unresolvable",
        pod("x", 4, policy="single-pcie"),
        reason="at most 2 healthy GPUs per PCIe switch (pci0-0: 2, pci0-1: 2, pci1-0: 2, pci1-1: 2); "
        "4 requested with policy single-pcie",
    ),
    Case(
        "single-pcie-switch-busy",
        pod("x", 2, policy="single-pcie"),
        pods=[pod("a", 4, node="n", ids="0,2,4,6")],
        resolvable=False,
        reason="fragmented: 4 free, largest PCIe switch has 1 (pci0-0: 1 free, pci0-1: 1 free, "
        "pci1-0: 1 free, pci1-1: 1 free; 2 requested with policy single-pcie)",
    ),
    Case(
        "invalid-policy-unresolvable",
        pod("x", 2, policy="pack-tight"),
        reason="invalid gpuwarden.io/topology-policy 'pack-tight': "
        "use single-numa, prefer-numa, single-pcie or none",
    ),
    # --- quarantine --------------------------------------------------------------------------------
    Case(
        "quarantined-gpu-skipped",
        pod("x", 4),
        nodes=[node("n", taint="xid-79", quarantine=quarantine_record("GPU-0001"))],
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "quarantined-gpu-shrinks-node",
        pod("x", 8),
        nodes=[node("n", taint="xid-79", quarantine=quarantine_record("GPU-0001"))],
        reason="only 7 healthy GPUs (1 quarantined: xid-79); 8 requested",
    ),
    Case(
        "quarantined-gpu-breaks-numa-fit",
        pod("x", 4),
        pods=[pod("a", 4, node="n", ids="4,5,6,7")],
        nodes=[node("n", taint="xid-79", quarantine=quarantine_record("GPU-0001"))],
        reason="no NUMA node with 4 free GPUs (NUMA0: 3 free)",
        resolvable=False,
    ),
    Case(
        "node-level-evidence-quarantines-node",
        pod("x", 1),
        nodes=[node("n", taint="gpu-missing", quarantine=quarantine_record(""))],
        reason="GPUs quarantined by gpuwarden (gpu-missing)",
    ),
    Case(
        "taint-without-record-quarantines-node",
        pod("x", 1),
        nodes=[node("n", taint="xid-48")],
        reason="GPUs quarantined by gpuwarden (xid-48)",
    ),
    Case(
        "unmappable-uuid-quarantines-node",
        pod("x", 1),
        nodes=[node("n", taint="xid-79", quarantine=quarantine_record("GPU-ffff"))],
        reason="GPUs quarantined by gpuwarden (xid-79)",
    ),
    Case(
        "record-without-taint-is-released",
        pod("x", 8),
        nodes=[node("n", quarantine=quarantine_record(""))],
        ids=tuple(str(i) for i in range(8)),
    ),
    # --- nominated pods ----------------------------------------------------------------------------
    Case(
        "nominated-higher-priority-reserves-a-numa-node",
        pod("x", 4, priority=0),
        pods=[pod("nom", 4, priority=100, nominated="n")],
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "nominated-higher-priority-fills-node",
        pod("x", 1, priority=0),
        pods=[pod("nom1", 4, priority=100, nominated="n"), pod("nom2", 4, priority=0, nominated="n")],
        reason="0 healthy GPUs free; 1 requested; 8 promised to nominated pods of priority >= 0",
        resolvable=True,
    ),
    Case(
        "nominated-lower-priority-ignored",
        pod("x", 8, priority=10),
        pods=[pod("nom", 4, priority=5, nominated="n")],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "nominated-self-ignored",
        pod("x", 8, priority=10, nominated="n"),
        pods=[pod("x", 8, priority=10, nominated="n")],
        ids=tuple(str(i) for i in range(8)),
    ),
    # --- a nominated pod and the victims its preemption is removing (watch lagging the deletion) -------
    Case(
        "nominated-terminating-victims-on-its-node-count-free",
        pod("x", 8, priority=10, nominated="n"),
        pods=[
            pod("v1", 4, node="n", ids="0,1,2,3", deleting=True),
            pod("v2", 4, node="n", ids="4,5,6,7", disrupted="PreemptionByScheduler"),
        ],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "nominated-lower-priority-victims-not-yet-seen-terminating-count-free",
        pod("x", 8, priority=10, nominated="n"),
        pods=[pod("v1", 4, node="n", ids="0,1,2,3", priority=0), pod("v2", 4, node="n", priority=5)],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "nominated-terminating-victim-frees-only-its-own-gpus",
        pod("x", 4, priority=10, nominated="n"),
        pods=[
            pod("v", 2, node="n", ids="0,1", deleting=True),
            pod("keep", 2, node="n", ids="4,5", priority=10),
        ],
        ids=("0", "1", "2", "3"),
        alignment="numa",
    ),
    Case(
        "not-nominated-pod-does-not-count-terminating-victims-free",
        pod("x", 8, priority=10),
        pods=[pod("v1", 4, node="n", ids="0,1,2,3", deleting=True), pod("v2", 4, node="n", ids="4,5,6,7")],
        reason="no 8 free GPUs on 2 NUMA nodes (none free)",
        resolvable=True,
    ),
    Case(
        "nominated-elsewhere-does-not-count-terminating-victims-free",
        pod("x", 8, priority=10, nominated="other"),
        pods=[pod("v1", 8, node="n", ids="0,1,2,3,4,5,6,7", deleting=True)],
        reason="no 8 free GPUs on 2 NUMA nodes (none free)",
        resolvable=True,
    ),
    Case(
        "nomination-not-yet-visible-lower-priority-preempted-victims-count-free",
        pod("x", 8, priority=10),
        pods=[
            pod("v1", 4, node="n", ids="0,1,2,3", disrupted="PreemptionByScheduler"),
            pod("v2", 4, node="n", ids="4,5,6,7", disrupted="PreemptionByScheduler", deleting=True),
        ],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "not-nominated-preempted-victims-of-equal-priority-still-count",
        pod("x", 8, priority=0),
        pods=[pod("v1", 8, node="n", ids="0,1,2,3,4,5,6,7", disrupted="PreemptionByScheduler")],
        reason="no 8 free GPUs on 2 NUMA nodes (none free)",
        resolvable=True,
    ),
    Case(
        "not-nominated-evicted-not-preempted-still-counts",
        pod("x", 8, priority=10),
        pods=[pod("v1", 8, node="n", ids="0,1,2,3,4,5,6,7", disrupted="EvictionByEvictionAPI")],
        reason="no 8 free GPUs on 2 NUMA nodes (none free)",
        resolvable=True,
    ),
    Case(
        "nominated-pod-blocked-by-equal-or-higher-priority-holders",
        pod("x", 8, priority=10, nominated="n"),
        pods=[
            pod("v", 4, node="n", ids="0,1,2,3", priority=0),
            pod("hi", 4, node="n", ids="4,5,6,7", priority=10),
        ],
        reason="no 8 free GPUs on 2 NUMA nodes (NUMA0: 4 free); 4 counted free: held by pods being preempted",
        resolvable=True,
    ),
    Case(
        "nominated-count-only-lower-priority-victim-counts-free",
        pod("x", 4, priority=10, nominated="n"),
        pods=[pod("v", 8, node="n", priority=0)],
        ids=("0", "1", "2", "3"),
    ),
    # --- pods whose GPU set we cannot see ----------------------------------------------------------
    Case(
        "count-only-pods-placed-adversarially",
        pod("x", 4),
        pods=[pod("other", 2, node="n")],
        resolvable=False,
        reason="fragmented: 6 free, largest NUMA node has 4 (NUMA0: 4 free, NUMA1: 4 free; "
        "4 requested with policy single-numa); 2 held by pods without a recorded GPU set",
    ),
    Case(
        "count-only-pod-one-gpu-still-leaves-a-numa-node",
        pod("x", 4),
        pods=[pod("other", 1, node="n")],
        ids=("0", "1", "2", "3"),
    ),
    Case(
        "count-only-counts-against-total",
        pod("x", 8, policy="none"),
        pods=[pod("other", 1, node="n")],
        reason="7 healthy GPUs free; 8 requested; 1 held by pods without a recorded GPU set",
        resolvable=True,
    ),
    Case(
        "ids-outside-topology-count-as-unknown",
        pod("x", 8, policy="none"),
        pods=[pod("o", 1, node="n", ids="9")],
        reason="7 healthy GPUs free; 8 requested; 1 held by pods without a recorded GPU set",
        resolvable=True,
    ),
    Case(
        "terminated-pods-free-their-gpus",
        pod("x", 8),
        pods=[pod("done", 4, node="n", ids="0,1,2,3", phase="Succeeded")],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "topology-larger-than-allocatable",
        pod("x", 4),
        nodes=[node("n", 4, topo=topology(2, 4))],
        reason="fragmented: 4 free, largest NUMA node has 4 (NUMA0: 4 free, NUMA1: 4 free; "
        "4 requested with policy single-numa); 4 in the topology but not allocatable",
        resolvable=False,
    ),
    # --- claims of concurrent binds ----------------------------------------------------------------
    Case(
        "fresh-claim-of-another-pod-holds-gpus",
        pod("x", 4),
        pods=[pod("c", 4, ids="0,1,2,3", claim=("n", NOW - 5))],
        ids=("4", "5", "6", "7"),
    ),
    Case(
        "expired-claim-releases-gpus",
        pod("x", 8),
        pods=[pod("c", 4, ids="0,1,2,3", claim=("n", NOW - 600))],
        ids=tuple(str(i) for i in range(8)),
    ),
    Case(
        "own-claim-does-not-block-itself",
        pod("x", 4, ids="0,1,2,3", claim=("n", NOW - 1)),
        pods=[pod("x", 4, ids="0,1,2,3", claim=("n", NOW - 1))],
        ids=("0", "1", "2", "3"),
    ),
    # --- unknown / unreadable topology -------------------------------------------------------------
    Case(
        "unknown-topology-multi-gpu-unresolvable",
        pod("x", 2),
        nodes=[node("n", topo=None)],
        reason="GPU topology unknown (no NodeResourceTopology, no gpuwarden.io/gpu-topology annotation); "
        "policy single-numa for 2 GPUs needs it",
    ),
    Case(
        "unknown-topology-single-gpu-fits",
        pod("x", 1),
        nodes=[node("n", topo=None)],
        ids=("0",),
        alignment="single",
    ),
    Case(
        "unknown-topology-prefer-numa-counts",
        pod("x", 2, policy="prefer-numa"),
        nodes=[node("n", topo=None)],
        ids=("0", "1"),
        alignment="unknown",
    ),
    Case(
        "unreadable-topology-unresolvable",
        pod("x", 2),
        nodes=[node("n", topo="{not json")],
        reason="GPU topology unreadable (gpuwarden.io/gpu-topology is not JSON",
    ),
    Case(
        "topology-without-pcie-for-single-pcie",
        pod("x", 2, policy="single-pcie"),
        nodes=[node("n", topo={str(i): {"numa": i // 4} for i in range(8)})],
        reason="GPU topology does not say which PCIe switch each GPU is on; policy single-pcie needs it",
    ),
    Case(
        "nrt-wins-over-annotation",
        pod("x", 4),
        nodes=[node("n", topo=topology(4, 2))],
        nrts=[nrt("n", [4, 4])],
        ids=("0", "1", "2", "3"),
        alignment="numa",
    ),
    Case(
        "nrt-zone-ids",
        pod("x", 2),
        nodes=[node("n", topo=None)],
        nrts=[nrt("n", [4, 4], ids=["4", "5", "6", "7", "0", "1", "2", "3"])],
        pods=[pod("a", 3, node="n", ids="5,6,7")],
        ids=("0", "1"),
        alignment="numa",
    ),
    # --- counts ------------------------------------------------------------------------------------
    Case(
        "more-than-allocatable-unresolvable",
        pod("x", 8),
        nodes=[node("n", 4)],
        reason="node has 4 nvidia.com/gpu allocatable; 8 requested",
    ),
    Case(
        "unknown-node-unresolvable",
        pod("x", 1),
        nodes=[node("other")],
        reason="node not (yet) known to the gpuwarden extender's cache",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_choose_and_filter(case: Case) -> None:
    m = model(case.nodes, case.pods, case.nrts)
    incoming = pod_info(case.incoming, RESOURCE)
    verdict = choose_gpus(incoming, m.view("n"), case.settings, NOW, node="n")
    result = filter_nodes(incoming, [("n", m.view("n"))], case.settings, NOW)
    if case.ids is not None:
        assert verdict.choice is not None, verdict.reason
        assert verdict.choice.ids == case.ids
        if case.alignment:
            assert verdict.choice.alignment == case.alignment
        assert 0 <= verdict.choice.score <= 10
        assert result.passed == ("n",) and not result.failed and not result.unresolvable
    else:
        assert verdict.choice is None, verdict.choice
        assert case.reason in verdict.reason
        assert verdict.resolvable is case.resolvable
        expected = {"n": verdict.reason}
        assert result.passed == ()
        assert (result.failed, result.unresolvable) == ((expected, {}) if case.resolvable else ({}, expected))


def test_filter_splits_candidates_and_keeps_input_order() -> None:
    m = model(
        [node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3", topo=topology(4, 2)), node("gpu-node-4")],
        [pod("a", 2, node="gpu-node-1", ids="0,1"), pod("b", 3, node="gpu-node-1", ids="4,5,6")],
    )
    names = ["gpu-node-4", "gpu-node-1", "gpu-node-3", "gpu-node-2", "gone"]
    incoming = pod_info(pod("x", 4), RESOURCE)
    result = filter_nodes(incoming, [(n, m.view(n)) for n in names], S, NOW)
    assert result.passed == ("gpu-node-4", "gpu-node-2")
    assert result.failed == {"gpu-node-1": "no NUMA node with 4 free GPUs (NUMA0: 2 free, NUMA1: 1 free)"}
    assert set(result.unresolvable) == {"gpu-node-3", "gone"}


def test_pod_without_gpus_passes_every_node_with_score_zero() -> None:
    m = model([node("n")])
    incoming = pod_info(pod("web", 0), RESOURCE)
    nodes = [("n", m.view("n")), ("unknown", None)]
    assert filter_nodes(incoming, nodes, S, NOW).passed == ("n", "unknown")
    assert [h.score for h in score_nodes(incoming, nodes, S, NOW)] == [0, 0]


@dataclass
class ScoreCase:
    id: str
    incoming: dict[str, Any]
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    scores: dict[str, int]
    trends: dict[str, float] = field(default_factory=dict)


SCORES = [
    ScoreCase(
        "tightest-fit-wins",
        pod("x", 2),
        [node("empty"), node("half")],
        [pod("a", 2, node="half", ids="0,1")],
        {"empty": 6, "half": 8},
    ),
    ScoreCase(
        "packing-a-numa-node-beats-opening-one",
        pod("x", 1),
        [node("empty"), node("three-used")],
        [pod("a", 3, node="three-used", ids="0,1,2")],
        {"empty": 5, "three-used": 8},
    ),
    ScoreCase(
        "aligned-beats-cross-numa",
        pod("x", 4, policy="prefer-numa"),
        [node("aligned"), node("split")],
        [
            pod("a", 2, node="aligned", ids="0,1"),
            pod("b", 2, node="split", ids="0,4"),
            pod("c", 2, node="aligned", ids="2,3"),
        ],
        {"aligned": 9, "split": 6},
    ),
    ScoreCase(
        "correctable-error-trend-penalty",
        pod("x", 2),
        [node("calm"), node("noisy"), node("mild")],
        [],
        {"calm": 6, "noisy": 3, "mild": 4},
        trends={"noisy": 50.0, "mild": 5.0},
    ),
    ScoreCase(
        "infeasible-scores-zero",
        pod("x", 4),
        [node("full"), node("ok")],
        [pod("a", 6, node="full", ids="0,1,4,5,6,7")],
        {"full": 0, "ok": 8},
    ),
]


@pytest.mark.parametrize("case", SCORES, ids=[c.id for c in SCORES])
def test_score_nodes(case: ScoreCase) -> None:
    m = model(case.nodes, case.pods)
    m.set_error_trends(case.trends)
    names = [n["metadata"]["name"] for n in case.nodes]
    incoming = pod_info(case.incoming, RESOURCE)
    result = score_nodes(incoming, [(n, m.view(n)) for n in names], S, NOW)
    assert {h.host: h.score for h in result} == case.scores
    assert [h.host for h in result] == names


def test_scores_are_integers_in_range_for_every_request_size() -> None:
    m = model([node("n")], [pod("a", 3, node="n", ids="0,1,5")])
    settings = replace(S, error_trend_penalty=20)
    m.set_error_trends({"n": 100.0})
    for k in range(0, 9):
        for policy in ("single-numa", "prefer-numa", "none", "single-pcie"):
            incoming = pod_info(pod("x", k, policy=policy), RESOURCE)
            for ranked in (
                score_nodes(incoming, [("n", m.view("n"))], S, NOW),
                score_nodes(incoming, [("n", m.view("n"))], settings, NOW),
            ):
                assert isinstance(ranked[0].score, int) and 0 <= ranked[0].score <= 10


def test_unknown_policy_value_is_reported_even_for_one_gpu() -> None:
    m = model([node("n")])
    verdict = choose_gpus(pod_info(pod("x", 1, policy="fastest"), RESOURCE), m.view("n"), S, NOW)
    assert not verdict.fits and not verdict.resolvable and "fastest" in verdict.reason
    json.dumps(verdict.reason)  # plain text, safe to embed in the wire response


# ---------------------------------------------------------------- answers cached on views with claims
# Views are shared by every request until their node changes; answers cached on one must equal what a
# fresh view would answer, also while in-flight claims expire (the clock moves on) or the clock steps back.

CLAIM_TTL = Settings(fleet_max_numa_gpus=4, claim_ttl_seconds=30.0)


def claimed_cluster() -> list[dict[str, Any]]:
    return [
        pod("a", 2, node="n", ids="0,1"),
        pod("c1", 2, ids="2,3", claim=("n", NOW - 25)),  # expires at NOW + 5
        pod("c2", 1, ids="4", claim=("n", NOW - 10)),  # expires at NOW + 20
        pod("c3", 2, ids="6,7", claim=("n", NOW - 40)),  # already expired
    ]


@pytest.mark.parametrize(
    "times",
    [
        [NOW, NOW + 1, NOW + 4.9, NOW + 5, NOW + 6, NOW + 19.9, NOW + 20, NOW + 25],
        [NOW + 6, NOW, NOW + 6, NOW - 100, NOW + 30],  # the clock steps back and forth
        [NOW + 20, NOW + 4, NOW + 21],
    ],
    ids=["forward-across-expiries", "clock-steps-back", "past-the-last-expiry-then-back"],
)
def test_answers_cached_on_a_view_with_claims_equal_fresh_answers(times: list[float]) -> None:
    shared = model([node("n")], claimed_cluster()).view("n")
    assert shared is not None and len(shared.claims) == 3
    for now in times:
        for gpus in (1, 2, 3, 4):
            for who in ("x", "c1", "c2", "y"):  # claim holders and others take turns on one shared view
                incoming = pod_info(pod(who, gpus), RESOURCE)
                fresh = replace(shared, memo={})
                for _ in range(2):  # the second round reads what the first cached
                    case = (now - NOW, gpus, who)
                    assert filter_nodes(incoming, [("n", shared)], CLAIM_TTL, now) == filter_nodes(
                        incoming, [("n", fresh)], CLAIM_TTL, now
                    ), case
                    assert score_nodes(incoming, [("n", shared)], CLAIM_TTL, now) == score_nodes(
                        incoming, [("n", fresh)], CLAIM_TTL, now
                    ), case
                    assert choose_gpus(incoming, shared, CLAIM_TTL, now) == choose_gpus(
                        incoming, fresh, CLAIM_TTL, now
                    ), case


def test_an_expiring_claim_frees_its_gpus_even_after_an_answer_was_cached() -> None:
    shared = model([node("n")], claimed_cluster()).view("n")
    assert shared is not None
    incoming = pod_info(pod("x", 4), RESOURCE)
    before = filter_nodes(incoming, [("n", shared)], CLAIM_TTL, NOW)  # cached while c1 holds 2,3
    after = filter_nodes(incoming, [("n", shared)], CLAIM_TTL, NOW + 5)  # c1 expired: NUMA0 has 2,3 back
    assert before.failed["n"] == "no NUMA node with 4 free GPUs (NUMA1: 3 free)"
    assert after.unresolvable["n"].startswith("fragmented: 5 free, largest NUMA node has 3 (NUMA0: 2 free,")
    assert after.fragmented == ("n",)
    assert choose_gpus(pod_info(pod("x", 2), RESOURCE), shared, CLAIM_TTL, NOW + 21).choice is not None
