"""Nomination cleanup benchmark: one scan over 10,000 pending nominated pods.

Prints numbers, asserts nothing about time. Parts:

1. snapshot: `build_snapshot` over the pod and node caches as the informers hold them (raw JSON): 10,000
   pending pods nominated across 2,500 GPU nodes plus 20,000 running pods (some of them terminating
   preemption victims), with the extender's model views of the nominated nodes (the never-fits rule).
2. decide: `plan_nominations` on that snapshot — median of several runs, with and without the model.
3. act (first pass after a deploy): how many API writes the plan implies — one record stamp per new
   nomination, one clear per stale one — and how long applying them takes against an in-memory API.

Goal (issue 7): a scan of 10,000 pending pods well inside the 30 s loop interval.
Run: `python -m tests.bench nominations`; `GPUWARDEN_BENCH_PENDING=2000` for a quicker run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.nominations.act import NominationActuator
from controller.nominations.decide import plan_nominations
from controller.nominations.metrics import NominationMetrics
from controller.nominations.plan import NominationPolicy
from controller.nominations.snapshot import NominationRecord, build_snapshot
from gpuwarden.config.nominations import NominationsConfig
from gpuwarden.kube.resources import ObjectList
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION
from tests.bench.summary import record

PENDING = int(os.environ.get("GPUWARDEN_BENCH_PENDING", "10000"))
NODES = max(10, PENDING // 4)
RUNNING = PENDING * 2
NOW = 1_700_000_000.0
TOPOLOGY = json.dumps(
    {str(i): {"numa": i // 4, "pcie": f"p{i // 2}", "nvlink": f"n{i // 2}"} for i in range(8)}
)


def node(i: int, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    taints = (
        [{"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
        if roll < 0.01
        else []
    )
    ready = "False" if 0.01 <= roll < 0.02 else "True"
    conditions = [{"type": "Ready", "status": ready, "lastTransitionTime": "2023-11-14T21:00:00Z"}]
    gpus = {"nvidia.com/gpu": "8"}
    return {
        "metadata": {"name": f"gpu-{i}", "annotations": {"gpuwarden.io/gpu-topology": TOPOLOGY}},
        "spec": {"unschedulable": 0.02 <= roll < 0.03, "taints": taints},
        "status": {"allocatable": gpus, "capacity": gpus, "conditions": conditions},
    }


def pod(name: str, rng: random.Random, *, pending: bool) -> dict[str, Any]:
    gpus = rng.choice((1, 1, 2, 4, 8))
    n = rng.randrange(NODES + NODES // 50)  # ~2 % point at nodes that are gone
    owners = [{"kind": "Job", "name": name[:-2], "uid": "j", "controller": True}]
    meta: dict[str, Any] = {"name": name, "namespace": f"team-{rng.randrange(50)}", "uid": f"uid-{name}",
                            "ownerReferences": owners}  # fmt: skip
    status: dict[str, Any] = {"phase": "Pending" if pending else "Running"}
    container = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    spec: dict[str, Any] = {"priority": 1000 if pending else 100, "containers": [container]}
    if pending:
        status["nominatedNodeName"] = f"gpu-{n}"
        if rng.random() < 0.8:
            age = rng.choice((10, 100, 400, 4000))
            meta["annotations"] = {NOMINATION_ANNOTATION: NominationRecord(f"gpu-{n}", NOW - age).encode()}
    else:
        spec["nodeName"] = f"gpu-{n % NODES}"
        if rng.random() < 0.02:
            meta["deletionTimestamp"] = "2023-11-14T22:13:00Z"
            marked = "2023-11-14T22:13:00Z"
            condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            status["conditions"] = [{**condition, "lastTransitionTime": marked}]
    return {"metadata": meta, "spec": spec, "status": status}


class CountingApi:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.writes = 0

    async def get(self, resource: Any, name: str, **_: Any) -> dict[str, Any]:
        return {**self.pods[name], "metadata": {**self.pods[name]["metadata"], "resourceVersion": "1"}}

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.writes += 1
        return {}

    async def list_objects(self, *args: Any, **kwargs: Any) -> ObjectList:
        return ObjectList([], "1")

    async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.writes += 1
        return {}


class NullRecorder:
    """An `EventRecorder` that writes nothing (the bench times decisions and writes, not Events)."""

    async def emit(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def emit_once(self, *args: Any, **kwargs: Any) -> bool:
        return True  # "nothing left to do", as for an Event that exists


def timed(fn: Any, runs: int = 5) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    rng = random.Random(7)
    nodes = [node(i, rng) for i in range(NODES)]
    pods = [pod(f"p{i:05d}-0", rng, pending=True) for i in range(PENDING)]
    pods += [pod(f"r{i:05d}-0", rng, pending=False) for i in range(RUNNING)]
    model = ClusterModel("nvidia.com/gpu")
    for obj in nodes:
        model.upsert_node(obj)
    for obj in pods:
        model.upsert_pod(obj)
    model.nodes_synced = model.pods_synced = True
    print(f"  fleet: {NODES} nodes, {PENDING} pending nominated pods, {RUNNING} running pods", flush=True)

    def snap(with_model: bool) -> Any:
        settings = replace(Settings(), fleet_max_numa_gpus=model.max_numa_gpus())  # as the extender's service
        return build_snapshot(pods, nodes, view_of=model.view if with_model else None,
                              fit_settings=settings if with_model else None)  # fmt: skip

    snap_s, snapshot = timed(lambda: snap(True), runs=3)
    bare_s, bare = timed(lambda: snap(False), runs=3)
    print(f"  snapshot: {snap_s * 1000:.0f} ms with model views, {bare_s * 1000:.0f} ms without "
          f"({sum(len(v) for v in snapshot.terminating.values())} terminating victims)")  # fmt: skip
    policy = NominationPolicy()
    plan_s, plan = timed(lambda: plan_nominations(snapshot, policy, NOW))
    plan_bare_s, _ = timed(lambda: plan_nominations(bare, policy, NOW))
    print(f"  plan_nominations: {plan_s * 1000:.0f} ms with the never-fits rule, "
          f"{plan_bare_s * 1000:.0f} ms without; {PENDING / plan_s:,.0f} pods/s")  # fmt: skip
    print(f"  plan: {plan.counts}")
    api = CountingApi(pods)
    act = NominationActuator(api, NullRecorder(), NominationMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    started = time.perf_counter()
    result = asyncio.run(act.apply(plan))
    act_s = time.perf_counter() - started
    print(f"  act (first pass, in-memory API): {api.writes} writes ({len(plan.stamps)} record stamps, "
          f"{len(result.cleared)} clears, {len(plan.evictions)} evictions) in {act_s:.2f} s")  # fmt: skip
    print(f"  total scan (snapshot + decide): {(snap_s + plan_s) * 1000:.0f} ms for {PENDING} pending pods")
    record(
        "nominations",
        f"scan (snapshot + decide), {PENDING:,} pending pods",
        (snap_s + plan_s) * 1000,
        "ms",
        anchor="default loop interval",
        anchor_value=NominationsConfig().loop_interval_seconds * 1000,
        goal="well inside the loop interval (issue 7)",
    )


if __name__ == "__main__":
    main()
