"""The extender's verbs on the lean HTTP/1.1 server core; every other request through aiohttp, on the same
listener.

Why it exists: kube-scheduler sends three requests per pod (filter, prioritize, bind) on one keep-alive
connection, and aiohttp's server machinery around a handler (request and response objects, the router,
header multidicts, the payload writer) costs about as much CPU as the extender's own answer for the
pre-encoded filter and prioritize (issue 29). The scheduler's requests are the simplest HTTP there is -
`POST <path> HTTP/1.1`, a `Content-Length` body, a JSON answer - so they are answered on
`gpuwarden.http1.server`, which frames them (strictly, with deadlines and bounded buffers), and this module
only says which requests are the extender's:

* `POST` to one of the extender's paths over HTTP/1.1 with a `Content-Length` body and no `Expect` or
  `Upgrade` is answered by the same reply function the aiohttp route calls (`server.verb_replies`: the same
  parsing, error contract and metrics);
* any other well-formed request - another path or method, HTTP/1.0, a chunked body, `Expect` - hands the
  connection, from that request on, to aiohttp's own protocol (the probes, `/metrics`);
* a malformed request, a declared body over `extender.max_request_bytes` or a client too slow is refused by
  the core before aiohttp could see it (400/413/431/408 and a close, one warning line, counted in
  `gpuwarden_http_requests_rejected_total`); on a connection already handed over, aiohttp's own refusal
  is logged the same way (`QuietBadRequests`) instead of at error with a traceback.

TLS is below it (asyncio's SSL transport), so both paths serve HTTPS alike; with client certificates
required (`peerauth.py`), a connection whose peer presented none is aiohttp's from the start.
`extender.lean_http: false` serves everything through aiohttp. It must not decide anything: the replies
are `server.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from controller.extender.server import Reply
from gpuwarden.http1.head import RequestHead
from gpuwarden.http1.server import Handler, LeanServer, Limits

IDLE_SECONDS = 75.0
"""A keep-alive connection with no request for this long is closed (aiohttp's `keepalive_timeout`)."""
PHASE_SECONDS = 10.0
"""A request head, and then its body, must arrive within this (or the idle time, when shorter): the
scheduler sends each request whole, and gives up on an answer after 5 s anyway."""

Route = Callable[[bytes], Awaitable[Reply]]


def is_lean(head: RequestHead) -> bool:
    """Whether a (strictly parsed) request head is of the shape the lean path answers. Pure."""
    return (
        head.method == "POST"
        and head.version == (1, 1)
        and not head.chunked
        and not head.upgrade
        and head.expect is None
    )


def lean_dispatch(routes: Mapping[str, Route]) -> Callable[[RequestHead], Handler | None]:
    """The core's dispatcher: the route (a reply function of the body) for the extender's requests, None
    (aiohttp) else."""
    handlers: dict[str, Handler] = dict(routes)

    def dispatch(head: RequestHead) -> Handler | None:
        return handlers.get(head.target) if is_lean(head) else None

    return dispatch


class QuietBadRequests(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's request handler logs a client's malformed request with `logger.exception` (a traceback
    per bad request, at error); on a connection handed to aiohttp this logs it as the lean core does: one
    warning line, no traceback, counted. Everything else goes through unchanged."""

    def __init__(self, logger: logging.Logger, rejected: Callable[[str], None] | None) -> None:
        super().__init__(logger, {})
        self._rejected = rejected

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.warning(
                "refused an HTTP request", extra={"reason": "malformed", "detail": str(exc_info)[:200]}
            )
            if self._rejected is not None:
                self._rejected("malformed")
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


def quiet_fallback(
    server: Callable[[], RequestHandler], rejected: Callable[[str], None] | None
) -> Callable[[], asyncio.BaseProtocol]:
    """aiohttp's protocol factory, its handlers logging malformed requests without tracebacks."""

    def make() -> asyncio.BaseProtocol:
        handler = server()
        handler.logger = QuietBadRequests(handler.logger, rejected)  # type: ignore[assignment]
        return handler

    return make


class LeanSite(web.TCPSite):
    """aiohttp's TCP site with the extender's verbs on the lean core: the controller's one listener (the
    extender, `/metrics`, the probes) as `web.TCPSite` serves it, only faster for the scheduler's requests.
    Stopping waits for the lean answers being computed, up to the runner's shutdown timeout (as aiohttp
    waits for its handlers)."""

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
        rejected: Callable[[str], None] | None = None,
        admit: Callable[[asyncio.BaseTransport], bool] | None = None,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._admit = admit
        self._lean_routes = routes
        phase = min(PHASE_SECONDS, idle_seconds)
        self._limits = Limits(
            max_body=max_body_bytes, head_seconds=phase, body_seconds=phase, idle_seconds=idle_seconds
        )
        self._rejected = rejected
        self.lean: LeanServer | None = None

    async def start(self) -> None:
        # As `TCPSite.start`, with the lean protocol in front of the runner's server.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self.lean = LeanServer(
            lean_dispatch(self._lean_routes),
            self._limits,
            fallback=quiet_fallback(server, self._rejected),
            rejected=self._rejected,
            admit=self._admit,
        )
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
            # the runner's grace (`web.AppRunner(shutdown_timeout=...)`), which aiohttp keeps private
            await self.lean.wait_closed(float(getattr(self._runner, "_shutdown_timeout", 60.0)))
