"""The drain plan and gate as tables: scope (GPU or node), exclusions, modes, deadlines, back-off, gate."""

from __future__ import annotations

from typing import Any

import pytest

from controller.drain.plan import (
    DrainNode,
    DrainPod,
    DrainVerdict,
    PodHistory,
    in_scope,
    plan_drains,
    pod_actions,
    rate_limit_note,
)
from gpuwarden.config.drain import DrainConfig

UUIDS = {f"GPU-{i}": str(i) for i in range(8)}
NOW = 10_000.0


def pod(name: str, ids: str | None, *, ns: str = "train", gpus: int | None = None, **kw: Any) -> DrainPod:
    gpu_ids = tuple(ids.split(",")) if ids else None
    count = gpus if gpus is not None else (len(gpu_ids) if gpu_ids else 0)
    return DrainPod(ns, name, f"uid-{name}", gpu_ids, count, **kw)


def node(fault: set[str], **kw: Any) -> DrainNode:
    return DrainNode("n1", frozenset(fault), UUIDS, **kw)


POLICY = DrainConfig.model_validate(
    {
        "enabled": True,
        "rules": [
            {"name": "jobs-finish", "namespaces": ["batch*"], "mode": "allow-completion",
             "completion_deadline_seconds": 600},
            {"name": "precious", "match_labels": {"tier": "precious"}, "mode": "never"},
            {"name": "pdb-delete", "namespaces": ["serve"], "mode": "immediate", "delete_after_seconds": 900},
        ],
    }
)  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "pods", "scope", "moved"),
    [
        pytest.param({"GPU-2"}, [pod("a", "2,3"), pod("b", "4,5")], "gpu", ["a"],
                     id="gpu-fault-only-holders"),
        pytest.param(set(), [pod("a", "2,3"), pod("b", "4,5")], "node", ["a", "b"],
                     id="node-fault-every-gpu-pod"),
        pytest.param({"GPU-unknown"}, [pod("a", "2"), pod("b", "4")], "node", ["a", "b"],
                     id="unmappable-gpu-means-node"),
        pytest.param({"GPU-2"}, [pod("a", "4"), pod("b", None, gpus=1)], "node", ["a", "b"],
                     id="a-gpu-pod-without-a-known-set-widens"),
        pytest.param({"GPU-2"}, [pod("a", "2"), pod("cpu", None, gpus=0)], "gpu", ["a"], id="cpu-pods-never"),
    ],
)  # fmt: skip
def test_scope(fault: set[str], pods: list[DrainPod], scope: str, moved: list[str]) -> None:
    got_scope, chosen = in_scope(node(fault), pods)
    assert got_scope == scope
    assert [p.name for p in chosen] == moved


@pytest.mark.parametrize(
    ("p", "hist", "started", "verdict"),
    [
        pytest.param(pod("a", "0"), None, None, DrainVerdict.EVICT, id="default-immediate"),
        pytest.param(pod("a", "0", ns="kube-system"), None, None, DrainVerdict.REPORT,
                     id="excluded-namespace"),
        pytest.param(pod("a", "0", labels={"gpuwarden.io/drain-exclude": "true"}), None, None,
                     DrainVerdict.REPORT, id="excluded-label"),
        pytest.param(pod("a", "0", labels={"tier": "precious"}), None, None, DrainVerdict.REPORT,
                     id="mode-never"),
        pytest.param(pod("a", "0", ns="batch-x"), None, NOW - 10, DrainVerdict.WAIT,
                     id="allow-completion-waits"),
        pytest.param(pod("a", "0", ns="batch-x"), None, NOW - 700, DrainVerdict.EVICT,
                     id="allow-completion-deadline-passed"),
        pytest.param(pod("a", "0", ns="serve"), PodHistory(NOW - 1000, NOW - 200, 3), NOW - 1000,
                     DrainVerdict.DELETE, id="pdb-refused-past-delete-after"),
        pytest.param(pod("a", "0"), PodHistory(NOW - 5000, NOW - 5, 2), NOW - 5000, DrainVerdict.BACKOFF,
                     id="refused-no-delete-after-backs-off"),
        pytest.param(pod("a", "0"), PodHistory(NOW - 5000, NOW - 200, 8), NOW - 5000, DrainVerdict.EVICT,
                     id="back-off-capped-at-two-minutes"),
    ],
)  # fmt: skip
def test_pod_verdicts(
    p: DrainPod, hist: PodHistory | None, started: float | None, verdict: DrainVerdict
) -> None:
    n = node(set(), started=started, history={p.key: hist} if hist else {})
    _, actions = pod_actions(n, [p], POLICY, NOW)
    assert [a.verdict for a in actions] == [verdict]


