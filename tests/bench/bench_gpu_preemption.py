"""GPU preemption benchmark: one pass of the controller's plan for 1,000 pending GPU pods over 5,000 nodes
with 10 pods each (6 GPU pods, 4 CPU-only), printed as p50/p99; asserts nothing about time.

Fleet: 2 NUMA x 4 GPU nodes; each holds six 1-GPU pods on random GPUs (priorities 10 / 100 / 1000) and four
pods without GPUs, so most nodes are fragmented for a 4-GPU single-numa pod. Pending: 1,000 pods of 4 GPUs
(priorities 100 / 500 / 2000), all rejected as fragmented. Parts:

1. observe: `room.candidate` over the 1,000 pending pods' JSON (PodScheduled condition, reservation);
2. decide: `plan_room` over every node's `NodeView` (victims chosen per node, best node per pod, one
   preemptor per node and pass) with the PodDisruptionBudgets of a tenth of the pods;
3. the floor in the same run: the extender's `filter_nodes` for the same 1,000 pods over the same 5,000
   nodes - what one scheduling attempt of each pending pod already costs the extender. The ratio says what
   making room adds to trying once.

Run: `python -m tests.bench gpu_preemption` (GPUWARDEN_BENCH_NODES=500 for a quick look).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

from controller.gpus.fit import Settings, filter_nodes
from controller.gpus.model import ClusterModel
from controller.gpus.objects import pod_info
from controller.makeroom.plan import NodeFacts, Pending, budgets_from, candidate, plan_room
from tests.bench.summary import record

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "5000"))
PENDING = 1000
NOW = 1_700_000_000.0
RUNS = 7
RESOURCE = "nvidia.com/gpu"


def _pod(name: str, gpus: int, priority: int, *, node: str = "", ids: str = "") -> dict[str, Any]:
    ann = {"gpuwarden.io/gpu-ids": ids} if ids else {}
    res = {"resources": {"limits": {RESOURCE: str(gpus)}}} if gpus else {}
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if not node:
        message, since = "0/5000 nodes are available: 4210 fragmented: 4 free, ...", "2023-11-14T22:00:00Z"
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "lastTransitionTime": since, "message": message}]  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": {"app": name[:6]},
                     "annotations": ann, "creationTimestamp": "2023-11-14T21:00:00Z"},
        "spec": {"priority": priority, "nodeName": node or None, "containers": [{"name": "c", **res}]},
        "status": status,
    }  # fmt: skip


def fleet(rng: random.Random) -> tuple[ClusterModel, list[dict[str, Any]], list[dict[str, Any]]]:
    m = ClusterModel(RESOURCE)
    bound: list[dict[str, Any]] = []
    for n in range(NODES):
        name = f"gpu-{n:05d}"
        topo = {str(g): {"numa": g // 4, "pcie": f"p{g // 2}", "uuid": f"GPU-{n}-{g}"} for g in range(8)}
        m.upsert_node({
            "metadata": {"name": name, "annotations": {"gpuwarden.io/gpu-topology": json.dumps(topo)}},
            "spec": {}, "status": {"allocatable": {RESOURCE: "8"}},
        })  # fmt: skip
        for i, gpu in enumerate(rng.sample(range(8), 6)):
            bound.append(_pod(f"{name}-g{i}", 1, rng.choice((10, 100, 1000)), node=name, ids=str(gpu)))
        bound += [_pod(f"{name}-c{i}", 0, 100, node=name) for i in range(4)]
    for p in bound:
        m.upsert_pod(p)
    pending = [_pod(f"pend-{i:04d}", 4, rng.choice((100, 500, 2000))) for i in range(PENDING)]
    for p in pending:
        m.upsert_pod(p)
    m.nodes_synced = m.pods_synced = True
    return m, bound, pending


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    rng = random.Random(7)
    started = time.perf_counter()
    m, bound, pending = fleet(rng)
    print(f"fleet: {NODES} nodes x 8 GPUs, {len(bound)} bound pods, {len(pending)} pending "
          f"(built in {time.perf_counter() - started:.1f}s)")  # fmt: skip
    settings = Settings(fleet_max_numa_gpus=m.max_numa_gpus())
    names = [f"gpu-{n:05d}" for n in range(NODES)]
    facts = {n: NodeFacts() for n in names}
    pdbs = [{"metadata": {"name": f"pdb-{i}", "namespace": "ml"},
             "spec": {"selector": {"matchLabels": {"app": f"gpu-{i:02d}"}}},
             "status": {"disruptionsAllowed": 0}} for i in range(0, 50, 10)]  # fmt: skip
    observe, decide, floor = [], [], []
    planned = victims = 0
    for _ in range(RUNS):
        views = {n: m.view(n) for n in names}  # fresh views: no answer cached from an earlier run
        for n in names:
            view = views[n]
            if view is not None:
                view.memo.clear()
        t0 = time.perf_counter()
        cands = []
        for obj in pending:
            got = candidate(obj, pod_info(obj, RESOURCE), NOW, 5.0, 60.0, ())
            if isinstance(got, Pending):
                cands.append(got)
        budgets = budgets_from(pdbs, bound)
        t1 = time.perf_counter()
        decisions = plan_room(cands, views, facts, settings, NOW, budgets=budgets, limit=PENDING)
        t2 = time.perf_counter()
        for n in names:
            view = views[n]
            if view is not None:
                view.memo.clear()
        t3 = time.perf_counter()
        nodes = list(views.items())
        for c in cands:
            filter_nodes(c.pod, nodes, settings, NOW)
        t4 = time.perf_counter()
        observe.append(t1 - t0)
        decide.append(t2 - t1)
        floor.append(t4 - t3)
        planned = sum(1 for d in decisions if d.plan)
        victims = sum(len(d.plan.victims) for d in decisions if d.plan)
    print(f"plans: {planned} of {len(pending)} preemptors got a node ({victims} victims); "
          f"{len(pending) - planned} wait (one preemptor per node and pass, or no room)")  # fmt: skip
    for label, xs in (("observe (candidates + PDB index)", observe), ("decide (plan_room)", decide),
                      ("floor: filter_nodes, 1,000 pods x all nodes", floor)):  # fmt: skip
        print(f"{label:46s} p50 {statistics.median(xs) * 1e3:8.1f} ms   p99 {_pct(xs, 0.99) * 1e3:8.1f} ms")
    ratio = statistics.median(decide) / statistics.median(floor)
    per_pod = statistics.median(decide) / len(pending) * 1e3
    print(f"plan / floor: {ratio:.2f}x   ({per_pod:.2f} ms per pending pod, {RUNS} runs)")
    record(
        "gpu_preemption",
        f"plan_room p50, {len(pending):,} pending pods over {NODES:,} nodes",
        statistics.median(decide) * 1e3,
        "ms",
        anchor="extender's filter_nodes, same pods and nodes",
        anchor_value=statistics.median(floor) * 1e3,
    )


if __name__ == "__main__":
    main()
