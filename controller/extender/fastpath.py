"""The extender's verbs on a lean HTTP/1.1 path; every other request through aiohttp, on the same listener.

Why it exists: kube-scheduler sends three requests per pod (filter, prioritize, bind) on one keep-alive
connection, and aiohttp's server machinery around a handler (request and response objects, the router,
header multidicts, the payload writer) costs about as much CPU as the extender's own answer for the
pre-encoded filter and prioritize (issue 29: the extender's own CPU per pod against the null extender's).
The scheduler's requests are the simplest HTTP there is - `POST <path> HTTP/1.1`, a `Content-Length` body,
a JSON answer - so this protocol answers exactly those and nothing else:

* a request whose line is `POST` to one of the extender's paths over HTTP/1.1, with one `Content-Length`
  no larger than `extender.max_request_bytes`, no `Transfer-Encoding`, no `Expect` and no `Upgrade`, is
  answered here by the same reply function the aiohttp route calls (`server.verb_replies`: the same
  parsing, error contract and metrics), one request at a time per connection (pipelined requests wait in
  the buffer), keep-alive unless the client sends `Connection: close`;
* anything else - another path or method, HTTP/1.0, chunked bodies, `Expect: 100-continue`, a body over
  the limit (aiohttp answers 413), a head it cannot read, a header block over 64 KiB - hands the connection,
  from that request on, to aiohttp's own protocol, which then serves it as if it had accepted it (the
  probes, `/metrics`, and every error answer aiohttp gives).

TLS is below it (asyncio's SSL transport), so both paths serve HTTPS alike; with client certificates
required (`peerauth.py`), a connection whose peer presented none is aiohttp's from the start.
`extender.lean_http: false` serves everything through aiohttp. It must not decide anything: the replies
are `server.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from typing import Any

from aiohttp import web

from controller.extender.server import Reply

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 << 10
"""A request head longer than this is not the scheduler's: aiohttp answers it (with its own limits)."""

IDLE_SECONDS = 75.0
"""A keep-alive connection with no request for this long is closed (aiohttp's `keepalive_timeout`)."""

_REASONS = {200: b"OK", 400: b"Bad Request", 500: b"Internal Server Error", 503: b"Service Unavailable"}


class Head:
    """What the lean path needs of a request head: its path, body length and whether to close after."""

    __slots__ = ("close", "length", "path")

    def __init__(self, path: str, length: int, close: bool) -> None:
        self.path, self.length, self.close = path, length, close


def parse_head(head: bytes) -> Head | None:
    """The head (request line and headers, without the blank line) of a request the lean path may answer,
    or None when aiohttp should: not `POST ... HTTP/1.1`, a header it does not handle, a missing, repeated
    or malformed `Content-Length`, a folded or malformed header line. Pure."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1" or not parts[1].startswith(b"/"):
        return None
    length: int | None = None
    close = False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            return None
        name = name.lower()
        value = value.strip()
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
        elif name == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
    if length is None:
        return None
    try:
        path = parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    return Head(path, length, close)


_date_cache: list[Any] = [0, b""]


def _date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return _date_cache[1]  # type: ignore[no-any-return]


def response_bytes(status: int, body: bytes, content_type: str, close: bool) -> bytes:
    """The HTTP/1.1 response for a reply. Pure but for the Date header."""
    reason = _REASONS.get(status, b"Error")
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n"
            % (status, reason, content_type.encode(), len(body), _date()),
            b"Connection: close\r\n\r\n" if close else b"\r\n",
            body,
        )
    )


Route = Callable[[bytes], Awaitable[Reply]]


class LeanVerbs:
    """The protocol factory of the extender's listener: each connection starts on the lean path and moves
    to `fallback` (aiohttp's `web.Server`) at the first request it does not answer itself."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        fallback: Callable[[], asyncio.BaseProtocol],
        max_body_bytes: int,
        idle_seconds: float = IDLE_SECONDS,
        admit: Callable[[asyncio.BaseTransport], bool] | None = None,
    ) -> None:
        self.routes = dict(routes)
        self.fallback = fallback
        self.max_body_bytes = max_body_bytes
        self.idle_seconds = idle_seconds
        self.admit = admit
        """Whether a new connection may be answered here at all (`peerauth.lean_admits`: only a peer with a
        verified client certificate); one it does not admit is aiohttp's from its first byte."""
        self.connections: set[LeanConnection] = set()
        self.handed_off = 0
        """Connections given to aiohttp (for tests and the curious)."""
        self.closing = False

    def __call__(self) -> LeanConnection:
        return LeanConnection(self)

    def close(self) -> None:
        """Stop: idle connections close now, busy ones once their answer is written."""
        self.closing = True
        for conn in list(self.connections):
            conn.close_when_idle()


