"""The node agent's listener: the pure routing, then the real server over a socket
(urllib as the client, as a probe or a scrape would be)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from gpuwarden.http1.server import Response, encode
from nodeagent.listener import Listener, Reply, answer

ROUTES = {
    "/healthz": lambda: Reply.text("ok"),
    "/readyz": lambda: Reply.text("not yet", 503),
    "/metrics": lambda: Reply(200, b"m 1\n", "text/plain; version=0.0.4; charset=utf-8"),
}


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        pytest.param("GET", "/healthz", 200, b"ok", id="route"),
        pytest.param("GET", "/readyz", 503, b"not yet", id="route-status"),
        pytest.param("GET", "/nope", 404, b"not found\n", id="unknown-path"),
        pytest.param("POST", "/healthz", 405, b"method not allowed\n", id="post"),
    ],
)
def test_answer(method: str, path: str, status: int, body: bytes) -> None:
    reply = answer(method, path, ROUTES)
    assert (reply.status, reply.body) == (status, body)


def test_encode_head_only_keeps_the_length_and_drops_the_body() -> None:
    full = encode(Response(200, b"ok"), close=True)
    head = encode(Response(200, b"ok"), close=True, head_only=True)
    assert full.startswith(b"HTTP/1.1 200 OK\r\n") and full.endswith(b"\r\n\r\nok")
    assert b"Content-Length: 2\r\n" in head and head.endswith(b"\r\n\r\n")


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


async def test_serves_routes_over_a_socket_and_survives_a_failing_route() -> None:
    def broken() -> Reply:
        raise RuntimeError("boom")

    listener = Listener({**ROUTES, "/broken": broken})
    await listener.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{listener.port}"
    try:
        got = [await asyncio.to_thread(_get, base + p) for p in ("/metrics", "/readyz", "/broken", "/x")]
        # a client that connects and sends nothing useful does not stop the next one
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"garbage\r\n\r\n")
        writer.close()
        after = await asyncio.to_thread(_get, base + "/healthz")
    finally:
        await listener.close()
    assert got == [
        (200, "text/plain; version=0.0.4; charset=utf-8", b"m 1\n"),
        (503, "text/plain; charset=utf-8", b"not yet"),
        (500, "text/plain; charset=utf-8", b"internal error\n"),
        (404, "text/plain; charset=utf-8", b"not found\n"),
    ]
    assert after == (200, "text/plain; charset=utf-8", b"ok")
