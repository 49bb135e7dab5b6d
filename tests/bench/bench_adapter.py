"""Adapter benchmark: HPA-shaped load through the real app against a real Prometheus, cached vs per-request.

Prints numbers, asserts nothing about time. Setup: a real Prometheus backfilled with one GPU-utilization
series and one request counter per pod for PODS pods in NAMESPACES namespaces (dcgm-exporter labels); the
adapter's clock is pinned to the data's end so every query evaluates there. Parts:

1. one pods list query (`pods/*/gpu_utilization?labelSelector=tier=inference`, 100 pods at the defaults):
   latency through the aiohttp app (client in-process), cache mode (after warm-up) vs per-request mode
   (a query per request, as prometheus-adapter does);
2. an HPA sync round: HPAS HPAs x 2 Pods metrics (gpu_utilization, requests_per_second), each selecting
   PODS / HPAS pods, sent with 5 concurrent workers (kube-controller-manager's default): requests/s,
   p50/p99 latency and Prometheus queries per round, extrapolated to queries per minute at the HPA's 15 s
   sync; in cache mode each round is preceded by one refresh pass (what the refresher does every 15 s);
3. memory: RSS and peak RSS of a real `gpuwarden adapter` process that LISTed and watches 50,000 real pods
   from a testbed API server (`memory_at_50k`; needs `make testbed`; GPUWARDEN_BENCH_MEMORY_PODS sets the
   count, 0 skips the part).

Defaults are the issue's scale (10,000 pods, 1,000 HPAs); `GPUWARDEN_BENCH_PODS`, `GPUWARDEN_BENCH_HPAS`
make a quicker run. prometheus-adapter itself is not run here (see the closing note of issue 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import PODS
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, backfill_openmetrics
from tests.bench.summary import record

POD_COUNT = int(os.environ.get("GPUWARDEN_BENCH_PODS", "10000"))
HPAS = int(os.environ.get("GPUWARDEN_BENCH_HPAS", "1000"))
NAMESPACES = max(1, HPAS // 10)
STEP, POINTS = 15, 9
WORKERS = 5


def pods(count: int = POD_COUNT) -> list[tuple[str, str, str]]:
    """(namespace, pod, app) with HPAS apps spread evenly over NAMESPACES namespaces."""
    per_app = max(1, count // HPAS)
    out = []
    for i in range(HPAS * per_app):
        app = i // per_app
        out.append((f"ns-{app % NAMESPACES:03d}", f"app-{app:04d}-{i % per_app:03d}", f"app-{app:04d}"))
    return out


def history(t_end: int, fleet: list[tuple[str, str, str]]) -> str:
    util = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    reqs = ["# TYPE http_requests counter"]
    for i in range(POINTS):
        ts = t_end - (POINTS - 1 - i) * STEP
        for n, (ns, pod, _) in enumerate(fleet):
            labels = f'pod="{pod}",namespace="{ns}"'
            util.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="node-{n // 8}",{labels}}} {n % 100} {ts}')
            reqs.append(f"http_requests_total{{{labels}}} {i * 15 * (n % 7 + 1)} {ts}")
    return "\n".join(util + reqs) + "\n# EOF\n"


def index_for(fleet: list[tuple[str, str, str]]) -> LabelIndex:
    index = LabelIndex([PODS])
    for ns, pod, app in fleet:
        index.upsert(PODS, ns, pod, {"app": app, "tier": "inference"})
    index.mark_synced(PODS)
    return index


def queries(registry: CollectorRegistry) -> float:
    total = 0.0
    for outcome in ("success", "empty", "timeout", "unreachable", "server_error", "bad_query"):
        total += (
            registry.get_sample_value(
                "gpuwarden_adapter_prometheus_queries_total", {"purpose": "values", "outcome": outcome}
            )
            or 0.0
        )
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def timed(client: TestClient[Any, Any], path: str) -> float:
    started = time.perf_counter()
    response = await client.get(path)
    await response.read()
    assert response.status == 200, (response.status, await response.text())
    return time.perf_counter() - started


async def one_list_query(client: TestClient[Any, Any], ns: str, selector: str, n: int) -> list[float]:
    base = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/%2A/gpu_utilization"
    path = f"{base}?labelSelector={selector}"
    await timed(client, path)  # warm-up (fills the cache in cache mode)
    return [await timed(client, path) for _ in range(n)]


async def hpa_round(client: TestClient[Any, Any], paths: list[str]) -> tuple[list[float], float]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in paths:
        queue.put_nowait(p)
    latencies: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            latencies.append(await timed(client, queue.get_nowait()))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return latencies, time.perf_counter() - started


async def run_mode(
    prom: LocalPrometheus,
    t_end: int,
    fleet: list[tuple[str, str, str]],
    mode: str,
) -> dict[str, Any]:
    registry = CollectorRegistry()
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "timeout_seconds": 30, "retries": 0},
            "adapter": {
                "authentication": {"enabled": False},
                "cache": {"mode": mode},
                "metrics_max_age_seconds": 900,
                "presets": {"requests_per_second": {"rate_window_seconds": 60}},
            },
        }
    )
    adapter = Adapter(config, index=index_for(fleet), registry=registry, clock=lambda: float(t_end))
    await adapter.discovery.relist()
    app = await adapter.start()
    out: dict[str, Any] = {"mode": mode}
    async with TestClient(TestServer(app)) as client:
        lat = await one_list_query(client, fleet[0][0], "tier%3Dinference", 200)
        out["list_p50_ms"], out["list_p99_ms"] = pct(lat, 0.5), pct(lat, 0.99)
        apps = sorted({(ns, a) for ns, _, a in fleet})
        paths = [
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/%2A/{metric}?labelSelector=app%3D{a}"
            for ns, a in apps
            for metric in ("gpu_utilization", "requests_per_second")
        ]
        await hpa_round(client, paths)  # warm-up: first requests fill the cache (one query per miss)
        rounds = 3
        all_lat: list[float] = []
        elapsed = 0.0
        before = queries(registry)
        for _ in range(rounds):
            if adapter.cache is not None:
                await adapter.cache.refresh_due(everything=True)  # the refresher's pass every 15 s
            lat, took = await hpa_round(client, paths)
            all_lat += lat
            elapsed += took
        per_round = (queries(registry) - before) / rounds
        out.update(
            requests_per_round=len(paths),
            rps=round(len(all_lat) / elapsed),
            round_p50_ms=pct(all_lat, 0.5),
            round_p99_ms=pct(all_lat, 0.99),
            prom_queries_per_round=per_round,
            prom_queries_per_min=per_round * 4,
        )
    await adapter.stop()
    return out


MEMORY_PODS = int(os.environ.get("GPUWARDEN_BENCH_MEMORY_PODS", "50000"))


async def memory_at_50k() -> tuple[float, float, float, int]:
    """(MiB RSS, MiB peak RSS, seconds to ready, pods) of a real `gpuwarden adapter` process whose label
    index holds MEMORY_PODS pods LISTed and watched from a testbed API server.

    What a user runs, measured from outside: a testbed control plane (kwokctl) gets MEMORY_PODS Pending
    pods (`bench_adapter_upstream.populate`, ~550 pods/s), an empty Prometheus answers discovery, and
    `python -m gpuwarden adapter` starts with authentication on (its defaults, as in
    bench_adapter_upstream). Once /readyz is 200 — which needs the pod and node caches synced — VmRSS and
    VmHWM are read from /proc/PID/status. No metric values are cached here (the side-by-side benchmark
    measures RSS again after HPA load). An in-process probe of the index alone used to stand in for this
    and said ~121 MiB while the process held 469 MiB: it skipped the list decoding that dominated.
    """
    import aiohttp

    from harness.testbed import Cluster, ClusterConfig
    from tests.bench.bench_adapter_upstream import (
        RULES,
        admin_client,
        hpa_session,
        our_adapter,
        populate,
        running,
    )

    fleet = pods(MEMORY_PODS)
    with tempfile.TemporaryDirectory(prefix="bench-adapter-memory-") as tmp:
        workdir = Path(tmp)
        rules = workdir / "rules.yaml"
        rules.write_text(RULES)
        (workdir / "prom").mkdir()
        async with LocalPrometheus(workdir / "prom") as prom:
            with Cluster.create(ClusterConfig(name="bench-adapter-memory", workdir=None)) as cluster:
                await populate(admin_client(cluster, workdir), fleet)
                adapter = our_adapter(workdir, cluster, prom.url, rules)
                async with hpa_session(cluster) as session:
                    with running(adapter):
                        assert adapter.started is not None
                        while True:
                            if not adapter.alive():
                                raise RuntimeError(f"adapter exited:\n{adapter.log_tail()}")
                            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                                async with session.get(f"{adapter.base}/readyz") as response:
                                    if response.status == 200:
                                        break
                            if time.perf_counter() - adapter.started > 300:
                                raise RuntimeError(f"adapter not ready after 300s:\n{adapter.log_tail()}")
                            await asyncio.sleep(0.25)
                        ready = time.perf_counter() - adapter.started
                        await asyncio.sleep(2)  # settle: the watches are open, nothing else is pending
                        rss, peak = adapter.rss_mib()
    return rss, peak, ready, len(fleet)


async def main() -> None:
    fleet = pods()
    t_end = (int(time.time()) // 3600 - 4) * 3600
    with tempfile.TemporaryDirectory(prefix="bench-adapter-") as tmp:
        started = time.perf_counter()
        backfill_openmetrics(Path(tmp), history(t_end, fleet), timeout=600)
        took = time.perf_counter() - started
        print(f"backfilled {len(fleet)} pods x 2 series x {POINTS} points in {took:.1f}s")
        async with LocalPrometheus(Path(tmp)) as prom:
            results = [await run_mode(prom, t_end, fleet, mode) for mode in ("cache", "per_request")]
    per_app = max(1, POD_COUNT // HPAS)
    print(f"\nfleet: {len(fleet)} pods, {HPAS} HPAs x 2 metrics, {NAMESPACES} namespaces, {per_app} pods/HPA")
    print(f"part 1 lists the {len([p for p in fleet if p[0] == fleet[0][0]])} pods of one namespace")
    header = ("mode", "list p50 ms", "list p99 ms", "req/s", "p50 ms", "p99 ms", "prom q/round", "prom q/min")
    print("  ".join(f"{h:>13}" for h in header))
    for r in results:
        row = (
            r["mode"],
            f"{r['list_p50_ms']:.2f}",
            f"{r['list_p99_ms']:.2f}",
            r["rps"],
            f"{r['round_p50_ms']:.2f}",
            f"{r['round_p99_ms']:.2f}",
            f"{r['prom_queries_per_round']:.0f}",
            f"{r['prom_queries_per_min']:.0f}",
        )
        print("  ".join(f"{c:>13}" for c in row))
    cache_q, direct_q = results[0]["prom_queries_per_min"], results[1]["prom_queries_per_min"]
    if cache_q:
        print(f"Prometheus queries: {direct_q / cache_q:.0f}x fewer with the cache")
    summarize(results)
    if MEMORY_PODS:
        rss, peak, ready, count = await memory_at_50k()
        print(
            f"memory: the real adapter process holding {count} testbed pods: RSS {rss:.0f} MiB,"
            f" peak {peak:.0f} MiB (ready, pod cache synced, {ready:.1f}s after start)"
        )
        record(
            "adapter",
            f"adapter process RSS holding {count:,} testbed pods",
            rss,
            "MiB",
            goal="≤ 150 MiB (README)",
            met=rss <= 150,
        )


def summarize(results: list[dict[str, Any]]) -> None:
    """The cache mode against the per-request mode (a query per request, as prometheus-adapter does)."""
    cache, direct = results
    anchor = "per-request mode, same app"
    record(
        "adapter",
        f"HPA rounds in-process, {POD_COUNT:,} pods: Prometheus queries/min",
        cache["prom_queries_per_min"],
        "queries/min",
        anchor=anchor,
        anchor_value=direct["prom_queries_per_min"],
    )
    record(
        "adapter",
        "HPA rounds in-process: request p99",
        cache["round_p99_ms"],
        "ms",
        anchor=anchor,
        anchor_value=direct["round_p99_ms"],
    )
