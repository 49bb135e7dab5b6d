"""CPU profile of the extender's request path, in process, no cluster: what one pod's filter + prioritize
cost the extender, from the request bytes to the response bytes (parse, decide, encode), as the HTTP
handlers run it (aiohttp's own share excluded).

A fleet of GPUWARDEN_BENCH_NODES (default 5,000) 8-GPU nodes as `bench_extender` builds it, the service
warmed as a serving extender is; then PODS pods of 1/2/4/8 GPUs, each a filter request with 500 random
candidate names (the body kube-scheduler sends: the pod object plus `NodeNames`) and a prioritize request
with the names that passed; after each pod one node changes (a pod bound there), as in a stream.

Prints the mean CPU per pod and the top of a cProfile (thread CPU time, sorted by own time).
Run: ``python -m tests.bench.profile_extender [PODS] [--sort tottime|cumtime] [--top N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import pstats
import random
import time
from typing import Any

from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService, answerers
from controller.extenderv1 import ExtenderArgs
from controller.gpus.fit import Settings
from tests.bench.bench_extender import CANDIDATES, SIZES, bind_one, fleet
from tests.unit.extender_support import pod


def scheduler_pod(name: str, gpus: int) -> dict[str, Any]:
    """A pod as kube-scheduler sends it: the test builder's pod plus the fields a real one carries."""
    obj = pod(name, gpus)
    obj["metadata"].update(
        uid=f"uid-{name}",
        resourceVersion="12345",
        creationTimestamp="2026-12-03T10:00:00Z",
        labels={"app": "bench"},
    )
    obj["spec"].update(schedulerName="default-scheduler", priority=0, restartPolicy="Always")
    obj["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
    return obj


async def run(pods: int, profiler: cProfile.Profile | None) -> float:
    rng = random.Random(29)
    model, _, _ = fleet(rng)
    service = ExtenderService(model, Settings(), extender_metrics(CollectorRegistry()), clock=lambda: 0.0)
    names = model.node_names()
    for k in sorted(set(SIZES)):  # warmed, as extender.warm_gpu_counts does
        for start in range(0, len(names), CANDIDATES):
            args = ExtenderArgs(pod=pod(f"warm{k}", k), node_names=names[start : start + CANDIDATES])
            await service.filter(args)
            await service.prioritize(args)
    gc.freeze()  # as the extender does once warmed
    bodies = []
    for i in range(pods):
        body = {"Pod": scheduler_pod(f"p{i}", rng.choice(SIZES)), "Nodes": None}
        bodies.append((body, rng.sample(names, CANDIDATES)))
    verbs = answerers(service)
    filter_, prioritize = verbs["filter"], verbs["prioritize"]
    spent = 0.0
    for i, (body, candidates) in enumerate(bodies):
        raw = json.dumps({**body, "NodeNames": candidates}).encode()
        began = time.thread_time()
        if profiler is not None:
            profiler.enable()
        _, out, _ = await filter_(raw)
        if profiler is not None:
            profiler.disable()
        spent += time.thread_time() - began
        raw = json.dumps({**body, "NodeNames": json.loads(out)["NodeNames"]}).encode()
        began = time.thread_time()
        if profiler is not None:
            profiler.enable()
        await prioritize(raw)
        if profiler is not None:
            profiler.disable()
        spent += time.thread_time() - began
        bind_one(model, rng, names, f"bound{i}")
    return spent / pods


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pods", nargs="?", type=int, default=1000)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=25)
    opts = parser.parse_args()
    plain = asyncio.run(run(opts.pods, None))
    profiler = cProfile.Profile(time.thread_time)
    asyncio.run(run(opts.pods, profiler))
    print(f"filter + prioritize, {CANDIDATES} candidates: {plain * 1000:.3f} ms CPU per pod (unprofiled)")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(opts.sort).print_stats(opts.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
