"""Idle-GPU detection benchmark: one pass over 40,000 GPU pods.

Prints numbers, asserts nothing about time. Parts:

1. queries per pass: one `IdleLoop.run_once` (dry-run) over the pods as the informer holds them (raw JSON),
   with a counting stand-in for Prometheus answering the pass's query; the loop must send exactly one.
2. read: `read_usage` over the answer Prometheus would give (two samples per GPU: peak and sample count).
3. snapshot + decide: `build_snapshot` (the pod-to-GPU join) and `plan_idle` — median of several runs.

Fleet: 40,000 pods (1, 2, 4 or 8 GPUs) on 8-GPU nodes; 70 % with a recorded `gpuwarden.io/gpu-ids` (joined
by node and GPU, series unlabelled), 30 % joined by dcgm-exporter's pod labels; 20 % idle, 5 % with gaps.
Run: `python -m tests.bench idle`; `GPUWARDEN_BENCH_IDLE_PODS=4000` for a quicker run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from typing import Any

from prometheus_client import CollectorRegistry

from controller.idle.decide import plan_idle, policy_from_config
from controller.idle.loop import IdleLoop
from controller.idle.query import STAT_LABEL, read_usage
from controller.idle.snapshot import build_snapshot
from gpuwarden.config.root import Config
from gpuwarden.promtypes import Sample, Vector
from gpuwarden.wellknown import GPU_IDS
from tests.bench.summary import record

PODS = int(os.environ.get("GPUWARDEN_BENCH_IDLE_PODS", "40000"))
NOW = 1_800_000_000.0
CONFIG = Config.model_validate({"idle": {"enabled": True}})


def fleet(rng: random.Random) -> tuple[list[dict[str, Any]], list[tuple[dict[str, str], float]]]:
    pods: list[dict[str, Any]] = []
    answer: list[tuple[dict[str, str], float]] = []
    node, free = 0, 8
    for i in range(PODS):
        gpus = rng.choice((1, 1, 1, 2, 4, 8))
        if gpus > free:
            node, free = node + 1, 8
        ids = [str(8 - free + g) for g in range(gpus)]
        free -= gpus
        name, ns, host = f"pod-{i}", f"team-{i % 200}", f"gpu-{node}"
        recorded = rng.random() < 0.7
        meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{i}",
                                "annotations": {GPU_IDS: ",".join(ids)} if recorded else {}}  # fmt: skip
        pods.append({
            "metadata": meta,
            "spec": {"nodeName": host,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
        })  # fmt: skip
        roll = rng.random()
        for gpu in ids:
            labels = {"Hostname": host, "gpu": gpu} | ({} if recorded else {"namespace": ns, "pod": name})
            peak = 0.3 if roll < 0.25 else 60.0  # 20 % idle, 5 % idle-looking with gaps (unknown)
            samples = 20 if 0.2 <= roll < 0.25 else 60
            answer.append(({**labels, STAT_LABEL: "max"}, peak))
            answer.append(({**labels, STAT_LABEL: "samples"}, float(samples)))
    return pods, answer


class CountingProm:
    def __init__(self, answer: list[tuple[dict[str, str], float]]) -> None:
        self.vector = Vector([Sample(labels, NOW, value) for labels, value in answer])
        self.queries = 0

    async def query(self, promql: str, time: float | None = None, timeout: float | None = None) -> Vector:  # noqa: ASYNC109
        self.queries += 1
        return self.vector


class Informer:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.synced = asyncio.Event()
        self.synced.set()

    def objects(self) -> list[dict[str, Any]]:
        return self.pods


class Recorder:
    async def emit(self, *_: Any, **__: Any) -> None:
        return None


def median_ms(fn: Any, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def main() -> None:
    rng = random.Random(27)
    pods, answer = fleet(rng)
    gpus = len(answer) // 2
    print(f"fleet: {len(pods)} GPU pods, {gpus} GPUs, answer of {len(answer)} samples")

    prom = CountingProm(answer)
    loop = IdleLoop(CONFIG, prom, None, pods=Informer(pods), recorder=Recorder(), clock=lambda: NOW,  # type: ignore[arg-type]
                    registry=CollectorRegistry())  # fmt: skip
    started = time.perf_counter()
    plan = await loop.run_once()
    took = (time.perf_counter() - started) * 1000
    print(f"one dry-run pass: {prom.queries} Prometheus query, {took:.0f} ms (observe over the in-memory "
          f"answer + decide + act), states {plan.counts}")  # fmt: skip
    budget = CONFIG.idle.max_marks_per_pass
    print(f"  {len(plan.marks)} reported (budget {budget}), {len(plan.deferred)} deferred")
    record(
        "idle",
        f"one pass over {len(pods):,} GPU pods: Prometheus queries",
        prom.queries,
        "queries",
        goal="exactly 1 (this bench)",
        met=prom.queries == 1,
    )
    record(
        "idle",
        "one dry-run pass (in-memory answer)",
        took,
        "ms",
        anchor="default pass interval",
        anchor_value=CONFIG.idle.loop_interval_seconds * 1000,
    )

    usage = read_usage(answer, CONFIG.idle.metric_labels)
    print(f"read_usage: {median_ms(lambda: read_usage(answer, CONFIG.idle.metric_labels)):.0f} ms median")
    resource = CONFIG.kubernetes.gpu_resource_name
    join_ms = median_ms(lambda: build_snapshot(pods, usage, resource=resource))
    print(f"build_snapshot (join): {join_ms:.0f} ms median")
    snapshot = build_snapshot(pods, usage, resource=resource)
    policy = policy_from_config(CONFIG.idle)
    print(f"plan_idle: {median_ms(lambda: plan_idle(snapshot, policy, NOW)):.0f} ms median")
