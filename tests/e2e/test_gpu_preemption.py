"""GPU preemption on fragmented nodes: the real kube-scheduler with all four extender verbs, gpuwarden's
controller making room (preemption.make_room) where the scheduler's own preemption cannot.

The module restarts the session scheduler with our extender (filter, prioritize, preempt, bind for
`nvidia.com/gpu` pods) and runs the controller's pieces as the controller process wires them (the extender,
the preemption throttle with the GPU model, the GPU preemption loop) in this process, on a thread with its
own loop. Passes of the loop run when a test calls them. Each test gets its own 2 NUMA x 4 GPU kwok nodes
(label + taint: no other test's pod lands there); the fragmenting pods are bound by `nodeName` with their
GPU set recorded, as pods the extender placed earlier would be.

Proofs: a node fragmented 2 + 2 by two lower-priority pods and a higher-priority 4-GPU single-numa pod:
the scheduler reports the node fragmented (and never `expected at least one victim`), exactly one
lower-priority pod is evicted, the preemptor binds to one NUMA node, the other keeps running, and a
4-GPU pod created meanwhile does not take the freed GPUs; with only higher-priority pods
nothing is evicted and the preemptor's Event says why; a PodDisruptionBudget moves the choice to the
other pod; the chain limit refuses a preemption by a recent victim; dry-run evicts nothing. Idle reclaim
(pods the idle loop marked `idle-reclaimable`): where the scheduler's preemption chose a busy pod the preempt
verb takes the idle one instead, and a pod short by count reclaims an idle pod of its own priority through
make-room while the busy one keeps running.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.runtime import Extender, build_extender
from controller.makeroom.loop import RoomLoop, RoomPass, plan_once
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import NODES, Informer, KubeClient
from harness.testbed import (
    Cluster,
    GpuNodeSpec,
    add_gpu_nodes,
    delete_nodes,
    poll,
)
from tests.e2e.conftest import free_port, gpuwarden_extender, pod_manifest, scheduler_calling
from tests.e2e.test_preemption_throttle import get_pod, running_on

pytestmark = pytest.mark.e2e

T = TypeVar("T")
SUFFIX = uuid.uuid4().hex[:5]
POOL_LABEL = "gpuwarden.io/e2e-pool"
PREFIX = "/gpuwarden"
PRIORITIES = {"low": 50, "mid": 100, "midhigh": 200, "high": 1000, "top": 5000}


def pclass(level: str) -> str:
    return f"gw-{SUFFIX}-{level}"


def topology(node: str) -> dict[str, Any]:
    return {str(i): {"numa": i // 4, "pcie": f"pci{i // 2}", "uuid": f"GPU-{node}-{i}"} for i in range(8)}


class Stack:
    """Extender + throttle + GPU preemption loop on 127.0.0.1:`port`, in a thread with its own loop."""

    def __init__(self, cluster: Cluster, port: int, overrides: dict[str, Any]) -> None:
        self.cluster, self.port, self.overrides = cluster, port, overrides
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gpuwarden-room", daemon=True)
        self.registry = CollectorRegistry()

    async def _start(self) -> None:
        preemption = {
            "make_room": {"enabled": True, "min_pending_seconds": 0.1, **self.overrides.pop("room", {})}
        }
        preemption.update(self.overrides.pop("preemption", {}))
        config = Config.model_validate(
            {"kubernetes": {"kubeconfig": str(self.cluster.kubeconfig)}, "extender": {"path_prefix": PREFIX},
             "preemption": preemption}
        )  # fmt: skip
        self.kube = KubeClient.from_config(kubeconfig=self.cluster.kubeconfig)
        self.throttle = PreemptionThrottle(config, self.kube, registry=self.registry, instance="e2e")
        self.extender: Extender = build_extender(
            config, self.kube, registry=self.registry, preempt_hook=self.throttle
        )
        self.throttle.use_gpu_model(self.extender.model, self.extender.service.current_settings)
        self.nodes = Informer(self.kube, NODES)
        self.room = RoomLoop(
            config, self.kube, throttle=self.throttle, model=self.extender.model,
            settings=self.extender.service.current_settings, nodes=self.nodes, registry=self.registry,
            instance="e2e",
        )  # fmt: skip
        app = web.Application()
        self.extender.mount(app)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.tasks = [
            asyncio.ensure_future(self.extender.run()),
            asyncio.ensure_future(self.throttle.run()),
            asyncio.ensure_future(self.nodes.run()),
        ]

    async def _stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.runner.cleanup()
        await self.kube.aclose()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def start(self) -> Stack:
        self.thread.start()
        self.call(self._start())
        poll(lambda: self.extender.ready() and self.throttle.ready() and self.room.ready(), timeout=60,
             what="gpuwarden stack synced")  # fmt: skip
        return self

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def pass_once(self) -> RoomPass:
        return self.call(self.room.run_once())

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


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


@contextmanager
def running(cluster: Cluster, port: int, **overrides: Any) -> Iterator[Stack]:
    stack = Stack(cluster, port, dict(overrides)).start()
    try:
        yield stack
    finally:
        stack.stop()


class Pool:
    """Private 8-GPU (2 NUMA x 4) nodes for one test."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.label = f"room-{SUFFIX}-{uuid.uuid4().hex[:4]}"
        self.names: list[str] = []

    def add(self, *shorts: str) -> list[str]:
        taint = {"key": POOL_LABEL, "value": self.label, "effect": "NoSchedule"}
        specs = [
            GpuNodeSpec(name=f"{self.label}-{s}", gpus=8, labels={POOL_LABEL: self.label, "e2e-node": s},
                        topology=topology(f"{self.label}-{s}"), taints=[taint])
            for s in shorts
        ]  # fmt: skip
        self.names += add_gpu_nodes(self.cluster, specs)
        return [f"{self.label}-{s}" for s in shorts]

    def pod(
        self, ns: str, name: str, gpus: int, level: str, *, node: str = "", ids: str = "", on: str = ""
    ) -> dict[str, Any]:
        """A GPU pod of this pool; `node` + `ids` bind it there with that recorded set (a pod placed
        earlier); `on` restricts scheduling to one of the pool's nodes (short name)."""
        pod = pod_manifest(name, gpus=gpus)
        pod["metadata"]["namespace"] = ns
        pod["metadata"].setdefault("labels", {})["app"] = name
        spec = pod["spec"]
        spec["priorityClassName"] = pclass(level)
        spec["nodeSelector"] = {POOL_LABEL: self.label, **({"e2e-node": on} if on else {})}
        spec["tolerations"] = [{"key": POOL_LABEL, "operator": "Equal", "value": self.label}]
        spec["terminationGracePeriodSeconds"] = 0
        if node:
            spec["nodeName"] = node
            pod["metadata"].setdefault("annotations", {})["gpuwarden.io/gpu-ids"] = ids
        return pod

    def delete(self) -> None:
        delete_nodes(self.cluster, self.names)


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[Pool]:
    created = Pool(cluster)
    try:
        yield created
    finally:
        created.delete()


