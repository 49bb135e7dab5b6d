"""The node agent's HTTP listener: `/healthz`, `/livez`, `/readyz` and `/metrics` on the lean HTTP/1.1 core.

Why not aiohttp.web (which the adapter and the controller use): the agent answers four GET paths to the
kubelet's probes and to Prometheus, on every GPU node, and its idle memory is the cost (issue 29: ≤ 40 MiB).
aiohttp's server and the client stack it drags in cost a large share of a process that otherwise waits on
two sockets (docs/node-agent.md). The framing, deadlines and limits are `gpuwarden.http1.server`'s (the
extender's lean path runs on the same core); this module only routes: a pure `answer` per (method, path).

What it must not do: grow into a web framework. No request bodies (a declared one over `MAX_BODY` is
refused from its head), GET and HEAD only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwarden.http1.head import RequestHead
from gpuwarden.http1.server import TEXT, Handler, LeanServer, Limits, Response

MAX_BODY = 4 << 10
"""Bytes of a request body accepted (probes and scrapes send none)."""
LIMITS = Limits(max_body=MAX_BODY, head_seconds=10.0, body_seconds=10.0, idle_seconds=30.0)
GRACE_SECONDS = 2.0
"""How long `close` waits for answers being written (the routes answer at once)."""


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


def answer(method: str, path: str, routes: Mapping[str, Route]) -> Reply:
    """The reply for one request: the route's, or 404 / 405."""
    route = routes.get(path)
    if route is None:
        return Reply.text("not found\n", 404)
    if method not in ("GET", "HEAD"):
        return Reply.text("method not allowed\n", 405)
    return route()


class Listener:
    """Serves `routes` (path → route) on HOST:PORT until `close()`; `rejected(reason)` counts what the
    core refused."""

    def __init__(self, routes: Mapping[str, Route], rejected: Callable[[str], None] | None = None) -> None:
        self.routes = routes
        self.lean = LeanServer(self._dispatch, LIMITS, rejected=rejected)
        self._server: asyncio.Server | None = None

    def _dispatch(self, head: RequestHead) -> Handler:
        async def handle(_: bytes) -> Response:
            reply = answer(head.method, head.path, self.routes)
            return Response(reply.status, reply.body, reply.content_type)

        return handle

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.get_running_loop().create_server(self.lean, host or "0.0.0.0", port)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self.lean.close()
            await self.lean.wait_closed(GRACE_SECONDS)
            await self._server.wait_closed()
