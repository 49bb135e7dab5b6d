"""One raw watch connection as an async iterator of `{"type", "object"}` dicts (JSON lines, or protobuf
frames decoded by `protobuf.py` when protobuf was asked for and answered).

Why it exists: the `kubernetes` client's `Watch` is a blocking generator that deserializes into models.
`AsyncWatchStream` (the default) reads the chunked response on the event loop through the native-async
transport and parses each line there: no thread, so no GIL hand-offs between a watch thread and the loop
(measured on the extender: watch threads holding the GIL delayed the loop's socket writes by milliseconds).
`WatchStream` (when a proxy is configured) reads line by line on a dedicated watch thread pool; its
`aclose()` shuts the socket down for reading, which wakes a thread blocked in `recv` immediately — closing
the file object from another thread would not.

What it must not do: interpret events. ERROR and BOOKMARK events are passed through untouched; relisting,
resourceVersion bookkeeping and back-off belong to `watch.py`. It never reconnects either: when the server
ends the watch (after `timeoutSeconds`) iteration simply stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from gpuwarden.errors import KubeError
from gpuwarden.kube.protobuf import Frames, ObjectDecoder, watch_event
from gpuwarden.kube.resources import JsonObject
from gpuwarden.kube.status import error_from_transport, outcome_of


def _lines(response: Any) -> Iterator[bytes]:
    """Complete newline-terminated lines of a chunked response (a trailing partial line at EOF included)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _parse(line: bytes) -> JsonObject:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise KubeError(f"watch stream carried invalid JSON: {exc}") from None
    if not isinstance(event, dict) or "type" not in event:
        raise KubeError("watch stream carried a line that is not a watch event")
    return event


def _next_event(lines: Iterator[bytes]) -> JsonObject | None:
    """Block for the next event (None at the end of the stream); runs on a watch thread."""
    from urllib3.exceptions import HTTPError

    try:
        line = next(lines)
    except StopIteration:
        return None
    except (HTTPError, OSError, ValueError) as exc:
        raise error_from_transport(exc) from None
    return _parse(line)


class WatchStream:
    """A single watch request; iterate it, then `aclose()` it (or use `async with`)."""

    def __init__(
        self, opener: Callable[[], Any], pool: ThreadPoolExecutor, count: Callable[[str], None]
    ) -> None:
        self._opener = opener
        self._pool = pool
        self._count = count
        self._response: Any = None
        self._lines: Iterator[bytes] | None = None
        self._inflight: Future[Any] | None = None
        self._closed = False

    async def _run(self, fn: Callable[[], Any]) -> Any:
        self._inflight = self._pool.submit(fn)
        return await asyncio.wrap_future(self._inflight)

    async def _open(self) -> Iterator[bytes]:
        try:
            self._response = await self._run(self._opener)
        except KubeError as exc:
            self._count(outcome_of(exc))
            raise
        self._count("success")
        self._lines = _lines(self._response)
        if self._closed:  # closed while the request was in flight
            await self.aclose()
            raise StopAsyncIteration
        return self._lines

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> JsonObject:
        if self._closed:
            raise StopAsyncIteration
        lines = self._lines if self._lines is not None else await self._open()
        try:
            event = await self._run(lambda: _next_event(lines))
        except KubeError as exc:
            if self._closed:
                raise StopAsyncIteration from None
            self._count(outcome_of(exc))
            raise
        if event is None:
            await self.aclose()
            raise StopAsyncIteration
        return dict(event)

    async def aclose(self) -> None:
        """Stop reading: wake a blocked reader, wait for it, close the connection (not back to the pool)."""
        self._closed = True
        inflight, response = self._inflight, self._response
        if inflight is not None and not inflight.done() and response is None:
            # Still connecting: let the open finish so the response can be closed rather than leaked.
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(inflight)
            response = self._response
        if response is None:
            return
        with contextlib.suppress(Exception):
            response.shutdown()
        if inflight is not None and not inflight.done():
            with contextlib.suppress(BaseException):
                await asyncio.wrap_future(inflight)
        with contextlib.suppress(Exception):
            response.close()
        self._response = None

    async def __aenter__(self) -> WatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class StreamingBody(Protocol):
    """A 2xx response body being received, as the async transports hand it over."""

    async def readany(self) -> bytes:
        """The next bytes (b"" at the end); a transport failure raises a `KubeError`."""
        ...

    def close(self) -> None:
        """Drop the connection (never back to a pool)."""
        ...


