"""The cross-tenant preemption rule (`preemption.tenants`) with the real kube-scheduler and all four verbs.

Two tenants by namespace label (`gpuwarden.io/tenant`): team-a (the preemptor's namespace) and team-b (the
victims' namespace). The controller's pieces run as in test_gpu_preemption.py (extender, throttle with the
GPU model and the tenant feed, GPU preemption loop) in this process.

Proofs, through the scheduler's own preemption (the `preempt` verb): a high-priority 4-GPU pod of team-a on
a node full of team-b pods; team-b at its share (a ResourceQuota `requests.nvidia.com/gpu: 8`) -> nothing
evicted, `PreemptionThrottled` on the preemptor says why, the metric counts `tenant`; team-b over its share
(config `guaranteed_gpus: 4`, it holds 8) -> the one 4-GPU victim that brings it back to its share is
evicted and the pod binds. Through GPU preemption on a fragmented node (make-room): team-b at its share ->
nothing evicted, the Event says why; over its share by 2 -> exactly one 2-GPU pod evicted, the pod binds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.testbed import Cluster, ensure_namespace, poll
from tests.e2e.conftest import free_port, gpuwarden_extender, scheduler_calling
from tests.e2e.test_gpu_preemption import (
    PREFIX,
    PRIORITIES,
    Pool,
    fragment,
    notes,
    pclass,
    running,
    wait_fragmented,
)
from tests.e2e.test_preemption_throttle import get_pod, running_on

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def port(cluster: Cluster) -> Iterator[int]:
    """Our extender's port, with the session scheduler using all four verbs for the module."""
    cluster.apply(
        *({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pclass(k)},
           "value": v} for k, v in PRIORITIES.items())
    )  # fmt: skip
    chosen = free_port()
    try:
        with scheduler_calling(cluster, gpuwarden_extender(chosen, PREFIX)):
            yield chosen
    finally:
        cluster.kubectl("delete", "priorityclass", *(pclass(k) for k in PRIORITIES), "--ignore-not-found",
                        check=False)  # fmt: skip


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[Pool]:
    created = Pool(cluster)
    try:
        yield created
    finally:
        created.delete()


@dataclass(frozen=True)
class Tenants:
    a: str  # team-a's namespace (the preemptor's)
    b: str  # team-b's namespace (the victims')
    team_b: str  # team-b's tenant name, unique per test: namespaces of earlier tests may still be going


@pytest.fixture
def tenants(cluster: Cluster, namespace: str) -> Iterator[Tenants]:
    """Two namespaces labelled with two tenants of their own."""
    suffix = namespace[-5:]
    cluster.kubectl("label", "namespace", namespace, f"gpuwarden.io/tenant=team-a-{suffix}", "--overwrite")
    other = f"{namespace[:50]}-b"
    ensure_namespace(cluster, other, labels={"gpuwarden.io/tenant": f"team-b-{suffix}"})
    try:
        yield Tenants(namespace, other, f"team-b-{suffix}")
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found", check=False)


def over_share(team_b: str, guaranteed_b: int | None) -> dict[str, Any]:
    tenants: dict[str, Any] = {"rule": "over-share"}
    if guaranteed_b is not None:
        tenants["tenants"] = [{"name": team_b, "guaranteed_gpus": guaranteed_b}]
    return {"tenants": tenants}


def fill(cluster: Cluster, pool: Pool, ns: str, node: str) -> None:
    """Two 4-GPU team-b pods holding the whole node: b1 on NUMA0, b2 on NUMA1."""
    cluster.apply(
        pool.pod(ns, "b1", 4, "mid", node=node, ids="0,1,2,3"),
        pool.pod(ns, "b2", 4, "mid", node=node, ids="4,5,6,7"),
    )
    poll(lambda: running_on(cluster, ns, "b1") and running_on(cluster, ns, "b2"), timeout=60, what="b runs")


def gpu_quota(cluster: Cluster, ns: str, gpus: int) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}}
    )  # fmt: skip


