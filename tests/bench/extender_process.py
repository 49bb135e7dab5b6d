"""gpuwarden's scheduler extender as its own process, for the end-to-end part of `bench_extender`.

Built exactly as the controller builds it (`build_extender` + watches through `KubeClient`), served on
127.0.0.1:PORT with the extender's Prometheus series at ``/metrics``, so the bench can read its
server-side latency and its peak RSS apart from the bench process. Prints ``ready`` once the model has
synced; stops on SIGTERM or when stdin closes. ``GPUWARDEN_BENCH_EXTENDER_CONFIG`` (JSON) is merged into the
``extender`` config section, e.g. ``{"events": false}``; with ``{"bind_protocol": "leader"}`` it binds
while holding a Lease of its own in namespace default, as the controller's leader does.
``GPUWARDEN_BENCH_EXTENDER_PROFILE=<path>`` writes a cProfile of the serving period (after ``ready``)
there on exit, for `python -m pstats`.

Run: ``python -m tests.bench.extender_process KUBECONFIG PORT PREFIX``.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import signal
import sys
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from controller.extender.runtime import build_extender
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient, LeaderElector


async def serve(kubeconfig: str, port: int, prefix: str) -> None:
    section = {"path_prefix": prefix, **json.loads(os.environ.get("GPUWARDEN_BENCH_EXTENDER_CONFIG", "{}"))}
    config = Config.model_validate({"kubernetes": {"kubeconfig": kubeconfig}, "extender": section})
    kube = KubeClient.from_config(kubeconfig=kubeconfig)
    registry = CollectorRegistry()
    elector = None
    if config.extender.bind_protocol == "leader":  # as in the controller: bind while holding a Lease
        elector = LeaderElector(
            kube,
            name=f"gw-bench-extender-{os.getpid()}",
            namespace="default",
            identity=f"bench-{os.getpid()}",
        )
    extender = build_extender(config, kube, registry=registry, elector=elector)
    app = web.Application()
    extender.mount(app)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # the controller's listener: the scheduler's requests on the lean path unless extender.lean_http is false
    await extender.site(runner, "127.0.0.1", port, lean=config.extender.lean_http).start()
    feed = asyncio.ensure_future(extender.run())
    election = asyncio.ensure_future(elector.run()) if elector is not None else None
    while not extender.ready() or (elector is not None and not elector.fenced()):
        if feed.done():
            feed.result()
        await asyncio.sleep(0.2)
    profile_path = os.environ.get("GPUWARDEN_BENCH_EXTENDER_PROFILE", "")
    profiler = cProfile.Profile(time.thread_time) if profile_path else None  # CPU, not wall time
    if profiler is not None:
        profiler.enable()
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stdin = sys.stdin.fileno()
    loop.add_reader(stdin, lambda: stop.set() if not os.read(stdin, 1) else None)
    await stop.wait()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_path)
    feed.cancel()
    await asyncio.gather(feed, return_exceptions=True)
    if elector is not None and election is not None:
        elector.stop()
        await asyncio.gather(election, return_exceptions=True)
    await runner.cleanup()
    await kube.aclose()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
