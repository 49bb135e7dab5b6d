"""What the real Karpenter (kwok cloud provider) does for each reason gpuwarden rejects or delays a GPU pod.

Measured, not wished: every test states the outcome observed with Karpenter v1.15 and gpuwarden as they are
now - `stuck` (the pod stays pending and no node is launched), `needless node` (a node is launched for a pod
that an existing node gets anyway) or `right` - and fails if that outcome changes, so a fix (or a Karpenter
upgrade) has to restate it here. The module's table (`OUTCOMES`) is the one docs/extender.md quotes.

Set-up, per module: the session scheduler calls all four of our verbs (as in test_gpu_preemption.py), the
controller's pieces (extender, throttle, make-room loop, whose passes run when a test calls them) run in this
process, and one Karpenter process serves a NodePool per test. Each test's pool is private: its static
nodes (kwok nodes created as the fleet's are, with gpuwarden's topology annotation, 2 NUMA x 4 GPUs) and
the nodes Karpenter launches for it share a label and a taint that only that test's pods select and
tolerate, so Karpenter's simulation of existing nodes sees exactly the pool's static nodes for them.
Karpenter's launched nodes carry the same labels, the GPU feature discovery labels and the topology
annotation through the NodePool template.

Karpenter's tell-tales read here: a `Nominated` Event (`Pod should schedule on: node/...`) when it believes a
pending pod fits an existing node, and NodeClaims when it launches.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.health.act import Actuator
from controller.health.metrics import HealthMetrics
from controller.health.plan import Action, BreakerDecision, HealthPlan
from controller.health.snapshot import BreakerState, Taint
from gpuwarden.kube import EventRecorder, KubeClient
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DISRUPTION_HOLD, KARPENTER_DO_NOT_DISRUPT, QUARANTINE_RECORD, QUARANTINE_TAINT
from harness.testbed import Cluster, ensure_namespace, poll
from harness.testbed.binaries import TestbedMissingError
from harness.testbed.karpenter import Karpenter, KarpenterBuild, gpu_node_pool
from tests.e2e.conftest import free_port, gpuwarden_extender, scheduler_calling
from tests.e2e.test_gpu_preemption import (
    POOL_LABEL,
    PREFIX,
    PRIORITIES,
    Pool,
    fragment,
    notes,
    pclass,
    running,
    scheduled_message,
    wait_fragmented,
)
from tests.e2e.test_preemption_throttle import get_pod, running_on

pytestmark = pytest.mark.e2e

OBSERVE_SECONDS = 20.0
"""How long a test watches for a NodeClaim that should not come: Karpenter batches pending pods for 1 s
(BATCH_IDLE_DURATION here) and at most 10 s, then launches within a second on kwok."""

REGISTRATION_DELAY = "15s"
"""A launched node appears this long after its NodeClaim (a cloud instance boots for a minute or more; kwok's
would be instant, which no real fleet sees and which would hide the race between make-room and a launch)."""

OUTCOMES = {
    "fragmentation (make-room cannot help)": "stuck",
    "GPU-level quarantine (only candidate)": "right",
    "tenant boundary (node full of another tenant at its share)": "right",
    "make-room on a fragmented node": "right",
    "make-room short by count (idle reclaim)": "needless node",
    "consolidation of a quarantined empty node": "removed",
}
"""Before: gpuwarden as it was (every switch at its default). `AFTER`: with the switch named."""
AFTER = {
    "consolidation of a quarantined empty node": "kept until released (health.hold_autoscaler_disruption)"
}


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


@pytest.fixture(scope="module")
def karpenter(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Karpenter]:
    missing: str | None = None
    try:
        build = KarpenterBuild.locate()
    except TestbedMissingError as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    process = Karpenter(
        cluster, tmp_path_factory.mktemp("karpenter"), build=build, registration_delay=REGISTRATION_DELAY
    ).start()
    try:
        yield process
    finally:
        process.stop()


def launched_topology() -> dict[str, Any]:
    """What the node agent would publish on a launched node: 2 NUMA x 4 GPUs (no UUIDs: the template is
    shared by every node of the pool)."""
    return {str(i): {"numa": i // 4, "pcie": f"pci{i // 2}"} for i in range(8)}


@dataclass
class Autoscaled:
    """A test's pool (static nodes, `Pool`) and the NodePool of the same label and taint."""

    pool: Pool
    karpenter: Karpenter
    name: str

    def claims(self) -> list[dict[str, Any]]:
        return self.karpenter.nodeclaims(self.name)

    def launched(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.karpenter.nodes(self.name)]


