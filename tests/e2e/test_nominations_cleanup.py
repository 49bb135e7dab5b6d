"""The nomination cleanup loop against the real kube-scheduler: the stale nominations it leaves are cleared.

The scheduler keeps a preemptor's `nominatedNodeName` when the extender's preempt verb vetoes the next
preemption (reference/scheduler-extender.md section 4.2) — which is exactly what gpuwarden's throttle does
once a budget is spent. Each test makes the real scheduler preempt a victim that stays terminating (a
finalizer holds it), then makes the nominated node unusable (quarantined by our taint / deleted) while a
second preemption is vetoed (workload budget of 1). The loop must hold the nomination while the victim is
terminating (the cascade guard), clear it with a `NominationCleared` Event once the victim is gone, and the
pod then schedules on capacity that appears elsewhere. While the API is unreachable for the controller (its
caches still warm) a stale nomination is decided but nothing is written. Passes are driven with
`run_once()`, never by sleeping.
Fixtures and the in-process `Stack` come from test_preemption_throttle.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from controller.nominations.plan import NominationPlan
from gpuwarden.kube import KubeClient, load_configuration
from harness.testbed import Cluster
from tests.e2e import test_preemption_throttle as shared
from tests.e2e.test_preemption_throttle import Pool, Stack, events, get_pod, running_on, wait

pytestmark = pytest.mark.e2e
pool = shared.pool
priority_classes = shared.priority_classes
stack_port = shared.stack_port

BUDGET_OF_ONE = {
    "preemption": {
        "global_budget": None,
        "namespace_budget": None,
        "workload_budget": {"max_victims": 1, "window_seconds": 300},
    }
}


def nominated(cluster: Cluster, namespace: str, name: str) -> str:
    pod = get_pod(cluster, namespace, name)
    return str(((pod or {}).get("status") or {}).get("nominatedNodeName") or "")


def deleting(cluster: Cluster, namespace: str, name: str) -> bool:
    pod = get_pod(cluster, namespace, name)
    return bool(pod and pod["metadata"].get("deletionTimestamp"))


def release(cluster: Cluster, namespace: str, name: str) -> None:
    """Let a held victim finish terminating (remove our test finalizer)."""
    patch = json.dumps({"metadata": {"finalizers": None}})
    cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=merge", "-p", patch, check=False)


def annotation(cluster: Cluster, namespace: str) -> str | None:
    meta = (get_pod(cluster, namespace, "preemptor") or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get("gpuwarden.io/nomination")


def unreachable(cluster: Cluster) -> KubeClient:
    """A client for this cluster whose API server address answers nothing (a network partition)."""
    configuration = load_configuration(kubeconfig=cluster.kubeconfig)
    configuration.host = "https://127.0.0.1:9"
    return KubeClient(configuration, request_timeout=2.0)


def held(plan: NominationPlan, name: str) -> str:
    return next((h.reason.value for h in plan.holds if h.pod.name == name), "")


@pytest.fixture
def victim_released(cluster: Cluster, namespace: str) -> Iterator[None]:
    yield
    release(cluster, namespace, "low-a")  # never leave a finalizer behind (the namespace could not go)


def preempt_onto_a(cluster: Cluster, namespace: str, pool: Pool) -> str:
    """low-a (held) on a, low-b on b, then `preemptor` takes a: nominated there while low-a terminates."""
    cluster.apply(
        pool.pod(namespace, "low-a", 100, nodes=["a"], hold=True),
        pool.pod(namespace, "low-b", 150, nodes=["b"]),
    )
    both = ("low-a", "low-b")
    wait(cluster, namespace, lambda: all(running_on(cluster, namespace, n) for n in both), "victims running")
    cluster.apply(pool.pod(namespace, "preemptor", 500))
    node_a = pool.node("a")

    def nominated_while_held() -> bool:
        return nominated(cluster, namespace, "preemptor") == node_a and deleting(cluster, namespace, "low-a")

    wait(cluster, namespace, nominated_while_held, "preemptor nominated to a, low-a terminating")
    return node_a


def pass_until(stack: Stack, cluster: Cluster, namespace: str, check: Any, what: str) -> NominationPlan:
    def probe() -> NominationPlan | None:
        plan = stack.call(stack.nominations.run_once())
        return plan if check(plan) else None

    return wait(cluster, namespace, probe, what, timeout=60, interval=1.0)  # type: ignore[no-any-return]


def test_nomination_to_a_quarantined_node_is_cleared_once_its_victim_is_gone(
    cluster: Cluster, namespace: str, stack_port: int, pool: Pool, victim_released: None
) -> None:
    pool.add("a", "b")
    elsewhere = Pool(cluster, uuid.uuid4().hex[:4])
    stack = Stack(cluster, stack_port, BUDGET_OF_ONE).start()
    try:
        node_a = preempt_onto_a(cluster, namespace, pool)
        shared.capture("pod_victim_terminating.json", get_pod(cluster, namespace, "low-a") or {})
        plan = pass_until(stack, cluster, namespace, lambda p: held(p, "preemptor"), "the loop sees it")
        assert held(plan, "preemptor") == "victim-terminating"
        record = wait(cluster, namespace, lambda: annotation(cluster, namespace), "nomination record")
        assert json.loads(record)["node"] == node_a

        cluster.kubectl("taint", "nodes", node_a, "gpuwarden.io/gpu-unhealthy=xid-79:NoSchedule")
        # The taint alone does not make kube-scheduler retry the preemptor: it was rejected by NodeAffinity
        # and NodeResourcesFit, whose queueing hints skip a node's taint change, so it waits in the
        # unschedulable queue for the victim's delete (or the 5-minute flush). In a cluster the next retry
        # comes from other churn; here an unrelated 1-GPU node (another pool's: the preemptor cannot land
        # there) joins, a Node Add that NodeResourcesFit's hint requeues on. One node watch delivers both
        # events in order, so the retry sees the taint.
        elsewhere.add("x")
        throttled = wait(cluster, namespace, lambda: events(cluster, namespace, "PreemptionThrottled"),
                         "second preemption (onto b) vetoed")  # fmt: skip
        assert throttled[0]["regarding"]["name"] == "preemptor" and "budget spent" in throttled[0]["note"]
        plan = stack.call(stack.nominations.run_once())
        hold = next(h for h in plan.holds if h.pod.name == "preemptor")
        assert hold.reason.value == "victim-terminating" and "quarantined" in hold.message, hold
        assert nominated(cluster, namespace, "preemptor") == node_a
        assert not events(cluster, namespace, "NominationCleared")

        release(cluster, namespace, "low-a")
        pass_until(stack, cluster, namespace, lambda p: any(c.pod.name == "preemptor" for c in p.clears),
                   "nomination judged stale")  # fmt: skip
        assert stack.nominations.last_result is not None and stack.nominations.last_result.cleared
        cleared = wait(cluster, namespace, lambda: events(cluster, namespace, "NominationCleared"), "Event")
        assert cleared[0]["regarding"]["name"] == "preemptor"
        assert "quarantined by gpuwarden (xid-79)" in cleared[0]["note"]
        assert (
            stack.metric("gpuwarden_nominations_cleared_total", reason="node-quarantined", dry_run="false")
            == 1
        )
        wait(cluster, namespace, lambda: not nominated(cluster, namespace, "preemptor"), "nomination gone")
        assert running_on(cluster, namespace, "low-b"), "the vetoed preemption left low-b running"

        node_c = pool.add("c")[0]
        wait(
            cluster,
            namespace,
            lambda: running_on(cluster, namespace, "preemptor") == node_c,
            "preemptor on c",
        )
    finally:
        stack.stop()
        elsewhere.delete()


def test_nomination_to_a_deleted_node_is_cleared(
    cluster: Cluster, namespace: str, stack_port: int, pool: Pool, victim_released: None
) -> None:
    pool.add("a", "b")
    stack = Stack(cluster, stack_port, BUDGET_OF_ONE).start()
    try:
        node_a = preempt_onto_a(cluster, namespace, pool)
        cluster.kubectl("delete", "node", node_a, "--wait=false")
        plan = pass_until(stack, cluster, namespace, lambda p: "no longer exists" in next(
            (h.message for h in p.holds if h.pod.name == "preemptor"), ""), "node deletion seen")  # fmt: skip
        assert held(plan, "preemptor") == "victim-terminating", "the victim's pod still terminates"

        release(cluster, namespace, "low-a")
        wait(cluster, namespace, lambda: get_pod(cluster, namespace, "low-a") is None, "victim gone")
        # the API becomes unreachable for the controller (its caches stay warm): the stale nomination is
        # decided, but nothing is written and no Event claims otherwise
        live = stack.nominations.actuator.client
        stack.nominations.actuator.client = unreachable(cluster)
        try:
            stale = "nomination judged stale"
            pass_until(
                stack,
                cluster,
                namespace,
                lambda p: any(c.reason.value == "node-gone" for c in p.clears),
                stale,
            )
            result = stack.nominations.last_result
            assert result is not None and not result.cleared and result.guarded, "unknown is never stale"
        finally:
            dead, stack.nominations.actuator.client = stack.nominations.actuator.client, live
            stack.call(dead.aclose())  # type: ignore[attr-defined]
        assert nominated(cluster, namespace, "preemptor") == node_a
        assert not events(cluster, namespace, "NominationCleared")
        pass_until(stack, cluster, namespace, lambda p: bool(stack.nominations.last_result
                   and stack.nominations.last_result.cleared), "cleared once the API is back")  # fmt: skip
        cleared = wait(cluster, namespace, lambda: events(cluster, namespace, "NominationCleared"), "Event")
        assert f"node {node_a} no longer exists" in cleared[0]["note"]
        wait(cluster, namespace, lambda: not nominated(cluster, namespace, "preemptor"), "nomination gone")

        node_c = pool.add("c")[0]
        wait(
            cluster,
            namespace,
            lambda: running_on(cluster, namespace, "preemptor") == node_c,
            "preemptor on c",
        )
    finally:
        stack.stop()
