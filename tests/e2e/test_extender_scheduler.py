"""The real kube-scheduler calling gpuwarden's extender (filter, prioritize, preempt, bind) on kwok GPU nodes.

For this module the session scheduler is restarted with our extender as the binder for `nvidia.com/gpu`
pods (nodeCacheCapable, weight 12, not ignorable) and restored afterwards. The extender runs in this
process as the controller would run it (`build_extender` + watches through `KubeClient`), on a thread with
its own event loop. A private pool of nodes (label + taint, so no other test's pod lands there):

* three nodes of 2 NUMA x 4 GPUs (NVLink pairs): the fleet a stream of 1-, 2-, 4- and 8-GPU pods fills;
* one node of 4 NUMA x 2 GPUs: no NUMA node holds 4 GPUs, so a 4-GPU pod is unresolvable there;
* one 2 x 4 node quarantined by the health controller's taint with effect PreferNoSchedule (which the
  scheduler itself would allow): only the extender keeps pods off it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.runtime import Extender, build_extender
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient, LeaderElector, LeaseDurations
from gpuwarden.wellknown import EXTENDER_URL
from harness.testbed import (
    Cluster,
    GpuNodeSpec,
    add_gpu_nodes,
    delete_nodes,
    mig_single_node,
    poll,
    time_sliced_node,
)
from tests.e2e.conftest import free_port, gpuwarden_extender, pod_manifest, scheduler_calling

pytestmark = pytest.mark.e2e

SUFFIX = uuid.uuid4().hex[:5]
POOL = f"ext-{SUFFIX}"
GOOD = [f"ext-{SUFFIX}-{i}" for i in range(3)]
SMALL = f"ext-{SUFFIX}-small"
QUARANTINED = f"ext-{SUFFIX}-quarantined"
PREFIX = "/gpuwarden"


def topology(numa: int, per_numa: int) -> dict[str, Any]:
    return {
        str(i): {
            "numa": i // per_numa,
            "pcie": f"pci{i // 2}",
            "nvlink": f"nvl{i // 2}",
            "uuid": f"GPU-{POOL}-{i}",
        }
        for i in range(numa * per_numa)
    }


TOPOLOGY = {name: topology(2, 4) for name in [*GOOD, QUARANTINED]} | {SMALL: topology(4, 2)}


class RunningExtender:
    """`build_extender` served on 127.0.0.1:`port` from a thread with its own loop (stop = a crash).

    With `lease`, it runs the leader bind protocol as a controller replica does: it competes for that Lease
    (short timings, so a test waits seconds, not 15 s), advertises its URL in it while leading, and forwards
    bind to the holder otherwise; stopping it then leaves the Lease held, as a killed pod would."""

    def __init__(
        self,
        cluster: Cluster,
        port: int,
        lease: str | None = None,
        *,
        section: dict[str, Any] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.cluster, self.port, self.lease = cluster, port, lease
        self.section = section or {}
        """More of the `extender` config section (e.g. the scheduler's httpTimeout, the bind protocol)."""
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        """Where the extender reaches the API server (a slowing proxy's kubeconfig in the overload test)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="extender", daemon=True)
        self.extender: Extender | None = None
        self.elector: LeaderElector | None = None
        self.registry = CollectorRegistry()

    async def _start(self) -> None:
        url = f"http://127.0.0.1:{self.port}{PREFIX}"
        section: dict[str, Any] = {"path_prefix": PREFIX, **self.section}
        if self.lease is not None:
            section |= {"bind_protocol": "leader", "advertise_url": url}
        config = Config.model_validate(
            {"kubernetes": {"kubeconfig": str(self.kubeconfig)}, "extender": section}
        )
        self.kube = KubeClient.from_config(kubeconfig=self.kubeconfig)
        if self.lease is not None:
            self.elector = LeaderElector(
                self.kube, name=self.lease, namespace="default", identity=f"replica-{self.port}",
                durations=LeaseDurations(4.0, 3.0, 0.5), annotations={EXTENDER_URL: url},
            )  # fmt: skip
        self.extender = build_extender(config, self.kube, registry=self.registry, elector=self.elector)
        app = web.Application()
        self.extender.mount(app)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.feed = asyncio.ensure_future(self.extender.run())
        self.election = asyncio.ensure_future(self.elector.run()) if self.elector is not None else None

    async def _stop(self) -> None:
        self.feed.cancel()
        await asyncio.gather(self.feed, return_exceptions=True)
        await self.runner.cleanup()
        await self.kube.aclose()  # first: a crashed leader releases nothing (the release fails)
        if self.election is not None:
            self.election.cancel()
            await asyncio.gather(self.election, return_exceptions=True)

    def counter(self, name: str, labels: dict[str, str]) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def start(self) -> RunningExtender:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        poll(lambda: self.extender is not None and self.extender.ready(), timeout=60, what="extender synced")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def pool(cluster: Cluster) -> Iterator[list[str]]:
    taint = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
    record = {
        "version": 1, "state": "quarantined", "reason": "xid-79", "class": "hw_pcie",
        "effect": "PreferNoSchedule", "evidence": [{"reason": "xid-79"}], "gpus": [], "xids": [79],
    }  # fmt: skip
    specs = [
        GpuNodeSpec(
            name=name, gpus=8, labels={"gpuwarden.io/e2e-pool": POOL}, topology=TOPOLOGY[name], taints=[taint]
        )
        for name in [*GOOD, SMALL]
    ]
    specs.append(
        GpuNodeSpec(
            name=QUARANTINED,
            gpus=8,
            labels={"gpuwarden.io/e2e-pool": POOL},
            topology=TOPOLOGY[QUARANTINED],
            annotations={"gpuwarden.io/quarantine": json.dumps(record)},
            taints=[
                taint,
                {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "PreferNoSchedule"},
            ],
        )
    )
    names = add_gpu_nodes(cluster, specs)
    try:
        yield names
    finally:
        delete_nodes(cluster, names)


@pytest.fixture(scope="module")
def extender_at(cluster: Cluster, pool: list[str]) -> Iterator[int]:
    """Our extender's port, with the session scheduler pointed at it for this module."""
    port = free_port()
    with scheduler_calling(cluster, gpuwarden_extender(port, PREFIX)):
        yield port


def gpu_pod(namespace: str, name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=gpus, **spec)
    pod["metadata"]["namespace"] = namespace
    pod["spec"].setdefault("nodeSelector", {"gpuwarden.io/e2e-pool": POOL})
    pod["spec"]["tolerations"] = [{"key": "gpuwarden.io/e2e-pool", "operator": "Equal", "value": POOL}]
    return pod


def pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace)["items"])


