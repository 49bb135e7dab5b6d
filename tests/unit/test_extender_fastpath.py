"""The extender's lean HTTP path (`controller/extender/fastpath.py`) on a real socket: the scheduler's
requests answered byte for byte as aiohttp's routes answer them, everything else handed to aiohttp on the
same connection, TLS, pipelining, limits and shutdown."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.extender.fastpath import LeanSite, lean_dispatch
from controller.extender.server import ExtenderService, add_extender_routes, verb_replies
from gpuwarden.http1.head import FramingError, parse_request_head
from tests.pki import CA
from tests.unit.test_extender_server import VERBS, build, golden

PREFIX = "/gpu-extender"


H = b"Host: a\r\n"


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"POST /x/filter HTTP/1.1\r\nHost: a\r\nContent-Length: 12", ("/x/filter", 12, False)),
        (
            b"POST /x/bind HTTP/1.1\r\n" + H + b"content-length:  0 \r\nConnection: Keep-Alive, close",
            ("/x/bind", 0, True),
        ),
        (
            b"POST /x/bind HTTP/1.1\r\n" + H + b"CONTENT-LENGTH: 3\r\nconnection: keep-alive",
            ("/x/bind", 3, False),
        ),
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"X: 1", ("/x/filter", 0, False)),  # no body: the verb's 400
        (b"GET /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 1", "aiohttp"),  # not POST
        (b"POST /x/filter HTTP/1.0\r\nContent-Length: 1", "aiohttp"),  # HTTP/1.0: aiohttp's
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked", "aiohttp"),
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 4\r\nExpect: 100-continue", "aiohttp"),
        (
            b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 4\r\nConnection: Upgrade\r\nUpgrade: h2c",
            "aiohttp",
        ),
        (
            b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 1",
            "refused",
        ),  # repeated
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: -1", "refused"),
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 1e3", "refused"),
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 99999999999999999999", "refused"),
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length : 4", "refused"),  # space before the colon
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 4\r\n folded", "refused"),  # obs-fold
        (b"POST /x/filter HTTP/1.1\r\n" + H + b"no colon\r\nContent-Length: 4", "refused"),
        (b"POST  /x/filter HTTP/1.1\r\n" + H + b"Content-Length: 4", "refused"),  # two spaces
        (b"POST /x/\xff HTTP/1.1\r\n" + H + b"Content-Length: 4", "refused"),
        (b"POST /x/filter HTTP/1.1\r\nContent-Length: 4", "refused"),  # no Host
    ],
)
def test_which_requests_the_lean_path_answers(head: bytes, expected: tuple[str, int, bool] | str) -> None:
    """Pure: a head is the lean path's (path, length, close), aiohttp's, or refused by the core."""
    dispatch = lean_dispatch({"/x/filter": echo_route, "/x/bind": echo_route})
    try:
        parsed = parse_request_head(head + b"\r\n\r\n")
    except FramingError:
        assert expected == "refused"
        return
    if expected == "aiohttp":
        assert dispatch(parsed) is None
    else:
        assert dispatch(parsed) is not None and (parsed.path, parsed.length, parsed.close) == expected


async def echo_route(raw: bytes) -> tuple[int, bytes, str]:
    return 200, raw, "application/json"


@dataclass
class Served:
    port: int
    site: web.TCPSite
    runner: web.AppRunner
    registry: CollectorRegistry


async def serve(
    *,
    lean: bool = True,
    ssl_context: ssl.SSLContext | None = None,
    max_body: int = 1 << 20,
    idle: float = 75.0,
) -> Served:
    service, _, registry = build()
    service.max_body_bytes = max_body
    app = web.Application()
    add_extender_routes(app, service, PREFIX)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site: web.TCPSite
    if lean:
        site = LeanSite(
            runner,
            "127.0.0.1",
            0,
            routes=verb_replies(service, PREFIX),
            max_body_bytes=max_body,
            ssl_context=ssl_context,
            idle_seconds=idle,
            rejected=service.metrics.reject,
        )
    else:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    return Served(site.port, site, runner, registry)


def handed_off(served: Served) -> int:
    assert isinstance(served.site, LeanSite) and served.site.lean is not None
    return served.site.lean.handed_off


@pytest.fixture
async def lean() -> AsyncIterator[Served]:
    served = await serve()
    yield served
    await served.runner.cleanup()


@pytest.fixture
async def plain() -> AsyncIterator[Served]:
    served = await serve(lean=False)
    yield served
    await served.runner.cleanup()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Response(status, headers, body)


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def exchange(port: int, *requests: bytes, ssl_context: ssl.SSLContext | None = None) -> list[Response]:
    """Each request written on one connection after the previous answer; the answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context)
    try:
        answers = []
        for request in requests:
            writer.write(request)
            await writer.drain()
            answers.append(await read_response(reader))
        return answers
    finally:
        writer.close()


