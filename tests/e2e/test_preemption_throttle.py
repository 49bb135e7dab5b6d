"""The real kube-scheduler preempting on kwok GPU nodes, gpuwarden's throttle in the extender's preempt verb.

For this module (and test_nominations_cleanup.py, which imports the fixtures) the session scheduler is
restarted with our extender's preempt verb for `nvidia.com/gpu` pods (nodeCacheCapable: victims as UIDs) and
restored afterwards. Only the preempt verb: with our filter too, a preemptor's retry right after its victim
is deleted can reach the extender before the extender's pod cache has seen the delete; the filter then
rejects the node and the pod waits for the scheduler's 5-minute unschedulable flush (the placement e2e in
test_extender_scheduler.py covers the other verbs). `Stack` runs the controller's pieces the way the
controller process wires them (`PreemptionThrottle` as the extender's preempt hook, the extender, and the
nomination loop sharing the throttle's pod informer) in this process, on a thread with its own event loop.
Every test adds its own 1-GPU nodes (label + taint, so no other test's pod lands there), deleted afterwards.

Proofs here: a real `Preempted` Event is observed; a spent budget vetoes the preemption and the victim keeps
running; a priority ladder that cascades through four workloads without the throttle (4 victims) stops at
the chain limit with it (2 victims).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.app import run_loops
from controller.extender.runtime import Extender, build_extender
from controller.nominations.loop import NominationLoop
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from harness.testbed import (
    Cluster,
    ExtenderSpec,
    GpuNodeSpec,
    SchedulerSettings,
    add_gpu_nodes,
    delete_nodes,
    poll,
    scheduler_configuration,
)
from tests.e2e.conftest import free_port, pod_manifest

pytestmark = pytest.mark.e2e

T = TypeVar("T")
SUFFIX = uuid.uuid4().hex[:5]
POOL_LABEL = "gpuwarden.io/e2e-pool"
POOL = f"pre-{SUFFIX}"
PREFIX = "/gpuwarden"
PRIORITIES = (100, 150, 200, 300, 400, 500)
HOLD = "gpuwarden.io/e2e-hold"


def priority_class(value: int) -> str:
    return f"gw-{SUFFIX}-{value}"


class Stack:
    """The controller's preemption pieces on 127.0.0.1:`port`, in a thread with its own loop."""

    def __init__(self, cluster: Cluster, port: int, overrides: dict[str, Any] | None = None) -> None:
        self.cluster, self.port = cluster, port
        self.overrides = overrides or {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gpuwarden-stack", daemon=True)
        self.registry = CollectorRegistry()
        self.leading = asyncio.Event()  # never set: passes run only when a test calls run_once()
        self.stopping = asyncio.Event()

    async def _start(self) -> None:
        doc = {
            "kubernetes": {"kubeconfig": str(self.cluster.kubeconfig)},
            "extender": {"path_prefix": PREFIX},
            **self.overrides,
        }
        config = Config.model_validate(doc)
        self.kube = KubeClient.from_config(kubeconfig=self.cluster.kubeconfig)
        self.throttle = PreemptionThrottle(config, self.kube, registry=self.registry, instance="e2e")
        self.extender: Extender = build_extender(
            config, self.kube, registry=self.registry, preempt_hook=self.throttle
        )
        self.nominations = NominationLoop(
            config, self.kube, registry=self.registry, instance="e2e", pods=self.throttle.pods,
            model=self.extender.model, settings=self.extender.service.current_settings,
        )  # fmt: skip
        app = web.Application()
        self.extender.mount(app)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.tasks = [
            asyncio.ensure_future(self.extender.run()),
            asyncio.ensure_future(self.throttle.run()),
            asyncio.ensure_future(run_loops(self.leading, self.stopping, nominations=self.nominations)),
        ]

    async def _stop(self) -> None:
        self.stopping.set()
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

        def ready() -> bool:
            return bool(
                self.extender.ready() and self.throttle.ready() and self.nominations.nodes.synced.is_set()
            )

        poll(ready, timeout=60, what="gpuwarden stack synced")
        return self

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="module")
def priority_classes(cluster: Cluster) -> Iterator[None]:
    cluster.apply(
        *(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": priority_class(v)}, "value": v}
            for v in PRIORITIES
        )
    )  # fmt: skip
    try:
        yield
    finally:
        names = [priority_class(v) for v in PRIORITIES]
        cluster.kubectl("delete", "priorityclass", *names, "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def stack_port(cluster: Cluster, priority_classes: None) -> Iterator[int]:
    """Our extender's port, with the session scheduler calling its preempt verb for the module."""
    port = free_port()
    original = yaml.safe_load(Path(cluster.scheduler_config_path()).read_text())
    spec = ExtenderSpec(
        url_prefix=f"http://127.0.0.1:{port}{PREFIX}",
        filter_verb="",
        preempt_verb="preempt",
        node_cache_capable=True,
        ignorable=False,
        http_timeout="5s",
        managed_resources=["nvidia.com/gpu"],
        ignored_by_scheduler=False,
    )
    cluster.restart_scheduler(scheduler_configuration(SchedulerSettings(extenders=[spec])))
    try:
        yield port
    finally:
        cluster.restart_scheduler(original)


class Pool:
    """1-GPU nodes private to one test; deleted afterwards."""

    def __init__(self, cluster: Cluster, tag: str) -> None:
        self.cluster = cluster
        self.label = f"{POOL}-{tag}"
        self.names: list[str] = []

    def add(self, *names: str) -> list[str]:
        taint = {"key": POOL_LABEL, "value": self.label, "effect": "NoSchedule"}
        labels = {POOL_LABEL: self.label}
        specs = [GpuNodeSpec(name=f"{self.label}-{n}", gpus=1, labels=labels, taints=[taint]) for n in names]
        added = add_gpu_nodes(self.cluster, specs)
        self.names += added
        return added

    def node(self, short: str) -> str:
        return f"{self.label}-{short}"

    def pod(
        self, namespace: str, name: str, priority: int, *, nodes: list[str] | None = None, hold: bool = False
    ) -> dict[str, Any]:
        """A 1-GPU pod of this pool; `nodes` restricts it to those (short) names; `hold` adds a finalizer so
        its deletion hangs (a victim that stays terminating)."""
        pod = pod_manifest(name, gpus=1)
        pod["metadata"]["namespace"] = namespace
        if hold:
            pod["metadata"]["finalizers"] = [HOLD]
        spec = pod["spec"]
        spec["priorityClassName"] = priority_class(priority)
        spec["nodeSelector"] = {POOL_LABEL: self.label}
        spec["tolerations"] = [{"key": POOL_LABEL, "operator": "Equal", "value": self.label}]
        spec["terminationGracePeriodSeconds"] = 0
        if nodes:
            term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                          "values": [self.node(n) for n in nodes]}]}  # fmt: skip
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}}  # fmt: skip
        return pod

    def deployment(self, namespace: str, name: str, priority: int, nodes: list[str]) -> dict[str, Any]:
        pod = self.pod(namespace, name, priority, nodes=nodes)
        template = {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
        }

    def delete(self) -> None:
        delete_nodes(self.cluster, self.names)


