"""The lean HTTP/1.1 server core: an asyncio protocol that frames requests (`RequestFramer`), answers them
with a handler chosen per request head, and keeps every phase of a connection bounded.

Why it exists: the extender answers kube-scheduler's three requests per pod, and the node agent answers
probes and scrapes on every GPU node; aiohttp's server costs the first CPU on every request and the
second memory it cannot spare (figures: README, docs/node-agent.md). Both now share this core instead of
two hand-made loops, so the rules below hold on both ports:

* each request's head is read once, by llhttp (`head.py`), as soon as its blank line arrives; a bare LF is
  refused as soon as it arrives (it would otherwise never end a head);
* deadlines: a head must arrive within `head_seconds` of its first byte, a body within `body_seconds` of
  its head (slow clients do not hold a connection by trickling bytes), an idle keep-alive connection is
  closed after `idle_seconds`;
* bounded buffers: a head over `MAX_HEAD` or a line over `MAX_LINE` is refused (431), a declared body over
  `max_body` is refused from the head (413, nothing of it read), and while an answer is computed reading
  pauses once `max_buffer` bytes wait;
* a malformed request is answered 400 (or its `FramingError`'s status) and the connection closed, logged
  once at warning without a traceback and counted (`rejected`);
* `close()` then `wait_closed()`: idle connections close at once, answers being computed are written
  first (a bind is never cut between its claim and its Binding), up to a grace period.

A request the dispatcher does not take is handed, with everything after it on that connection, to a
`fallback` protocol (aiohttp's, for the extender's probes and `/metrics`) - only after its head was read
strictly, so the fallback never sees a malformed head. What it must not do: route, decide, or grow a
framework; request bodies are read by Content-Length only (a chunked one goes to the fallback, or 411).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import NamedTuple

from gpuwarden.http1.head import (
    MAX_HEAD,
    MAX_LINE,
    FramingError,
    RequestHead,
    parse_request_head,
    response_head,
)

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"


class Response(NamedTuple):
    """What a handler answers; `close` ends the connection after it."""

    status: int
    body: bytes
    content_type: str = TEXT
    close: bool = False


Answer = Response | tuple[int, bytes, str]
"""A `Response`, or (status, body, content type) as the extender's reply functions give it."""
Handler = Callable[[bytes], Awaitable[Answer]]
"""Answers a request from its body (the dispatcher that chose it has seen the head)."""
Dispatch = Callable[[RequestHead], Handler | None]
"""Chooses the handler for a request head; None hands the connection to the fallback (or answers 404)."""


class Limits(NamedTuple):
    """A connection's bounds (every one documented in the module docstring)."""

    max_body: int = 1 << 20
    head_seconds: float = 10.0
    body_seconds: float = 10.0
    idle_seconds: float = 75.0
    max_buffer: int = MAX_HEAD


DEFAULT_LIMITS = Limits()


class RequestFramer:
    """Requests out of a byte stream, one at a time: `feed` bytes, `head()` once its blank line is in,
    `body()` once its Content-Length bytes are, `take()` to drop it. Pure; the head is scanned once (only
    the new bytes for its end and for bare LFs) and parsed once."""

    __slots__ = ("_head", "_scanned", "_start", "buf")

    def __init__(self) -> None:
        self.buf = bytearray()
        self._scanned = 0
        self._start = 0
        self._head: RequestHead | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data

    def head(self) -> RequestHead | None:
        """The current request's head, None while it is incomplete; `FramingError` when it is refused."""
        if self._head is not None:
            return self._head
        buf, scanned = self.buf, self._scanned
        end = buf.find(b"\r\n\r\n", scanned - 3 if scanned > 3 else 0)
        stop = len(buf) if end < 0 else end + 4
        if buf.count(b"\n", scanned, stop) != buf.count(b"\r\n", scanned - 1 if scanned else 0, stop):
            raise FramingError("line_ending", "bare LF")
        if end < 0:
            self._scanned = stop
            if stop > MAX_HEAD:
                raise FramingError("head_too_large", status=431)
            if stop - buf.rfind(b"\n") - 1 > MAX_LINE:
                raise FramingError("line_too_long", status=431)
            return None
        with memoryview(buf) as view:
            self._head = parse_request_head(bytes(view[:stop]), scanned=True)
        self._start = stop
        return self._head

    def body(self) -> bytes | None:
        """The current request's body once it is all in (its head must be)."""
        assert self._head is not None
        end = self._start + self._head.length
        if len(self.buf) < end:
            return None
        with memoryview(self.buf) as view:
            return bytes(view[self._start : end])

    def take(self) -> None:
        """Drop the current request (head and body) from the buffer."""
        assert self._head is not None
        del self.buf[: self._start + self._head.length]
        self._head, self._scanned, self._start = None, 0, 0