@pytest.fixture
def autoscaled(cluster: Cluster, karpenter: Karpenter) -> Iterator[Autoscaled]:
    pool = Pool(cluster)
    taint = {"key": POOL_LABEL, "value": pool.label, "effect": "NoSchedule"}
    name = karpenter.add_pool(
        gpu_node_pool(
            pool.label,
            labels={POOL_LABEL: pool.label, "e2e-node": "launched"},
            topology=launched_topology(),
            taints=[taint],
            consolidate_after="5s",
        )
    )
    try:
        yield Autoscaled(pool, karpenter, name)
    finally:
        karpenter.delete_pool(name)
        pool.delete()


def nominated_by_karpenter(cluster: Cluster, ns: str, pod: str) -> list[str]:
    """Karpenter's `Nominated` Events on the pod: it believes the pod fits that existing node."""
    return [n for n in notes(cluster, ns, "Nominated", pod) if n.startswith("Pod should schedule on: node/")]


def stays_without_claims(scaled: Autoscaled, seconds: float = OBSERVE_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert scaled.claims() == [], [c["metadata"]["name"] for c in scaled.claims()]
        time.sleep(1)


def test_fragmentation_without_make_room_is_stuck(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """4 GPUs free by count (2 + 2) but none NUMA-aligned, held by pods make-room may not take: Karpenter
    believes the pod fits the existing node and launches nothing; the pod stays pending."""
    pool = autoscaled.pool
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "top"), ("b", "top"))
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        wait_fragmented(cluster, namespace, "p")
        poll(
            lambda: nominated_by_karpenter(cluster, namespace, "p"), timeout=60, what="Karpenter's nomination"
        )
        assert nominated_by_karpenter(cluster, namespace, "p")[0] == f"Pod should schedule on: node/{node}"
        assert stack.pass_once().evicted == []
        stays_without_claims(autoscaled)
        assert not running_on(cluster, namespace, "p")
        assert "fragmented:" in scheduled_message(cluster, namespace, "p")


def quarantine(cluster: Cluster, node: str, gpu_index: int) -> None:
    """A GPU-level quarantine as the health loop writes it: our NoSchedule taint and the record naming the
    faulty GPU's UUID (the static node's topology maps it)."""
    ev = Evidence("xid-79", gpu=f"GPU-{node}-{gpu_index}", xid=79, first_seen=time.time())
    record = QuarantineRecord("quarantined", "xid-79", reason_class="hw_pcie", evidence=(ev,),
                              quarantined_at=time.time()).encode()  # fmt: skip
    cluster.kubectl("annotate", "node", node, f"{QUARANTINE_RECORD}={record}", "--overwrite")
    cluster.kubectl("taint", "node", node, f"{QUARANTINE_TAINT}=xid-79:NoSchedule", "--overwrite")


def test_a_gpu_level_quarantine_gets_a_new_node(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """The only static node has 1 quarantined GPU and 7 free: our NoSchedule taint is visible to Karpenter,
    which launches a node; the pod binds there NUMA-aligned."""
    pool = autoscaled.pool
    (node,) = pool.add("n")
    quarantine(cluster, node, 0)
    with running(cluster, port):
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: autoscaled.launched(), timeout=90, what="a launched node")
        poll(lambda: running_on(cluster, namespace, "p"), timeout=120, what="p bound")
        assert running_on(cluster, namespace, "p") in autoscaled.launched()
        final = get_pod(cluster, namespace, "p") or {}
        assert final["metadata"]["annotations"]["gpuwarden.io/numa-node"] in ("0", "1")
        assert len(autoscaled.claims()) == 1
        assert not nominated_by_karpenter(cluster, namespace, "p")


