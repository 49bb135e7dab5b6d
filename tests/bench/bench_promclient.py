"""Benchmark: per-query overhead of PrometheusClient over a bare httpx call, against a real local Prometheus.

Both sides send the same instant query (`vector(1)`) over loopback and parse the JSON; the client adds
typed parsing, auth/header handling, the timeout budget, retries bookkeeping and self-metrics. The rounds
are interleaved so drift on a busy machine hits every variant alike. Prints numbers; asserts nothing.

Run: `python -m tests.bench.bench_promclient [--queries N]` (or via `make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from harness.localprom import LocalPrometheus
from tests.bench.summary import record

PROMQL = "vector(1)"
ROUND = 50  # queries per variant before switching to the next one


def _summary(name: str, micros: list[float]) -> str:
    ordered = sorted(micros)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"{name:<28} n={len(micros):<5} mean={statistics.fmean(micros):8.0f}  "
        f"p50={statistics.median(micros):8.0f}  p99={p99:8.0f}  (µs)"
    )


async def _run(queries: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as workdir:
        async with LocalPrometheus(Path(workdir)) as prom:
            bare = httpx.AsyncClient(base_url=prom.url, trust_env=False)
            client_get = prom.client(registry=CollectorRegistry(), method="GET", retries=0)
            client_post = prom.client(registry=CollectorRegistry(), method="POST", retries=0)

            async def bare_get() -> None:
                response = await bare.get("/api/v1/query", params={"query": PROMQL})
                response.raise_for_status()
                assert response.json()["status"] == "success"

            async def typed_get() -> None:
                await client_get.query(PROMQL)

            async def typed_post() -> None:
                await client_post.query(PROMQL)

            variants: dict[str, Callable[[], Awaitable[None]]] = {
                "bare httpx GET + json": bare_get,
                "PrometheusClient GET": typed_get,
                "PrometheusClient POST": typed_post,
            }
            timings: dict[str, list[float]] = {name: [] for name in variants}
            for call in variants.values():  # warm-up: connections, JIT-less caches, Prometheus' query path
                for _ in range(20):
                    await call()
            done = 0
            while done < queries:
                batch = min(ROUND, queries - done)
                for name, call in variants.items():
                    for _ in range(batch):
                        started = time.perf_counter()
                        await call()
                        timings[name].append((time.perf_counter() - started) * 1e6)
                done += batch
            await bare.aclose()
            await client_get.aclose()
            await client_post.aclose()

    print(f"PrometheusClient overhead vs bare httpx, {queries} sequential `{PROMQL}` instant queries each")
    for name, micros in timings.items():
        print(_summary(name, micros))
    base_mean = statistics.fmean(timings["bare httpx GET + json"])
    base_p50 = statistics.median(timings["bare httpx GET + json"])
    for name in ("PrometheusClient GET", "PrometheusClient POST"):
        extra_mean = statistics.fmean(timings[name]) - base_mean
        extra_p50 = statistics.median(timings[name]) - base_p50
        print(f"overhead {name:<21} mean={extra_mean:+8.0f} µs  p50={extra_p50:+8.0f} µs")
        record(
            "promclient",
            f"{name}, `{PROMQL}` over loopback: p50",
            statistics.median(timings[name]),
            "µs",
            anchor="bare httpx GET + json",
            anchor_value=base_p50,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queries", type=int, default=500, help="queries per variant (default 500)")
    args = parser.parse_args(argv or [])  # called as main() from `make bench`: defaults, not sys.argv
    asyncio.run(_run(max(1, min(args.queries, 100_000))))


if __name__ == "__main__":
    main(sys.argv[1:])
