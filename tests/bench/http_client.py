"""A scheduler-like HTTP client for `bench_extender`, run as its own process.

It sends POST filter then POST prioritize (nodeCacheCapable: NodeNames only) for `requests` pods, each with
`candidates` random node names out of ``gpu-node-00000`` .. ``gpu-node-<nodes-1>``, one request at a time
as the scheduler does, and prints the client-observed seconds per pair as one JSON list. Being a separate
process, its own JSON and aiohttp cost runs beside the server instead of on the server's event loop.

Run: ``python -m tests.bench.http_client URL NODES CANDIDATES REQUESTS SEED``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import aiohttp

from tests.unit.extender_support import pod

SIZES = (1, 1, 2, 4, 8)
WARMUP = 10


async def run(url: str, nodes: int, candidates: int, requests: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    samples: list[float] = []
    async with aiohttp.ClientSession() as session:
        for i in range(requests + WARMUP):
            body = {
                "Pod": pod(f"c{i}", rng.choice(SIZES)),
                "Nodes": None,
                "NodeNames": rng.sample(names, candidates),
            }
            start = time.perf_counter()
            async with session.post(f"{url}/filter", data=json.dumps(body)) as resp:
                filtered = json.loads(await resp.read())
            body["NodeNames"] = filtered["NodeNames"]
            async with session.post(f"{url}/prioritize", data=json.dumps(body)) as resp:
                await resp.read()
            if i >= WARMUP:
                samples.append(time.perf_counter() - start)
    return samples


if __name__ == "__main__":
    url, nodes, candidates, requests, seed = sys.argv[1], *map(int, sys.argv[2:6])
    print(json.dumps(asyncio.run(run(url, nodes, candidates, requests, seed))))