def test_a_tenant_boundary_on_a_full_node_gets_a_new_node(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """The static node is full of another tenant's lower-priority pods, that tenant at its share: the
    preempt verb refuses them; full by count, Karpenter launches a node and the pod binds there."""
    pool = autoscaled.pool
    (node,) = pool.add("n")
    suffix = uuid.uuid4().hex[:5]
    cluster.kubectl("label", "namespace", namespace, f"gpuwarden.io/tenant=team-a-{suffix}", "--overwrite")
    other = f"{namespace[:50]}-b"
    ensure_namespace(cluster, other, labels={"gpuwarden.io/tenant": f"team-b-{suffix}"})
    try:
        cluster.apply(
            pool.pod(other, "b1", 4, "mid", node=node, ids="0,1,2,3"),
            pool.pod(other, "b2", 4, "mid", node=node, ids="4,5,6,7"),
        )
        poll(lambda: running_on(cluster, other, "b1") and running_on(cluster, other, "b2"), timeout=60,
             what="b runs")  # fmt: skip
        cluster.apply(
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": other},
             "spec": {"hard": {"requests.nvidia.com/gpu": "8"}}}
        )  # fmt: skip
        with running(cluster, port, preemption={"tenants": {"rule": "over-share"}}):
            cluster.apply(pool.pod(namespace, "p", 4, "high"))
            poll(lambda: running_on(cluster, namespace, "p"), timeout=120, what="p bound")
            assert running_on(cluster, namespace, "p") in autoscaled.launched()
            assert running_on(cluster, other, "b1") and running_on(cluster, other, "b2")
            assert len(autoscaled.claims()) == 1
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found", check=False)


def test_make_room_on_a_fragmented_node_launches_nothing(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """Fragmented by lower-priority pods: free by count, so Karpenter nominates the existing node and
    launches nothing; make-room evicts one pod and the preemptor binds there."""
    pool = autoscaled.pool
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "mid"), ("b", "mid"))
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        wait_fragmented(cluster, namespace, "p")
        poll(
            lambda: nominated_by_karpenter(cluster, namespace, "p"), timeout=60, what="Karpenter's nomination"
        )
        assert stack.pass_once().evicted == [f"{namespace}/a"]
        poll(lambda: running_on(cluster, namespace, "p") == node, timeout=90, what="preemptor bound")
        stays_without_claims(autoscaled, seconds=5)


def test_make_room_short_by_count_launches_a_needless_node(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """Full by count, one of the two pods idle-reclaimable at the preemptor's own priority: Karpenter sees
    no room and launches a node; make-room reclaims the idle pod's GPUs on the existing node anyway - one
    node launched for a pod that did not need it."""
    pool = autoscaled.pool
    (node,) = pool.add("n")
    idle = pool.pod(namespace, "idle", 4, "high", node=node, ids="4,5,6,7")
    idle["metadata"]["annotations"] |= {
        "gpuwarden.io/idle-since": "2026-01-01T00:00:00Z",
        "gpuwarden.io/idle-reclaimable": "true",
    }
    cluster.apply(pool.pod(namespace, "busy", 4, "high", node=node, ids="0,1,2,3"), idle)
    poll(lambda: running_on(cluster, namespace, "busy") and running_on(cluster, namespace, "idle"),
         timeout=60, what="both run")  # fmt: skip
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: "Insufficient nvidia.com/gpu" in scheduled_message(cluster, namespace, "p"), timeout=60,
             what="p short by count")  # fmt: skip
        # make-room acts on pods pending >= 5 s, every 10 s by default; Karpenter within its 1 s batch
        poll(lambda: autoscaled.claims(), timeout=OBSERVE_SECONDS, what="a NodeClaim")
        done = stack.pass_once()
        assert done.evicted == [f"{namespace}/idle"], done.to_dict()
        poll(lambda: running_on(cluster, namespace, "p"), timeout=90, what="preemptor bound")
        assert running_on(cluster, namespace, "p") == node
        assert len(autoscaled.claims()) == 1  # launched for nothing (consolidation removes it later)


def test_consolidation_removes_an_empty_node_under_quarantine(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """A launched node quarantined (node-level evidence: our taint and record) and then emptied: Karpenter's
    consolidation deletes it, evidence and all, although the health loop has not released it."""
    pool = autoscaled.pool
    with running(cluster, port):
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: running_on(cluster, namespace, "p"), timeout=120, what="p bound on a launched node")
    (node,) = autoscaled.launched()
    assert running_on(cluster, namespace, "p") == node
    record = QuarantineRecord("quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),),
                              quarantined_at=time.time()).encode()  # fmt: skip
    cluster.kubectl("annotate", "node", node, f"{QUARANTINE_RECORD}={record}", "--overwrite")
    cluster.kubectl("taint", "node", node, f"{QUARANTINE_TAINT}=gpu-missing:NoSchedule", "--overwrite")
    cluster.kubectl("delete", "pod", "-n", namespace, "p", "--wait=true", timeout=60)
    poll(lambda: not autoscaled.launched() and not autoscaled.claims(), timeout=120,
         what="the quarantined node consolidated away")  # fmt: skip
    disrupted = [line for line in autoscaled.karpenter.lines("disrupting node(s)") if node in line]
    assert disrupted, "the node left otherwise than by Karpenter's disruption"
    assert "delete" in disrupted[0].lower(), disrupted[0]


