"""The lean HTTP/1.1 server core (`gpuwarden/http1/server.py`) on real sockets, as the extender's listener
(`LeanSite`, aiohttp behind it) and the node agent's (`Listener`) serve it: the security review's
reproductions F1-F5 (issue 44), each written to fail on the previous hand-made loops, then the framer's
pure table."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from controller.extender.fastpath import LeanSite
from gpuwarden.http1.server import LeanServer, Limits, Response
from nodeagent.listener import Listener, Reply

Route = Callable[[bytes], Awaitable[tuple[int, bytes, str]]]


async def echo(body: bytes) -> tuple[int, bytes, str]:
    return 200, body, "application/json"


@contextlib.asynccontextmanager
async def extender(
    routes: dict[str, Route] | None = None, idle: float = 75.0, grace: float = 5.0
) -> AsyncIterator[tuple[int, LeanSite, web.AppRunner]]:
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=grace)
    await runner.setup()
    site = LeanSite(
        runner, "127.0.0.1", 0, routes=routes or {"/x/echo": echo}, max_body_bytes=1 << 20, idle_seconds=idle
    )
    await site.start()
    try:
        yield site.port, site, runner
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def node_agent() -> AsyncIterator[int]:
    listener = Listener({"/healthz": lambda: Reply.text("ok")})
    await listener.start("127.0.0.1", 0)
    try:
        yield listener.port
    finally:
        await listener.close()


@contextlib.asynccontextmanager
async def listening(kind: str) -> AsyncIterator[int]:
    if kind == "extender":
        async with extender() as (port, _, _):
            yield port
    else:
        async with node_agent() as port:
            yield port


async def status_of(port: int, data: bytes, wait: float = 3.0) -> int | None:
    """Write `data` at once; the status of the answer, None when the server closed without one. Fails
    (TimeoutError) when nothing comes within `wait` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(wait):
            line = await reader.readline()
        return int(line.split(b" ")[1]) if line.startswith(b"HTTP/1.1 ") else None
    finally:
        writer.close()


GET = b"GET /healthz HTTP/1.1\r\nHost: a\r\n"