@pytest.mark.parametrize(
    "p",
    [
        pod("ds", "0", owner_kinds=("DaemonSet",)),
        pod("static", "0", mirror=True),
        pod("done", "0", phase="Succeeded"),
        pod("failed", "0", phase="Failed"),
    ],
    ids=lambda p: p.name,
)
def test_never_moved(p: DrainPod) -> None:
    _, actions = pod_actions(node(set()), [p], POLICY, NOW)
    assert actions == []


def test_gate_limits_draining_nodes_and_evictions() -> None:
    nodes = [DrainNode(f"n{i}", frozenset(), UUIDS) for i in range(4)]
    pods = {f"n{i}": [pod(f"p{i}-{j}", str(j)) for j in range(3)] for i in range(4)}
    plan = plan_drains(
        nodes, pods, POLICY, NOW, evictions_last_minute=0, gpu_nodes=100, schedulable_gpu_nodes=96
    )
    started = [p.node for p in plan.nodes if p.start]
    assert started == ["n0", "n1"]  # max_draining_nodes 2
    held = [p for p in plan.nodes if p.held]
    assert [p.node for p in held] == ["n2", "n3"]
    assert all(a.verdict is DrainVerdict.BACKOFF for p in held for a in p.actions)
    evicted = [a for p in plan.nodes for a in p.actions if a.verdict is DrainVerdict.EVICT]
    assert len(evicted) == 6  # under the 10/min budget
    plan = plan_drains(
        nodes, pods, POLICY, NOW, evictions_last_minute=8, gpu_nodes=100, schedulable_gpu_nodes=96
    )
    assert len([a for p in plan.nodes for a in p.actions if a.verdict is DrainVerdict.EVICT]) == 2
    assert any("rate limit" in why for why in plan.gate_closed)


@pytest.mark.parametrize(
    ("window", "note"),
    [(60, "eviction rate limit (10/min)"), (15, "eviction rate limit (10 per 15s)"),
     (2.5, "eviction rate limit (10 per 2.5s)")],
)  # fmt: skip
def test_rate_limit_note_names_the_window(window: float, note: str) -> None:
    policy = DrainConfig.model_validate({"enabled": True, "gate": {"rate_window_seconds": window}})
    nodes = [DrainNode("n1", frozenset(), UUIDS)]
    pods = {"n1": [pod(f"p{j}", str(j)) for j in range(3)]}
    plan = plan_drains(
        nodes, pods, policy, NOW, evictions_last_minute=10, gpu_nodes=100, schedulable_gpu_nodes=100
    )
    assert note in plan.gate_closed
    assert rate_limit_note(policy.gate) == note


@pytest.mark.parametrize("bad", [0, -1, True, "a minute"])
def test_rate_window_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ValueError):
        DrainConfig.model_validate({"gate": {"rate_window_seconds": bad}})


def test_capacity_floor_holds_new_drains_but_not_running_ones() -> None:
    running = DrainNode("old", frozenset(), UUIDS, started=NOW - 60)
    fresh = DrainNode("new", frozenset(), UUIDS)
    pods = {"old": [pod("a", "0")], "new": [pod("b", "0")]}
    plan = plan_drains([fresh, running], pods, POLICY, NOW, evictions_last_minute=0, gpu_nodes=10,
                       schedulable_gpu_nodes=5)  # fmt: skip
    by = {p.node: p for p in plan.nodes}
    assert [a.verdict for a in by["old"].actions] == [DrainVerdict.EVICT]
    assert "min_schedulable_percent" in by["new"].held and not by["new"].start


