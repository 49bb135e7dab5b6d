"""Benchmark: fleet simulator exposition for 5,000 nodes x 8 GPUs (examples/scenarios/fleet-5000.yaml).

Prints body size (plain, gzip, lines), render and gzip times cold (first render) and warm (next simulation
step: only changed blocks re-rendered and re-compressed), the cache hit within a step, and HTTP scrape times
over loopback (whole fleet plain and gzip, and one node's endpoint). Numbers only, no assertions.
Run: `python -m tests.bench simulator` (or `make bench`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import aiohttp

from harness.simulator import Simulator, build_app, load_scenario
from harness.simulator.compression import gzip_chunks
from tests.bench.summary import record

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "fleet-5000.yaml"


class StepClock:
    """The simulator's clock, moved by the benchmark one tick at a time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _mb(n: int) -> str:
    return f"{n / 1e6:8.1f} MB"


def _timed(label: str, seconds: float, extra: str = "") -> None:
    print(f"  {label:<44} {seconds * 1000:9.1f} ms  {extra}", flush=True)


async def main() -> None:
    clock = StepClock()
    started = time.perf_counter()
    sim = Simulator(load_scenario(SCENARIO), clock)
    fleet = sim.fleet
    gpus = sum(len(n.gpus) for n in fleet.nodes.values())
    print(f"fleet: {len(fleet.nodes)} nodes, {gpus} GPUs, {len(fleet.pods)} pods", flush=True)
    _timed("build fleet (scenario -> state)", time.perf_counter() - started)

    t = time.perf_counter()
    chunks = sim.renderer.render_chunks()
    _timed("render cold (labels + every block)", time.perf_counter() - t)
    t = time.perf_counter()
    plain = b"".join(c.data for c in chunks)
    _timed("join to one body", time.perf_counter() - t)
    t = time.perf_counter()
    gz = gzip_chunks(chunks)
    _timed("gzip cold (level 1, every chunk)", time.perf_counter() - t)
    lines = plain.count(b"\n")
    print(f"  body: {_mb(len(plain))} plain, {_mb(len(gz))} gzip, {lines:,} lines", flush=True)

    for step in range(1, 4):
        clock.t += fleet.tick
        t = time.perf_counter()
        fleet.advance(clock())
        _timed(f"step {step}: advance (counters, load, faults)", time.perf_counter() - t)
        t = time.perf_counter()
        chunks = sim.renderer.render_chunks()
        _timed(f"step {step}: render warm (changed blocks only)", time.perf_counter() - t)
        t = time.perf_counter()
        gzip_chunks(chunks)
        _timed(f"step {step}: gzip warm (changed chunks only)", time.perf_counter() - t)

    from aiohttp.test_utils import TestServer

    server = TestServer(build_app(sim), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            url = str(server.make_url("/metrics"))
            for encoding in ("identity", "gzip"):
                clock.t += fleet.tick  # a new step: the scrape renders
                for kind in ("new step", "cached"):
                    t = time.perf_counter()
                    async with http.get(url, headers={"Accept-Encoding": encoding}) as resp:
                        size = len(await resp.read())
                    took = time.perf_counter() - t
                    _timed(f"HTTP /metrics {encoding}, {kind}", took, _mb(size))
                    if encoding == "gzip" and kind == "new step":
                        record(
                            "simulator",
                            f"HTTP /metrics gzip, new step, {len(fleet.nodes):,} nodes x 8 GPUs",
                            took * 1000,
                            "ms",
                        )
            node = next(iter(fleet.nodes))
            node_url = str(server.make_url(f"/nodes/{node}/metrics"))
            times = []
            for _ in range(200):
                t = time.perf_counter()
                async with http.get(node_url, headers={"Accept-Encoding": "gzip"}) as resp:
                    await resp.read()
                times.append(time.perf_counter() - t)
            _timed("HTTP /nodes/<node>/metrics gzip, median of 200", statistics.median(times))
    finally:
        await server.close()