def scheduled_message(cluster: Cluster, ns: str, name: str) -> str:
    pod = get_pod(cluster, ns, name) or {}
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or "")
    return ""


def notes(cluster: Cluster, ns: str, reason: str, regarding: str = "") -> list[str]:
    items = cluster.get_json("events.events.k8s.io", "-n", ns)["items"]
    return [
        str(e.get("note") or "")
        for e in items
        if e.get("reason") == reason and (not regarding or e["regarding"]["name"] == regarding)
    ]


def fragment(
    cluster: Cluster, pool: Pool, ns: str, node: str, a: tuple[str, str], b: tuple[str, str]
) -> None:
    """Pods a and b (2 GPUs each) bound to `node` on GPUs 0,1 (NUMA0) and 4,5 (NUMA1)."""
    cluster.apply(
        pool.pod(ns, a[0], 2, a[1], node=node, ids="0,1"), pool.pod(ns, b[0], 2, b[1], node=node, ids="4,5")
    )
    poll(
        lambda: running_on(cluster, ns, a[0]) and running_on(cluster, ns, b[0]),
        timeout=60,
        what="fragmenters run",
    )


def wait_fragmented(cluster: Cluster, ns: str, name: str) -> str:
    poll(lambda: "fragmented:" in scheduled_message(cluster, ns, name), timeout=60, what=f"{name} fragmented")
    return scheduled_message(cluster, ns, name)


