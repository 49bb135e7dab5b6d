"""One side of `bench_http1`, run as its own process against whichever checkout is first on PYTHONPATH
(so the same bench measures this tree and an older one in one run). Standalone on purpose: it imports only
what both trees have.

    http1_worker.py server lean|aiohttp|agent   prints its port; then "cpu" on stdin -> its CPU seconds
    http1_worker.py client pool|aiohttp PORT N  N sequential requests; prints its CPU seconds per request
"""

from __future__ import annotations

import asyncio
import importlib
import json
import resource
import sys
from typing import Any

ANSWER = json.dumps({"NodeNames": [f"gpu-node-{i:05d}" for i in range(40)], "FailedNodes": {}}).encode()


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serve(kind: str) -> None:
    from aiohttp import web

    async def filter_reply(_: bytes) -> tuple[int, bytes, str]:
        return 200, ANSWER, "application/json"

    loop = asyncio.get_running_loop()
    closer: Any
    if kind == "agent":
        from nodeagent.listener import Listener, Reply

        listener = Listener({"/metrics": lambda: Reply(200, ANSWER, "text/plain; version=0.0.4")})
        await listener.start("127.0.0.1", 0)
        port, closer = listener.port, listener.close
    else:
        from controller.extender.fastpath import LeanSite

        async def handle(request: web.Request) -> web.Response:
            status, body, content_type = await filter_reply(await request.read())
            return web.Response(status=status, body=body, content_type=content_type)

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)  # the extender's path, and the client bench's
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site: web.TCPSite
        if kind == "lean":
            routes = {"/gpu-extender/filter": filter_reply}
            site = LeanSite(runner, "127.0.0.1", 0, routes=routes, max_body_bytes=1 << 20)
        else:
            site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port, closer = runner.addresses[0][1], runner.cleanup
    print(port, flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"cpu":
            print(f"{cpu():.6f}", flush=True)
    await closer()


async def client(kind: str, port: int, n: int) -> None:
    path, body = "/api/v1/namespaces/default/pods/p/binding", b'{"kind":"Binding"}' * 10
    headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "bench"}
    if kind == "pool":
        try:
            module = importlib.import_module("gpuwarden.http1.pool")
        except ImportError:  # the tree before the http1 room
            module = importlib.import_module("gpuwarden.kube.keepalive")
        pool = module.KeepAlivePool(
            "127.0.0.1", port, tls=None, server_name=None, authority=f"127.0.0.1:{port}", limit=4
        )
        for _ in range(50):
            await pool.request("POST", path, headers, body)
        start = cpu()
        for _ in range(n):
            await pool.request("POST", path, headers, body)
        took = cpu() - start
        pool.close()
    else:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}{path}"
            for _ in range(50):
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
            start = cpu()
            for _ in range(n):
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
            took = cpu() - start
    print(f"{took / n:.9f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve(sys.argv[2]))
    else:
        asyncio.run(client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
