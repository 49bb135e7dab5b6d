"""Native-async HTTP to the API server: unary requests on a keep-alive pool (`gpuwarden/http1/pool.py`),
watches on an aiohttp `ClientSession`, both per event loop.

Why it exists: the `kubernetes` client is synchronous, so each request used to hold a pool thread for its
whole round trip. Under load (the extender's bind path: a claim PATCH, a LIST and a Binding per pod, while
watches decode events on their own threads) requests queued behind the few pool threads and every thread
switch contended for the GIL; binds that the API server served in ~15 ms took seconds. Here a request is a
coroutine on the event loop over a keep-alive connection pool: waiting costs nothing, and only decoding a
large body (a LIST page) is handed to a thread so the loop never stalls on it.

It takes the connection facts from the same `kubernetes.client.Configuration` the watches use (server URL,
CA, client certificate, bearer token with its refresh hook, `verify_ssl`, `tls_server_name`); a proxy is not
supported here (`AsyncTransport.supports` says so and the client then keeps the threaded path). aiohttp, not
httpx: measured on the extender's bind path, httpx/httpcore spent a quarter of the process's CPU in
per-request bookkeeping (expiry checks of every pooled connection through anyio, async-library sniffing).

It must not map errors to domain meaning (status.py does), retry beyond one refused connection (the request
was never sent, as urllib3 was configured before), or be shared between event loops (connections belong
to the loop that opened them: a session is made per running loop).
"""

from __future__ import annotations

import asyncio
import ssl
from concurrent.futures import Executor
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

from gpuwarden.http1.pool import KeepAlivePool
from gpuwarden.kube.status import error_from_status, error_from_transport
from gpuwarden.kube.wire import (
    INLINE_DECODE_BYTES,
    Answer,
    Credentials,
    decode,
    parse_object,
    request_body,
    request_headers,
    ssl_context,
)

__all__ = ["INLINE_DECODE_BYTES", "Answer", "AsyncTransport", "parse_object", "ssl_context"]


