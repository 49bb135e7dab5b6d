"""The node agent's HTTP listener: `/healthz`, `/livez`, `/readyz` and `/metrics` on plain asyncio streams.

Why not aiohttp.web (which the adapter and the controller use): the agent answers four GET paths to the
kubelet's probes and to Prometheus, on every GPU node, and its idle memory is the cost (issue 29: ≤ 40 MiB).
aiohttp's server and the client stack it drags in cost ~10 MiB of a process that otherwise waits on two
sockets. The request line is parsed by a pure function; the shell reads one request per connection and
answers with `Connection: close` (probes and scrapes open a connection per request anyway).

What it must not do: grow into a web framework. No bodies, no keep-alive, no chunking; GET and HEAD only;
a request head larger than `MAX_HEAD` or slower than `HEAD_TIMEOUT` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_HEAD = 16 << 10
"""Bytes of request line + headers accepted (probes and Prometheus send a few hundred)."""
HEAD_TIMEOUT = 10.0
"""Seconds a client may take to send its request head."""
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Reply:
    """What a route answers."""

    status: int
    body: bytes
    content_type: str = TEXT

    @classmethod
    def text(cls, body: str, status: int = 200) -> Reply:
        return cls(status, body.encode())


Route = Callable[[], Reply]


def target(request_line: bytes) -> tuple[str, str] | None:
    """(method, path without the query) of an HTTP/1.x request line; None when it is not one."""
    parts = request_line.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return None
    return parts[0], parts[1].split("?", 1)[0]


def answer(method: str, path: str, routes: Mapping[str, Route]) -> Reply:
    """The reply for one request: the route's, or 404 / 405."""
    route = routes.get(path)
    if route is None:
        return Reply.text("not found\n", 404)
    if method not in ("GET", "HEAD"):
        return Reply.text("method not allowed\n", 405)
    return route()


def encode(reply: Reply, *, head_only: bool = False) -> bytes:
    """The response bytes (HTTP/1.1, `Connection: close`)."""
    reason = HTTPStatus(reply.status).phrase
    head = (
        f"HTTP/1.1 {reply.status} {reason}\r\nContent-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + reply.body


class Listener:
    """Serves `routes` (path → route) on HOST:PORT until `close()`."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self.routes = routes
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host or "0.0.0.0", port, limit=MAX_HEAD)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            request = target(head.split(b"\r\n", 1)[0])
            if request is None:
                writer.write(encode(Reply.text("bad request\n", 400)))
            else:
                method, path = request
                writer.write(encode(answer(method, path, self.routes), head_only=method == "HEAD"))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that went away or sent too much gets nothing
        except Exception:  # a failing route must not end the listener
            log.exception("HTTP route failed")
            with contextlib.suppress(OSError):
                writer.write(encode(Reply.text("internal error\n", 500)))
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
