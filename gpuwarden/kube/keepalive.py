"""Keep-alive HTTP/1.1 connections to the API server on plain asyncio streams: the unary requests (GET, POST,
PATCH, PUT, DELETE) of `transport.AsyncTransport`.

Why it exists: the extender's bind path writes a Binding and an Event per pod, and aiohttp's client spends
about twice the CPU of a plain request/response exchange on each (request and response objects, URL and
header multidicts, cookie and trace hooks, timers): measured ~400 against ~190 µs per request on the same
server. The API server's answers to unary requests are plain HTTP/1.1 - a status line, headers, a
`Content-Length` or chunked body - so a pool of keep-alive connections that writes the request and reads
exactly that answer does the same work for half. Watches stay on aiohttp (`AsyncTransport.open_stream`).

How a connection is kept: after an answer read to its end (`Content-Length` or the last chunk) unless the
server said `Connection: close`; an idle connection is dropped after `IDLE_SECONDS` (below the API server's
own idle timeout, as aiohttp's default keep-alive) or once the server has closed it (seen as EOF while
idle, as Go's transport sees it).

What it must not do: pipeline, follow redirects, decompress (it never asks for compression), talk to a
proxy (`AsyncTransport.supports` already refuses those), or send a request twice when the server may have
acted on it: only an idempotent method (GET, HEAD, PUT, DELETE, OPTIONS) is sent again, once, and only when
a reused connection ended before its answer arrived (what Go's net/http retries too); a refused
connection is tried once more (nothing was sent). Errors are the caller's to map (`status.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import NamedTuple

from gpuwarden.kube.minihttp import parse_head, request_head

IDLE_SECONDS = 15.0
"""An idle pooled connection older than this is closed instead of reused."""

MAX_HEAD = 64 << 10
"""Bytes of status line + headers accepted from the server (also the stream reader's line limit)."""

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class Reply(NamedTuple):
    """A whole answer: status, reason, headers (lower-case names) and body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class _Stale(Exception):
    """A reused connection ended before a whole answer head arrived: the server had closed it."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def read_reply(reader: asyncio.StreamReader, method: str) -> tuple[Reply, bool]:
    """Read one answer; (the answer, whether the connection may carry another request). Raises
    `asyncio.IncompleteReadError` (nothing at all received: `partial` empty), `ValueError` (malformed) or
    `OSError`."""
    while True:
        status, reason, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
        if not 100 <= status <= 199 or status == 101:
            break  # 1xx interim answers (e.g. 100 Continue) precede the real one
    keep = "close" not in headers.get("connection", "").lower() and status != 101
    if method == "HEAD" or status in (204, 304) or status == 101:
        return Reply(status, reason, headers, b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                break
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise ValueError("chunk not followed by CRLF")
        return Reply(status, reason, headers, b"".join(parts)), keep
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ValueError(f"malformed Content-Length {length[:40]!r}")
        return Reply(status, reason, headers, await reader.readexactly(int(length))), keep
    return Reply(status, reason, headers, await reader.read()), False  # up to the server's close


class KeepAlivePool:
    """Keep-alive connections to one server, at most `limit` open at once; `request` sends one request."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        authority: str,
        limit: int,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._host, self._port = host, port
        self._tls = tls
        self._server_name = (server_name or host) if tls is not None else None
        self.authority = authority
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self._idle_seconds = idle_seconds
        self._closed = False
        self.opened = 0
        """Connections opened so far (tests: reuse shows as fewer opened than requests)."""

    async def request(
        self, method: str, target: str, headers: dict[str, str], content: bytes | None
    ) -> Reply:
        """Send one request and read its whole answer. Transport failures raise (`OSError`, `ValueError`,
        `EOFError`, `asyncio.LimitOverrunError`); the caller bounds the time."""
        length = None if content is None else len(content)
        head = request_head(method, target, self.authority, headers, length, close=False)
        message = head + content if content else head
        async with self._slots:
            for attempt in (1, 2):
                (reader, writer), reused = await self._acquire()
                try:
                    reply, keep = await self._exchange(reader, writer, message, method, reused)
                except _Stale:
                    writer.close()
                    if attempt == 1 and method in IDEMPOTENT:
                        continue
                    raise ConnectionResetError(
                        "the API server closed the connection before answering"
                    ) from None
                except BaseException:
                    writer.close()
                    raise
                if keep and not self._closed:
                    self._idle.append((reader, writer, asyncio.get_running_loop().time()))
                else:
                    writer.close()
                return reply
        raise AssertionError("unreachable")

    @staticmethod
    async def _exchange(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: bytes, method: str, reused: bool
    ) -> tuple[Reply, bool]:
        try:
            writer.write(message)
            await writer.drain()
            return await read_reply(reader, method)
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Stale from None
            raise
        except (ConnectionResetError, BrokenPipeError):
            if reused:  # no whole answer came; sent again only when idempotent (`request`)
                raise _Stale from None
            raise

    async def _acquire(self) -> tuple[Connection, bool]:
        """The newest live idle connection (True: reused), else a new one."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if writer.is_closing() or reader.at_eof() or now - since > self._idle_seconds:
                writer.close()
                continue
            return (reader, writer), True
        for attempt in (1, 2):
            try:
                connection = await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, server_hostname=self._server_name, limit=MAX_HEAD
                )
            except ConnectionRefusedError:
                if attempt == 2:
                    raise
                continue
            self.opened += 1
            return connection, False
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the idle connections (those in use close when their request ends with an error, or are
        when returned: the pool is not used after this)."""
        self._closed = True
        for _, writer, _ in self._idle:
            with contextlib.suppress(Exception):
                writer.close()
        self._idle.clear()
