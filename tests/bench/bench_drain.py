"""Drain benchmark: one pass of the drain loop's pure work over 5,000 GPU nodes x 8 GPUs and 40,000 pods.

Prints numbers, asserts nothing about time. Parts:

1. observe: `build_snapshot` over the node and pod caches as the informers hold them (raw JSON): 5,000 nodes
   with the topology annotation, 40,000 GPU pods with `gpuwarden.io/gpu-ids`; 2 % of the nodes quarantined
   (half GPU-level XID 79, half node-level), some of them mid-drain with a drain state.
2. decide: `plan_drains` on that snapshot — p50/p99 of repeated runs.

The floor for comparison is one pass over the same caches that only counts the pods per node (the least any
per-pass reading of the caches costs). Run: `python -m tests.bench drain`.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

from controller.drain.observe import build_snapshot
from controller.drain.plan import plan_drains
from controller.drain.state import DrainState
from gpuwarden.config.drain import DrainConfig
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION
from tests.bench.summary import record

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "5000"))
PODS_PER_NODE = 8
NOW = 1_700_000_000.0
RUNS = 20


def fleet(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, pods = [], []
    for n in range(NODES):
        name = f"gpu-{n:05d}"
        topo = {str(g): {"numa": g // 4, "pcie": f"p{g // 2}", "uuid": f"GPU-{n}-{g}"} for g in range(8)}
        ann = {"gpuwarden.io/gpu-topology": json.dumps(topo)}
        taints = []
        if rng.random() < 0.02:
            gpu_level = rng.random() < 0.5
            ev = (
                Evidence("xid-79", gpu=f"GPU-{n}-{rng.randrange(8)}", xid=79)
                if gpu_level
                else Evidence("gpu-missing")
            )
            ann["gpuwarden.io/quarantine"] = QuarantineRecord(
                "quarantined", ev.reason, evidence=(ev,)
            ).encode()
            taints.append({"key": "gpuwarden.io/gpu-unhealthy", "value": ev.reason, "effect": "NoSchedule"})
            if rng.random() < 0.3:
                ann[DRAIN_ANNOTATION] = DrainState(started=NOW - 120, scope="gpu").encode()
        nodes.append({"metadata": {"name": name, "annotations": ann}, "spec": {"taints": taints},
                      "status": {"allocatable": {"nvidia.com/gpu": "8"}}})  # fmt: skip
        for p in range(PODS_PER_NODE):
            pods.append(
                {
                    "metadata": {"namespace": f"team-{p % 7}", "name": f"job-{n}-{p}", "uid": f"u-{n}-{p}",
                                 "labels": {"app": f"job-{n}"},
                                 "annotations": {"gpuwarden.io/gpu-ids": str(p)},
                                 "ownerReferences": [{"kind": "Job", "name": f"job-{n}"}]},
                    "spec": {"nodeName": name,
                             "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                    "status": {"phase": "Running"},
                }
            )  # fmt: skip
    return nodes, pods


def timed(fn: Any, runs: int = RUNS) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    rng = random.Random(7)
    nodes, pods = fleet(rng)
    policy = DrainConfig.model_validate({"enabled": True})

    def observe() -> Any:
        return build_snapshot(nodes, pods, resource="nvidia.com/gpu")

    snap = observe()

    def decide() -> Any:
        return plan_drains(
            snap.nodes, snap.pods_by_node, policy, NOW, evictions_last_minute=0,
            gpu_nodes=snap.gpu_nodes, schedulable_gpu_nodes=snap.schedulable_gpu_nodes,
        )  # fmt: skip

    def floor() -> Any:
        counts: dict[str, int] = {}
        for p in pods:
            node = p["spec"]["nodeName"]
            counts[node] = counts.get(node, 0) + 1
        return len(nodes), counts

    t_obs, t_dec, t_floor = timed(observe), timed(decide), timed(floor)
    plan = decide()
    evict = sum(1 for n in plan.nodes for a in n.actions if a.verdict.value == "evict")
    gpu_level = sum(1 for n in snap.nodes if n.fault_gpus)
    gate = policy.gate

    def q(v: list[float], p: float) -> float:
        return sorted(v)[min(len(v) - 1, int(p * len(v)))] * 1e3

    obs50, dec50, floor50 = (statistics.median(t) * 1e3 for t in (t_obs, t_dec, t_floor))
    print(
        f"{NODES} GPU nodes x 8 GPUs, {len(pods)} pods; {len(snap.nodes)} quarantined ({gpu_level} GPU-level)"
    )
    print(f"  plan: {evict} evictions this pass (gate: {gate.max_draining_nodes} nodes, "
          f"{gate.max_evictions_per_minute}/min)")  # fmt: skip
    print(f"  observe (build_snapshot): p50 {obs50:7.1f} ms, p99 {q(t_obs, 0.99):7.1f} ms")
    print(f"  decide (plan_drains):     p50 {dec50:7.2f} ms, p99 {q(t_dec, 0.99):7.2f} ms")
    ratio = (obs50 + dec50) / floor50
    print(f"  floor (count pods/node):  p50 {floor50:7.1f} ms -> observe + decide = {ratio:.1f}x")
    record(
        "drain",
        f"observe + decide p50, {NODES:,} nodes, {len(pods):,} pods",
        obs50 + dec50,
        "ms",
        anchor="floor: one pass counting pods per node",
        anchor_value=floor50,
    )