@pytest.mark.parametrize(("verb", "request_file", "response_file"), VERBS, ids=[v[1] for v in VERBS])
async def test_the_scheduler_s_requests_are_answered_as_aiohttp_answers_them(
    lean: Served, plain: Served, verb: str, request_file: str, response_file: str
) -> None:
    request = post(f"{PREFIX}/{verb}", golden(request_file))
    [fast] = await exchange(lean.port, request)
    [slow] = await exchange(plain.port, request)
    assert handed_off(lean) == 0
    assert (fast.status, fast.body) == (slow.status, slow.body) == (200, golden(response_file))
    assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("verb", "body"),
    [("filter", b"{"), ("prioritize", b'{"NodeNames":[]}'), ("bind", b'{"PodName":"x"}'), ("preempt", b"[]")],
)
async def test_malformed_requests_get_the_same_400(
    lean: Served, plain: Served, verb: str, body: bytes
) -> None:
    [fast] = await exchange(lean.port, post(f"{PREFIX}/{verb}", body))
    [slow] = await exchange(plain.port, post(f"{PREFIX}/{verb}", body))
    assert handed_off(lean) == 0
    assert fast.status == slow.status == 400
    assert fast.body == slow.body and fast.body.startswith(b"malformed Extender")
    assert fast.headers["content-type"] == slow.headers["content-type"] == "text/plain; charset=utf-8"


async def test_metrics_count_each_lean_request_once(lean: Served) -> None:
    await exchange(
        lean.port, post(f"{PREFIX}/filter", golden("filter_args_cache.json")), post(f"{PREFIX}/bind", b"{")
    )
    sample = lean.registry.get_sample_value
    assert sample("gpuwarden_extender_requests_total", {"verb": "filter", "outcome": "ok"}) == 1
    assert sample("gpuwarden_extender_requests_total", {"verb": "bind", "outcome": "bad_request"}) == 1
    assert sample("gpuwarden_extender_request_duration_seconds_count", {"verb": "filter"}) == 1


async def test_other_requests_on_the_same_connection_are_aiohttp_s(lean: Served) -> None:
    filter_ = post(f"{PREFIX}/filter", golden("filter_args_cache.json"))
    answers = await exchange(lean.port, filter_, GET_HEALTHZ, filter_, post("/nowhere", b"{}"))
    assert [a.status for a in answers] == [200, 200, 200, 404]
    assert answers[1].body == b"ok"
    assert answers[0].body == answers[2].body == golden("filter_result_cache.json")
    assert handed_off(lean) == 1  # from the probe on, the connection is aiohttp's


@pytest.mark.parametrize(
    "request_bytes",
    [
        # chunked
        f"POST {PREFIX}/filter HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + b"%x\r\n" % len(golden("filter_args_cache.json"))
        + golden("filter_args_cache.json")
        + b"\r\n0\r\n\r\n",
        # HTTP/1.0
        post(f"{PREFIX}/filter", golden("filter_args_cache.json")).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
        # Expect: 100-continue (the client sends the body at once; aiohttp answers 100 first)
        post(f"{PREFIX}/filter", golden("filter_args_cache.json"), "Expect: 100-continue"),
    ],
    ids=["chunked", "http-1.0", "expect"],
)
async def test_requests_the_lean_path_does_not_read_are_answered_by_aiohttp(
    lean: Served, request_bytes: bytes
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lean.port)
    try:
        writer.write(request_bytes)
        answer = await read_response(reader)
        if answer.status == 100:
            answer = await read_response(reader)
    finally:
        writer.close()
    assert handed_off(lean) == 1
    assert (answer.status, answer.body) == (200, golden("filter_result_cache.json"))


