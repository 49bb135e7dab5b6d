"""The simulator's HTTP shell: serves /metrics from the pure fleet, caches bodies per step, hosts /control.

Why it exists: one aiohttp process stands in for a whole fleet of dcgm-exporters (and the pods' own /metrics)
so that a real Prometheus, the adapter, the controller and the demo can be exercised against known behaviour.

Endpoints:
    GET /metrics                  every node's DCGM series plus http_requests_total of every pod and the
                                  gateway's gateway_requests_total per workload (one target)
    GET /nodes/{node}/metrics     one node's exporter only, as a DaemonSet pod would serve it
    GET /apps/metrics             only the app series (the pods' own endpoints and the gateway's, merged)
    GET /healthz                  liveness
    /control/...                  the control API (control.py)

"Exporter down" is modelled honestly for both ways of scraping: with one /metrics target the node's series
vanish (Prometheus marks them stale; `up` stays 1 because the simulator itself answered), and a per-node
target /nodes/{node}/metrics answers 503, so Prometheus records `up == 0` for that node as for a real outage.

Performance: the whole-fleet body is rendered at most once per (simulation step, fleet version) in a worker
thread while an asyncio lock keeps the control API from changing the fleet under it; the gzip form (what
Prometheus asks for) is assembled from per-chunk cached deflate data (compression.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from harness.simulator.compression import gzip_chunks
from harness.simulator.control import add_routes
from harness.simulator.exposition import CONTENT_TYPE, Chunk, Renderer
from harness.simulator.fleet import Fleet
from harness.simulator.scenario import Scenario

log = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")


@dataclass(eq=False)
class _Body:
    key: tuple[int, int]
    chunks: list[Chunk]
    plain: bytes | None = None
    gz: bytes | None = None


class Simulator:
    """The fleet, its renderer and the body cache, behind one lock. Time comes from the injected `clock`."""

    def __init__(self, scenario: Scenario, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.fleet = Fleet(scenario, start=clock())
        self.renderer = Renderer(self.fleet)
        self._lock = asyncio.Lock()
        self._body: _Body | None = None

    async def with_fleet(self, fn: Callable[[Fleet], T]) -> T:
        """Advance the fleet to now and run `fn` on it, exclusive of renders and other changes."""
        async with self._lock:
            self.fleet.advance(self.clock())
            return fn(self.fleet)

    async def metrics(self, *, gzip: bool) -> bytes:
        """The whole-fleet body (plain or gzip), rendered at most once per step and fleet version."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            self.fleet.advance(self.clock())
            key = (self.fleet.step, self.fleet.version)
            body = self._body
            if body is None or body.key != key:
                chunks = await loop.run_in_executor(None, self.renderer.render_chunks)
                body = self._body = _Body(key, chunks)
            if gzip:
                if body.gz is None:
                    body.gz = await loop.run_in_executor(None, gzip_chunks, body.chunks)
                return body.gz
            if body.plain is None:
                body.plain = await loop.run_in_executor(None, b"".join, [c.data for c in body.chunks])
            return body.plain

    async def node_metrics(self, node: str) -> bytes | None:
        """One node's exporter body, or None while its exporter is down. Small, so rendered inline."""

        def render(fleet: Fleet) -> bytes | None:
            if not fleet.nodes[node].exporter_up:
                return None
            return b"".join(c.data for c in self.renderer.render_chunks(node=node, apps=False))

        return await self.with_fleet(render)

    async def app_metrics(self) -> bytes:
        return await self.with_fleet(
            lambda _: b"".join(c.data for c in self.renderer.render_chunks(dcgm=False, apps=True))
        )


def _wants_gzip(request: web.Request) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "").lower()


def build_app(sim: Simulator) -> web.Application:
    """The aiohttp application serving `sim` (used by `serve`, tests and the benchmark)."""
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        gz = _wants_gzip(request)
        body = await sim.metrics(gzip=gz)
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def node_metrics(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if node not in sim.fleet.nodes:
            return web.Response(status=404, text=f"unknown node {node!r}\n")
        body = await sim.node_metrics(node)
        if body is None:
            return web.Response(status=503, text=f"exporter on {node} is down (simulated)\n")
        response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
        response.enable_compression()
        return response

    async def app_metrics(request: web.Request) -> web.Response:
        response = web.Response(body=await sim.app_metrics(), headers={"Content-Type": CONTENT_TYPE})
        response.enable_compression()
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/nodes/{node}/metrics", node_metrics)
    app.router.add_get("/apps/metrics", app_metrics)
    app.router.add_get("/healthz", healthz)
    add_routes(app, sim)
    return app


@dataclass
class RunningSimulator:
    """A started simulator: its address, its state, and how to stop it."""

    sim: Simulator
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(
    scenario: Scenario, host: str = "127.0.0.1", port: int = 0, *, clock: Clock = time.monotonic
) -> RunningSimulator:
    """Start serving in the running loop and return at once; port 0 picks a free port (see `.port`)."""
    # building 40k GPUs takes about a second: off the event loop
    sim = await asyncio.get_running_loop().run_in_executor(None, Simulator, scenario, clock)
    runner = web.AppRunner(build_app(sim), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return RunningSimulator(sim, runner, host, bound)


async def serve(scenario: Scenario, host: str, port: int, *, clock: Clock = time.monotonic) -> None:
    """Serve the simulator on host:port until cancelled (the `gpuwarden simulate` entry point)."""
    running = await start(scenario, host, port, clock=clock)
    fleet = running.sim.fleet
    log.info(
        "fleet simulator listening",
        extra={
            "url": running.url,
            "nodes": len(fleet.nodes),
            "gpus": sum(len(n.gpus) for n in fleet.nodes.values()),
            "pods": len(fleet.pods),
            "scheduled_faults": len(fleet.scenario.faults),
        },
    )
    try:
        await asyncio.Event().wait()
    finally:
        await running.stop()