def test_one_lower_priority_pod_is_evicted_and_the_preemptor_binds_on_one_numa_node(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "mid"), ("b", "mid"))
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        message = wait_fragmented(cluster, namespace, "p")
        assert "gpuwarden can make room by preempting 1 lower-priority pod" in message, message
        assert not any(
            "expected at least one victim" in n for n in notes(cluster, namespace, "FailedScheduling")
        )

        done = stack.pass_once()
        assert done.evicted == [f"{namespace}/a"], done.to_dict()
        reserved = get_pod(cluster, namespace, "p") or {}
        assert reserved["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] == "0,1,2,3"
        # a 4-GPU pod arriving now (too low in priority to preempt anything) must not take p's GPUs
        cluster.apply(pool.pod(namespace, "c", 4, "low"))

        poll(lambda: running_on(cluster, namespace, "p") == node, timeout=90, what="preemptor bound")
        final = get_pod(cluster, namespace, "p") or {}
        assert final["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] == "0,1,2,3"
        assert final["metadata"]["annotations"]["gpuwarden.io/numa-node"] == "0"
        assert running_on(cluster, namespace, "b") == node
        assert get_pod(cluster, namespace, "a") is None
        assert not running_on(cluster, namespace, "c")
        assert any(n.startswith("evicting " + namespace + "/a (priority 100, GPUs 0,1)") for n in
                   notes(cluster, namespace, "GPUPreempting", "p"))  # fmt: skip
        assert any(n.startswith("Preempted by pod ") for n in notes(cluster, namespace, "Preempted", "a"))
        assert stack.metric("gpuwarden_gpu_preemptions_total", outcome="started") == 1
        assert stack.metric("gpuwarden_gpu_preemption_victims_total", outcome="evicted") == 1
        again = stack.pass_once()  # restart-safe and idempotent: nothing more to do
        assert again.evicted == [] and again.decisions == []


def test_only_higher_priority_pods_nothing_is_evicted_and_the_event_says_why(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "top"), ("b", "top"))
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        message = wait_fragmented(cluster, namespace, "p")
        assert "gpuwarden cannot make room: no lower-priority pods to preempt" in message, message
        done = stack.pass_once()
        assert done.evicted == [] and done.started == []
        poll(lambda: notes(cluster, namespace, "GPUPreemptionNotPossible", "p"), timeout=30, what="event")
        (note,) = notes(cluster, namespace, "GPUPreemptionNotPossible", "p")
        assert "no lower-priority pods to preempt" in note or "no node" in note, note
        assert running_on(cluster, namespace, "a") and running_on(cluster, namespace, "b")


def test_a_pdb_on_the_cheaper_victim_moves_the_choice_to_the_other_pod(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "mid"), ("b", "midhigh"))
    cluster.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": "keep-a", "namespace": namespace},
                   "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}}})  # fmt: skip
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        wait_fragmented(cluster, namespace, "p")
        done = stack.pass_once()
        assert done.evicted == [f"{namespace}/b"], done.to_dict()
        poll(lambda: running_on(cluster, namespace, "p") == node, timeout=90, what="preemptor bound")
        assert (get_pod(cluster, namespace, "p") or {})["metadata"]["annotations"][
            "gpuwarden.io/gpu-ids"
        ] == "4,5,6,7"
        assert running_on(cluster, namespace, "a") == node


