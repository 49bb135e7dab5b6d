"""The keep-alive pool of unary API requests (`gpuwarden/http1/pool.py`) against real local servers:
connections reused, answers read to their exact end (length, chunked, close), servers that close idle
connections, no second send of a request the server may have acted on (K1), and no connection kept after
any framing doubt (K2). `test_kube_client.py` runs the whole client (errors, TLS settings, credentials)
over it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gpuwarden.http1.head import request_head
from gpuwarden.http1.pool import KeepAlivePool, read_reply


def pool(port: int, limit: int = 4, idle: float = 15.0) -> KeepAlivePool:
    return KeepAlivePool(
        "127.0.0.1",
        port,
        tls=None,
        server_name=None,
        authority=f"127.0.0.1:{port}",
        limit=limit,
        idle_seconds=idle,
    )


@contextlib.asynccontextmanager
async def aiohttp_server(keepalive_timeout: float = 75.0) -> AsyncIterator[tuple[int, list[str]]]:
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(f"{request.method} {request.path_qs} {body.decode()}")
        if request.path == "/chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(50):
                await resp.write(b"x" * 1000 + str(i).encode())
            await resp.write_eof()
            return resp
        if request.path == "/close":
            return web.Response(text="bye", headers={"Connection": "close"})
        if request.path == "/empty":
            return web.Response(status=204)
        return web.Response(body=b"echo:" + body, status=201 if request.method == "POST" else 200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, keepalive_timeout=keepalive_timeout, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


def test_request_head_keeps_the_connection() -> None:
    head = request_head("POST", "/api/v1/x?a=b", "k:6443", {"Accept": "application/json"}, 2, close=False)
    assert (
        head == b"POST /api/v1/x?a=b HTTP/1.1\r\nHost: k:6443\r\nAccept: application/json\r\n"
        b"Content-Length: 2\r\n\r\n"
    )
    assert b"Connection" not in head


async def test_sequential_requests_share_one_connection() -> None:
    async with aiohttp_server() as (port, seen):
        p = pool(port)
        replies = [await p.request("POST", f"/p{i}", {}, b'{"i":%d}' % i) for i in range(5)]
        replies.append(await p.request("GET", "/chunked", {}, None))
        replies.append(await p.request("GET", "/empty", {}, None))
        replies.append(await p.request("GET", "/after", {}, None))
        p.close()
    assert [r.status for r in replies] == [201] * 5 + [200, 204, 200]
    assert replies[0].body == b'echo:{"i":0}' and replies[4].body == b'echo:{"i":4}'
    assert replies[5].body == b"".join(b"x" * 1000 + str(i).encode() for i in range(50))
    assert replies[6].body == b"" and replies[7].body == b"echo:"
    assert p.opened == 1
    assert seen[0] == 'POST /p0 {"i":0}' and len(seen) == 8


async def test_connection_close_and_concurrency_limit() -> None:
    async with aiohttp_server() as (port, _):
        p = pool(port, limit=2)
        assert (await p.request("GET", "/close", {}, None)).body == b"bye"
        assert (await p.request("GET", "/a", {}, None)).status == 200
        assert p.opened == 2  # the first connection was not kept
        got = await asyncio.gather(*(p.request("GET", f"/c{i}", {}, None) for i in range(10)))
        p.close()
    assert [r.body for r in got] == [b"echo:"] * 10
    assert p.opened <= 3  # at most two at a time (one of them the kept one)


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async with aiohttp_server(keepalive_timeout=0.1) as (port, seen):
        p = pool(port)
        assert (await p.request("POST", "/one", {}, b"1")).status == 201
        await asyncio.sleep(0.5)  # the server closes the idle connection; the pool sees its EOF
        assert (await p.request("POST", "/two", {}, b"2")).status == 201
        p.close()
    assert p.opened == 2
    assert seen == ["POST /one 1", "POST /two 2"]  # each sent once


async def test_idle_connections_older_than_the_idle_time_are_not_reused() -> None:
    async with aiohttp_server() as (port, _):
        p = pool(port, idle=0.05)
        await p.request("GET", "/a", {}, None)
        await asyncio.sleep(0.2)
        await p.request("GET", "/b", {}, None)
        p.close()
    assert p.opened == 2


@contextlib.asynccontextmanager
async def closes_after_first_request() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server that answers the first request of each connection with keep-alive, then reads the next one
    and closes without answering (a server that dropped the connection as the request arrived)."""
    received: list[bytes] = []

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        received.append(head.split(b"\r\n", 1)[0])
        length = [
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ]
        if length:
            await reader.readexactly(length[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            received.append(head.split(b"\r\n", 1)[0])
        writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], received
    finally:
        server.close()


async def test_an_idempotent_request_is_sent_again_once_when_a_reused_connection_ends_unanswered() -> None:
    async with closes_after_first_request() as (port, received):
        p = pool(port)
        await p.request("GET", "/first", {}, None)
        reply = await p.request("GET", "/second", {}, None)
        p.close()
    assert reply.body == b"ok"
    assert received == [b"GET /first HTTP/1.1", b"GET /second HTTP/1.1", b"GET /second HTTP/1.1"]


async def test_a_post_is_never_sent_twice() -> None:
    async with closes_after_first_request() as (port, received):
        p = pool(port)
        await p.request("POST", "/first", {}, b"{}")
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await p.request("POST", "/bind", {}, b"{}")
        p.close()
    assert received == [b"POST /first HTTP/1.1", b"POST /bind HTTP/1.1"]


@pytest.mark.parametrize(
    ("answer", "body", "keep"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", b"abc", True, id="length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
            b"abcde",
            True,
            id="chunked-with-extension-and-trailer",
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz",
            b"z",
            True,
            id="1xx-skipped",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nz", b"z", False, id="close"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", b"until the end", False, id="until-close"),
        pytest.param(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", b"", True, id="304"),
        # K2: framing doubts end the connection
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"abc",
            False,
            id="K2-unsolicited-bytes-after-the-answer",
        ),
        pytest.param(
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", b"", False, id="K2-204-with-a-body"
        ),
        pytest.param(
            b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"",
            False,
            id="K2-304-chunked",
        ),
    ],
)
async def test_read_reply_reads_exactly_one_answer(answer: bytes, body: bytes, keep: bool) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(answer)
    if b"until the end" in answer:
        reader.feed_eof()
    reply, kept = await read_reply(reader, "GET")
    assert (reply.body, kept) == (body, keep)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n", id="length-not-a-number"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", id="chunk-not-hex"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX", id="chunk-end"),
        # K2: conflicting or lenient framing is refused, never guessed
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            id="K2-length-and-chunked",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", id="K2-two-lengths"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", id="K2-two-equal-lengths"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\n\r\nabc", id="K2-space-before-colon"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc", id="K2-plus-length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n", id="K2-0x-chunk"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\nab\r\n0\r\n\r\n", id="K2-plus-chunk"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", id="unknown-coding"
        ),
        pytest.param(b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", id="bare-lf"),
    ],
)
async def test_malformed_answers_are_value_errors(answer: bytes) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(answer)
    reader.feed_eof()
    with pytest.raises(ValueError):
        await read_reply(reader, "GET")


