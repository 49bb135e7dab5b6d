"""Preemption throttle benchmark: decisions per second with 1,000 preemption events per minute.

Prints numbers, asserts nothing about time. Parts:

1. ingest: 15 minutes of history at 1,000 victims per minute (15,000 `Preempted` Events, the chain window)
   fed through the observer's handlers over a 20,000-pod index — records per second.
2. decide: `PreemptionThrottle.decide()` (request parsing + `decide_preemption` over that graph) for
   nodeCacheCapable requests with 10 and 100 candidate nodes of 1-4 victims — median, p99, decisions/s.
   Budgets and the chain limit are set high so every candidate goes through every check (the defaults veto
   at once at this rate, which is cheaper; measured too).
3. live: the same decisions while Events keep arriving at 1,000 per minute of simulated time, with pruning.
4. HTTP: the preempt verb through the extender's aiohttp edge on loopback (client cost included).
5. tenants: the same decisions with `preemption.tenants.rule: over-share` (40 namespaces as 8 tenants with
   quotas, every pod holding a GPU in the GPU model): the tenancy is rebuilt per request and every victim
   judged, against the same run without the rule.

Goal (issue 7): decisions fast enough to be invisible next to the scheduler's 5 s extender timeout.
Run: `python -m tests.bench preemption`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import statistics
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService, add_extender_routes
from controller.extenderv1 import ExtenderPreemptionArgs
from controller.gpus.fit import Settings
from controller.gpus.model import ClusterModel
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import ADDED, WatchEvent
from tests.bench.summary import record

RATE_PER_MIN = 1000
WINDOW_MIN = 15
PODS = 20_000
WORKLOADS = 400
NODES = 2_000
NOW = 1_700_000_000.0
EXTENDER_TIMEOUT_MS = 5000.0
"""kube-scheduler's default extender httpTimeout: the goal is decisions invisible next to it (issue 7)."""
GOAL = "invisible next to the timeout (issue 7)"
PERMISSIVE = {"global_budget": {"max_victims": 1_000_000, "window_seconds": 300},
              "namespace_budget": {"max_victims": 1_000_000, "window_seconds": 300},
              "workload_budget": {"max_victims": 1_000_000, "window_seconds": 600},
              "max_chain_depth": 1_000_000}  # fmt: skip


