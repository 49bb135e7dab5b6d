"""Health quarantine benchmark: one observe-decide-act pass over a large fleet, and detection latency.

Prints numbers, asserts nothing about time. Parts:

1. decide: `plan_quarantine` over N nodes x 8 GPUs (synthetic snapshot, a few faults) — median of runs.
2. observe: the real queries against a real Prometheus scraping the fleet simulator at N x 8 (only the
   families the health loop reads, to keep a 2-core machine responsive), timed end to end, with the number
   of Prometheus queries (constant) and the answer sizes.
3. act: API writes for that plan through a counting in-memory API (writes only for changes).
4. detection latency: the loop at its default 10 s interval; faults injected at random phases; time from the
   fault's first sample in Prometheus to the taint write. Goal: <= interval + 2 s.

Run: `python -m tests.bench health` (or `make bench`); `GPUWARDEN_BENCH_NODES=500` for a quicker run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httpx
from prometheus_client import CollectorRegistry

from controller.health.act import Actuator
from controller.health.decide import plan_quarantine
from controller.health.metrics import HealthMetrics
from controller.health.observe import Observer
from controller.health.policy import HealthPolicy, policy_from_config
from controller.health.snapshot import FleetSnapshot, GpuTelemetry, NodeState, XidObservation
from gpuwarden.config.health import HealthConfig
from gpuwarden.errors import KubeNotFound
from gpuwarden.kube import EventRecorder, KubeClient
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from tests.bench.summary import record

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "5000"))
GPUS = 8
HEALTH_FAMILIES = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                   "DCGM_FI_DEV_XID_ERRORS"]  # fmt: skip


class CountingApi:
    """An in-memory API for nodes/configmaps/events that counts writes (stands in for the API server)."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.objects = {("nodes", n["metadata"]["name"]): n for n in nodes}
        self.writes: list[tuple[str, str, float]] = []
        self.field_manager = "bench"

    async def get(self, resource: Any, name: str, **_: Any) -> dict[str, Any]:
        obj = self.objects.get((resource.plural, name))
        if obj is None:
            raise KubeNotFound(f"{name} not found", status=404)
        return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": "1"}}

    async def patch(
        self, resource: Any, name: str, body: Any, subresource: str | None = None, **_: Any
    ) -> Any:
        self.writes.append((resource.plural, name, time.time()))
        obj = self.objects.get((resource.plural, name))
        if obj is not None and subresource is None:
            body = {k: v for k, v in body.items() if k != "metadata"} | {
                "metadata": {k: v for k, v in body.get("metadata", {}).items() if k != "resourceVersion"}
            }
            merge(obj, body)
        return {}

    def nodes(self) -> list[dict[str, Any]]:
        return [o for (kind, _), o in self.objects.items() if kind == "nodes"]

    async def create(self, resource: Any, body: Any, **_: Any) -> dict[str, Any]:
        self.writes.append((resource.plural, str(body["metadata"]["name"]), time.time()))
        return dict(body)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}, "annotations": {}}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(GPUS)}, "nodeInfo": {"bootID": "b"}}}  # fmt: skip


def synthetic_snapshot(n: int, now: float) -> FleetSnapshot:
    nodes = []
    for i in range(n):
        gpus = []
        for g in range(GPUS):
            xids: tuple[XidObservation, ...] = ()
            if i % 1000 == 7 and g == 0:
                xids += (XidObservation(79, True, 1, now - 5),)
            xids += (XidObservation(13, True, 1, now - 5),) if i % 50 == 3 else ()
            gpus.append(GpuTelemetry(f"GPU-{i}-{g}", str(g), now - 3, xids[-1].code if xids else None, xids,
                                     dbe_volatile=0, row_remap_failure=0))  # fmt: skip
        nodes.append(NodeState(f"node-{i:05d}", gpu_capacity=GPUS, boot_id="b", gpus=tuple(gpus)))
    return FleetSnapshot(now, tuple(nodes))


def bench_decide() -> None:
    now = time.time()
    snap = synthetic_snapshot(NODES, now)
    policy = HealthPolicy()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        plan = plan_quarantine(snap, policy, now)
        times.append(time.perf_counter() - t0)
    med, low = statistics.median(times) * 1000, min(times) * 1000
    print(f"decide: {NODES} nodes x {GPUS} GPUs: plan_quarantine median {med:.0f} ms (min {low:.0f}); "
          f"{len(plan.actions)} actions, {len(plan.skips)} skips")  # fmt: skip
    record("health", f"plan_quarantine median, {NODES:,} nodes x {GPUS} GPUs (synthetic)", med, "ms")


