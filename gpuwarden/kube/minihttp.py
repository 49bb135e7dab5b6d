"""HTTP/1.1 to the API server on plain asyncio streams: the node agent's transport.

Why it exists: the node agent, on every GPU node, makes a handful of API requests a minute (a patch when a
pod's GPUs were recorded, an Event now and then) and holds two watches (its pods, its Node). aiohttp, the
transport of the adapter and the controller (`transport.py`, chosen there for throughput on the bind
path), costs ~8 MiB of a process whose idle goal is ≤ 40 MiB (issue 29). This is the same contract —
`send`, `decode`, `open_stream`, `aclose`, a `KubeError` for every failure, the same TLS and credentials
(`wire.py`) — in the few lines those requests need.

One connection per request (`Connection: close`): with this little traffic a pool would only hold idle
sockets, and a stale pooled connection is the classic source of spurious failures. A watch holds its own
connection until it is closed. The HTTP/1.1 itself (request head, answer head, a body with
`Content-Length`, chunked or until the server closes) is `gpuwarden/http1`'s; this module maps it to the
Kubernetes contract: every failure, a malformed answer included, is a `KubeError`.

What it must not do: retry (beyond one refused connection, when nothing was sent), follow redirects,
decompress (it never asks for compression), talk to a proxy (`supports` says no and the client then keeps
the threaded path), or serve a deployable with heavy API traffic (use `transport.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import weakref
from concurrent.futures import Executor
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpuwarden.errors import KubeError
from gpuwarden.http1.client import ResponseBody, read_head
from gpuwarden.http1.head import MAX_HEAD, request_head
from gpuwarden.kube.status import error_from_status, error_from_transport
from gpuwarden.kube.wire import Answer, Credentials, decode, request_body, request_headers, ssl_context

TRANSPORT_ERRORS = (TimeoutError, OSError, ValueError, EOFError, asyncio.LimitOverrunError)
"""What a failed exchange raises (`FramingError` is a ValueError); each becomes a `KubeUnreachable`."""


class Body:
    """A response body being received (`http1.client.ResponseBody`), each read bounded by `read_timeout`
    and every failure a `KubeError` (what `stream.StreamingBody` callers expect)."""

    def __init__(self, body: ResponseBody, writer: asyncio.StreamWriter, read_timeout: float | None) -> None:
        self.status = body.head.status
        self._body, self._writer, self._timeout = body, writer, read_timeout

    async def readany(self) -> bytes:
        """The next bytes of the body (b"" at its end); failures as `KubeError`."""
        try:
            async with asyncio.timeout(self._timeout):
                return await self._body.readany()
        except TRANSPORT_ERRORS as exc:
            raise error_from_transport(exc) from None

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self._body.done = True
        self._writer.close()


class MiniTransport:
    """Requests to one API server over asyncio streams; same interface as `transport.AsyncTransport`."""

    def __init__(
        self,
        configuration: Any,
        *,
        timeout: float,
        user_agent: str,
        decode_pool: Executor,
        credential_ttl: float = 1.0,
    ) -> None:
        url = urlsplit(str(configuration.host).rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeError(f"unsupported API server URL {configuration.host!r}", reason="Config")
        self._tls: ssl.SSLContext | None = ssl_context(configuration) if url.scheme == "https" else None
        self._host, self._port = url.hostname, url.port or (443 if self._tls else 80)
        self._authority = url.netloc
        self._prefix = url.path
        self._server_name: str | None = getattr(configuration, "tls_server_name", None) or None
        self._timeout = timeout
        self._user_agent = user_agent
        self._decode_pool = decode_pool
        self._credentials = Credentials(configuration, decode_pool, credential_ttl)
        self._open_bodies: weakref.WeakSet[Body] = weakref.WeakSet()
        """Watch bodies not yet dropped, closed by `aclose`."""

    @staticmethod
    def supports(configuration: Any) -> bool:
        """False when the configuration routes through a proxy."""
        return not getattr(configuration, "proxy", None)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        server_hostname = (self._server_name or self._host) if self._tls else None
        for attempt in (1, 2):
            try:
                return await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, server_hostname=server_hostname, limit=MAX_HEAD
                )
            except ConnectionRefusedError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        headers: dict[str, str],
        content: bytes | None,
        read_timeout: float | None,
    ) -> Body:
        """Connect, send, read the head; a 2xx `Body` (unread) or the mapped `KubeError`."""
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        headers = {"User-Agent": self._user_agent, **headers}
        length = None if content is None else len(content)
        writer: asyncio.StreamWriter | None = None
        try:
            head = request_head(method, target, self._authority, headers, length)
            async with asyncio.timeout(self._timeout):
                reader, writer = await self._connect()
                writer.write(head + (content or b""))
                await writer.drain()
                response = await read_head(reader)
                body = Body(ResponseBody(reader, response, method), writer, read_timeout)
        except TRANSPORT_ERRORS as exc:
            if writer is not None:
                writer.close()
            raise error_from_transport(exc) from None
        status = response.status
        if 200 <= status <= 299:
            return body
        try:
            async with asyncio.timeout(self._timeout):
                data = await body.read()
        except (KubeError, TimeoutError):
            data = b""
        finally:
            body.close()
        raise error_from_status(status, data, response.headers(), http_reason=response.reason)

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
        """One request; the raw 2xx body, else the mapped `KubeError`."""
        content, content_type = request_body(body, content_type)
        headers = await self._headers(accept, content_type)
        answer = await self._exchange(method, path, query, headers, content, None)
        try:
            async with asyncio.timeout(self._timeout):
                data = await answer.read()
        except TimeoutError as exc:
            raise error_from_transport(exc) from None
        finally:
            answer.close()
        return Answer(answer.status, data)

    async def open_stream(
        self, path: str, query: list[tuple[str, str]], accept: str, read_timeout: float
    ) -> Body:
        """A GET whose 2xx body the caller reads (a watch); `read_timeout` bounds each read. The caller
        closes it (`aclose` closes any still open)."""
        headers = await self._headers(accept, None)
        body = await self._exchange("GET", path, query, headers, None, read_timeout)
        self._open_bodies.add(body)
        return body

    async def decode(self, answer: Answer) -> dict[str, Any]:
        """The body as a JSON object (large bodies decoded on a pool thread)."""
        return await decode(answer, self._decode_pool)

    async def aclose(self) -> None:
        for body in list(self._open_bodies):
            with contextlib.suppress(Exception):
                body.close()
        self._open_bodies.clear()
