"""Reading one HTTP/1.1 answer from an asyncio stream: its head (1xx skipped) and its body, framed by
`head.response_framing` (Content-Length, chunked, or up to the server's close).

Why it exists: the keep-alive pool (`pool.py`) and the node agent's connection-per-request transport
(`gpuwarden/kube/minihttp.py`) read the same answers, the first whole and the second also as a stream (a
watch); one body reader serves both, so a framing rule is enforced in one place. The chunked body is read
here (size lines strict per `head.chunk_size`, trailers checked and dropped) rather than by llhttp because
a keep-alive client must know exactly where an answer ends: bytes after it are not the next answer.

Failures: `FramingError` (a ValueError) for a malformed answer, `asyncio.IncompleteReadError` for an answer
cut short, `OSError` for the socket; the caller maps them (`gpuwarden/kube/status.py`) and never keeps a
connection that raised. What it must not do: decompress, follow redirects, or keep reading past an answer.
"""

from __future__ import annotations

import asyncio

from gpuwarden.http1.head import (
    CHUNKED,
    NO_BODY,
    UNTIL_CLOSE,
    FramingError,
    ResponseHead,
    check_trailer,
    chunk_size,
    parse_response_head,
    response_framing,
)

READ_SIZE = 64 << 10
"""Bytes asked of the stream at a time for a body read to the server's close."""


def buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the stream holds that nobody has read (asyncio keeps no public count)."""
    return len(getattr(reader, "_buffer", b""))


async def read_head(reader: asyncio.StreamReader) -> ResponseHead:
    """The next final answer's head (1xx interim answers skipped; a 101 is final). The reader's limit must
    be at least `MAX_HEAD`; a head that long without its end is refused."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise FramingError("head_too_large", status=431) from None
        except asyncio.IncompleteReadError as exc:  # cut short; or a head with bare LFs, ended by them
            if exc.partial.count(b"\n") != exc.partial.count(b"\r\n"):
                raise FramingError("line_ending", "bare LF") from None
            raise
        head = parse_response_head(raw)
        if not 100 <= head.status <= 199 or head.status == 101:
            return head
        if response_framing(head, "GET")[1]:
            raise FramingError("no_body_allowed", f"{head.status} declares a body")


class ResponseBody:
    """An answer's body being received; `readany` gives its next bytes, b"" at its end."""

    def __init__(self, reader: asyncio.StreamReader, head: ResponseHead, method: str) -> None:
        self.head = head
        self._reader = reader
        framing, doubt = response_framing(head, method)
        self._framing = framing
        self._remaining = framing if framing >= 0 else 0
        self.done = framing == NO_BODY or framing == 0
        self.reusable = not (head.close or doubt or framing == UNTIL_CLOSE or head.status == 101)
        """Whether the connection may carry another request once the body is read to its end."""

    async def _chunk(self) -> bytes:
        reader = self._reader
        size = chunk_size(await reader.readuntil(b"\r\n"))
        if size == 0:
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                check_trailer(line)
            self.done = True
            return b""
        data = await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise FramingError("chunk_end")
        return data

    async def readany(self) -> bytes:
        """The next bytes of the body; b"" at its end."""
        if self.done:
            return b""
        try:
            if self._framing == CHUNKED:
                while not self.done:
                    if data := await self._chunk():
                        return data
                return b""
            if self._framing == UNTIL_CLOSE:
                data = await self._reader.read(READ_SIZE)
                self.done = not data
                return data
            data = await self._reader.read(min(self._remaining, READ_SIZE))
        except asyncio.LimitOverrunError:
            raise FramingError("line_too_long", status=431) from None
        if not data:
            raise asyncio.IncompleteReadError(b"", self._remaining)
        self._remaining -= len(data)
        self.done = self._remaining == 0
        return data

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        if self._framing >= 0 and not self.done:
            data = await self._reader.readexactly(self._remaining)
            self._remaining, self.done = 0, True
            return data
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def keep(self) -> bool:
        """After the body was read to its end: may the connection carry another request? Not when the
        server closes, the framing was in doubt, or bytes nobody asked for already arrived."""
        return self.done and self.reusable and buffered(self._reader) == 0 and not self._reader.at_eof()