async def bench_observe_act(workdir: Path) -> None:
    scenario = parse_scenario({"fleet": {"nodes": NODES, "gpus_per_node": GPUS},
                               "exporter": {"metrics": HEALTH_FAMILIES, "tick": 5}})  # fmt: skip
    sim = await start(scenario)
    prom = LocalPrometheus(workdir / "prom-observe", [scrape_target("dcgm", f"127.0.0.1:{sim.port}",
                                                                   scrape_interval_seconds=15)])  # fmt: skip
    try:
        await prom.start()
        await prom.wait_for_up("dcgm", timeout=120)
        async with httpx.AsyncClient() as http:
            faults = [{"kind": "xid", "node": f"gpu-node-{i:03d}", "gpu": 1, "code": 79} for i in (1, 2)]
            faults += [
                {"kind": "xid", "node": f"gpu-node-{i:03d}", "gpu": 0, "code": 13} for i in range(0, NODES, 7)
            ]
            (await http.post(f"{sim.url}/control/faults", json=faults)).raise_for_status()
        await asyncio.sleep(20)  # at least one scrape with the faults
        cfg = HealthConfig()
        nodes = [node_obj(f"gpu-node-{i:03d}") for i in range(NODES)]
        observer = Observer(cfg)
        async with prom.client() as client:
            times, snap = [], None
            for _ in range(3):
                t0 = time.perf_counter()
                snap = await observer.observe(client, nodes, None, time.time())
                times.append(time.perf_counter() - t0)
        assert snap is not None
        gpus = sum(len(n.gpus or ()) for n in snap.nodes)
        print(
            f"observe: {NODES} nodes: {snap.queries} Prometheus queries per pass (constant), median "
            f"{statistics.median(times) * 1000:.0f} ms; {gpus} GPUs joined, ok={snap.prometheus_ok}"
        )
        record(
            "health", f"observe, real Prometheus, {NODES:,} nodes: queries per pass", snap.queries, "queries"
        )
        record("health", "observe median", statistics.median(times) * 1000, "ms")
        t0 = time.perf_counter()
        plan = plan_quarantine(snap, policy_from_config(cfg), snap.taken_at)
        decide_ms = (time.perf_counter() - t0) * 1000
        api = CountingApi(nodes)
        kube = cast(KubeClient, api)
        actuator = Actuator(kube, EventRecorder(kube, component="health", instance="bench"),
                            HealthMetrics(CollectorRegistry()), namespace="bench")  # fmt: skip
        t0 = time.perf_counter()
        result = await actuator.apply(plan)
        act_ms = (time.perf_counter() - t0) * 1000
        node_writes = sum(1 for w in api.writes if w[0] == "nodes")
        print(f"decide (real snapshot): {decide_ms:.0f} ms; act: {act_ms:.0f} ms, {len(plan.actions)} actions"
              f" -> {node_writes} node writes (+{result.events} events) for {NODES} nodes; "
              f"{len(plan.skips_of('not-quarantining'))} XID-13 nodes skipped")  # fmt: skip
    finally:
        await prom.stop()
        await sim.stop()


async def bench_latency(workdir: Path, trials: int = 5) -> None:
    interval = HealthConfig().loop_interval_seconds
    scenario = parse_scenario({"fleet": {"nodes": 8}, "exporter": {"metrics": HEALTH_FAMILIES, "tick": 1}})
    sim = await start(scenario)
    prom = LocalPrometheus(workdir / "prom-latency", [scrape_target("dcgm", f"127.0.0.1:{sim.port}",
                                                                   scrape_interval_seconds=5)])  # fmt: skip
    latencies: list[float] = []
    try:
        await prom.start()
        await prom.wait_for_up("dcgm")
        cfg = HealthConfig.model_validate({"breaker": {"max_absolute": trials}})  # every trial may taint
        nodes = [node_obj(f"gpu-node-{i:03d}") for i in range(8)]
        api = CountingApi(nodes)
        kube = cast(KubeClient, api)
        observer = Observer(cfg)
        policy = policy_from_config(cfg)
        actuator = Actuator(kube, EventRecorder(kube, component="health", instance="bench"),
                            HealthMetrics(CollectorRegistry()), namespace="bench")  # fmt: skip
        async with prom.client() as client, httpx.AsyncClient() as http:
            for trial in range(trials):
                node = f"gpu-node-{trial:03d}"
                await asyncio.sleep(random.uniform(0, interval))
                fault = {"kind": "xid", "node": node, "gpu": 2, "code": 79}
                (await http.post(f"{sim.url}/control/faults", json=fault)).raise_for_status()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    started = time.monotonic()
                    snap = await observer.observe(client, api.nodes(), None, time.time())
                    plan = plan_quarantine(snap, policy, snap.taken_at)
                    mine = [a for a in plan.actions if a.node == node and a.kind == "quarantine"]
                    if mine:
                        await actuator.apply(plan)
                        written = next(w[2] for w in api.writes if w[1] == node)
                        assert mine[0].first_seen is not None
                        latencies.append(written - mine[0].first_seen)
                        break
                    await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:
        await prom.stop()
        await sim.stop()
    if latencies:
        print(f"detection latency (first sample in Prometheus -> taint write), loop interval {interval:g}s: "
              f"median {statistics.median(latencies):.1f}s, max {max(latencies):.1f}s over {len(latencies)} "
              f"faults (goal <= {interval + 2:g}s)")  # fmt: skip
        record(
            "health",
            f"detection latency, worst of {len(latencies)} faults",
            max(latencies),
            "s",
            goal=f"≤ {interval + 2:g} s (loop interval + 2 s)",
            met=max(latencies) <= interval + 2,
        )


async def main() -> None:
    bench_decide()
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        await bench_observe_act(Path(tmp))
        await bench_latency(Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