def assert_placements(cluster: Cluster, namespace: str, sizes: dict[str, int]) -> None:
    """Every pod bound with a recorded set of the right size, NUMA-aligned, off the quarantined node, and no
    GPU recorded twice on a node."""
    held: dict[str, Counter[str]] = {}
    for obj in pods(cluster, namespace):
        name, node = obj["metadata"]["name"], obj["spec"]["nodeName"]
        annotations = obj["metadata"].get("annotations") or {}
        ids = annotations["gpuwarden.io/gpu-ids"].split(",")
        assert len(ids) == sizes[name], (name, ids)
        assert node != QUARANTINED, f"{name} landed on the quarantined node"
        numa = {TOPOLOGY[node][i]["numa"] for i in ids}
        per_numa = 2 if node == SMALL else 4
        assert len(numa) == max(1, -(-len(ids) // per_numa)), f"{name} on {node} spans NUMA {numa} with {ids}"
        assert annotations["gpuwarden.io/numa-node"] == ",".join(str(n) for n in sorted(numa))
        held.setdefault(node, Counter()).update(ids)
    for node, counts in held.items():
        assert all(c == 1 for c in counts.values()), f"GPU assigned twice on {node}: {counts}"


def pending_report(cluster: Cluster, namespace: str) -> str:
    """Why each pending pod waits, and where the bound ones went (fragmentation shows up here)."""
    lines = []
    for obj in pods(cluster, namespace):
        name, node = obj["metadata"]["name"], obj["spec"].get("nodeName")
        if not node:
            conds = [c.get("message", "") for c in obj.get("status", {}).get("conditions") or []]
            lines.append(f"{name}: {conds}")
        else:
            ids = (obj["metadata"].get("annotations") or {}).get("gpuwarden.io/gpu-ids")
            lines.append(f"{name}: bound to {node} on GPUs {ids}")
    return "\n".join(lines)


def wait_all_bound(cluster: Cluster, namespace: str, count: int, timeout: float) -> None:
    def done() -> bool:
        items = pods(cluster, namespace)
        return len(items) == count and all(p["spec"].get("nodeName") for p in items)

    try:
        poll(done, timeout=timeout, what="every pod bound")
    except Exception as exc:
        raise AssertionError(f"{exc}\npending:\n{pending_report(cluster, namespace)}") from None


def gpus_assigned(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """The extender's GPUsAssigned Events (events.k8s.io/v1, as `kubectl describe pod` shows them) by pod."""
    items = cluster.get_json("events.v1.events.k8s.io", "-n", namespace)["items"]
    return {
        e["regarding"]["name"]: e
        for e in items
        if e.get("reason") == "GPUsAssigned" and e.get("reportingController") == "gpuwarden.io/extender"
    }


def assert_assignment_events(cluster: Cluster, namespace: str, names: list[str]) -> None:
    """Every bound pod has a GPUsAssigned Event naming its node, its recorded GPU ids and NUMA node."""
    poll(lambda: set(names) <= set(gpus_assigned(cluster, namespace)), timeout=60, what="GPUsAssigned events")
    events = gpus_assigned(cluster, namespace)
    for obj in pods(cluster, namespace):
        name, node = obj["metadata"]["name"], obj["spec"]["nodeName"]
        annotations = obj["metadata"]["annotations"]
        event = events[name]
        assert event["type"] == "Normal" and event["regarding"]["uid"] == obj["metadata"]["uid"], event
        assert event["related"] == {"apiVersion": "v1", "kind": "Node", "name": node}, event
        note = event["note"]
        assert f"GPUs {annotations['gpuwarden.io/gpu-ids']} on node {node}, " in note, note
        assert f"NUMA node {annotations['gpuwarden.io/numa-node']}, " in note, note
        assert "topology policy single-numa satisfied" in note or "topology policy none" in note, note


def test_stream_is_numa_aligned_without_double_assignment_across_a_restart(
    cluster: Cluster, namespace: str, extender_at: int
) -> None:
    # 26 of the pool's 32 GPUs; the 8-GPU pods first in each half, as a queue of big jobs would arrive
    first = {"a-8gpu": 8, "a-4gpu": 4, "a-2gpu": 2, "a-1gpu": 1}
    second = {"b-8gpu": 8, "b-2gpu": 2, "b-1gpu": 1}
    running = RunningExtender(cluster, extender_at).start()
    try:
        cluster.apply(*(gpu_pod(namespace, n, k) for n, k in first.items()))
        wait_all_bound(cluster, namespace, len(first), timeout=60)
        # Events are written off the bind path by the replica that bound the pod; a crash drops what it had
        # queued (counted in gpuwarden_extender_events_dropped_total), so they are checked while it runs.
        assert_assignment_events(cluster, namespace, [*first])
    finally:
        running.stop()  # the extender dies mid-stream; pods keep arriving
    cluster.apply(*(gpu_pod(namespace, n, k) for n, k in second.items()))
    running = RunningExtender(cluster, extender_at).start()  # a fresh replica rebuilds from the API
    try:
        wait_all_bound(cluster, namespace, len(first) + len(second), timeout=90)
        assert_placements(cluster, namespace, first | second)
        assert_assignment_events(cluster, namespace, [*first, *second])  # the first batch's are kept
    finally:
        running.stop()


def test_two_replicas_under_the_leader_protocol_bind_once_each_across_a_killed_leader(
    cluster: Cluster, namespace: str, extender_at: int
) -> None:
    """The scheduler calls replica B; A holds the Lease, so B forwards every bind to A, which writes each
    GPU set on the Binding itself (no claim label). A is killed holding the Lease; B takes it over, chooses
    from a consistent read until its watch passes the takeover, and binds the rest itself: no GPU twice."""
    lease = f"ext-binder-{SUFFIX}"
    first = {"l-8gpu": 8, "l-4gpu": 4, "l-2gpu": 2, "l-1gpu": 1}
    second = {"m-4gpu": 4, "m-2gpu": 2, "m-1gpu": 1}
    a = RunningExtender(cluster, free_port(), lease).start()
    try:
        poll(lambda: a.elector is not None and a.elector.fenced(), timeout=30, what="replica A leading")
        b = RunningExtender(cluster, extender_at, lease).start()
    except BaseException:
        a.stop()
        raise
    try:
        try:
            cluster.apply(*(gpu_pod(namespace, n, k) for n, k in first.items()))
            wait_all_bound(cluster, namespace, len(first), timeout=60)
            forwarded = b.counter("gpuwarden_extender_binds_forwarded_total", {"outcome": "ok"})
            assert forwarded == len(first), forwarded
            bound_by_a = a.counter(
                "gpuwarden_extender_requests_total", {"verb": "bind_forwarded", "outcome": "ok"}
            )
            assert bound_by_a == len(first), bound_by_a
        finally:
            a.stop()  # killed while holding the Lease
        cluster.apply(*(gpu_pod(namespace, n, k) for n, k in second.items()))
        wait_all_bound(cluster, namespace, len(first) + len(second), timeout=90)
        assert b.elector is not None and b.elector.fenced(), "B did not take the Lease over"
        assert_placements(cluster, namespace, first | second)
        for obj in pods(cluster, namespace):  # every set rode on its Binding: no claim PATCH, no label
            assert "gpuwarden.io/gpu-node" not in (obj["metadata"].get("labels") or {}), obj["metadata"]
            assert obj["metadata"]["annotations"]["gpuwarden.io/gpu-node"] == obj["spec"]["nodeName"]
        assert_assignment_events(cluster, namespace, [*second])
    finally:
        b.stop()
        cluster.kubectl("delete", "lease", lease, "-n", "default", "--ignore-not-found", check=False)


def unschedulable_message(cluster: Cluster, namespace: str, name: str) -> str | None:
    obj = cluster.get_json("pod", name, "-n", namespace)
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


def test_unfit_and_quarantined_nodes_are_rejected_with_a_reason(
    cluster: Cluster, namespace: str, extender_at: int
) -> None:
    for node in (SMALL, QUARANTINED):  # pods of the previous test may still be terminating there
        poll(
            lambda node=node: (
                not cluster.get_json("pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
            ),  # type: ignore[misc]
            timeout=60,
            what=f"{node} empty",
        )
    running = RunningExtender(cluster, extender_at).start()
    try:
        cluster.apply(
            gpu_pod(namespace, "numa-4", 4, nodeSelector={"kubernetes.io/hostname": SMALL}),
            gpu_pod(namespace, "on-quarantined", 1, nodeSelector={"kubernetes.io/hostname": QUARANTINED}),
        )
        for name, reason in (
            ("numa-4", "at most 2 healthy GPUs per NUMA node (0: 2, 1: 2, 2: 2, 3: 2); 4 requested"),
            ("on-quarantined", "GPUs quarantined by gpuwarden (xid-79)"),
        ):
            message = poll(
                lambda name=name: unschedulable_message(cluster, namespace, name),  # type: ignore[misc]
                timeout=60,
                what=f"{name} reported unschedulable",
            )
            assert reason in message, message
        assert not any(p["spec"].get("nodeName") for p in pods(cluster, namespace))
    finally:
        running.stop()


@pytest.fixture
def priority_classes(cluster: Cluster) -> Iterator[tuple[str, str]]:
    low, high = f"ext-{SUFFIX}-low", f"ext-{SUFFIX}-high"
    kind = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
    cluster.apply(*({**kind, "metadata": {"name": n}, "value": v} for n, v in ((low, 10), (high, 1000))))
    try:
        yield low, high
    finally:
        cluster.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)


def test_preemptor_binds_right_after_its_victims_go(
    cluster: Cluster, namespace: str, extender_at: int, priority_classes: tuple[str, str]
) -> None:
    """The preemptor is retried within milliseconds of the victims' deletion, usually before our watch has
    seen it; the extender must not reject its nominated node then (the pod would wait for the 5-minute
    unschedulable flush: an extender rejection is not requeued by pod-deletion events)."""
    low, high = priority_classes
    target = GOOD[2]
    poll(
        lambda: not cluster.get_json("pods", "-A", "--field-selector", f"spec.nodeName={target}")["items"],
        timeout=60,
        what=f"{target} empty",
    )
    pin = {"nodeSelector": {"kubernetes.io/hostname": target}}
    running = RunningExtender(cluster, extender_at).start()
    try:
        for i in range(2):
            cluster.apply(gpu_pod(namespace, f"victim-{i}", 4, priorityClassName=low, **pin))
        wait_all_bound(cluster, namespace, 2, timeout=60)
        cluster.apply(gpu_pod(namespace, "preemptor", 8, priorityClassName=high, **pin))

        def preemptor_bound() -> bool:
            obj = cluster.get_json("pod", "preemptor", "-n", namespace)
            return bool(obj["spec"].get("nodeName") == target)

        try:
            poll(preemptor_bound, timeout=45, what="preemptor bound")
        except Exception as exc:
            assert running.extender is not None
            service = running.extender.service
            view = service.model.view(target)
            binder = service.binder
            state = (
                f"extender view of {target}: used={sorted(view.used) if view else None} "
                f"holders={view.holders if view else None} "
                f"overlay={binder.overlay(target) if binder else None} "
                f"cached preemptor={service.model.pod(namespace + '/preemptor')}"
            )
            raise AssertionError(f"{exc}\n{pending_report(cluster, namespace)}\n{state}") from None
        obj = cluster.get_json("pod", "preemptor", "-n", namespace)
        ids = obj["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(",")
        assert sorted(ids, key=int) == [str(i) for i in range(8)]
    finally:
        running.stop()


SHARED_TS, SHARED_MIG = f"ext-{SUFFIX}-ts", f"ext-{SUFFIX}-mig"


@pytest.fixture
def shared_pool(cluster: Cluster, pool: list[str]) -> Iterator[list[str]]:
    """A time-sliced node (8 GPUs x 4 replicas) and a MIG-single node (8 x 7 instances of 1g.10gb) in the
    pool, each published with a topology of its 8 physical GPUs (what the node agent writes)."""
    taint = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
    common: dict[str, Any] = {
        "labels": {"gpuwarden.io/e2e-pool": POOL},
        "taints": [taint],
        "topology": topology(2, 4),
    }
    specs = [time_sliced_node(SHARED_TS, gpus=8, replicas=4, **common), mig_single_node(SHARED_MIG, **common)]
    names = add_gpu_nodes(cluster, specs)
    try:
        yield names
    finally:
        delete_nodes(cluster, names)


def test_shared_nodes_are_passed_through_with_a_reason_and_no_fictional_set(
    cluster: Cluster, namespace: str, extender_at: int, shared_pool: list[str]
) -> None:
    """On time-sliced and MIG nodes the scheduler binds through our extender, which records no GPU set (no
    `0..31` on a node of 8 GPUs) and says why in a GPUsShared Event; kube-scheduler counts the slots."""
    running = RunningExtender(cluster, extender_at).start()
    try:
        cluster.apply(
            *(
                gpu_pod(namespace, f"{kind}-{i}", 2, nodeSelector={"kubernetes.io/hostname": node})
                for kind, node in (("ts", SHARED_TS), ("mig", SHARED_MIG))
                for i in range(3)
            )
        )
        wait_all_bound(cluster, namespace, 6, timeout=60)
        for obj in pods(cluster, namespace):
            assert "gpuwarden.io/gpu-ids" not in (obj["metadata"].get("annotations") or {}), obj["metadata"]

        def shared_events() -> dict[str, dict[str, Any]]:
            items = cluster.get_json("events.v1.events.k8s.io", "-n", namespace)["items"]
            return {e["regarding"]["name"]: e for e in items if e.get("reason") == "GPUsShared"}

        poll(lambda: len(shared_events()) == 6, timeout=60, what="GPUsShared events")
        notes = {name: e["note"] for name, e in shared_events().items()}
        assert "time-slicing: 8 physical GPUs, 4 replicas each (32 nvidia.com/gpu)" in notes["ts-0"], notes
        assert "MIG single: 8 physical GPUs, 56 1g.10gb instances" in notes["mig-0"], notes
        assert not gpus_assigned(cluster, namespace)
        assert running.counter("gpuwarden_extender_filter_nodes_total", {"result": "shared_passthrough"}) >= 6
    finally:
        running.stop()
