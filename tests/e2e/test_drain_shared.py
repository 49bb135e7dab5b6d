"""Drain on shared GPUs, on kwok nodes of the real control plane.

Two kwok nodes built here with GPU feature discovery's labels: a time-sliced node (2 GPUs x 4 replicas,
`nvidia.com/gpu: 8`) and a MIG-single node (2 H100s cut into 1g.10gb instances, `nvidia.com/gpu: 4`,
the MIG devices published in `gpuwarden.io/gpu-topology` as the node agent does). Pods are bound to them
with the device IDs the kubelet's PodResources would give (replicas `<uuid>::<n>`, opaque MIG UUIDs),
written as the node agent's reconciled sets. One physical GPU of each node is quarantined; the real
DrainLoop, against the real API server (kwok finishes the evicted pods' graceful deletion), moves exactly
the pods holding its replicas or instances: the drain state says `gpu` scope and the sharers of the healthy
GPU keep running.
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
from gpuwarden.wellknown import GPU_IDS, GPU_IDS_SOURCE, GPU_IDS_SOURCE_KUBELET, QUARANTINE_RECORD
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, ensure_namespace
from tests.e2e.conftest import pod_manifest

pytestmark = pytest.mark.e2e
POOL = f"ds-{uuid.uuid4().hex[:5]}"
SLICED, MIG = f"{POOL}-sliced", f"{POOL}-mig"
POOL_TAINT = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
QUARANTINE_TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}


def gpu_uuid(node: str, g: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}')}"


def mig_uuid(node: str, g: int, gi: int) -> str:
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}/{gi}')}"


# pod -> (node, device IDs as PodResources gives them)
HOLDINGS: dict[str, tuple[str, list[str]]] = {
    "ts-a0": (SLICED, [f"{gpu_uuid(SLICED, 0)}::0"]),
    "ts-a1": (SLICED, [f"{gpu_uuid(SLICED, 0)}::3"]),
    "ts-b0": (SLICED, [f"{gpu_uuid(SLICED, 1)}::1"]),
    "ts-b1": (SLICED, [f"{gpu_uuid(SLICED, 1)}::2"]),
    "ts-ab": (SLICED, [f"{gpu_uuid(SLICED, 0)}::1", f"{gpu_uuid(SLICED, 1)}::0"]),
    "mig-a1": (MIG, [mig_uuid(MIG, 0, 1)]),
    "mig-a2": (MIG, [mig_uuid(MIG, 0, 2)]),
    "mig-b1": (MIG, [mig_uuid(MIG, 1, 1)]),
}
FAULTY = {SLICED: gpu_uuid(SLICED, 1), MIG: gpu_uuid(MIG, 0)}
MOVED = {"ts-b0", "ts-b1", "ts-ab", "mig-a1", "mig-a2"}


@pytest.fixture(scope="module")
def pool(cluster: Cluster) -> Iterator[str]:
    sliced = GpuNodeSpec(
        name=SLICED,
        gpus=8,
        gpu_product="Tesla-T4-SHARED",
        labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        topology={gpu_uuid(SLICED, g): {"numa": 0, "uuid": gpu_uuid(SLICED, g)} for g in range(2)},
        taints=[POOL_TAINT],
    )  # fmt: skip
    mig = GpuNodeSpec(
        name=MIG,
        gpus=4,
        gpu_product="NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        labels={"nvidia.com/gpu.count": "4", "nvidia.com/mig.strategy": "single"},
        topology={
            gpu_uuid(MIG, g): {"numa": 0, "uuid": gpu_uuid(MIG, g),
                               "mig": [{"uuid": mig_uuid(MIG, g, gi), "gi": gi, "ci": 0, "profile": "1g.10gb"}
                                       for gi in (1, 2)]}
            for g in range(2)
        },
        taints=[POOL_TAINT],
    )  # fmt: skip
    add_gpu_nodes(cluster, [sliced, mig])
    ns = f"{POOL}-work"
    ensure_namespace(cluster, ns)
    pods = []
    for name, (node, ids) in HOLDINGS.items():
        p = pod_manifest(name, gpus=len(ids), nodeName=node, tolerations=[{"operator": "Exists"}])
        p["metadata"]["namespace"] = ns
        p["metadata"]["annotations"] = {GPU_IDS: ",".join(ids), GPU_IDS_SOURCE: GPU_IDS_SOURCE_KUBELET}
        pods.append(p)
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        delete_nodes(cluster, [SLICED, MIG])


def quarantine(cluster: Cluster, node: str, gpu: str) -> None:
    ev = Evidence("xid-79", gpu=gpu, xid=79, first_seen=time.time())
    record = QuarantineRecord("quarantined", "xid-79", evidence=(ev,), quarantined_at=time.time()).encode()
    patch: dict[str, Any] = {
        "metadata": {"annotations": {QUARANTINE_RECORD: record}},
        "spec": {"taints": [POOL_TAINT, QUARANTINE_TAINT]},
    }
    cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps(patch))


def running(cluster: Cluster, ns: str) -> set[str]:
    pods = cluster.get_json("pods", "-n", ns)["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def test_a_faulty_physical_gpu_moves_exactly_its_replica_and_instance_holders(
    cluster: Cluster, pool: str
) -> None:
    for node, gpu in FAULTY.items():
        quarantine(cluster, node, gpu)
    states: dict[str, Any] = {}

    async def run() -> list[Any]:
        config = Config.model_validate(
            {"drain": {"enabled": True, "gate": {"max_draining_nodes": 5, "max_evictions_per_minute": 50,
                                                 "min_schedulable_percent": 0}}}
        )  # fmt: skip
        plans = []
        async with KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube:
            loop = DrainLoop(config, kube, instance="e2e-shared")
            caches = [asyncio.ensure_future(i.run()) for i in loop.caches()]
            try:
                await loop.wait_ready()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    plans.append(await loop.run_once())
                    await asyncio.sleep(1.0)
                    for node in FAULTY:
                        ann = ((loop.nodes.get(node) or {}).get("metadata") or {}).get("annotations") or {}
                        states[node] = decode(ann.get(DRAIN_ANNOTATION))[0]
                    if all(s is not None and s.done is not None for s in states.values()):
                        break
                return plans
            finally:
                for task in caches:
                    task.cancel()
                await asyncio.gather(*caches, return_exceptions=True)

    plans = asyncio.run(run())
    first = {n.node: n for n in plans[0].nodes if n.node in FAULTY}
    assert {n: p.scope for n, p in first.items()} == {SLICED: "gpu", MIG: "gpu"}, first
    planned = {a.pod.name for p in first.values() for a in p.actions}
    assert planned == MOVED, planned
    for node, state in states.items():
        assert state is not None and state.scope == "gpu" and state.done is not None, (node, state)

    def settled() -> bool:
        return running(cluster, pool) == set(HOLDINGS) - MOVED

    deadline = time.monotonic() + 30
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running(cluster, pool) == set(HOLDINGS) - MOVED  # the sharers of the healthy GPUs keep running
