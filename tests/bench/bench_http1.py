"""HTTP/1.1 micro-benchmark: CPU per request of the extender's lean server path against aiohttp's server,
of the keep-alive API client pool against aiohttp's client, and of the node agent's listener; each side in
its own process (`tests/bench/http1_worker.py`), so a process's CPU is its own.

Prints numbers, asserts nothing. Ratios are same-run (lean ÷ aiohttp). With
`GPUWARDEN_BENCH_HTTP1_BEFORE=/path/to/an/older/checkout` the same workers also run against that tree (the
first entry of their PYTHONPATH), so "before" and "after" are measured in one run, on one machine state;
`GPUWARDEN_BENCH_HTTP1_REQUESTS` sets the requests per measurement (default 3,000), each measured
`ROUNDS` times (`GPUWARDEN_BENCH_HTTP1_ROUNDS`), interleaved, reporting the median and the least (on a
shared machine the least is the steadier figure: a neighbour only ever adds).

Run: `python -m tests.bench http1`.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

from tests.bench.summary import record

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("http1_worker.py")
ROUNDS = int(os.environ.get("GPUWARDEN_BENCH_HTTP1_ROUNDS", "3"))
BODY = b'{"Pod":{"metadata":{"name":"p","namespace":"default"}},"NodeNames":["gpu-node-00001"]}' * 8
FILTER = (
    b"POST /gpu-extender/filter HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-scheduler/v1.37.2\r\n"
    b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
    % (len(BODY), BODY)
)
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Prometheus/3\r\nAccept: text/plain\r\n\r\n"


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}


class Server:
    """A worker server process of `tree`."""

    def __init__(self, tree: Path, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "server", kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(tree), text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def cpu(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("cpu\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _read_answer(sock: socket.socket, buf: bytearray) -> None:
    """Read one answer (Content-Length framed) off `sock`, leaving what follows in `buf`."""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += sock.recv(65536)
    head = bytes(buf[:end]).lower()
    at = head.index(b"content-length:") + len(b"content-length:")
    length = int(head[at : head.index(b"\r\n", at) if b"\r\n" in head[at:] else len(head)])
    while len(buf) < end + 4 + length:
        buf += sock.recv(65536)
    del buf[: end + 4 + length]


def server_cpu(tree: Path, kind: str, requests: int, keep_alive: bool) -> float:
    """Server CPU seconds per request: `requests` sent one at a time by a plain-socket client."""
    server = Server(tree, kind)
    message = FILTER if kind != "agent" else SCRAPE
    try:
        sock, buf = socket.create_connection(("127.0.0.1", server.port)), bytearray()
        for i in range(50 + requests):  # 50 to warm up
            if i == 50:
                start = server.cpu()
            if not keep_alive and i:
                sock.close()
                sock, buf = socket.create_connection(("127.0.0.1", server.port)), bytearray()
            sock.sendall(message)
            _read_answer(sock, buf)
        took = server.cpu() - start
        sock.close()
    finally:
        server.close()
    return took / requests


def client_cpu(tree: Path, kind: str, requests: int) -> float:
    """Client CPU seconds per request of the pool (or aiohttp) of `tree`, against this tree's aiohttp."""
    server = Server(ROOT, "aiohttp")
    try:
        out = subprocess.run(
            [sys.executable, str(WORKER), "client", kind, str(server.port), str(requests)],
            env=_env(tree), capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
    finally:
        server.close()
    return float(out.stdout.strip().splitlines()[-1])


def agent_rss(tree: Path) -> None:
    """RSS (MiB) of the idle `gpuwarden node-agent` of `tree` (`bench_node_agent.process_idle`'s setup)."""
    import tempfile

    from tests.bench import bench_node_agent

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _env(tree)["PYTHONPATH"]
    try:
        with tempfile.TemporaryDirectory(prefix="gwbench-", dir="/tmp") as d:
            bench_node_agent.process_idle(Path(d))
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def median(samples: list[float]) -> float:
    return statistics.median(samples)


async def amain() -> None:
    requests = int(os.environ.get("GPUWARDEN_BENCH_HTTP1_REQUESTS", "3000"))
    trees = [("after", ROOT)]
    if before := os.environ.get("GPUWARDEN_BENCH_HTTP1_BEFORE"):
        trees.insert(0, ("before", Path(before)))
    cases = [
        ("extender server, lean path", "server", "lean", True),
        ("extender server, aiohttp", "server", "aiohttp", True),
        ("node agent listener, /metrics", "server", "agent", False),
        ("API client, keep-alive pool", "client", "pool", True),
        ("API client, aiohttp", "client", "aiohttp", True),
    ]
    samples: dict[tuple[str, str], list[float]] = {}
    started = time.monotonic()
    for _ in range(ROUNDS):  # interleaved, so a busier minute hits every case alike
        for name, tree in trees:
            for label, side, kind, keep in cases:
                if side == "server":
                    value = server_cpu(tree, kind, requests, keep)
                else:
                    value = client_cpu(tree, kind, requests)
                samples.setdefault((name, label), []).append(value)
    print(f"HTTP/1.1 CPU per request ({requests} requests x {ROUNDS} rounds, median; "
          f"{time.monotonic() - started:.0f} s)")  # fmt: skip
    for name, _ in trees:
        got = {label: median(samples[(name, label)]) * 1e6 for label, *_ in cases}
        low = {label: min(samples[(name, label)]) * 1e6 for label, *_ in cases}
        for label, value in got.items():
            print(f"  {name:6} {label:34} {value:7.1f} µs, least {low[label]:7.1f}   (rounds: "
                  f"{', '.join(f'{v * 1e6:.1f}' for v in samples[(name, label)])})")  # fmt: skip
        for which, figures in (("median", got), ("least", low)):
            server_ratio = figures["extender server, lean path"] / figures["extender server, aiohttp"]
            client_ratio = figures["API client, keep-alive pool"] / figures["API client, aiohttp"]
            print(
                f"  {name:6} lean ÷ aiohttp ({which}): server {server_ratio:.2f}, client {client_ratio:.2f}"
            )
        if name == "after":
            lean, pool = got["extender server, lean path"], got["API client, keep-alive pool"]
            record(
                "http1", "extender server CPU per request, lean path", lean, "µs",
                anchor="aiohttp's server, same run", anchor_value=got["extender server, aiohttp"],
            )  # fmt: skip
            record(
                "http1", "API client CPU per request, keep-alive pool", pool, "µs",
                anchor="aiohttp's client, same run", anchor_value=got["API client, aiohttp"],
            )  # fmt: skip
    for name, tree in trees:
        print(f"  {name}: ", end="", flush=True)
        agent_rss(tree)


def main() -> Awaitable[None]:
    return amain()
