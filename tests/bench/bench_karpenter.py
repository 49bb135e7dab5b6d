"""Karpenter (kwok provider) with gpuwarden: time from pending to bound, and nodes launched per pending pod.

For each reason gpuwarden rejects or delays a 4-GPU pod (tests/e2e/test_karpenter_outcomes.py states the
outcome; this measures it), `ROUNDS` rounds each on a fresh private pool, with the real kube-scheduler
calling all four of our verbs, the controller's extender, throttle and make-room loop in this process (a
make-room pass runs when the pod has been pending for make-room's default `min_pending_seconds`, 5 s), and
one Karpenter process whose launched nodes appear `REGISTRATION_DELAY` after their NodeClaim (an instance's
boot; kwok's would be instant). Cases:

* `plain launch` (the anchor): no static node at all - the pod's time to a new node, Karpenter's own cost;
* `quarantined GPU`: the only static node has one quarantined GPU (our NoSchedule taint): a node launched;
* `fragmented, make-room can't`: 2 + 2 free GPUs held by higher-priority pods: Karpenter nominates the
  node, nothing is launched, the pod never binds (reported as stuck after `STUCK_SECONDS`);
* `fragmented, make-room`: lower-priority fragmenters: make-room evicts one, the pod binds on the node;
* `short by count, make-room`: full, one pod idle-reclaimable: a node is launched and make-room places the
  pod on the existing node anyway.

Ideal: 0 or 1 node launched per pending pod, and 1 only where no existing node could take it. Asserts nothing
about time. Run: `python -m tests.bench karpenter` (needs `make testbed karpenter`).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from harness.testbed import (
    Cluster,
    ClusterConfig,
    SchedulerSettings,
    ensure_namespace,
    scheduler_configuration,
)
from harness.testbed.karpenter import Karpenter, gpu_node_pool
from tests.bench.summary import record
from tests.e2e.conftest import free_port, gpuwarden_extender
from tests.e2e.test_gpu_preemption import (
    POOL_LABEL,
    PREFIX,
    PRIORITIES,
    Pool,
    Stack,
    fragment,
    pclass,
    scheduled_message,
)
from tests.e2e.test_karpenter_outcomes import launched_topology, quarantine
from tests.e2e.test_preemption_throttle import running_on

ROUNDS = 3
REGISTRATION_DELAY = "15s"
STUCK_SECONDS = 45.0
MIN_PENDING = 5.0
"""make-room's default `preemption.make_room.min_pending_seconds`."""


@dataclass
class Case:
    name: str
    seconds: list[float | None] = field(default_factory=list)
    """Pending to bound per round; None: not bound within STUCK_SECONDS."""
    launched: list[int] = field(default_factory=list)


def one_round(
    cluster: Cluster, karpenter: Karpenter, stack: Stack, case: str, ns: str
) -> tuple[float | None, int]:
    pool = Pool(cluster)
    taint = {"key": POOL_LABEL, "value": pool.label, "effect": "NoSchedule"}
    name = karpenter.add_pool(
        gpu_node_pool(
            pool.label,
            labels={POOL_LABEL: pool.label, "e2e-node": "launched"},
            topology=launched_topology(),
            taints=[taint],
            consolidate_after="Never",
        )
    )
    try:
        make_room = False
        if case == "quarantined GPU":
            (node,) = pool.add("n")
            quarantine(cluster, node, 0)
        elif case == "fragmented, make-room can't":
            (node,) = pool.add("n")
            fragment(cluster, pool, ns, node, (f"a-{pool.label}", "top"), (f"b-{pool.label}", "top"))
        elif case == "fragmented, make-room":
            (node,) = pool.add("n")
            fragment(cluster, pool, ns, node, (f"a-{pool.label}", "mid"), (f"b-{pool.label}", "mid"))
            make_room = True
        elif case == "short by count, make-room":
            (node,) = pool.add("n")
            idle = pool.pod(ns, f"idle-{pool.label}", 4, "high", node=node, ids="4,5,6,7")
            idle["metadata"]["annotations"] |= {
                "gpuwarden.io/idle-since": "2026-01-01T00:00:00Z",
                "gpuwarden.io/idle-reclaimable": "true",
            }
            cluster.apply(pool.pod(ns, f"busy-{pool.label}", 4, "high", node=node, ids="0,1,2,3"), idle)
            make_room = True
        pod = f"p-{pool.label}"
        started = time.monotonic()
        cluster.apply(pool.pod(ns, pod, 4, "high"))
        passed = False
        bound: float | None = None
        while time.monotonic() - started < STUCK_SECONDS:
            if running_on(cluster, ns, pod):
                bound = time.monotonic() - started
                break
            due = make_room and not passed and time.monotonic() - started >= MIN_PENDING
            if due and scheduled_message(cluster, ns, pod):
                stack.pass_once()
                passed = True
            time.sleep(0.25)
        if bound is not None:
            time.sleep(2)  # a NodeClaim Karpenter created in the same batch shows up by now
        return bound, len(karpenter.nodeclaims(name))
    finally:
        cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=false", check=False)
        karpenter.delete_pool(name)
        pool.delete()