@pytest.mark.parametrize("kind", ["extender", "node-agent"])
@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(GET + b"\r\n", 200, id="well-formed"),
        pytest.param(b"GET /healthz HTTP/1.1\nHost: a\n\n", 400, id="F5-bare-LF-head"),
        pytest.param(
            GET + b"X-A: 1\nTransfer-Encoding: chunked\r\n\r\n", 400, id="F5-bare-LF-hiding-a-header"
        ),
        pytest.param(GET + b"X-A: a\x00b\r\n\r\n", 400, id="F5-NUL-in-a-value"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nX-A: b\r\n\r\n", 400, id="F5-no-Host"),
        pytest.param(GET + b"X-A: " + b"a" * (9 << 10) + b"\r\n\r\n", 431, id="F5-9-KiB-line"),
        pytest.param(
            GET + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(244)) + b"\r\n",
            431,
            id="F5-244-KiB-head-in-one-read",
        ),
        pytest.param(GET + b"Content-Length : 2\r\n\r\nab", 400, id="space-before-the-colon"),
        pytest.param(GET + b"X-A: 1\r\n folded\r\n\r\n", 400, id="obs-fold"),
        pytest.param(GET + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\na", 400, id="two-lengths"),
        pytest.param(GET + b"Content-Length: +1\r\n\r\na", 400, id="plus-length"),
        pytest.param(
            GET + b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
            400,
            id="CL-and-TE",
        ),
        pytest.param(
            GET + b"Content-Length: 100000000000000000\r\n\r\na", 413, id="declared-body-over-the-limit"
        ),
    ],
)
async def test_F5_refuses_what_aiohttp_refuses(kind: str, request_bytes: bytes, status: int) -> None:
    async with listening(kind) as port:
        assert await status_of(port, request_bytes) == status


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"POST /x/echo HTTP/1.1\r\nHost: a\r\nContent-", id="partial-head"),
        pytest.param(b"POST /x/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n{", id="partial-body"),
    ],
)
async def test_F1_a_slow_client_is_timed_out(request_bytes: bytes) -> None:
    async with extender(idle=0.3) as (port, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        try:
            for _ in range(10):  # a byte at a time, each before the deadline
                await asyncio.sleep(0.1)
                with contextlib.suppress(ConnectionError):
                    writer.write(b"a" if b"\r\n\r\n" in request_bytes else b"X")
            async with asyncio.timeout(3):  # the server must end the connection
                try:
                    answer = await reader.read()
                except ConnectionError:  # our late bytes met the closed socket: closed all the same
                    answer = b""
        finally:
            writer.close()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")


def _count_head_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the lean path's head parses (the core's parser; before it, fastpath's own)."""
    calls = [0]
    try:
        import gpuwarden.http1.server as module

        name = "parse_request_head"
    except ImportError:  # the hand-made loop before the http1 room
        import controller.extender.fastpath as module  # type: ignore[no-redef]

        name = "parse_head"
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_F2_a_head_is_parsed_once_while_its_body_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_head_parses(monkeypatch)
    fields = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(58))  # a ~60 KB head
    body = b"x" * 4000
    head = b"POST /x/echo HTTP/1.1\r\nHost: a\r\n" + fields + b"Content-Length: %d\r\n\r\n" % len(body)
    async with extender() as (port, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        for at in range(0, len(body), 100):
            writer.write(body[at : at + 100])
            await writer.drain()
            await asyncio.sleep(0.001)
        async with asyncio.timeout(5):
            status = await reader.readline()
        writer.close()
    assert status.startswith(b"HTTP/1.1 200 ")
    assert calls[0] == 1


def _buffered(site: LeanSite) -> int:
    assert site.lean is not None
    total = 0
    for conn in site.lean.connections:
        buf = getattr(conn, "_buf", None)
        total += len(buf if buf is not None else conn._framer.buf)  # type: ignore[attr-defined]
    return total


async def test_F3_reading_pauses_while_an_answer_is_computed() -> None:
    gate = asyncio.Event()

    async def slow(body: bytes) -> tuple[int, bytes, str]:
        await gate.wait()
        return 200, body, "application/json"

    async with extender({"/x/slow": slow}) as (port, site, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x/slow HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        await asyncio.sleep(0.05)
        writer.write(b"P" * (16 << 20))  # whatever comes while the answer is computed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(writer.drain(), 1.0)
        held = _buffered(site)
        gate.set()
        async with asyncio.timeout(5):
            status = await reader.readline()
        writer.close()
    assert status.startswith(b"HTTP/1.1 200 ")
    assert held <= 1 << 20, f"{held} bytes buffered"


async def test_F4_shutdown_waits_for_a_lean_answer_in_flight() -> None:
    gate = asyncio.Event()
    finished: list[str] = []

    async def bind(body: bytes) -> tuple[int, bytes, str]:
        await gate.wait()  # between the claim and the Binding
        finished.append("bound")
        return 200, b"{}", "application/json"

    async with extender({"/x/bind": bind}) as (port, _, runner):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x/bind HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_later(0.3, gate.set)
        await runner.cleanup()  # the controller's shutdown; the loop would end right after
        assert finished == ["bound"]
        async with asyncio.timeout(1):
            status = await reader.readline()
        writer.close()
    assert status.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("kind", ["extender", "node-agent"])
async def test_a_malformed_request_is_logged_once_at_warning_without_a_traceback(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(kind) as port:
        caplog.clear()
        assert await status_of(port, GET + b"Content-Length: -1\r\n\r\n") == 400
        await asyncio.sleep(0.05)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None


async def test_a_malformed_request_on_a_connection_handed_to_aiohttp_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with extender() as (port, site, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET + b"\r\n")  # a probe: from here on the connection is aiohttp's
        async with asyncio.timeout(3):
            await reader.readuntil(b"ok")
        caplog.clear()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n")
        async with asyncio.timeout(3):
            status = await reader.readline()
        writer.close()
        assert site.lean is not None and site.lean.handed_off == 1
    assert b" 400 " in status  # aiohttp's answer
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.WARNING, None)]


@contextlib.asynccontextmanager
async def core(limits: Limits) -> AsyncIterator[int]:
    """The bare core answering every request with 200 "ok"."""

    async def ok(_: bytes) -> Response:
        return Response(200, b"ok")

    lean = LeanServer(lambda _: ok, limits)
    server = await asyncio.get_running_loop().create_server(lean, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        lean.close()
        await lean.wait_closed(1)


async def test_a_head_deadline_is_not_held_back_by_an_earlier_idle_timer() -> None:
    async with core(Limits(idle_seconds=30, head_seconds=0.3)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET + b"\r\n")
        async with asyncio.timeout(3):
            await reader.readuntil(b"ok")  # now idle: a timer due in 30 s
        writer.write(b"GET /healthz HTTP/1.1\r\nHo")
        async with asyncio.timeout(3):
            answer = await reader.read()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")


async def test_an_idle_deadline_counts_from_the_last_answer() -> None:
    loop = asyncio.get_running_loop()
    async with core(Limits(idle_seconds=0.4)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):  # each within the idle time of the one before
            writer.write(GET + b"\r\n")
            async with asyncio.timeout(3):
                await reader.readuntil(b"ok")
            last = loop.time()
            await asyncio.sleep(0.25)
        async with asyncio.timeout(3):
            assert await reader.read() == b""
        closed = loop.time() - last
        writer.close()
    assert 0.35 <= closed <= 1.5
