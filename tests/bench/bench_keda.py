"""KEDA bench: SCALED_OBJECTS ScaledObjects on one Prometheus, KEDA's own `prometheus` scaler vs gpuwarden's.

Prints numbers, asserts nothing about time. What runs, all on loopback:
- a real Prometheus scraping a dcgm-exporter look-alike served here: one GPU per pod, 2 pods per workload,
  SCALED_OBJECTS workloads in NAMESPACES namespaces (`app` label on the series and on the pods);
- gpuwarden's adapter (cache mode, real clock, the pods' labels in its index, KEDA external scaler on,
  plaintext gRPC);
- KEDA v2.21.0's scaler code (tests/keda, `make keda-client`): for each ScaledObject its own scaler, as the
  operator builds them — `NewPrometheusScaler` with `avg(DCGM_FI_DEV_GPU_UTIL{namespace, app})`, and
  `NewExternalScaler` with `preset: gpu-utilization, labelSelector: app=..., aggregation: avg` — each called
  ROUNDS times (`GetMetricsAndActivity`, what every poll and every uncached HPA read runs) from 16 goroutines;
  then the same for a serving engine's queue (`sum(vllm:num_requests_waiting{namespace, app})` vs
  `preset: vllm-queue`), each way on a fresh adapter, both sides measured back to back in one run.
Goals (issue 50): gpuwarden's p99 <= KEDA's Prometheus scaler's; Prometheus queries/min at 1,000
ScaledObjects about 1/1,000 of KEDA's (at its defaults, without `useCachedMetrics`).

Not run: the KEDA operator, its metrics server and the HPA (tests/e2e has no KEDA yet). Per-minute numbers
apply KEDA's defaults to the measured per-call costs: a trigger is called every pollingInterval (30 s) and,
without `useCachedMetrics`, on every HPA read (15 s): 6 calls/min, or 2 with the cache. gpuwarden's Prometheus
load is measured directly: queries Prometheus served during a window after the load, while the adapter's
refresher keeps every entry fresh. Prometheus counts its own `/api/v1/query` calls; the client CPU is the
harness process' (KEDA's scaler code), per call.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import PODS
from gpuwarden.config.root import Config
from gpuwarden.ports import free_port
from harness.localprom import LocalPrometheus, scrape_target
from tests.bench.summary import record

ROOT = Path(__file__).resolve().parents[2]
KEDACLIENT = Path(os.environ.get("GPUWARDEN_KEDACLIENT", ROOT / ".cache" / "kedaclient" / "kedaclient"))
SCALED_OBJECTS = int(os.environ.get("GPUWARDEN_BENCH_SCALED_OBJECTS", "1000"))
NAMESPACES = 100
PODS_PER_WORKLOAD = 2
ROUNDS = int(os.environ.get("GPUWARDEN_BENCH_KEDA_ROUNDS", "3"))
WINDOW = float(os.environ.get("GPUWARDEN_BENCH_KEDA_WINDOW", "45"))
CALLS_PER_MIN = {"without useCachedMetrics": 6, "with useCachedMetrics": 2}


def fleet() -> list[tuple[str, str, str, float]]:
    """(namespace, pod, app, GPU utilization) — workload i lives in namespace i % NAMESPACES."""
    out = []
    for i in range(SCALED_OBJECTS):
        ns, app = f"ns-{i % NAMESPACES:03d}", f"app-{i:04d}"
        for k in range(PODS_PER_WORKLOAD):
            out.append((ns, f"{app}-{k}", app, float((i * 7 + k * 13) % 100)))
    return out


def exposition(pods: list[tuple[str, str, str, float]]) -> str:
    """dcgm-exporter's GPU utilization per pod and a vLLM engine's queue per pod (two engine cores each,
    as vLLM V1 with data parallelism labels them: `engine`, `model_name`)."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for n, (ns, pod, app, util) in enumerate(pods):
        lines.append(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{n}",Hostname="node-{n // 8}",'
            f'pod="{pod}",namespace="{ns}",app="{app}"}} {util}'
        )
    lines.append("# TYPE vllm:num_requests_waiting gauge")
    for n, (ns, pod, app, util) in enumerate(pods):
        for engine in (0, 1):
            waiting = (n + engine * 3 + int(util)) % 9
            lines.append(
                f'vllm:num_requests_waiting{{engine="{engine}",model_name="m",'
                f'pod="{pod}",namespace="{ns}",app="{app}"}} {waiting}'
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Way:
    """One comparison: a KEDA `prometheus` trigger's query and the gpuwarden preset that answers it."""

    label: str
    query: str
    preset: str
    aggregation: str


WAYS = (
    Way(
        "GPU preset", 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ns-{ns}",app="app-{i}"})', "gpu-utilization", "avg"
    ),
    Way(
        "engine preset",
        'sum(vllm:num_requests_waiting{namespace="ns-{ns}",app="app-{i}"})',
        "vllm-queue",
        "sum",
    ),
)


async def prometheus_queries(client: httpx.AsyncClient, url: str) -> float:
    """Prometheus' own count of /api/v1/query requests (read from its /metrics, which is not a query)."""
    return (await prometheus_counters(client, url))[0]


async def prometheus_counters(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(/api/v1/query requests served, CPU seconds used) by Prometheus, from its own /metrics."""
    text = (await client.get(f"{url}/metrics")).text
    total, cpu = 0.0, 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("process_cpu_seconds_total "):
            cpu = float(line.rsplit(" ", 1)[1])
    return total, cpu


async def kedaclient(case: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(KEDACLIENT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(json.dumps({"cases": [case]}).encode())
    if proc.returncode != 0:
        raise RuntimeError(f"kedaclient failed: {err.decode()[-1000:]}")
    result: dict[str, Any] = json.loads(out.decode().splitlines()[0])
    return result


def load_case(kind: str, metadata: dict[str, str]) -> dict[str, Any]:
    return {
        "id": kind,
        "op": "load",
        "name": "so",
        "namespace": "ns-000",
        "triggerType": kind,
        "objects": SCALED_OBJECTS,
        "rounds": ROUNDS,
        "workers": 16,
        "namespaces": NAMESPACES,
        "metadata": metadata,
    }


async def wait_for_series(client: httpx.AsyncClient, url: str, want: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counts = []
        for series in ("DCGM_FI_DEV_GPU_UTIL", "vllm:num_requests_waiting"):
            r = await client.get(f"{url}/api/v1/query", params={"query": f"count({series})"})
            result = r.json()["data"]["result"]
            counts.append(int(float(result[0]["value"][1])) if result else 0)
        if min(counts) >= want:
            return
        await asyncio.sleep(1)
    raise RuntimeError("the exporter's series never showed up in Prometheus")


def summary(label: str, r: dict[str, Any], queries: float) -> None:
    calls = r["calls"]
    print(
        f"  {label:<34} calls {calls:>6}  errors {r['errors']:>3}  p50 {r['p50Millis']:7.2f} ms  "
        f"p99 {r['p99Millis']:7.2f} ms  client CPU {1000 * r['cpuSeconds'] / max(calls, 1):6.3f} ms/call  "
        f"Prometheus queries {queries:>6.0f} ({queries / max(calls, 1):.2f}/call)"
    )
    if r.get("firstError"):
        print(f"    first error: {r['firstError'][:200]}")


def require_client() -> None:
    if not KEDACLIENT.is_file():
        raise RuntimeError(f"{KEDACLIENT} is missing: run `make keda-client`")


async def compare(way: Way, prom_url: str, http: httpx.AsyncClient, index: LabelIndex) -> None:
    """KEDA's prometheus scaler, then gpuwarden's external scaler on a fresh adapter, on `way`'s metric."""
    keda_port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": prom_url},
            "adapter": {
                "authentication": {"enabled": False},
                "keda": {
                    "enabled": True,
                    "bind_address": "127.0.0.1",
                    "port": keda_port,
                    "tls": {"plaintext": True},
                },
            },
        }
    )
    adapter = Adapter(config, index=index)
    await adapter.discovery.relist()
    await adapter.start()
    await adapter.serve_keda()
    try:
        before, prom_cpu = await prometheus_counters(http, prom_url)
        theirs = await kedaclient(
            load_case("prometheus", {"serverAddress": prom_url, "query": way.query, "threshold": "60"})
        )
        after, prom_cpu_after = await prometheus_counters(http, prom_url)
        their_queries, their_prom_cpu = after - before, prom_cpu_after - prom_cpu
        before, prom_cpu = await prometheus_counters(http, prom_url)
        adapter_cpu = time.process_time()
        ours = await kedaclient(
            load_case(
                "external",
                {
                    "scalerAddress": f"127.0.0.1:{keda_port}",
                    "preset": way.preset,
                    "namespace": "ns-{ns}",
                    "labelSelector": "app=app-{i}",
                    "aggregation": way.aggregation,
                    "targetValue": "60",
                },
            )
        )
        adapter_cpu = time.process_time() - adapter_cpu
        after, prom_cpu_after = await prometheus_counters(http, prom_url)
        our_queries, our_prom_cpu = after - before, prom_cpu_after - prom_cpu
        window_start = await prometheus_queries(http, prom_url)
        await asyncio.sleep(WINDOW)
        steady = (await prometheus_queries(http, prom_url) - window_start) * 60 / WINDOW
        entries = len(adapter.cache) if adapter.cache is not None else 0
    finally:
        await adapter.stop()

    print(
        f"{way.label}: KEDA `{way.query}` vs gpuwarden preset: {way.preset} (measured, KEDA's scaler code):"
    )
    summary("KEDA prometheus scaler", theirs, their_queries)
    summary("gpuwarden external scaler", ours, our_queries)
    print(
        f"  server side: Prometheus CPU {their_prom_cpu:.2f} s for KEDA's prometheus scaler calls, "
        f"{our_prom_cpu:.2f} s during the external ones; gpuwarden adapter (this process) CPU "
        f"{1000 * adapter_cpu / max(ours['calls'], 1):.3f} ms per GetMetricsAndActivity (2 RPCs)"
    )
    agree = sum(1 for k, v in theirs["perObject"].items() if ours["perObject"].get(k) == v)
    print(f"  values agree for {agree} of {SCALED_OBJECTS} ScaledObjects (KEDA's own quantity strings)")
    print(
        f"  gpuwarden cache entries {entries}; Prometheus queries/min while they are kept fresh: {steady:.1f}"
    )
    record(
        "keda",
        f"{way.label} ({way.preset}): GetMetricsAndActivity p99 (KEDA's scaler code)",
        ours["p99Millis"],
        "ms",
        anchor="KEDA prometheus scaler, same run",
        anchor_value=theirs["p99Millis"],
        goal="<= 1x",
        met=ours["p99Millis"] <= theirs["p99Millis"],
    )
    print(f"  derived at KEDA's defaults for {SCALED_OBJECTS} ScaledObjects (Prometheus queries/min):")
    per_call = their_queries / max(theirs["calls"], 1)
    for label, calls in CALLS_PER_MIN.items():
        theirs_per_min = SCALED_OBJECTS * calls * per_call
        print(
            f"    KEDA prometheus trigger, {label:<25} {theirs_per_min:>8.0f}   gpuwarden {steady:>6.1f}   "
            f"ratio {theirs_per_min / max(steady, 1e-9):,.0f}x"
        )
        default = label == "without useCachedMetrics"
        record(
            "keda",
            f"{way.label} ({way.preset}), {SCALED_OBJECTS:,} ScaledObjects: Prometheus queries/min",
            steady,
            "queries/min",
            anchor=f"KEDA prometheus trigger, {label} (derived)",
            anchor_value=theirs_per_min,
            goal="~1/1,000" if default else "",
            met=(steady * 500 <= theirs_per_min) if default else None,
        )
        their_cpu = SCALED_OBJECTS * calls * theirs["cpuSeconds"] / max(theirs["calls"], 1)
        our_cpu = SCALED_OBJECTS * calls * ours["cpuSeconds"] / max(ours["calls"], 1)
        print(f"      KEDA-side CPU of those calls: prometheus {their_cpu:.1f}, external {our_cpu:.1f} s/min")


async def main() -> None:
    require_client()
    pods = fleet()
    body = exposition(pods)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    exporter_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", exporter_port).start()
    index = LabelIndex([PODS])
    for ns, pod, app_name, _ in pods:
        index.upsert(PODS, ns, pod, {"app": app_name})
    index.mark_synced(PODS)
    print(
        f"{SCALED_OBJECTS} ScaledObjects (one workload each, {PODS_PER_WORKLOAD} pods with one GPU, "
        f"{NAMESPACES} namespaces), {ROUNDS} GetMetricsAndActivity calls per ScaledObject per side"
    )
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-keda-") as tmp:
        scrape = [scrape_target("dcgm", f"127.0.0.1:{exporter_port}", scrape_interval_seconds=5)]
        async with (
            LocalPrometheus(Path(tmp), scrape_configs=scrape, scrape_interval_seconds=5) as prom,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await wait_for_series(http, prom.url, len(pods))
            for way in WAYS:
                await compare(way, prom.url, http, index)
    await runner.cleanup()
