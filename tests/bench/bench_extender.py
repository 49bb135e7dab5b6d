"""Scheduler-extender benchmark: filter + prioritize latency for 500 candidates out of a 5,000-node fleet.

Prints numbers, asserts nothing about time. Parts:

1. model build: feeding 5,000 nodes x 8 GPUs (2 NUMA x 4, NVLink pairs) and ~20,000 GPU pods into the model.
2. in-process: `filter_nodes` on 500 random candidates, then `score_nodes` on the survivors (what the
   scheduler asks next), for a mix of 1/2/4/8-GPU pods; between requests one pod is bound (one node's view
   and cached answers are rebuilt), as in a scheduling stream. Cold = the first request of each shape right
   after every view was dropped (a relist).
3. over HTTP (nodeCacheCapable: true): the same pair as POST /filter + POST /prioritize on loopback through
   aiohttp, client and server in this process (so the client's own cost is included).
4. the payload size of a nodeCacheCapable: false filter request for 500 candidates, and its parse time.

5. opt-in (`GPUWARDEN_BENCH_E2E_NODES=N`, `GPUWARDEN_BENCH_E2E_PODS=M`): pods/s of the real kube-scheduler
   on N kwok GPU nodes, default scheduler vs. with our extender filtering, scoring and binding.

Goals (issue 6): p99 <= 5 ms in-process and <= 15 ms over HTTP at 500 candidates; >= 100 pods/s end to end.
Run: `python -m tests.bench extender`; `GPUWARDEN_BENCH_NODES=1000` for a quicker run.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import statistics
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.decide import Settings, filter_nodes, score_nodes
from controller.extender.metrics import extender_metrics
from controller.extender.model import ClusterModel
from controller.extender.objects import PodInfo, pod_info
from controller.extender.server import ExtenderService, add_extender_routes
from controller.extender.wire import ExtenderArgs
from tests.unit.extender_support import node, pod

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "5000"))
CANDIDATES = 500
REQUESTS = int(os.environ.get("GPUWARDEN_BENCH_REQUESTS", "400"))
SIZES = (1, 1, 2, 4, 8)


def fleet(rng: random.Random) -> tuple[ClusterModel, list[dict[str, Any]], float]:
    """A model with NODES GPU nodes, about half their GPUs held by annotated pods, a few count-only."""
    started = time.perf_counter()
    model = ClusterModel("nvidia.com/gpu")
    nodes = [node(f"gpu-node-{i:05d}") for i in range(NODES)]
    for obj in nodes:
        model.upsert_node(obj)
    count = 0
    for i in range(NODES):
        free = list(range(8))
        rng.shuffle(free)
        for _ in range(rng.randint(0, 5)):
            k = min(rng.choice((1, 1, 2, 4)), len(free))
            ids, free = free[:k], free[k:]
            if not ids:
                break
            annotated = rng.random() > 0.02
            model.upsert_pod(
                pod(
                    f"p{count}",
                    k,
                    node=f"gpu-node-{i:05d}",
                    ids=",".join(map(str, sorted(ids))) if annotated else None,
                )
            )
            count += 1
    model.nodes_synced = model.pods_synced = True
    return model, nodes, time.perf_counter() - started


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def report(label: str, samples: list[float]) -> None:
    print(
        f"  {label:<44} p50 {pct(samples, 0.50):6.2f} ms   p99 {pct(samples, 0.99):6.2f} ms   "
        f"max {max(samples) * 1000:6.2f} ms   (n={len(samples)})",
        flush=True,
    )


def request(
    model: ClusterModel, settings: Settings, incoming: PodInfo, candidates: list[str]
) -> tuple[float, int]:
    """One filter + prioritize pair as the scheduler sends it; (seconds, nodes passing filter)."""
    start = time.perf_counter()
    result = filter_nodes(incoming, [(n, model.view(n)) for n in candidates], settings, 0.0)
    score_nodes(incoming, [(n, model.view(n)) for n in result.passed], settings, 0.0)
    return time.perf_counter() - start, len(result.passed)


def in_process(model: ClusterModel, rng: random.Random) -> None:
    names = model.node_names()
    settings = Settings(fleet_max_numa_gpus=model.max_numa_gpus())
    shapes = [pod_info(pod(f"shape{k}", k), model.resource) for k in sorted(set(SIZES))]
    for n in names:  # cold: every view rebuilt (after a relist or a restart)
        model._views.pop(n, None)
    cold = [request(model, settings, shape, rng.sample(names, CANDIDATES))[0] for shape in shapes]
    for shape in shapes:  # the scheduler has seen every node with every shape once
        request(model, settings, shape, names)
    steady: list[float] = []
    passed: list[int] = []
    filt: list[float] = []
    for i in range(REQUESTS):
        incoming = pod_info(pod(f"x{i}", rng.choice(SIZES)), model.resource)
        candidates = rng.sample(names, CANDIDATES)
        start = time.perf_counter()
        filter_nodes(incoming, [(n, model.view(n)) for n in candidates], settings, 0.0)
        filt.append(time.perf_counter() - start)
        seconds, count = request(model, settings, incoming, candidates)
        steady.append(seconds)
        passed.append(count)
        # the previous pod was bound: one node changed, its view and answers are rebuilt on next use
        model.upsert_pod(pod(f"bound{i}", 1, node=rng.choice(names), ids=str(rng.randrange(8))))
    report("filter only (500 candidates)", filt)
    report("filter + prioritize, steady stream", steady)
    report("filter + prioritize, cold (views rebuilt)", cold)
    print(f"  candidates passing filter: median {statistics.median(passed):.0f} of {CANDIDATES}")


async def over_http(model: ClusterModel, rng: random.Random) -> None:
    names = model.node_names()
    service = ExtenderService(model, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: 0.0)
    app = web.Application()
    add_extender_routes(app, service, "/gpuwarden")
    samples: list[float] = []
    async with TestClient(TestServer(app)) as client:
        for i in range(REQUESTS // 2 + 10):
            body = {
                "Pod": pod(f"h{i}", rng.choice(SIZES)),
                "Nodes": None,
                "NodeNames": rng.sample(names, CANDIDATES),
            }
            start = time.perf_counter()
            resp = await client.post("/gpuwarden/filter", data=json.dumps(body))
            filtered = json.loads(await resp.read())
            body["NodeNames"] = filtered["NodeNames"]
            resp = await client.post("/gpuwarden/prioritize", data=json.dumps(body))
            await resp.read()
            if i >= 10:  # the first few warm up aiohttp's connection and code paths
                samples.append(time.perf_counter() - start)
            model.upsert_pod(pod(f"hb{i}", 1, node=rng.choice(names), ids=str(rng.randrange(8))))
    report("HTTP filter + prioritize (NodeNames), steady", samples)


def payload(nodes: list[dict[str, Any]], rng: random.Random) -> None:
    body = {
        "Pod": pod("big", 4),
        "Nodes": {"metadata": {}, "items": rng.sample(nodes, CANDIDATES)},
        "NodeNames": None,
    }
    raw = json.dumps(body).encode()
    small = json.dumps(
        {
            "Pod": pod("big", 4),
            "Nodes": None,
            "NodeNames": [n["metadata"]["name"] for n in body["Nodes"]["items"]],
        }
    )
    start = time.perf_counter()
    for _ in range(10):
        ExtenderArgs.model_validate_json(raw)
    parse = (time.perf_counter() - start) / 10
    print(
        f"  filter request for {CANDIDATES} nodes: nodeCacheCapable false {len(raw) / 1024:.0f} KiB "
        f"(parse {parse * 1000:.1f} ms), true {len(small) / 1024:.1f} KiB"
    )


async def main() -> None:
    rng = random.Random(6)
    model, nodes, build = fleet(rng)
    gc.freeze()  # as the controller does after its first sync: the cache is not rescanned by every gen-2 GC
    print(
        f"fleet: {NODES} nodes x 8 GPUs, {len(model._pods)} GPU pods; model built in {build:.2f} s",
        flush=True,
    )
    in_process(model, rng)
    await over_http(model, rng)
    payload(nodes, rng)
    e2e_nodes = int(os.environ.get("GPUWARDEN_BENCH_E2E_NODES", "0"))
    if e2e_nodes:
        await asyncio.to_thread(
            e2e_throughput, e2e_nodes, int(os.environ.get("GPUWARDEN_BENCH_E2E_PODS", "1000"))
        )
    else:
        print(
            "  e2e pods/s through the real scheduler: set GPUWARDEN_BENCH_E2E_NODES=1000 (starts a cluster)"
        )


def e2e_throughput(nodes: int, pods_per_run: int) -> None:
    """Pods/s of the real kube-scheduler on `nodes` kwok GPU nodes, without and with the extender binding.

    Opt-in (`GPUWARDEN_BENCH_E2E_NODES=1000`): it starts a control plane, which a shared 2-core machine feels.
    Time runs from the moment all pods exist (one `kubectl create`) until every pod has a node.
    """
    from gpuwarden.testbed import (
        Cluster,
        ClusterConfig,
        ExtenderSpec,
        GpuNodeSpec,
        SchedulerSettings,
        add_gpu_nodes,
        ensure_namespace,
        poll,
        scheduler_configuration,
    )
    from tests.e2e.conftest import free_port, pod_manifest
    from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender, topology

    cluster = Cluster.create(ClusterConfig(name=f"gw-bench-{os.getpid()}", progress=False))
    try:
        started = time.perf_counter()
        specs = [GpuNodeSpec(name=f"bench-{i:05d}", gpus=8, topology=topology(2, 4)) for i in range(nodes)]
        for i in range(0, nodes, 500):
            add_gpu_nodes(cluster, specs[i : i + 500], timeout=600)
        print(f"  e2e: {nodes} kwok nodes ready in {time.perf_counter() - started:.0f} s", flush=True)
        port = free_port()
        spec = ExtenderSpec(
            url_prefix=f"http://127.0.0.1:{port}{PREFIX}", prioritize_verb="prioritize",
            preempt_verb="preempt", bind_verb="bind", weight=12, node_cache_capable=True,
            managed_resources=["nvidia.com/gpu"],
        )  # fmt: skip
        for mode in ("default scheduler", "with gpuwarden extender"):
            running = None
            if mode.startswith("with"):
                cluster.restart_scheduler(scheduler_configuration(SchedulerSettings(extenders=[spec])))
                running = RunningExtender(cluster, port).start()
            namespace = f"bench-{mode.split()[0]}"
            ensure_namespace(cluster, namespace)
            items = []
            for i in range(pods_per_run):
                body = pod_manifest(f"p{i}", gpus=rng_size(i))
                body["metadata"]["namespace"] = namespace
                items.append(body)
            cluster.kubectl(
                "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            )
            start = time.perf_counter()

            def bound(namespace: str = namespace) -> bool:
                listed = cluster.get_json("pods", "-n", namespace)["items"]
                return sum(1 for p in listed if p["spec"].get("nodeName")) == pods_per_run

            poll(bound, timeout=600, interval=0.5, what=f"{pods_per_run} pods bound")
            elapsed = time.perf_counter() - start
            print(
                f"  e2e {mode:<26} {pods_per_run / elapsed:7.1f} pods/s "
                f"({pods_per_run} pods, {elapsed:.1f} s)"
            )
            if running is not None:
                running.stop()
    finally:
        cluster.delete()


def rng_size(i: int) -> int:
    return (1, 1, 2, 4, 1, 2, 8, 1)[i % 8]