async def test_a_truncated_answer_is_an_incomplete_read() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError):
        await read_reply(reader, "GET")


@contextlib.asynccontextmanager
async def scripted(*answers: bytes | None) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server whose Nth request (over all connections) gets answers[N] and then, when the script says
    so, loses its connection: None closes without a byte; an answer ending in b"|close" is written
    without that marker and the connection closed (part of an answer, then a reset); b"|idle:" + bytes
    answers, then writes those bytes unasked while the connection is idle."""
    received: list[bytes] = []
    script = list(answers)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while script:
                head = await reader.readuntil(b"\r\n\r\n")
                received.append(head.split(b"\r\n", 1)[0])
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                answer = script.pop(0)
                if answer is None:
                    break
                answer, _, unasked = answer.partition(b"|idle:")
                answer, closing, _ = answer.partition(b"|close")
                writer.write(answer)
                await writer.drain()
                if closing:
                    break
                if unasked:
                    await asyncio.sleep(0.05)
                    writer.write(unasked)
        writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], received
    finally:
        server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.parametrize("method", ["DELETE", "PUT", "GET"])
@pytest.mark.parametrize("body", [b"", b"abc"], ids=["head-only", "head-and-part-of-the-body"])
async def test_K1_nothing_is_sent_again_after_part_of_its_answer_arrived(method: str, body: bytes) -> None:
    partial = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + body + b"|close"
    async with scripted(OK, partial, OK, OK) as (port, received):
        p = pool(port)
        await p.request("GET", "/first", {}, None)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await p.request(method, "/lease", {}, b"{}" if method == "PUT" else None)
        p.close()
    assert received == [b"GET /first HTTP/1.1", f"{method} /lease HTTP/1.1".encode()]


@pytest.mark.parametrize("method", ["DELETE", "PUT", "PATCH"])
async def test_K1_only_get_head_and_options_are_sent_again_on_a_stale_connection(method: str) -> None:
    async with scripted(OK, None, OK) as (port, received):
        p = pool(port)
        await p.request("GET", "/first", {}, None)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await p.request(method, "/eviction", {}, b"{}")
        p.close()
    assert received == [b"GET /first HTTP/1.1", f"{method} /eviction HTTP/1.1".encode()]


async def test_K2_unsolicited_bytes_on_an_idle_connection_never_become_the_next_answer() -> None:
    evil = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"
    async with scripted(OK + b"|idle:" + evil, OK) as (port, _):
        p = pool(port)
        await p.request("GET", "/first", {}, None)
        await asyncio.sleep(0.2)  # the unasked answer arrives while the connection is idle
        reply = await p.request("GET", "/second", {}, None)
        p.close()
    assert reply.body == b"ok"
    assert p.opened == 2