def summarize(cases: list[Case]) -> None:
    anchor = cases[0]
    anchor_p50 = statistics.median([s for s in anchor.seconds if s is not None] or [float("nan")])
    for case in cases:
        bound = [s for s in case.seconds if s is not None]
        p50 = statistics.median(bound) if bound else None
        stuck = len(case.seconds) - len(bound)
        nodes = statistics.mean(case.launched)
        print(
            f"  {case.name:28s} pending->bound p50 {'-' if p50 is None else f'{p50:6.1f} s'}"
            f"  stuck {stuck}/{len(case.seconds)}  nodes launched per pending pod {nodes:.2f}",
            flush=True,
        )
        if case is not anchor:
            record("karpenter", f"{case.name}: pending to bound (p50)", p50, "s", anchor="plain launch",
                   anchor_value=anchor_p50)  # fmt: skip
        ideal = IDEAL_LAUNCHES[case.name]
        record("karpenter", f"{case.name}: nodes launched per pending pod", nodes, "nodes",
               goal=f"{ideal} (issue 48)", met=nodes == ideal)  # fmt: skip


IDEAL_LAUNCHES = {
    "plain launch": 1,
    "quarantined GPU": 1,
    "fragmented, make-room can't": 1,
    "fragmented, make-room": 0,
    "short by count, make-room": 0,
}
"""1 where no existing node can take the pod, 0 where one will (issue 48: 0 or 1, never a needless one)."""

CASES = (
    "plain launch",
    "quarantined GPU",
    "fragmented, make-room can't",
    "fragmented, make-room",
    "short by count, make-room",
)


def main() -> None:
    port = free_port()
    scheduler = scheduler_configuration(SchedulerSettings(extenders=[gpuwarden_extender(port, PREFIX)]))
    with TemporaryDirectory(prefix="gpuwarden-bench-karpenter-") as tmp:
        cluster = Cluster.create(ClusterConfig(name="bench-karpenter", scheduler_config=scheduler))
        karpenter: Karpenter | None = None
        stack: Stack | None = None
        try:
            cluster.apply(
                *({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": pclass(k)}, "value": v} for k, v in PRIORITIES.items())
            )  # fmt: skip
            ns = f"bench-karpenter-{uuid.uuid4().hex[:5]}"
            ensure_namespace(cluster, ns)
            karpenter = Karpenter(cluster, Path(tmp), registration_delay=REGISTRATION_DELAY).start()
            stack = Stack(cluster, port, {}).start()
            print(f"karpenter bench: {ROUNDS} rounds per case, launched nodes register after "
                  f"{REGISTRATION_DELAY}", flush=True)  # fmt: skip
            cases = [Case(c) for c in CASES]
            for case in cases:
                for _ in range(ROUNDS):
                    seconds, launched = one_round(cluster, karpenter, stack, case.name, ns)
                    case.seconds.append(seconds)
                    case.launched.append(launched)
            summarize(cases)
        finally:
            stop: list[Callable[[], None]] = [s.stop for s in (stack, karpenter) if s is not None]
            for fn in stop:
                fn()
            cluster.delete()