@pytest.fixture
def pool(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Pool]:
    created = Pool(cluster, uuid.uuid4().hex[:4])
    try:
        yield created
    finally:
        created.delete()


# ----------------------------------------------------------------------------------------- cluster reads
def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    items = cluster.get_json("pods", "-n", namespace, "--field-selector", f"metadata.name={name}")["items"]
    return items[0] if items else None


def running_on(cluster: Cluster, namespace: str, name: str) -> str:
    pod = get_pod(cluster, namespace, name)
    if pod and pod["spec"].get("nodeName") and pod.get("status", {}).get("phase") == "Running":
        return str(pod["spec"]["nodeName"])
    return ""


def events(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = cluster.get_json("events.events.k8s.io", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


def victims(cluster: Cluster, namespace: str) -> set[str]:
    """Victim pod UIDs named by the scheduler's Preempted Events in the namespace."""
    return {e["regarding"]["uid"] for e in events(cluster, namespace, "Preempted")}


def report(cluster: Cluster, namespace: str) -> str:
    """Pods (node, nomination, conditions) and Events of a namespace, for failure messages."""
    lines = []
    for pod in cluster.get_json("pods", "-n", namespace)["items"]:
        status = pod.get("status") or {}
        conds = [f"{c['type']}={c['status']}:{c.get('reason', '')}:{c.get('message', '')[:150]}"
                 for c in status.get("conditions") or []]  # fmt: skip
        meta = pod["metadata"]
        where = f"node={pod['spec'].get('nodeName')} nnn={status.get('nominatedNodeName')}"
        lines.append(f"pod {meta['name']} {where} deleting={bool(meta.get('deletionTimestamp'))} {conds}")
    for e in cluster.get_json("events.events.k8s.io", "-n", namespace)["items"]:
        lines.append(f"event {e.get('reason')} {e['regarding'].get('name')}: {str(e.get('note'))[:200]}")
    return "\n".join(lines)


def wait(
    cluster: Cluster, namespace: str, probe: Any, what: str, timeout: float = 60, interval: float = 0.25
) -> Any:
    try:
        return poll(probe, timeout=timeout, what=what, interval=interval)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{report(cluster, namespace)}") from None


def capture(name: str, obj: dict[str, Any]) -> None:
    """With GPUWARDEN_CAPTURE_DIR set, keep a real object (how the golden files were made)."""
    import os

    target = os.environ.get("GPUWARDEN_CAPTURE_DIR")
    if target:
        Path(target, name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------- tests
def test_preempted_event_observed_and_spent_budget_leaves_victim_running(
    cluster: Cluster, namespace: str, stack_port: int, pool: Pool
) -> None:
    pool.add("a", "b")
    # the graph is cluster-wide (earlier tests' preemptions count globally): a per-namespace budget of 1
    overrides = {"preemption": {"global_budget": None, "workload_budget": None,
                                "namespace_budget": {"max_victims": 1, "window_seconds": 300}}}  # fmt: skip
    stack = Stack(cluster, stack_port, overrides).start()
    try:
        cluster.apply(
            pool.pod(namespace, "low-a", 100, nodes=["a"]), pool.pod(namespace, "low-b", 100, nodes=["b"])
        )
        poll(lambda: running_on(cluster, namespace, "low-a") and running_on(cluster, namespace, "low-b"),
             timeout=60, what="low-priority pods running")  # fmt: skip
        cluster.apply(pool.pod(namespace, "high-1", 500))
        wait(
            cluster,
            namespace,
            lambda: running_on(cluster, namespace, "high-1"),
            "high-1 bound after preemption",
        )
        preempted = poll(lambda: events(cluster, namespace, "Preempted"), timeout=30, what="Preempted event")
        capture("event_preempted_events_v1.json", preempted[0])
        core = [
            e for e in cluster.get_json("events", "-n", namespace)["items"] if e.get("reason") == "Preempted"
        ]
        capture("event_preempted_core_v1.json", core[0])
        high1 = get_pod(cluster, namespace, "high-1")
        assert high1 is not None
        assert preempted[0]["note"].startswith(f"Preempted by pod {high1['metadata']['uid']} on node ")
        poll(lambda: stack.metric("gpuwarden_preemptions_observed_total") >= 1, timeout=30, what="observed")
        record = stack.throttle.graph.get(preempted[0]["regarding"]["uid"])
        assert record is not None and record.preemptor_uid == high1["metadata"]["uid"]
        survivor = "low-b" if record.node == pool.node("a") else "low-a"

        cluster.apply(pool.pod(namespace, "high-2", 500))
        throttled = poll(lambda: events(cluster, namespace, "PreemptionThrottled"), timeout=60,
                         what="PreemptionThrottled event")  # fmt: skip
        assert throttled[0]["regarding"]["name"] == "high-2"
        assert "budget spent" in throttled[0]["note"]
        time.sleep(8)  # several scheduling attempts (pod back-off 1-2 s): the veto keeps holding
        pod = get_pod(cluster, namespace, survivor)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp"), f"{survivor} was preempted"
        assert running_on(cluster, namespace, survivor)
        assert not running_on(cluster, namespace, "high-2")
        assert len(victims(cluster, namespace)) == 1
        assert stack.metric("gpuwarden_preemption_throttled_total", reason="budget-namespace") >= 1
        assert len(events(cluster, namespace, "PreemptionThrottled")) == 1, "one Event, as a series"
    finally:
        stack.stop()


LADDER = {  # workload -> (priority, nodes it may use); created bottom-up, so each starts on its first node
    "w1": (100, ["n4"]),
    "w2": (200, ["n3", "n4"]),
    "w3": (300, ["n2", "n3"]),
    "w4": (400, ["n1", "n2"]),
}


def cascade(cluster: Cluster, namespace: str, stack_port: int, pool: Pool, overrides: dict[str, Any]) -> int:
    """Fill four nodes with a priority ladder, add `w5` (only fits n1), and count the victims."""
    pool.add("n1", "n2", "n3", "n4")
    stack = Stack(cluster, stack_port, overrides).start()
    try:
        for name, (priority, nodes) in LADDER.items():
            cluster.apply(pool.deployment(namespace, name, priority, nodes))
            poll(lambda: all(p["status"].get("phase") == "Running" for p in _pods(cluster, namespace)),
                 timeout=60, what=f"{name} running")  # fmt: skip
        cluster.apply(pool.deployment(namespace, "w5", 500, ["n1"]))

        def settled() -> int | None:
            pods = _pods(cluster, namespace)
            pending = [p for p in pods if not p["spec"].get("nodeName")]
            terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")]
            w5 = [p for p in pods if p["metadata"]["name"].startswith("w5-") and p["spec"].get("nodeName")]
            if not w5 or terminating or len(pending) != 1:
                return None
            scheduled: dict[str, Any] = next(
                (c for c in pending[0]["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {}
            )
            return len(victims(cluster, namespace)) if scheduled.get("reason") == "Unschedulable" else None

        seen: dict[str, Any] = {"count": None, "since": 0.0}

        def stable() -> int | None:  # settled, with the same victim count for 10 s
            count, now = settled(), time.monotonic()
            if count is None or count != seen["count"]:
                seen.update(count=count, since=now)
                return None
            return count if now - seen["since"] >= 10 else None

        return int(wait(cluster, namespace, stable, "cascade settled", timeout=180, interval=1.0))
    finally:
        stack.stop()


def _pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace)["items"])


def test_cascade_without_the_throttle_is_bounded_with_it(
    cluster: Cluster, stack_port: int, pool: Pool, request: pytest.FixtureRequest
) -> None:
    from harness.testbed import ensure_namespace

    counts = {}
    for label, overrides in (("without", {"preemption": {"enabled": False}}), ("with", {})):
        ns = f"cascade-{label}-{uuid.uuid4().hex[:5]}"
        ensure_namespace(cluster, ns)
        run_pool = Pool(cluster, f"{label[:1]}{uuid.uuid4().hex[:3]}")
        try:
            counts[label] = cascade(cluster, ns, stack_port, run_pool, overrides)
        finally:
            run_pool.delete()
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    print(
        f"\n[e2e] cascade victims: without throttle {counts['without']}, with {counts['with']}",
        file=sys.stderr,
    )
    assert counts["without"] == 4, counts
    assert counts["with"] == 2, counts