class AsyncTransport:
    """Requests to one API server; `send` returns the 2xx `Answer` or raises a `KubeError`."""

    def __init__(
        self,
        configuration: Any,
        *,
        max_connections: int,
        max_watches: int,
        timeout: float,
        user_agent: str,
        decode_pool: Executor,
        credential_ttl: float = 1.0,
    ) -> None:
        self._configuration = configuration
        self._host = str(configuration.host).rstrip("/")
        self._limits = {"requests": max_connections, "watches": max_watches}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._user_agent = user_agent
        self._decode_pool = decode_pool
        self._credentials = Credentials(configuration, decode_pool, credential_ttl)
        self._ssl: ssl.SSLContext | bool = True
        if self._host.startswith("https"):
            self._ssl = ssl_context(configuration)
        self._server_name: str | None = getattr(configuration, "tls_server_name", None) or None
        url = urlsplit(self._host)
        self._url = url
        self._prefix = url.path
        self._pools: dict[asyncio.AbstractEventLoop, KeepAlivePool] = {}
        """Per running loop, the keep-alive pool of the unary requests (`gpuwarden/http1/pool.py`)."""
        self._sessions: dict[tuple[asyncio.AbstractEventLoop, str], aiohttp.ClientSession] = {}
        """Per running loop, one session for requests and one for watches: long-lived watches hold their
        connections, so they get their own pool and can never starve short requests (and vice versa)."""

    @staticmethod
    def supports(configuration: Any) -> bool:
        """False when the configuration routes through a proxy (the threaded client handles that)."""
        return not getattr(configuration, "proxy", None)

    def _session(self, kind: str = "requests") -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get((loop, kind))
        if session is None:
            for old in [key for key in self._sessions if key[0].is_closed()]:
                del self._sessions[old]  # its loop is gone; so are its connections
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limits[kind], ssl=self._ssl),
                timeout=self._timeout,
                headers={"User-Agent": self._user_agent},
                skip_auto_headers=("Accept-Encoding",),
                trust_env=False,
            )
            self._sessions[(loop, kind)] = session
        return session

    def _pool(self) -> KeepAlivePool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for old in [key for key in self._pools if key.is_closed()]:
                del self._pools[old]  # its loop is gone; so are its connections
            url = self._url
            tls = self._ssl if isinstance(self._ssl, ssl.SSLContext) else None
            pool = KeepAlivePool(
                url.hostname or "",
                url.port or (443 if url.scheme == "https" else 80),
                tls=tls,
                server_name=self._server_name,
                authority=url.netloc,
                limit=self._limits["requests"],
            )
            self._pools[loop] = pool
        return pool

    async def _headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        return await request_headers(self._credentials, accept, content_type)

    async def send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str | None,
        accept: str,
    ) -> Answer:
        """One request on the keep-alive pool (`gpuwarden/http1/pool.py`); the raw 2xx body, else the mapped
        `KubeError` (`status.py`), a transport failure or the timeout as `KubeUnreachable`."""
        content, content_type = request_body(body, content_type)
        headers = {"User-Agent": self._user_agent, **await self._headers(accept, content_type)}
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        try:
            async with asyncio.timeout(self._timeout.total):
                reply = await self._pool().request(method, target, headers, content)
        except (TimeoutError, OSError, ValueError, EOFError, asyncio.LimitOverrunError) as exc:
            raise error_from_transport(exc) from None
        if not 200 <= reply.status <= 299:
            raise error_from_status(reply.status, reply.body, reply.headers, http_reason=reply.reason)
        return Answer(reply.status, reply.body)

    async def _open(
        self,
        kind: str,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        headers: dict[str, str],
        **kwargs: Any,
    ) -> aiohttp.ClientResponse:
        """Send a request on the `kind` pool and return its 2xx response, body unread; a non-2xx answer is
        read, released and raised as its `KubeError`. A refused connection is tried once more (nothing was
        sent); nothing else is retried."""
        for attempt in (1, 2):
            try:
                response = await self._session(kind).request(
                    method, self._host + path, params=query or None, headers=headers,
                    server_hostname=self._server_name, **kwargs,
                )  # fmt: skip
                break
            except aiohttp.ClientConnectorError as exc:
                if attempt == 2:
                    raise error_from_transport(exc) from None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise error_from_transport(exc) from None
        if not 200 <= response.status <= 299:
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError):
                data = b""
            finally:
                response.release()
            raise error_from_status(
                response.status, data, dict(response.headers), http_reason=response.reason or ""
            )
        return response

    async def open_stream(
        self, path: str, query: list[tuple[str, str]], accept: str, read_timeout: float
    ) -> StreamBody:
        """A GET whose 2xx response body is read by the caller (a watch); `read_timeout` bounds the wait
        for each chunk, not the whole response. The caller closes the body."""
        headers = await self._headers(accept, None)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._timeout.total, sock_connect=self._timeout.total, sock_read=read_timeout
        )
        return StreamBody(await self._open("watches", "GET", path, query, headers, timeout=timeout))

    async def decode(self, answer: Answer) -> dict[str, Any]:
        """The body as a JSON object (large bodies decoded on a pool thread)."""
        return await decode(answer, self._decode_pool)

    async def aclose(self) -> None:
        """Close the sessions of the running loop (others belong to loops that are gone or not ours)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        pool = self._pools.pop(loop, None)
        if pool is not None:
            pool.close()
        for kind in self._limits:
            session = self._sessions.pop((loop, kind), None)
            if session is not None:
                await session.close()


class StreamBody:
    """A streaming response body as `stream.StreamingBody`: `readany()` (transport failures as `KubeError`)
    and `close()`."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def readany(self) -> bytes:
        try:
            return await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise error_from_transport(exc) from None

    def close(self) -> None:
        self._response.close()
