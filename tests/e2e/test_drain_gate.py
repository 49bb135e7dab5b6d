"""The drain gate under a mass fault, on kwok nodes of the real control plane.

Eight of twelve kwok GPU nodes are quarantined at once (node-level faults, as the health loop records a GPU
that fell off the bus). The real DrainLoop runs pass after pass against the real API server (kwok finishes
evicted pods' graceful deletion): never more than `max_draining_nodes` of them drain at once, the evictions
stay within `max_evictions_per_minute`, and the gate says so (`gate_closed`, metric).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from controller.drain.loop import DrainLoop
from controller.drain.state import decode
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, ensure_namespace
from tests.e2e.conftest import pod_manifest

pytestmark = pytest.mark.e2e
POOL = f"dg-{uuid.uuid4().hex[:5]}"
NODES = [f"{POOL}-{i}" for i in range(12)]
FAULTY = NODES[:8]
POOL_TAINT = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
QUARANTINE_TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "gpu-missing", "effect": "NoSchedule"}
MAX_NODES, MAX_PER_MINUTE = 2, 3


@pytest.fixture(scope="module")
def pool(cluster: Cluster) -> Iterator[str]:
    topo = {str(g): {"numa": g // 4, "uuid": f"GPU-{POOL}-{g}"} for g in range(8)}
    add_gpu_nodes(cluster, [GpuNodeSpec(name=n, gpus=8, topology=topo, taints=[POOL_TAINT]) for n in NODES])
    ns = f"{POOL}-work"
    ensure_namespace(cluster, ns)
    pods = []
    for node in NODES:
        for i in range(2):
            p = pod_manifest(f"{node}-p{i}", gpus=1, nodeName=node,
                             tolerations=[{"operator": "Exists"}])  # fmt: skip
            p["metadata"]["namespace"] = ns
            p["metadata"]["annotations"] = {"gpuwarden.io/gpu-ids": str(i)}
            pods.append(p)
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        delete_nodes(cluster, NODES)


def quarantine_all(cluster: Cluster) -> None:
    record = QuarantineRecord("quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),)).encode()
    for node in FAULTY:
        patch: dict[str, Any] = {
            "metadata": {"annotations": {"gpuwarden.io/quarantine": record}},
            "spec": {"taints": [POOL_TAINT, QUARANTINE_TAINT]},
        }
        cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps(patch))


def test_mass_fault_drains_at_most_n_nodes_and_m_evictions_per_minute(cluster: Cluster, pool: str) -> None:
    quarantine_all(cluster)
    draining_seen: list[int] = []
    gate: set[str] = set()

    async def run() -> DrainLoop:
        config = Config.model_validate(
            {"drain": {"enabled": True, "gate": {"max_draining_nodes": MAX_NODES,
                                                 "max_evictions_per_minute": MAX_PER_MINUTE,
                                                 "min_schedulable_percent": 0}}}
        )  # fmt: skip
        async with KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube:
            loop = DrainLoop(config, kube, instance="e2e-gate")
            caches = [asyncio.ensure_future(i.run()) for i in loop.caches()]
            try:
                await loop.wait_ready()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    plan = await loop.run_once()
                    gate.update(plan.gate_closed)
                    await asyncio.sleep(1.0)
                    states = [decode(((loop.nodes.get(n) or {}).get("metadata") or {}).get("annotations", {})
                                     .get(DRAIN_ANNOTATION))[0] for n in FAULTY]  # fmt: skip
                    draining_seen.append(sum(1 for s in states if s is not None and s.done is None))
                return loop
            finally:
                for task in caches:
                    task.cancel()
                await asyncio.gather(*caches, return_exceptions=True)

    started = time.monotonic()
    loop = asyncio.run(run())
    elapsed = time.monotonic() - started
    evicted = loop.metrics.evictions.labels("evicted")._value.get()
    assert elapsed < 60  # the whole run fits in one rate-limit window
    assert max(draining_seen) <= MAX_NODES, draining_seen
    assert evicted == MAX_PER_MINUTE, evicted  # the budget was used, and never exceeded
    assert any("eviction rate limit" in g for g in gate), gate
    assert any("nodes draining" in g for g in gate), gate
    # The healthy four were never touched; the pods of the other quarantined nodes are still there.
    names = cluster.kubectl("get", "pods", "-n", pool, "-o", "jsonpath={.items[*].metadata.name}").split()
    assert all(f"{n}-p{i}" in names for n in NODES[8:] for i in range(2))
    assert len(names) >= 2 * len(NODES) - MAX_PER_MINUTE  # other tests' quarantined nodes may share it