class LeanConnection(asyncio.Protocol):
    """One client connection on the lean path (see the module docstring)."""

    def __init__(self, owner: LeanVerbs) -> None:
        self._owner = owner
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner.connections.add(self)
        self._arm_idle()
        if self._owner.admit is not None and not self._owner.admit(transport):
            self._hand_off()

    def connection_lost(self, exc: Exception | None) -> None:
        # An answer being computed is not cancelled (a bind goes on, as aiohttp lets a handler finish).
        self._owner.connections.discard(self)
        self._transport = None
        self._disarm_idle()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._disarm_idle()
        if not self._busy:
            self._next()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._busy and self._transport is not None:
            self._transport.close()
        return True  # a busy connection writes its answer before it closes

    def close_when_idle(self) -> None:
        if not self._busy and self._transport is not None:
            self._transport.close()

    def _next(self) -> None:
        """Answer the next complete request in the buffer, or hand the connection over, or wait."""
        transport = self._transport
        if transport is None or self._busy:
            return
        if self._owner.closing and not self._buf:
            transport.close()
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                self._hand_off()
            elif not self._buf:
                self._arm_idle()
            return
        head = parse_head(bytes(self._buf[:end]))
        owner = self._owner
        route = owner.routes.get(head.path) if head is not None else None
        if head is None or route is None or head.length > owner.max_body_bytes:
            self._hand_off()
            return
        start = end + 4
        if len(self._buf) < start + head.length:
            return  # the body is still arriving
        body = bytes(self._buf[start : start + head.length])
        del self._buf[: start + head.length]
        self._busy = True
        # held, so the task is not garbage-collected while it runs (asyncio keeps only a weak reference)
        self._task = asyncio.get_running_loop().create_task(self._serve(route, body, head.close))

    async def _serve(self, route: Route, body: bytes, close: bool) -> None:
        try:
            status, payload, content_type = await route(body)
        except Exception:  # the reply functions answer every error themselves; this is a last resort
            log.exception("extender request failed")
            status, payload, content_type, close = 500, b"internal error", "text/plain; charset=utf-8", True
        self._busy = False
        transport = self._transport
        if transport is None:
            return
        close = close or self._owner.closing or self._eof
        transport.write(response_bytes(status, payload, content_type, close))
        if close:
            transport.close()
            return
        self._next()

    def _hand_off(self) -> None:
        """From this request on, the connection is aiohttp's."""
        transport = self._transport
        assert transport is not None
        self._owner.connections.discard(self)
        self._owner.handed_off += 1
        self._disarm_idle()
        self._transport = None
        protocol = self._owner.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._buf:
            assert isinstance(protocol, asyncio.Protocol)
            protocol.data_received(bytes(self._buf))
            self._buf.clear()

    def _arm_idle(self) -> None:
        self._disarm_idle()
        self._timer = asyncio.get_running_loop().call_later(self._owner.idle_seconds, self.close_when_idle)

    def _disarm_idle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class LeanSite(web.TCPSite):
    """aiohttp's TCP site with the extender's verbs on the lean path (`LeanVerbs`): the controller's one
    listener (the extender, `/metrics`, the probes) as `web.TCPSite` serves it, only faster for the
    scheduler's requests."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        routes: Mapping[str, Route],
        max_body_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        idle_seconds: float = IDLE_SECONDS,
        admit: Callable[[asyncio.BaseTransport], bool] | None = None,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._lean_routes = routes
        self._max_body = max_body_bytes
        self._idle = idle_seconds
        self._admit = admit
        self.lean: LeanVerbs | None = None

    async def start(self) -> None:
        # As `TCPSite.start`, with the lean protocol in front of the runner's server.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self.lean = LeanVerbs(self._lean_routes, server, self._max_body, self._idle, self._admit)
        self._server = await asyncio.get_running_loop().create_server(
            self.lean,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        if self.lean is not None:
            self.lean.close()