class NullRecorder:
    """An `EventRecorder` that writes nothing (the bench times decisions and writes, not Events)."""

    async def emit(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def emit_once(self, *args: Any, **kwargs: Any) -> bool:
        return True  # "nothing left to do", as for an Event that exists

    async def flush(self) -> None:
        return None


SAFE = "bcdfghjklmnpqrstvwxz2456789"


def suffix(i: int) -> str:
    """A generateName suffix (5 chars of the safe alphabet), unique per i."""
    return "".join(SAFE[(i // len(SAFE) ** k) % len(SAFE)] for k in range(5))


def pod(i: int) -> dict[str, Any]:
    w = i % WORKLOADS
    owners = [{"kind": "ReplicaSet", "name": f"w{w}-5d4f8b9c7", "controller": True}]
    return {
        "metadata": {"uid": f"pod-{i}", "name": f"w{w}-5d4f8b9c7-{suffix(i)}", "namespace": f"team-{w % 40}",
                     "labels": {"pod-template-hash": "5d4f8b9c7"}, "ownerReferences": owners,
                     "creationTimestamp": "2023-11-14T20:00:00Z"},
        "spec": {"nodeName": f"gpu-{i % NODES}", "priority": 100 + (w % 5) * 100},
        "status": {"phase": "Running"},
    }  # fmt: skip


def event(n: int, at: float, rng: random.Random) -> dict[str, Any]:
    victim, preemptor = pod(rng.randrange(PODS)), pod(rng.randrange(PODS))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
    ref = {"apiVersion": "v1", "kind": "Pod"}
    return {
        "metadata": {"uid": f"ev-{n}", "name": f"e{n}", "namespace": victim["metadata"]["namespace"]},
        "reason": "Preempted", "action": "Preempting", "eventTime": stamp,
        "regarding": {**ref, "uid": f"victim-{n}", "name": victim["metadata"]["name"],
                      "namespace": victim["metadata"]["namespace"]},
        "related": {**ref, "uid": preemptor["metadata"]["uid"], "name": preemptor["metadata"]["name"],
                    "namespace": preemptor["metadata"]["namespace"]},
        "note": f"Preempted by pod {preemptor['metadata']['uid']} on node {victim['spec']['nodeName']}",
    }  # fmt: skip


def request(rng: random.Random, candidates: int) -> bytes:
    preemptor = pod(rng.randrange(PODS))
    preemptor["spec"].pop("nodeName")
    preemptor["spec"]["priority"] = 10_000
    nodes = rng.sample(range(NODES), candidates)
    victims = {f"gpu-{n}": {"Pods": [{"UID": f"pod-{rng.randrange(PODS)}"} for _ in range(rng.randint(1, 4))],
                            "NumPDBViolations": 0} for n in nodes}  # fmt: skip
    return json.dumps(
        {"Pod": preemptor, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims}
    ).encode()


def throttle(clock: list[float], preemption: dict[str, Any]) -> PreemptionThrottle:
    config = Config.model_validate({"preemption": preemption})
    t = PreemptionThrottle(config, object(), registry=CollectorRegistry(), recorder=NullRecorder(),  # type: ignore[arg-type]
                           clock=lambda: clock[0])  # fmt: skip
    for i in range(PODS):
        t.observer.on_pod(WatchEvent(ADDED, pod(i)))
    t.observer.pods.synced.set()
    t.observer.events_synced = True
    return t


def with_tenants(t: PreemptionThrottle) -> PreemptionThrottle:
    """`t` deciding with a GPU model of every pod (1 GPU each) and, when its rule is not `any`, 40 labelled
    namespaces as 8 tenants with a 400-GPU quota each."""
    m = ClusterModel()
    for n in range(NODES):
        m.upsert_node({"metadata": {"name": f"gpu-{n}"}, "status": {"allocatable": {"nvidia.com/gpu": "16"}}})
    for i in range(PODS):
        obj = pod(i)
        obj["spec"]["containers"] = [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        m.upsert_pod(obj)
    m.nodes_synced = m.pods_synced = True
    t.use_gpu_model(m, Settings)
    if t.tenants.namespaces is not None and t.tenants.quotas is not None:
        t.tenants.namespaces.store = {
            f"team-{k}": {"metadata": {"name": f"team-{k}", "labels": {"gpuwarden.io/tenant": f"t{k % 8}"}}}
            for k in range(40)
        }
        t.tenants.quotas.store = {
            f"team-{k}/gpus": {"metadata": {"name": "gpus", "namespace": f"team-{k}"},
                               "spec": {"hard": {"requests.nvidia.com/gpu": "400"}}}
            for k in range(40)
        }  # fmt: skip
        t.tenants.namespaces.synced.set()
        t.tenants.quotas.synced.set()
    return t


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def decide_loop(t: PreemptionThrottle, bodies: list[bytes], clock: list[float], rng: random.Random,
                live: bool) -> list[float]:  # fmt: skip
    times: list[float] = []
    n = 10**9
    for i, body in enumerate(bodies):
        if live:  # simulated time: ~17 decisions per second of it, Events at 1,000 per minute
            clock[0] += 0.06
            t.observer.on_event(WatchEvent(ADDED, event(n + i, clock[0], rng)))
            if i % 170 == 0:
                t.observer.prune()
        args = ExtenderPreemptionArgs.model_validate_json(body)
        started = time.perf_counter()
        t.decide(args)
        times.append(time.perf_counter() - started)
    return times


async def over_http(t: PreemptionThrottle, bodies: list[bytes]) -> list[float]:
    service = ExtenderService(ClusterModel(), Settings(), extender_metrics(None), preempt_hook=t)
    app = web.Application()
    add_extender_routes(app, service)
    times: list[float] = []
    async with TestClient(TestServer(app)) as client:
        for body in bodies:
            started = time.perf_counter()
            response = await client.post("/gpu-extender/preempt", data=body)
            await response.read()
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    rng = random.Random(11)
    clock = [NOW - WINDOW_MIN * 60]
    t = throttle(clock, PERMISSIVE)
    total = RATE_PER_MIN * WINDOW_MIN
    events = [event(n, clock[0] + n * 60.0 / RATE_PER_MIN, rng) for n in range(total)]
    started = time.perf_counter()
    for e in events:
        t.observer.on_event(WatchEvent(ADDED, e))
    ingest = time.perf_counter() - started
    clock[0] = NOW
    t.observer.prune()
    print(f"  ingest: {total} Preempted Events in {ingest:.2f} s ({total / ingest:,.0f}/s); graph holds "
          f"{len(t.graph)} victims, chains up to depth {max(t.graph.depth_histogram())} "
          f"(random preemptor/victim pairs over {WORKLOADS} workloads: a worst case)")  # fmt: skip
    for candidates in (10, 100):
        bodies = [request(rng, candidates) for _ in range(2000)]
        times = decide_loop(t, bodies, clock, rng, live=False)
        print(f"  decide, {candidates:3d} candidates: median {statistics.median(times) * 1e6:.0f} us, "
              f"p99 {pct(times, 0.99) * 1e6:.0f} us, {len(times) / sum(times):,.0f} decisions/s")  # fmt: skip
        record(
            "preemption",
            f"decide, {candidates} candidates, {total:,} Events in the graph: p99",
            pct(times, 0.99) * 1e3,
            "ms",
            anchor="kube-scheduler's extender timeout",
            anchor_value=EXTENDER_TIMEOUT_MS,
            goal=GOAL,
        )
    bodies = [request(rng, 10) for _ in range(5000)]
    times = decide_loop(t, bodies, clock, rng, live=True)
    print(f"  live (1,000 Events/min arriving, pruning): median {statistics.median(times) * 1e6:.0f} us, "
          f"p99 {pct(times, 0.99) * 1e6:.0f} us, {len(times) / sum(times):,.0f} decisions/s")  # fmt: skip
    strict = throttle(clock, {})
    for e in events:
        strict.observer.on_event(WatchEvent(ADDED, e))
    times = decide_loop(strict, bodies[:2000], clock, rng, live=False)
    print(f"  default config (vetoed at this rate): median {statistics.median(times) * 1e6:.0f} us, "
          f"{len(times) / sum(times):,.0f} decisions/s")  # fmt: skip
    logging.getLogger("controller.preemption.hook").setLevel(logging.ERROR)  # no Event writer runs here
    variants = (
        ("no rule (any)", "any", False),
        ("over-share, snapshot reused", "over-share", False),
        ("over-share, snapshot rebuilt", "over-share", True),
    )
    tenant_p99: dict[str, float] = {}
    for label, rule, rebuild in variants:
        ruled = with_tenants(throttle(clock, {**PERMISSIVE, "tenants": {"rule": rule}}))
        for e in events:
            ruled.observer.on_event(WatchEvent(ADDED, e))
        if rebuild:  # every request builds a new snapshot
            ruled.tenants.max_age = 0.0
        times = decide_loop(ruled, bodies[:2000], clock, rng, live=False)
        print(f"  tenants {label}, {PODS:,} GPU pods, 10 candidates: median "
              f"{statistics.median(times) * 1e6:.0f} us, p99 {pct(times, 0.99) * 1e6:.0f} us, "
              f"{len(times) / sum(times):,.0f} decisions/s")  # fmt: skip
        tenant_p99[label] = pct(times, 0.99) * 1e3
    record(
        "preemption",
        "tenants over-share, snapshot rebuilt per request: p99",
        tenant_p99["over-share, snapshot rebuilt"],
        "ms",
        anchor="same decisions, no rule (any)",
        anchor_value=tenant_p99["no rule (any)"],
    )
    http = asyncio.run(over_http(t, bodies[:1000]))
    print(f"  HTTP preempt verb, 10 candidates: median {statistics.median(http) * 1000:.2f} ms, "
          f"p99 {pct(http, 0.99) * 1000:.2f} ms")  # fmt: skip
    record(
        "preemption",
        "HTTP preempt verb, 10 candidates: p99",
        pct(http, 0.99) * 1000,
        "ms",
        anchor="kube-scheduler's extender timeout",
        anchor_value=EXTENDER_TIMEOUT_MS,
        goal=GOAL,
    )


if __name__ == "__main__":
    main()