def health_plan(node: str, action: Action, now: float) -> HealthPlan:
    """A one-action plan as the health loop's decision makes it (the decision is table-tested in unit)."""
    starts = ((node, now),) if action.kind == "quarantine" else ()
    breaker = BreakerDecision(before=BreakerState(), after=BreakerState(starts=starts), quarantined=1,
                              limit=10, new_in_window=len(starts), new_limit=10)  # fmt: skip
    return HealthPlan(now=now, dry_run=False, actions=(action,), skips=(), breaker=breaker)


def apply_plan(cluster: Cluster, namespace: str, plan: HealthPlan, *, hold: bool) -> None:
    """The health loop's actuator (health.hold_autoscaler_disruption = `hold`) applies `plan`."""

    async def go() -> None:
        kube = KubeClient.from_config(kubeconfig=cluster.kubeconfig)
        try:
            recorder = EventRecorder(kube, component="health", instance="e2e")
            actuator = Actuator(
                kube,
                recorder,
                HealthMetrics(CollectorRegistry()),
                namespace=namespace,
                breaker_configmap=f"breaker-{uuid.uuid4().hex[:5]}",
                hold_disruption=hold,
            )
            result = await actuator.apply(plan)
            assert result.failures == 0, result
        finally:
            await kube.aclose()

    asyncio.run(go())


HELD_SECONDS = 45.0
"""How long the held node is watched once empty: an unheld one goes well within it (the test above, and this
one after its release)."""


def consolidatable(scaled: Autoscaled) -> bool:
    """Karpenter's NodeClaim condition: it would consolidate the node now, were nothing to block it."""
    return any(
        c.get("type") == "Consolidatable" and c.get("status") == "True"
        for claim in scaled.claims()
        for c in (claim.get("status") or {}).get("conditions") or []
    )


def test_with_the_hold_consolidation_keeps_a_quarantined_node_until_its_release(
    cluster: Cluster, port: int, autoscaled: Autoscaled, namespace: str
) -> None:
    """After: `health.hold_autoscaler_disruption` on. The health loop's actuator quarantines the launched
    node (taint, record, and Karpenter's do-not-disrupt with our mark); emptied and Consolidatable, the node
    stays until the release lifts the hold with the taint, and then consolidation removes it."""
    pool = autoscaled.pool
    with running(cluster, port):
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: running_on(cluster, namespace, "p"), timeout=120, what="p bound on a launched node")
    (node,) = autoscaled.launched()
    now = time.time()
    record = QuarantineRecord("quarantined", "gpu-missing", reason_class="hw_pcie",
                              evidence=(Evidence("gpu-missing"),), quarantined_at=now)  # fmt: skip
    taint = Taint(QUARANTINE_TAINT, "gpu-missing", "NoSchedule")
    quarantine_action = Action("quarantine", node, "gpu-missing", "e2e", add_taint=taint, record=record)
    apply_plan(cluster, namespace, health_plan(node, quarantine_action, now), hold=True)
    annotations = cluster.get_json("node", node)["metadata"]["annotations"]
    assert annotations[KARPENTER_DO_NOT_DISRUPT] == "true" and annotations[DISRUPTION_HOLD] == "quarantine"
    cluster.kubectl("delete", "pod", "-n", namespace, "p", "--wait=true", timeout=60)
    emptied = time.monotonic()
    poll(lambda: consolidatable(autoscaled), timeout=60, what="Karpenter marks the NodeClaim Consolidatable")
    while time.monotonic() - emptied < HELD_SECONDS:
        assert autoscaled.launched() == [node], "consolidated while held"
        time.sleep(1)

    release = Action("release", node, "healthy-period", "e2e", remove_taint=taint, remove_record=True)
    apply_plan(cluster, namespace, health_plan(node, release, time.time()), hold=True)
    annotations = cluster.get_json("node", node)["metadata"].get("annotations") or {}
    assert KARPENTER_DO_NOT_DISRUPT not in annotations and DISRUPTION_HOLD not in annotations
    released = time.monotonic()
    poll(lambda: not autoscaled.launched(), timeout=120, what="the released node consolidated away")
    print(f"held {HELD_SECONDS:.0f} s empty; consolidated {time.monotonic() - released:.1f} s after release")
    disrupted = [line for line in autoscaled.karpenter.lines("disrupting node(s)") if node in line]
    assert disrupted and "delete" in disrupted[0].lower(), disrupted