def test_preempt_verb_refuses_victims_of_a_tenant_at_its_share(
    cluster: Cluster, port: int, pool: Pool, tenants: Tenants
) -> None:
    a, b, team_b = tenants.a, tenants.b, tenants.team_b
    (node,) = pool.add("n")
    fill(cluster, pool, b, node)
    gpu_quota(cluster, b, 8)  # after b's pods run: team-b's share is its quota, 8 GPUs, all held
    with running(cluster, port, preemption=over_share(team_b, None)) as stack:
        cluster.apply(pool.pod(a, "p", 4, "high"))
        poll(lambda: notes(cluster, a, "PreemptionThrottled", "p"), timeout=60, what="throttle event")
        (note, *_) = notes(cluster, a, "PreemptionThrottled", "p")
        assert "tenant rule:" in note and f"tenant {team_b}, which holds 8 GPUs of a 8-GPU share" in note, (
            note
        )
        assert stack.metric("gpuwarden_preemption_throttled_total", reason="tenant") >= 1
        assert running_on(cluster, b, "b1") and running_on(cluster, b, "b2")
        assert not running_on(cluster, a, "p")
        assert not (get_pod(cluster, a, "p") or {}).get("status", {}).get("nominatedNodeName")


def test_preempt_verb_takes_what_a_tenant_holds_beyond_its_share(
    cluster: Cluster, port: int, pool: Pool, tenants: Tenants
) -> None:
    a, b, team_b = tenants.a, tenants.b, tenants.team_b
    (node,) = pool.add("n")
    fill(cluster, pool, b, node)
    with running(cluster, port, preemption=over_share(team_b, 4)):  # team-b holds 8, guaranteed 4
        cluster.apply(pool.pod(a, "p", 4, "high"))
        poll(lambda: running_on(cluster, a, "p") == node, timeout=90, what="preemptor bound")
        left = [n for n in ("b1", "b2") if running_on(cluster, b, n)]
        assert len(left) == 1, left  # exactly the 4 GPUs team-b held beyond its share
        assert not notes(cluster, a, "PreemptionThrottled", "p")


def test_make_room_respects_the_share_then_takes_the_excess(
    cluster: Cluster, port: int, pool: Pool, tenants: Tenants
) -> None:
    a, b, team_b = tenants.a, tenants.b, tenants.team_b
    (node,) = pool.add("n")
    fragment(cluster, pool, b, node, ("x", "mid"), ("y", "mid"))  # team-b holds 4 GPUs, 2 + 2
    with running(cluster, port, preemption=over_share(team_b, 4)) as stack:  # at its share: refused
        cluster.apply(pool.pod(a, "p", 4, "high"))
        wait_fragmented(cluster, a, "p")
        done = stack.pass_once()
        assert done.evicted == [] and done.started == [], done.to_dict()
        poll(lambda: notes(cluster, a, "PreemptionThrottled", "p"), timeout=30, what="throttle event")
        (note,) = notes(cluster, a, "PreemptionThrottled", "p")
        assert note.startswith("GPU preemption refused: ") and "tenant rule:" in note, note
        assert "holds 4 GPUs of a 4-GPU share" in note, note
        assert stack.metric("gpuwarden_preemption_throttled_total", reason="tenant") == 1
        rows = {r["tenant"]: r for r in done.to_dict()["tenants"]}
        assert (rows[team_b]["guaranteed"], rows[team_b]["held"], rows[team_b]["preemptable"]) == (
            4,
            4,
            0,
        )
        assert running_on(cluster, b, "x") and running_on(cluster, b, "y")
    with running(cluster, port, preemption=over_share(team_b, 2)) as stack:  # 2 over its share: one 2-GPU pod
        wait_fragmented(cluster, a, "p")  # the scheduler's verdict again, from this stack's extender
        done = stack.pass_once()
        assert len(done.evicted) == 1 and done.evicted[0].startswith(f"{b}/"), done.to_dict()
        poll(lambda: running_on(cluster, a, "p") == node, timeout=90, what="preemptor bound")
        assert sum(bool(running_on(cluster, b, n)) for n in ("x", "y")) == 1