_date_cache: list[object] = [0, b""]


def _date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return _date_cache[1]  # type: ignore[return-value]


def encode(response: Response, *, close: bool, head_only: bool = False) -> bytes:
    """The bytes of an answer (the head only for a HEAD request). Pure but for the Date field."""
    head = response_head(
        response.status, response.content_type, len(response.body), close=close, date=_date()
    )
    return head if head_only else head + response.body


class LeanServer:
    """The protocol factory: `loop.create_server(LeanServer(...), ...)`, then `close()` and
    `await wait_closed(grace)` to stop."""

    def __init__(
        self,
        dispatch: Dispatch,
        limits: Limits = DEFAULT_LIMITS,
        *,
        fallback: Callable[[], asyncio.BaseProtocol] | None = None,
        rejected: Callable[[str], None] | None = None,
        admit: Callable[[asyncio.BaseTransport], bool] | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.admit = admit
        """Whether a new connection may be served here at all (e.g. only a peer with a verified client
        certificate); one it does not admit is the fallback's from its first byte."""
        self.limits = limits
        self.fallback = fallback
        self.rejected = rejected
        self.connections: set[ServerConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        """Answers being computed (held: asyncio keeps only weak references to tasks)."""
        self.handed_off = 0
        """Connections given to the fallback (for tests and the curious)."""
        self.closing = False

    def __call__(self) -> ServerConnection:
        return ServerConnection(self)

    def close(self) -> None:
        """Stop: idle connections close now, busy ones once their answer is written."""
        self.closing = True
        for conn in list(self.connections):
            conn.close_when_idle()

    async def wait_closed(self, grace: float) -> None:
        """Wait up to `grace` seconds for the answers being computed; cancel those still running then."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(set(self.tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


class ServerConnection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server: LeanServer) -> None:
        self._server = server
        self._limits = server.limits
        self._framer = RequestFramer()
        self._transport: asyncio.Transport | None = None
        self._handler: Handler | None = None
        self._busy = False
        self._paused = False
        self._eof = False
        self._timer: asyncio.TimerHandle | None = None
        self._phase = ""
        self._deadline = 0.0
        self._task: asyncio.Task[None] | None = None

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server.connections.add(self)
        admit = self._server.admit
        if admit is not None and self._server.fallback is not None and not admit(transport):
            self._hand_off()
            return
        self._advance()

    def connection_lost(self, exc: Exception | None) -> None:
        # An answer being computed is not cancelled: it goes on (a bind), and `wait_closed` waits for it.
        self._server.connections.discard(self)
        self._transport = None
        self._stop_timer()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._framer.feed(data)
        if not self._busy:
            self._advance()
        elif len(self._framer.buf) > self._limits.max_buffer and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._busy and self._transport is not None:
            self._transport.close()
        return True  # a busy connection writes its answer before it closes

    def close_when_idle(self) -> None:
        if not self._busy and self._transport is not None:
            self._transport.close()

    # the request cycle

    def _advance(self) -> None:
        """Start answering the next complete request in the buffer, or wait for more under a deadline, or
        refuse, or hand the connection over."""
        transport, framer = self._transport, self._framer
        if transport is None or self._busy:
            return
        try:
            head = framer.head()
        except FramingError as exc:
            self._refuse(exc.status, exc.reason, str(exc))
            return
        if head is None:
            if framer.buf:
                self._set_timer("head")
            elif self._server.closing or self._eof:
                transport.close()
            else:
                self._set_timer("idle")
            return
        if self._handler is None and not self._choose(head):
            return
        body = framer.body()
        if body is None:
            self._set_timer("body")
            return
        handler, self._handler = self._handler, None
        assert handler is not None
        framer.take()
        self._set_timer("")
        self._busy = True
        self._task = asyncio.get_running_loop().create_task(self._serve(handler, head, body))
        self._server.tasks.add(self._task)

    def _choose(self, head: RequestHead) -> bool:
        """Decide once per head: its handler (True), or a refusal / hand-off (False)."""
        if head.length > self._limits.max_body:
            self._refuse(413, "body_too_large", f"declared {head.length} bytes")
            return False
        handler = self._server.dispatch(head)
        if handler is None:
            if self._server.fallback is not None:
                self._hand_off()
            else:
                self._answer(head, Response(404, b"not found\n", close=True))
            return False
        if head.chunked:
            self._refuse(411, "chunked_request", "chunked request bodies are not read here")
            return False
        self._handler = handler
        if head.length and head.expect == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    async def _serve(self, handler: Handler, head: RequestHead, body: bytes) -> None:
        response: Answer
        try:
            response = await handler(body)
        except Exception:  # handlers answer their own errors; this is a last resort
            log.exception("HTTP handler failed", extra={"path": head.path})
            response = Response(500, b"internal error\n", close=True)
        finally:
            self._server.tasks.discard(self._task)
        self._busy = False
        if self._transport is None:
            return
        self._answer(head, response)
        if self._transport is not None:
            if self._paused:
                self._paused = False
                self._transport.resume_reading()
            self._advance()

    def _answer(self, head: RequestHead, response: Answer) -> None:
        transport = self._transport
        assert transport is not None
        close = (
            (isinstance(response, Response) and response.close)
            or head.close
            or self._server.closing
            or self._eof
        )
        status, body, content_type = response[0], response[1], response[2]
        head_bytes = response_head(status, content_type, len(body), close=close, date=_date())
        transport.write(head_bytes if head.method == "HEAD" else head_bytes + body)
        if close:
            self._close(transport)

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer a client's malformed or over-limit request and close: one warning line, one count."""
        transport = self._transport
        assert transport is not None
        log.warning(
            "refused an HTTP request",
            extra={"reason": reason, "status": status, "detail": detail[:200], "peer": _peer(transport)},
        )
        if self._server.rejected is not None:
            self._server.rejected(reason)
        body = f"{reason.replace('_', ' ')}\n".encode()
        transport.write(encode(Response(status, body), close=True))
        self._close(transport)

    def _close(self, transport: asyncio.Transport) -> None:
        self._stop_timer()
        self._transport = None
        self._server.connections.discard(self)
        transport.close()

    def _hand_off(self) -> None:
        """From this request on, the connection is the fallback's."""
        transport, fallback = self._transport, self._server.fallback
        assert transport is not None and fallback is not None
        self._server.connections.discard(self)
        self._server.handed_off += 1
        self._stop_timer()
        self._transport = None
        protocol = fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._framer.buf:
            assert isinstance(protocol, asyncio.Protocol)
            protocol.data_received(bytes(self._framer.buf))
            self._framer.buf.clear()

    # deadlines

    def _set_timer(self, phase: str) -> None:
        """Start the deadline of `phase` (head, body, idle) unless it is already running; "" stops it.

        One timer per connection, re-armed lazily: a timer due before the new deadline is left to fire
        and re-arm itself (`_expired`), so a keep-alive connection answering request after request does
        not create and cancel a timer for each."""
        if phase == self._phase:
            return
        self._phase = phase
        if not phase:
            return  # a pending timer finds nothing to do (`_expired`)
        limits = self._limits
        seconds = (
            limits.idle_seconds
            if phase == "idle"
            else limits.head_seconds
            if phase == "head"
            else limits.body_seconds
        )
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + seconds
        timer = self._timer
        if timer is not None:
            if timer.when() <= self._deadline:
                return
            timer.cancel()
        self._timer = loop.call_at(self._deadline, self._expired)

    def _stop_timer(self) -> None:
        self._phase = ""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport, phase = self._transport, self._phase
        if transport is None or self._busy or not phase:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:  # an earlier phase's timer: wait for this one's deadline
            self._timer = loop.call_at(self._deadline, self._expired)
            return
        self._phase = ""
        if phase == "idle":
            self._close(transport)
        else:
            self._refuse(408, f"{phase}_timeout", "the client was too slow")


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