def test_paused_and_done() -> None:
    paused = DrainConfig.model_validate({"enabled": True, "paused": True})
    n = DrainNode("n1", frozenset(), UUIDS, started=NOW - 10)
    plan = plan_drains([n], {"n1": [pod("a", "0")]}, paused, NOW, evictions_last_minute=0, gpu_nodes=4,
                       schedulable_gpu_nodes=4)  # fmt: skip
    assert plan.nodes[0].held == "paused" and plan.nodes[0].actions[0].verdict is DrainVerdict.BACKOFF
    plan = plan_drains([n], {"n1": [pod("cpu", None, gpus=0)]}, POLICY, NOW, evictions_last_minute=0,
                       gpu_nodes=4, schedulable_gpu_nodes=4)  # fmt: skip
    assert plan.nodes[0].done


def test_config_rejects_repeated_rule_names() -> None:
    with pytest.raises(ValueError, match="repeated: a"):
        DrainConfig.model_validate(
            {"rules": [{"name": "a", "mode": "never"}, {"name": "a", "mode": "never"}]}
        )


def test_plan_as_json_and_table() -> None:
    from controller.app import ControllerPlan
    from controller.drain.plan import plan_to_dict

    n = DrainNode("n1", frozenset({"GPU-2"}), UUIDS)
    plan = plan_drains([n], {"n1": [pod("a", "2"), pod("b", "3")]}, POLICY, NOW, evictions_last_minute=0,
                       gpu_nodes=4, schedulable_gpu_nodes=3)  # fmt: skip
    doc = plan_to_dict(plan)
    assert doc["nodes"] == [
        {"node": "n1", "scope": "gpu", "scope_note": "", "start": True, "done": False, "held": "",
         "pods": [{"pod": "train/a", "verdict": "evict", "mode": "immediate", "rule": "default",
                   "reason": "holds a faulty GPU"}]},
    ]  # fmt: skip
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, doc).render_table()
    assert "n1 (gpu scope, draining)" in table and "train/a" in table and "train/b" not in table


def test_a_widened_scope_says_why_in_the_plan() -> None:
    from controller.app import ControllerPlan
    from controller.drain.plan import plan_to_dict

    n = DrainNode("n1", frozenset({"GPU-2"}), UUIDS)
    plan = plan_drains([n], {"n1": [pod("a", "2"), pod("b", None, gpus=1)]}, POLICY, NOW,
                       evictions_last_minute=0, gpu_nodes=4, schedulable_gpu_nodes=3)  # fmt: skip
    doc = plan_to_dict(plan)
    assert doc["nodes"][0]["scope_note"] == "train/b holds GPUs no set names"  # type: ignore[index]
    table = ControllerPlan({}, "", {"clear": [], "evict": [], "hold": []}, doc).render_table()
    assert "n1 (node scope: train/b holds GPUs no set names, draining)" in table


def test_finished_drains_do_not_count_against_the_limit() -> None:
    done = [DrainNode(f"d{i}", frozenset(), UUIDS, started=NOW - 100, finished=True) for i in range(2)]
    fresh = DrainNode("new", frozenset(), UUIDS)
    plan = plan_drains([*done, fresh], {"new": [pod("a", "0")]}, POLICY, NOW, evictions_last_minute=0,
                       gpu_nodes=10, schedulable_gpu_nodes=10)  # fmt: skip
    by = {p.node: p for p in plan.nodes}
    assert by["new"].start and not by["new"].held


def test_a_terminating_pod_is_left_alone_but_keeps_the_drain_open() -> None:
    n = DrainNode("n1", frozenset(), UUIDS, started=NOW - 10)
    pods = {"n1": [pod("going", "0", terminating=True)]}
    plan = plan_drains([n], pods, POLICY, NOW, evictions_last_minute=0, gpu_nodes=4, schedulable_gpu_nodes=4)
    (node_plan,) = plan.nodes
    assert [a.verdict for a in node_plan.actions] == [DrainVerdict.WAIT] and not node_plan.done


def test_back_off_exponent_is_capped() -> None:
    p = pod("a", "0", ns="serve")
    hist = PodHistory(first_refused=NOW - 10**6, last_attempt=NOW - 200, attempts=5000)
    n = node(set(), started=NOW - 10**6, history={p.key: hist})
    _, actions = pod_actions(n, [p], POLICY, NOW)  # no OverflowError; the delete_after path is reached
    assert [a.verdict for a in actions] == [DrainVerdict.DELETE]