def test_the_chain_limit_refuses_a_preemption_by_a_recent_victim(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    first, second = pool.add("n1", "n2")
    fragment(cluster, pool, namespace, first, ("a", "mid"), ("b", "mid"))
    fragment(cluster, pool, namespace, second, ("m", "low"), ("n", "low"))
    with running(cluster, port, preemption={"max_chain_depth": 1}) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high", on="n1"))
        wait_fragmented(cluster, namespace, "p")
        assert stack.pass_once().evicted == [f"{namespace}/a"]
        poll(lambda: get_pod(cluster, namespace, "a") is None, timeout=60, what="victim gone")
        # a's replacement (same workload) now needs room on n2, from pods of lower priority than its own
        cluster.apply(pool.pod(namespace, "a", 4, "mid", on="n2"))
        wait_fragmented(cluster, namespace, "a")
        refused = stack.pass_once()
        assert refused.evicted == [], refused.to_dict()
        assert "depth 2" in refused.throttled.get(f"{namespace}/a", ""), refused.to_dict()
        assert running_on(cluster, namespace, "m") and running_on(cluster, namespace, "n")
        poll(lambda: notes(cluster, namespace, "PreemptionThrottled", "a"), timeout=30, what="throttle event")


def test_dry_run_evicts_nothing(cluster: Cluster, port: int, pool: Pool, namespace: str) -> None:
    (node,) = pool.add("n")
    fragment(cluster, pool, namespace, node, ("a", "mid"), ("b", "mid"))
    with running(cluster, port, room={"dry_run": True}) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        wait_fragmented(cluster, namespace, "p")
        room = {"make_room": {"min_pending_seconds": 0.1}}
        config = Config.model_validate(
            {"kubernetes": {"kubeconfig": str(cluster.kubeconfig)}, "preemption": room}
        )
        printed = stack.call(plan_once(config)).to_dict()["preemptions"]  # what `gpuwarden plan` prints
        assert [(p["pod"], p["node"], p["victims"], p["gpus"]) for p in printed] == [
            (f"{namespace}/p", node, [f"{namespace}/a"], ["0", "1", "2", "3"])
        ]
        done = stack.pass_once()
        assert done.evicted == [] and done.decisions and done.decisions[0].plan is not None
        poll(lambda: notes(cluster, namespace, "GPUPreempting", "p"), timeout=30, what="dry-run event")
        assert all(
            n.startswith("[dry-run] would evict") for n in notes(cluster, namespace, "GPUPreempting", "p")
        )
        assert running_on(cluster, namespace, "a") and running_on(cluster, namespace, "b")
        assert "gpuwarden.io/gpu-ids" not in (
            (get_pod(cluster, namespace, "p") or {})["metadata"].get("annotations") or {}
        )
        assert stack.metric("gpuwarden_gpu_preemptions_total", outcome="dry_run") == 1
    json.dumps(done.to_dict())  # the plan is printable as `gpuwarden plan` prints it


def idle_pod(pool: Pool, ns: str, name: str, level: str, node: str, ids: str) -> dict[str, Any]:
    """A 4-GPU pod bound to `node` as the idle loop leaves one under a prefer-as-victim rule
    (tests/e2e/test_idle_gpus.py proves the loop writes these annotations)."""
    pod = pool.pod(ns, name, 4, level, node=node, ids=ids)
    pod["metadata"]["annotations"] |= {
        "gpuwarden.io/idle-since": "2026-01-01T00:00:00Z",
        "gpuwarden.io/idle-reclaimable": "true",
    }
    return pod


def test_the_preempt_verb_takes_the_idle_pod_where_the_scheduler_chose_a_busy_one(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    """Full by count: kube-scheduler's own preemption picks a victim by priority and start time - of two
    equal-priority pods it spares the older, here the idle one - and our preempt verb swaps in the idle
    pod."""
    (node,) = pool.add("n")
    cluster.apply(idle_pod(pool, namespace, "idle", "mid", node, "4,5,6,7"))
    poll(lambda: running_on(cluster, namespace, "idle"), timeout=60, what="idle pod runs")
    time.sleep(1.5)  # a later start time: the scheduler would spare the idle pod and take the busy one
    cluster.apply(pool.pod(namespace, "busy", 4, "mid", node=node, ids="0,1,2,3"))
    poll(lambda: running_on(cluster, namespace, "busy"), timeout=60, what="busy pod runs")
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: running_on(cluster, namespace, "p") == node, timeout=90, what="preemptor bound")
        final = get_pod(cluster, namespace, "p") or {}
        assert final["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] == "4,5,6,7"
        assert running_on(cluster, namespace, "busy") == node, "the busy pod keeps running"
        assert get_pod(cluster, namespace, "idle") is None
        assert stack.metric("gpuwarden_gpu_preemptions_total", outcome="started") == 0  # the scheduler's


def test_make_room_reclaims_an_idle_pod_of_equal_priority_for_a_pod_short_by_count(
    cluster: Cluster, port: int, pool: Pool, namespace: str
) -> None:
    """Full by count with pods of the preemptor's own priority: the scheduler finds no victim; make-room
    reclaims the idle pod's GPUs (never the busy one's)."""
    (node,) = pool.add("n")
    cluster.apply(
        pool.pod(namespace, "busy", 4, "high", node=node, ids="0,1,2,3"),
        idle_pod(pool, namespace, "idle", "high", node, "4,5,6,7"),
    )
    poll(lambda: running_on(cluster, namespace, "busy") and running_on(cluster, namespace, "idle"),
         timeout=60, what="both run")  # fmt: skip
    with running(cluster, port) as stack:
        cluster.apply(pool.pod(namespace, "p", 4, "high"))
        poll(lambda: "Insufficient nvidia.com/gpu" in scheduled_message(cluster, namespace, "p"), timeout=60,
             what="p short by count")  # fmt: skip
        done = stack.pass_once()
        assert done.evicted == [f"{namespace}/idle"], done.to_dict()
        poll(lambda: running_on(cluster, namespace, "p") == node, timeout=90, what="preemptor bound")
        final = get_pod(cluster, namespace, "p") or {}
        assert final["metadata"]["annotations"]["gpuwarden.io/gpu-ids"] == "4,5,6,7"
        assert running_on(cluster, namespace, "busy") == node
        assert any("idle" in n for n in notes(cluster, namespace, "GPUPreempting", "p"))