async def test_a_body_over_the_limit_is_refused_from_its_head_with_413() -> None:
    served = await serve(max_body=100)
    try:
        [answer] = await exchange(served.port, post(f"{PREFIX}/filter", golden("filter_args_cache.json")))
    finally:
        await served.runner.cleanup()
    assert (answer.status, answer.headers["connection"]) == (413, "close")
    assert handed_off(served) == 0
    sample = served.registry.get_sample_value
    assert sample("gpuwarden_http_requests_rejected_total", {"reason": "body_too_large"}) == 1


async def test_pipelined_requests_and_split_writes_are_answered_in_order(lean: Served) -> None:
    first = post(f"{PREFIX}/filter", golden("filter_args_cache.json"))
    second = post(f"{PREFIX}/prioritize", golden("prioritize_args_cache.json"))
    reader, writer = await asyncio.open_connection("127.0.0.1", lean.port)
    try:
        stream = first + second
        for at in range(0, len(stream), 97):  # heads and bodies cut anywhere
            writer.write(stream[at : at + 97])
            await writer.drain()
            await asyncio.sleep(0)
        answers = [await read_response(reader), await read_response(reader)]
    finally:
        writer.close()
    assert [a.body for a in answers] == [golden("filter_result_cache.json"), golden("prioritize_result.json")]
    assert handed_off(lean) == 0


async def test_connection_close_is_honoured(lean: Served) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", lean.port)
    try:
        writer.write(post(f"{PREFIX}/filter", golden("filter_args_cache.json"), "Connection: close"))
        answer = await read_response(reader)
        assert answer.headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    finally:
        writer.close()


async def test_tls_serves_both_paths(tmp_path: Path) -> None:
    ca = CA.new()
    cert, key = ca.issue("localhost", server=True)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cadata=ca.pem.decode())
    served = await serve(ssl_context=server_ctx)
    try:
        filter_ = post(f"{PREFIX}/filter", golden("filter_args_cache.json"))
        answers = await exchange(served.port, filter_, filter_, GET_HEALTHZ, ssl_context=client_ctx)
    finally:
        await served.runner.cleanup()
    assert [a.status for a in answers] == [200, 200, 200]
    assert answers[0].body == answers[1].body == golden("filter_result_cache.json")
    assert answers[2].body == b"ok"
    assert handed_off(served) == 1


async def test_idle_connections_close_after_the_idle_time_and_on_cleanup() -> None:
    served = await serve(idle=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(post(f"{PREFIX}/filter", golden("filter_args_cache.json")))
    assert (await read_response(reader)).status == 200
    assert await asyncio.wait_for(reader.read(), 5) == b""  # idle: closed by the server
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(post(f"{PREFIX}/filter", golden("filter_args_cache.json")))
    assert (await read_response(reader)).status == 200
    await served.runner.cleanup()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed on shutdown
    writer.close()


async def test_a_slow_answer_is_written_before_shutdown_closes_the_connection() -> None:
    gate = asyncio.Event()

    async def slow(raw: bytes) -> tuple[int, bytes, str]:
        await gate.wait()
        return 200, raw, "application/json"

    app = web.Application()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = LeanSite(runner, "127.0.0.1", 0, routes={"/slow": slow}, max_body_bytes=1 << 10)
    await site.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    writer.write(post("/slow", b'{"a":1}'))
    await writer.drain()
    await asyncio.sleep(0.05)
    assert site.lean is not None
    site.lean.close()  # as the site's stop does: the busy connection stays until its answer is out
    gate.set()
    answer = await read_response(reader)
    assert (answer.status, answer.body, answer.headers["connection"]) == (200, b'{"a":1}', "close")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await runner.cleanup()


def test_every_verb_has_a_lean_route() -> None:
    service, _, _ = build()
    assert isinstance(service, ExtenderService)
    verbs = ("filter", "prioritize", "preempt", "bind")
    assert set(verb_replies(service, PREFIX)) == {f"{PREFIX}/{v}" for v in verbs}
