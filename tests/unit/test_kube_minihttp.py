"""The node agent's HTTP/1.1 transport (`gpuwarden/kube/minihttp.py`) against scripted local servers: every
answer the `http1` room refuses reaches the caller as a `KubeError` (M1: a malformed Content-Length used to
escape as a bare ValueError, which ended the node agent's run), and 1xx interim answers are skipped. The
whole transport runs every `test_kube_client.py` case too, beside aiohttp's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client import Configuration

from gpuwarden.errors import KubeError
from gpuwarden.http1.head import request_head
from gpuwarden.kube.minihttp import MiniTransport


def test_request_head() -> None:
    head = request_head(
        "PATCH", "/api/v1/nodes/n?fieldManager=x", "k:6443", {"Accept": "application/json"}, 2
    )
    assert head == (
        b"PATCH /api/v1/nodes/n?fieldManager=x HTTP/1.1\r\nHost: k:6443\r\nConnection: close\r\n"
        b"Accept: application/json\r\nContent-Length: 2\r\n\r\n"
    )


@contextlib.asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[MiniTransport]:
    """A MiniTransport to a server that answers every request with `answer` and closes."""

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with ThreadPoolExecutor(1) as pool:
        configuration = Configuration(host=f"http://127.0.0.1:{port}", api_key={"authorization": "t0"})
        transport = MiniTransport(configuration, timeout=5.0, user_agent="test", decode_pool=pool)
        try:
            yield transport
        finally:
            await transport.aclose()
            server.close()


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n{}", id="M1-length-not-a-number"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", id="M1-plus-length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", id="two-lengths"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n", id="0x-chunk"
        ),
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/2 200\r\n\r\n", id="http2"),
        pytest.param(b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", id="header-without-colon"),
    ],
)
async def test_M1_malformed_answers_are_kube_errors(answer: bytes) -> None:
    async with answering(answer) as transport:
        with pytest.raises(KubeError):
            await transport.send("GET", "/api/v1/nodes/n", None, None, None, "application/json")


async def test_M1_interim_answers_are_skipped() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    async with answering(answer) as transport:
        reply = await transport.send("GET", "/api/v1/nodes/n", None, None, None, "application/json")
    assert (reply.status, reply.body) == (200, b"{}")
