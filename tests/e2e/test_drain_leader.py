"""A leader change mid-drain, on kwok nodes of the real control plane: the fleet's eviction rate holds and
every evicted pod gets exactly one GPUPodEvicted Event.

One kwok GPU node is quarantined (node-level fault) with four GPU pods on it; `max_evictions_per_minute: 2`.
The first leader's DrainLoop dies right after its first Eviction, before that pod's Event (its Event write
raises, as a SIGKILL there would stop it). A second DrainLoop - a new leader with nothing in memory, on its
own caches - then runs passes for the rest of the minute. Before the eviction ledger a new leader counted
afresh and evicted two more (three in the minute, as issue 32 measured); now it reads the ledger.
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
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.quarantine import Evidence, QuarantineRecord
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, ensure_namespace
from tests.e2e.conftest import pod_manifest

pytestmark = pytest.mark.e2e
POOL = f"dl-{uuid.uuid4().hex[:5]}"
NODE = f"{POOL}-0"
POOL_TAINT = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
QUARANTINE_TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "gpu-missing", "effect": "NoSchedule"}
PER_MINUTE = 2
PODS = [f"{NODE}-p{i}" for i in range(4)]


class Killed(Exception):
    """The first leader dies here."""


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[str]:
    topo = {str(g): {"numa": g // 4, "uuid": f"GPU-{POOL}-{g}"} for g in range(8)}
    add_gpu_nodes(cluster, [GpuNodeSpec(name=NODE, gpus=8, topology=topo, taints=[POOL_TAINT])])
    ns = f"{POOL}-work"
    ensure_namespace(cluster, ns)
    pods = []
    for i, name in enumerate(PODS):
        p = pod_manifest(name, gpus=1, nodeName=NODE, tolerations=[{"operator": "Exists"}])
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
        delete_nodes(cluster, [NODE])


def evicted_events(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    items = cluster.get_json("events.events.k8s.io", "-n", ns)["items"]
    return [e for e in items if e.get("reason") == "GPUPodEvicted"]


def test_a_new_leader_inherits_the_eviction_rate_and_the_owed_event(cluster: Cluster, pool: str) -> None:
    config = Config.model_validate(
        {
            "drain": {
                "enabled": True,
                "gate": {"max_evictions_per_minute": PER_MINUTE, "min_schedulable_percent": 0},
            }
        }
    )
    record = QuarantineRecord("quarantined", "gpu-missing", evidence=(Evidence("gpu-missing"),)).encode()
    patch = {"metadata": {"annotations": {"gpuwarden.io/quarantine": record}},
             "spec": {"taints": [POOL_TAINT, QUARANTINE_TAINT]}}  # fmt: skip

    async def leader(name: str, seconds: float, *, die_at_first_event: bool) -> DrainLoop:
        async with KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube:
            loop = DrainLoop(config, kube, instance=name)
            if die_at_first_event:

                async def killed(*_: Any, **kw: Any) -> bool:
                    if kw.get("reason") == "GPUPodEvicted":
                        raise Killed
                    return True

                loop.actuator.events.emit_once = killed  # type: ignore[method-assign]
            caches = [asyncio.ensure_future(i.run()) for i in loop.caches()]
            try:
                await loop.wait_ready()
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    try:
                        await loop.run_once()
                    except Killed:
                        return loop
                    await asyncio.sleep(1.0)
                return loop
            finally:
                for task in caches:
                    task.cancel()
                await asyncio.gather(*caches, return_exceptions=True)

    started = time.monotonic()
    cluster.kubectl("patch", "node", NODE, "--type=merge", "-p", json.dumps(patch))
    first = asyncio.run(leader("leader-1", 20, die_at_first_event=True))
    assert first.metrics.evictions.labels("evicted")._value.get() == 1, "died right after its first Eviction"
    assert evicted_events(cluster, pool) == [], "and before its Event"
    second = asyncio.run(leader("leader-2", 20, die_at_first_event=False))
    elapsed = time.monotonic() - started

    by_second = second.metrics.evictions.labels("evicted")._value.get()
    assert elapsed < 60, elapsed  # both leaders within one rate-limit minute
    assert 1 + by_second == PER_MINUTE, by_second  # the new leader had one eviction left, not a fresh two
    events = evicted_events(cluster, pool)
    names = sorted(e["regarding"]["name"] for e in events)
    assert len(names) == len(set(names)) == PER_MINUTE, names  # one Event per evicted pod, the owed one too
    print(f"\n[e2e] evictions in the minute across the leader change: {1 + by_second} (limit {PER_MINUTE})")
