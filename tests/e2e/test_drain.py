"""The drain loop on the real kubelet node: GPU precision, graceful termination, PDBs, release, dry-run.

Two 1-GPU pods run on the real node behind a device plugin; the node agent (observe mode) records the GPUs
each actually holds. The health controller's quarantine (its taint and its `gpuwarden.io/quarantine` record,
written here as the health loop writes them after an XID 79) names one GPU: only the pod on it gets SIGTERM,
with its grace period honoured, and the other keeps running; a node-level fault moves the rest. A PDB that
forbids the eviction is reported (drain state, Event, metric) and the pod keeps running; releasing the node
mid-drain cancels it; dry-run evicts nothing; an allow-completion pod is left to finish.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.drain.loop import DrainLoop
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION
from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE as SOURCE_ANNOTATION
from harness.testbed import Cluster, poll
from harness.testbed.realnode import KUBELET_SOCKET, RealNode
from tests.e2e.conftest import REAL_NODE
from tests.e2e.test_kubelet_node import create, events, first, pod_phase, tool_pod, wait_phase
from tests.e2e.test_node_agent import UUIDS, Agent, HighestFirstPlugin, annotations, wait_allocatable

pytestmark = pytest.mark.e2e
TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def gpu_node(node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """The real node with 8 GPUs (a test device plugin) and the node agent recording actual allocations."""
    node = node_cluster.real_node()
    plugin = HighestFirstPlugin(resource="nvidia.com/gpu", devices=UUIDS, plugin_dir=node.device_plugin_dir)
    plugin.start(KUBELET_SOCKET)
    agent = Agent(node_cluster, node, tmp_path_factory.mktemp("drain-agent"), device_plugin=False)
    try:
        wait_allocatable(node_cluster, 8)
        poll(
            lambda: (
                "gpuwarden.io/gpu-topology"
                in node_cluster.get_json("node", REAL_NODE)["metadata"]["annotations"]
            ),
            timeout=30,
            what="topology published",
        )
        yield node
    finally:
        unquarantine(node_cluster)
        agent.stop()
        plugin.stop()


def quarantine(cluster: Cluster, gpu_uuid: str | None) -> None:
    """What the health loop writes for an XID 79 on one GPU (or a node-level gpu-missing when None)."""
    now = time.time()
    evidence = (
        Evidence("xid-79", gpu=gpu_uuid, xid=79, first_seen=now) if gpu_uuid else Evidence("gpu-missing")
    )
    record = QuarantineRecord(state="quarantined", reason=evidence.reason, reason_class="hw_pcie",
                              evidence=(evidence,), quarantined_at=now)  # fmt: skip
    node = cluster.get_json("node", REAL_NODE)
    taints = [t for t in node["spec"].get("taints", []) if t["key"] != TAINT["key"]] + [TAINT]
    patch = {
        "metadata": {"annotations": {"gpuwarden.io/quarantine": record.encode()}},
        "spec": {"taints": taints},
    }
    cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))


def unquarantine(cluster: Cluster) -> None:
    node = cluster.get_json("node", REAL_NODE)
    taints = [t for t in node["spec"].get("taints", []) if t["key"] != TAINT["key"]]
    patch = {"metadata": {"annotations": {"gpuwarden.io/quarantine": None}}, "spec": {"taints": taints}}
    cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))


def drain_until(
    cluster: Cluster, done: Callable[[], bool], *, timeout: float = 60, dry_run: bool = False,
    drain: dict[str, Any] | None = None,
) -> DrainLoop:  # fmt: skip
    """Run the real DrainLoop (its own watches of this cluster) pass after pass until `done()`."""

    async def run() -> DrainLoop:
        # Two GPU nodes here (the real one and a kwok one): with one quarantined, 50 % accept pods.
        settings = {
            "enabled": True,
            "dry_run": dry_run,
            "gate": {"min_schedulable_percent": 50},
            **(drain or {}),
        }
        config = Config.model_validate({"drain": settings})
        async with KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube:
            loop = DrainLoop(config, kube, instance="e2e")
            caches = [asyncio.ensure_future(i.run()) for i in loop.caches()]
            try:
                await loop.wait_ready()
                deadline = time.monotonic() + timeout
                while True:
                    await loop.run_once()
                    if await asyncio.to_thread(done):
                        return loop
                    assert time.monotonic() < deadline, "drain did not reach the expected state"
                    await asyncio.sleep(1.0)
            finally:
                for task in caches:
                    task.cancel()
                await asyncio.gather(*caches, return_exceptions=True)

    return asyncio.run(run())


def gpu_pod(
    name: str, records: Path, *, grace: int = 20, delay: float = 2, labels: dict[str, str] | None = None,
    sleep: str = "0",
) -> dict[str, Any]:  # fmt: skip
    pod = tool_pod(name, ["--record", f"/record/{name}.log", "--sleep", sleep, "--term-delay", str(delay)],
                   gpus=1, grace=grace, record_dir=records, labels=labels)  # fmt: skip
    pod["spec"]["tolerations"].append({"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"})
    return pod


def held_gpu(cluster: Cluster, ns: str, name: str) -> str:
    ann = poll(
        lambda: (a := annotations(cluster, ns, name)).get(SOURCE_ANNOTATION) == "kubelet" and a,
        timeout=30,
        what=f"{name}'s actual GPU recorded by the node agent",
    )
    return str(ann[GPU_IDS_ANNOTATION])


def gone(cluster: Cluster, ns: str, name: str) -> bool:
    return not cluster.kubectl("get", "pod", name, "-n", ns, "--ignore-not-found", "-o", "name")


def drain_state(cluster: Cluster) -> dict[str, Any] | None:
    text = cluster.get_json("node", REAL_NODE)["metadata"].get("annotations", {}).get(DRAIN_ANNOTATION)
    return json.loads(text) if text else None


def reasons(cluster: Cluster, ns: str, name: str) -> list[str]:
    out = cluster.kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
                          "-o", "jsonpath={.items[*].reason}", check=False)  # fmt: skip
    return out.split()


def test_gpu_fault_moves_only_the_pod_on_that_gpu_then_a_node_fault_moves_the_rest(
    node_cluster: Cluster, gpu_node: RealNode, node_ns: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    create(node_cluster, node_ns, gpu_pod("on-faulty", records), gpu_pod("healthy", records))
    for name in ("on-faulty", "healthy"):
        wait_phase(node_cluster, node_ns, name, "Running")
    faulty_uuid = held_gpu(node_cluster, node_ns, "on-faulty")
    assert held_gpu(node_cluster, node_ns, "healthy") != faulty_uuid
    try:
        quarantine(node_cluster, faulty_uuid)
        # The default capacity floor (75 % of GPU nodes schedulable) holds the drain: nothing is forced.
        held = drain_until(node_cluster, lambda: True, drain={"gate": {}})
        assert held.last_plan is not None and any(
            "min_schedulable_percent" in w for w in held.last_plan.gate_closed
        )
        assert (
            drain_state(node_cluster) is None and pod_phase(node_cluster, node_ns, "on-faulty") == "Running"
        )
        assert "GPUDrainGateClosed" in reasons(node_cluster, "default", REAL_NODE)
        t0 = time.time()
        loop = drain_until(node_cluster, lambda: gone(node_cluster, node_ns, "on-faulty"))
        log = events((records / "on-faulty.log").read_text())
        sig, ended = first(log, "event=sigterm"), first(log, "event=exit reason=sigterm")
        assert sig and ended and sig[0] >= t0 - 1 and ended[0] - sig[0] >= 2.0  # grace honoured
        assert pod_phase(node_cluster, node_ns, "healthy") == "Running"
        assert first(events((records / "healthy.log").read_text()), "event=sigterm") is None
        state = drain_state(node_cluster)
        assert state is not None and state["scope"] == "gpu"
        assert loop.metrics.evictions.labels("evicted")._value.get() == 1
        assert {"GPUPodEvicted"} <= set(reasons(node_cluster, node_ns, "on-faulty"))
        # The health loop widens the record to a node-level fault: the healthy pod moves too.
        quarantine(node_cluster, None)
        drain_until(node_cluster, lambda: gone(node_cluster, node_ns, "healthy"))
        assert first(events((records / "healthy.log").read_text()), "event=exit reason=sigterm") is not None
        assert (drain_state(node_cluster) or {}).get("scope") == "node"
    finally:
        unquarantine(node_cluster)
        node_cluster.kubectl("annotate", "node", REAL_NODE, f"{DRAIN_ANNOTATION}-", check=False)


def test_pdb_blocks_and_is_reported_release_cancels_and_dry_run_evicts_nothing(
    node_cluster: Cluster, gpu_node: RealNode, node_ns: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    labels = {"app": "guarded"}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}  # fmt: skip
    create(node_cluster, node_ns, pdb, gpu_pod("guarded", records, labels=labels), gpu_pod("spared", records))
    for name in ("guarded", "spared"):
        wait_phase(node_cluster, node_ns, name, "Running")
    poll(
        lambda: (
            node_cluster.get_json("pdb", "guarded", "-n", node_ns).get("status", {}).get("currentHealthy")
            == 1
        ),
        timeout=60,
        what="PDB computed",
    )
    try:
        # Dry-run first: the same plan, nothing evicted, no drain state written.
        quarantine(node_cluster, None)
        dry = drain_until(node_cluster, lambda: True, dry_run=True)
        assert dry.metrics.evictions.labels("dry_run")._value.get() >= 1
        assert drain_state(node_cluster) is None
        assert pod_phase(node_cluster, node_ns, "spared") == "Running"
        # For real: the spared pod goes, the guarded one is refused (429) and reported, and keeps running.
        loop = drain_until(
            node_cluster,
            lambda: (
                gone(node_cluster, node_ns, "spared")
                and "guarded" in json.dumps((drain_state(node_cluster) or {}).get("blocked", {}))
            ),
        )
        state = drain_state(node_cluster) or {}
        assert state["blocked"][f"{node_ns}/guarded"] == "PodDisruptionBudget (429)"
        assert f"{node_ns}/guarded" in state["pending"]
        assert loop.metrics.evictions.labels("blocked")._value.get() >= 1
        assert "GPUDrainBlocked" in reasons(node_cluster, node_ns, "guarded")
        assert pod_phase(node_cluster, node_ns, "guarded") == "Running"
        assert first(events((records / "guarded.log").read_text()), "event=sigterm") is None
        # The node is released mid-drain: the drain is cancelled and nothing more is evicted; what is left of
        # its state is the eviction ledger (the fleet's rate), until the last minute has passed.
        unquarantine(node_cluster)
        drain_until(node_cluster, lambda: "cancelled" in (drain_state(node_cluster) or {"cancelled": 1}))
        left = drain_state(node_cluster)
        assert left is None or (not left["pending"] and not left["blocked"]), left
        time.sleep(2)
        assert pod_phase(node_cluster, node_ns, "guarded") == "Running"
        assert "GPUDrainCancelled" in reasons(node_cluster, "default", REAL_NODE)
    finally:
        unquarantine(node_cluster)
        node_cluster.kubectl("annotate", "node", REAL_NODE, f"{DRAIN_ANNOTATION}-", check=False)
        node_cluster.kubectl("delete", "pdb", "guarded", "-n", node_ns, check=False)


def test_allow_completion_lets_a_job_finish(
    node_cluster: Cluster, gpu_node: RealNode, node_ns: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    template = gpu_pod("finisher", records, sleep="6")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "finisher"},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "finisher"}},
                                                    "spec": template["spec"]}}}  # fmt: skip
    create(node_cluster, node_ns, job)
    pod_name = poll(
        lambda: node_cluster.kubectl("get", "pods", "-n", node_ns, "-l", "job-name=finisher",
                                     "-o", "jsonpath={.items[0].metadata.name}", check=False),
        timeout=60,
        what="the Job's pod",
    )  # fmt: skip
    wait_phase(node_cluster, node_ns, pod_name, "Running")
    rule = {
        "name": "jobs",
        "namespaces": [node_ns],
        "mode": "allow-completion",
        "completion_deadline_seconds": 600,
    }
    try:
        quarantine(node_cluster, None)
        drain_until(
            node_cluster,
            lambda: (
                node_cluster.get_json("job", "finisher", "-n", node_ns).get("status", {}).get("succeeded")
                == 1
            ),
            drain={"rules": [rule]},
        )
        log = events((records / "finisher.log").read_text())
        assert first(log, "event=sigterm") is None and first(log, "event=exit reason=done") is not None
    finally:
        unquarantine(node_cluster)
        node_cluster.kubectl("annotate", "node", REAL_NODE, f"{DRAIN_ANNOTATION}-", check=False)
