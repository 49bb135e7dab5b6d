"""Keep-alive HTTP/1.1 connections to one server on plain asyncio streams: the API client's unary requests
(GET, POST, PATCH, PUT, DELETE) for `gpuwarden/kube/transport.py`.

Why it exists: the extender's bind path writes a Binding and an Event per pod, and aiohttp's client spends
more CPU on each than a plain request/response exchange (figures: README, dependency table). The API
server's answers to unary requests are plain HTTP/1.1, so a pool of keep-alive connections that writes the
request and reads exactly that answer (`client.py`) does the same work for less. Watches stay on aiohttp.

How a connection is kept (Go's net/http transport is the model): after an answer read to its exact end,
unless the server said `Connection: close`, the framing was in doubt (a 204 that declared a body) or bytes
nobody asked for arrived after it. An idle connection is dropped after `IDLE_SECONDS`, and checked before
reuse: one the server closed, or that holds unsolicited bytes, is dropped, never read as the next answer.

What it must not do: pipeline, follow redirects, decompress, talk to a proxy, or send a request twice when
the server may have acted on it: only GET, HEAD and OPTIONS are sent again, once, and only when a reused
connection failed before a single byte of the answer arrived (Go's `isReplayable`); a refused connection is
tried once more (nothing was sent). Errors are the caller's to map (`gpuwarden/kube/status.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import NamedTuple

from gpuwarden.http1.client import ResponseBody, buffered, read_head
from gpuwarden.http1.head import MAX_HEAD, request_head

IDLE_SECONDS = 15.0
"""An idle pooled connection older than this is closed instead of reused (below the API server's own
idle timeout, as aiohttp's default keep-alive)."""

REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods sent again when a reused connection turns out dead before any byte of the answer."""


class Reply(NamedTuple):
    """A whole answer: status, reason, headers (lower-case names) and body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class _Stale(Exception):
    """A reused connection failed before any byte of an answer arrived: the server had closed it."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def read_reply(reader: asyncio.StreamReader, method: str) -> tuple[Reply, bool]:
    """Read one whole answer; (the answer, whether the connection may carry another request)."""
    head = await read_head(reader)
    body = ResponseBody(reader, head, method)
    data = await body.read()
    return Reply(head.status, head.reason, head.headers(), data), body.keep()


def _idle_usable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """An idle connection may be reused: open, nothing received since its last answer, no error."""
    return not (writer.is_closing() or reader.at_eof() or buffered(reader) or reader.exception() is not None)


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
        """Send one request and read its whole answer. Transport failures raise (`OSError`, `ValueError`
        incl. `FramingError`, `EOFError`); the caller bounds the time."""
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
                    if attempt == 1 and method in REPLAYABLE:
                        continue
                    raise ConnectionResetError("the server closed the connection before answering") from None
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
        """Write the request, read the answer. A reused connection that fails before any byte of the
        answer arrived raises `_Stale`; once a byte arrived, every failure is final."""
        try:
            writer.write(message)
            await writer.drain()
            head = await read_head(reader)
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Stale from None
            raise
        except (ConnectionResetError, BrokenPipeError):
            if reused and not buffered(reader):
                raise _Stale from None
            raise
        body = ResponseBody(reader, head, method)
        data = await body.read()
        return Reply(head.status, head.reason, head.headers(), data), body.keep()

    async def _acquire(self) -> tuple[Connection, bool]:
        """The newest usable idle connection (True: reused), else a new one."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if not _idle_usable(reader, writer) or now - since > self._idle_seconds:
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
        """Close the idle connections (those in use close when their request ends: the pool is not used
        after this)."""
        self._closed = True
        for _, writer, _ in self._idle:
            with contextlib.suppress(Exception):
                writer.close()
        self._idle.clear()