class AsyncWatchStream:
    """A single watch request read on the event loop; iterate it, then `aclose()` it (or `async with`).

    With `decode` (protobuf was asked for), a response that does not start with `{` is read as protobuf
    frames (`protobuf.py`): a JSON watch event always starts with `{`, a frame with its 4-byte length,
    whose first byte is 0 for any frame under 16 MiB; the event's object goes through `decode`."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[StreamingBody]],
        count: Callable[[str], None],
        *,
        decode: ObjectDecoder | None = None,
    ) -> None:
        self._opener = opener
        self._count = count
        self._decode = decode
        self._sniffing = decode is not None
        """Protobuf was asked for and the answer's first bytes (which say which format it is) are due."""
        self._frames: Frames | None = None
        """Set once the response turned out to be protobuf frames."""
        self._response: StreamingBody | None = None
        self._ready: list[bytes] = []
        """Complete lines not yet returned, newest first."""
        self._partial: list[bytes] = []
        """Pieces of the line being received."""
        self._eof = False
        self._closed = False

    def __aiter__(self) -> AsyncWatchStream:
        return self

    async def _open(self) -> StreamingBody:
        try:
            response = await self._opener()
        except KubeError as exc:
            self._count(outcome_of(exc))
            raise
        self._count("success")
        if self._closed:  # closed while the request was in flight
            response.close()
            raise StopAsyncIteration
        self._response = response
        return response

    async def _line(self) -> bytes | None:
        """The next non-empty line (or protobuf frame), None at the end of the stream."""
        while not self._ready:
            if self._eof:
                return None
            response = self._response if self._response is not None else await self._open()
            try:
                chunk = await response.readany()
            except KubeError as exc:
                if self._closed:
                    return None
                raise await self._fail(exc) from None
            if self._sniffing and chunk:
                self._sniffing = False
                if chunk[:1] != b"{":
                    self._frames = Frames()
            if self._frames is not None:
                if not chunk:
                    self._eof = True
                    if self._frames.pending:
                        try:
                            self._frames.feed(b"")  # a frame over the limit is the error to report
                        except KubeError as exc:
                            raise await self._fail(exc) from None
                        raise await self._fail(KubeError("watch stream ended inside a protobuf frame"))
                    continue
                try:
                    frames = self._frames.feed(chunk)
                except KubeError as exc:  # a frame over the limit: the stream cannot be followed further
                    raise await self._fail(exc) from None
                self._ready.extend(reversed(frames))  # popped from the end
                continue
            if not chunk:
                self._eof = True
                tail = b"".join(self._partial)
                self._partial.clear()
                if tail.strip():
                    self._ready.append(tail)
                continue
            if b"\n" not in chunk:  # a large event arrives in many chunks: join them once, at its end
                self._partial.append(chunk)
                continue
            first, *complete, rest = chunk.split(b"\n")
            self._partial.append(first)
            lines = [b"".join(self._partial), *complete]
            self._partial = [rest] if rest else []
            self._ready.extend(line for line in reversed(lines) if line.strip())  # popped from the end
        return self._ready.pop()

    async def _fail(self, error: KubeError) -> KubeError:
        """Count `error`, release the connection at once (the caller may not close us right away)."""
        self._count(outcome_of(error))
        await self.aclose()
        return error

    async def __anext__(self) -> JsonObject:
        if self._closed:
            raise StopAsyncIteration
        line = await self._line()
        if line is None or self._closed:
            await self.aclose()
            raise StopAsyncIteration
        try:
            if self._frames is not None and self._decode is not None:
                return watch_event(line, self._decode)
            return _parse(line)
        except KubeError as exc:
            raise await self._fail(exc) from None

    async def aclose(self) -> None:
        """Stop reading and close the connection (not back to the pool); a pending read ends at once."""
        self._closed = True
        response, self._response = self._response, None
        if response is not None:
            response.close()

    async def __aenter__(self) -> AsyncWatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


AnyWatchStream = WatchStream | AsyncWatchStream
"""What `KubeClient.watch()` returns: the async stream, or the threaded one when a proxy is configured."""
