"""HTTP/1.1 message heads, strict per RFC 9112: read a request or response head with llhttp (`httptools`,
the parser aiohttp is built on), say how the body is framed, read a chunk-size line, write a request or
response head. Pure functions, no I/O.

Why it exists: the API client (`client.py`, `pool.py`) and the lean server core (`server.py`) read and write
the same framing, and every place that reads framing differently from its peer is a smuggling or
desynchronisation hole. llhttp (strict: no leniency flag is ever set) refuses bare LF or CR, obs-fold,
controls in names and values, whitespace before the colon, a Content-Length that is not plain decimal or
is repeated, Content-Length with Transfer-Encoding; this module adds what llhttp leaves to its caller: an
HTTP/1.1 request must carry exactly one Host, Transfer-Encoding in an HTTP/1.0 message is faulty framing,
only `chunked` is a transfer coding we read, a 1xx/204 answer that declares a body is a framing doubt, and
lines and heads are bounded. Every refusal is a `FramingError` carrying the status a server answers and a
short reason (a metric label).

The framing is held to h11's by a differential fuzz test (`tests/unit/test_http1_fuzz.py`): whatever this
room accepts, h11 accepts with the same method, target, status, fields, body and message end; whatever it
refuses that h11 accepts is one of `STRICTER_THAN_H11`.

What it must not do: read sockets, log, or tolerate "just this once" (a tolerated oddity is where a proxy in
front and this parser disagree about where a message ends).
"""

from __future__ import annotations

import re
from functools import cache
from http import HTTPStatus
from typing import NamedTuple

import httptools

MAX_LINE = 8 << 10
"""Bytes of one head line (request line, status line or field line) accepted (aiohttp's limit too)."""
MAX_HEAD = 64 << 10
"""Bytes of a whole head accepted (start line, fields and the blank line)."""

STRICTER_THAN_H11 = frozenset(
    {
        "line_ending",  # h11 reads a lone LF as a line end
        "obs_fold",  # h11 unfolds continuation lines
        "header_value",  # h11 accepts controls other than NUL, CR, LF in values
        "status_line",  # ... and in reason phrases, and a status outside 100-599
        "conflicting_framing",  # h11 lets Transfer-Encoding win over Content-Length
        "repeated_content_length",  # h11 merges equal ones
        "repeated_host",
        "version",  # h11 parses any HTTP/d.d
        "transfer_encoding_http10",  # RFC 9112 §6.1: faulty framing in an HTTP/1.0 message
        "chunk_size",  # h11 allows whitespace after the size and 20 digits
        "line_too_long",  # h11 bounds the head only
        "head_too_large",
        "content_length",  # h11 allows "1, 1"
        "target",  # llhttp refuses some bytes h11's request-target allows
        "request_line",  # a leading blank line (h11 skips it)
        "method",  # llhttp knows the registered methods only; h11 takes any token
        "transfer_encoding",  # llhttp refuses a TAB after `chunked`
        "no_body_allowed",  # a 1xx that declares a body
    }
)
"""Reasons this room refuses a message h11 accepts (on purpose; the fuzz test checks that no other does)."""


class FramingError(ValueError):
    """A message this room will not read: `status` is what a server answers (then closes), `reason` a short
    label for metrics and logs (one of a small fixed set)."""

    def __init__(self, reason: str, detail: str = "", status: int = 400) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.status = status


Fields = tuple[tuple[bytes, bytes], ...]
"""(lower-case name, value without surrounding whitespace) in the order received."""


class RequestHead(NamedTuple):
    """A request head and its framing: `length` is the body's Content-Length (0 when none), `chunked` a
    chunked body; `close` whether the connection ends after the answer; `upgrade` an Upgrade/CONNECT;
    `expect` the Expect field's value (lower case) when there is one."""

    method: str
    target: str
    version: tuple[int, int]
    fields: Fields
    length: int
    chunked: bool
    close: bool
    upgrade: bool = False
    expect: bytes | None = None

    def get(self, name: bytes) -> bytes | None:
        """The value of field `name` (lower case), the first one when repeated."""
        return _get(self.fields, name)

    @property
    def path(self) -> str:
        """The target without its query."""
        return self.target.split("?", 1)[0]


class ResponseHead(NamedTuple):
    """A response head: status, reason phrase, fields and whether the server closes after it."""

    status: int
    reason: str
    version: tuple[int, int]
    fields: Fields
    close: bool

    def get(self, name: bytes) -> bytes | None:
        return _get(self.fields, name)

    def headers(self) -> dict[str, str]:
        """The fields as a dict of lower-case names (the last of a repeated one; Latin-1 decoded)."""
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.fields}


def _get(fields: Fields, name: bytes) -> bytes | None:
    for key, value in fields:
        if key == name:
            return value
    return None


class _Head:
    """httptools' callbacks for one head."""

    __slots__ = ("done", "fields", "reason", "url")

    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.reason = b""
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        self.done = True


_LLHTTP_REASONS = (
    ("Duplicate Content-Length", "repeated_content_length"),
    ("can't be present with", "conflicting_framing"),
    ("Content-Length", "content_length"),
    ("Transfer-Encoding", "transfer_encoding"),
    ("whitespace", "obs_fold"),
    ("CR", "line_ending"),
    ("LF", "line_ending"),
    ("header value", "header_value"),
    ("header field", "header_name"),
    ("header token", "header_name"),
    ("version", "version"),
    ("HTTP/", "status_line"),
    ("status", "status_line"),
    ("method", "method"),
    ("URL", "target"),
    ("url", "target"),
)


def _llhttp_reason(exc: Exception) -> str:
    text = str(exc)
    for needle, reason in _LLHTTP_REASONS:
        if needle in text:
            return reason
    return "malformed"


def _check_lines(head: bytes, scanned: bool = False) -> None:
    if not scanned and head.count(b"\n") != head.count(b"\r\n"):
        raise FramingError("line_ending", "bare LF")
    if len(head) > MAX_HEAD:
        raise FramingError("head_too_large", status=431)
    if len(head) > MAX_LINE and max(map(len, head.split(b"\r\n"))) > MAX_LINE:
        raise FramingError("line_too_long", status=431)


def _feed(parser: httptools.HttpRequestParser | httptools.HttpResponseParser, head: bytes) -> bool:
    """Feed a whole head; True when it asks for an upgrade."""
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        return True
    except httptools.HttpParserError as exc:
        raise FramingError(_llhttp_reason(exc), str(exc)) from None
    return False


def _version(text: str) -> tuple[int, int]:
    if text == "1.1":
        return (1, 1)
    if text != "1.0":
        raise FramingError("version", text, status=505)
    return (1, int(text[2]))


def _body_fields(fields: Fields, version: tuple[int, int]) -> tuple[int | None, bool]:
    """(Content-Length or None, chunked) from fields llhttp already accepted (one plain decimal length,
    never with Transfer-Encoding); `FramingError` on a transfer coding other than `chunked`."""
    length: int | None = None
    chunked = False
    for name, value in fields:
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            if chunked or value.lower() != b"chunked":
                raise FramingError("transfer_encoding", repr(value[:40]), status=501)
            chunked = True
    if chunked and version < (1, 1):
        raise FramingError("transfer_encoding_http10")
    return length, chunked


def _connection_close(fields: Fields, version: tuple[int, int]) -> bool:
    for name, value in fields:
        if name == b"connection" and b"close" in (t.strip(b" \t").lower() for t in value.split(b",")):
            return True
    return version < (1, 1)


def parse_request_head(head: bytes, *, scanned: bool = False) -> RequestHead:
    """A request head given whole, up to and including its blank line; `FramingError` when it is not
    strictly one. `scanned`: the caller already refused bare LFs in it (`server.RequestFramer`)."""
    _check_lines(head, scanned)
    got = _Head()
    parser = httptools.HttpRequestParser(got)
    upgrade = _feed(parser, head)
    if not got.done:
        raise FramingError("incomplete")
    version = _version(parser.get_http_version())
    hosts, length, chunked, close, expect = 0, 0, False, version < (1, 1), None
    for name, value in got.fields:  # one pass over what llhttp accepted
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            length = int(value)  # llhttp allows one plain decimal length, never with Transfer-Encoding
        elif name == b"transfer-encoding":
            if chunked or value.lower() != b"chunked":
                raise FramingError("transfer_encoding", repr(value[:40]), status=501)
            chunked = True
        elif name == b"connection":
            close = close or b"close" in (t.strip(b" \t").lower() for t in value.split(b","))
        elif name == b"expect":
            expect = value.lower()
    if hosts != 1 and (hosts or version == (1, 1)):
        raise FramingError("repeated_host" if hosts else "missing_host")
    if chunked and version < (1, 1):
        raise FramingError("transfer_encoding_http10")
    method = parser.get_method()
    if head[: head.find(b"\r\n")] != b"%s %s HTTP/1.%d" % (method, got.url, version[1]):
        raise FramingError("request_line", "not exactly METHOD SP TARGET SP VERSION")  # llhttp allows more
    try:
        target = got.url.decode("ascii")
    except UnicodeDecodeError:
        raise FramingError("target") from None
    fields = tuple(got.fields)
    return RequestHead(
        method.decode("ascii"), target, version, fields, length, chunked, close, upgrade, expect
    )


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] [1-5][0-9]{2}(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")


def parse_response_head(head: bytes) -> ResponseHead:
    """A response head given whole, up to and including its blank line; `FramingError` when it is not
    strictly one."""
    _check_lines(head)
    got = _Head()
    parser = httptools.HttpResponseParser(got)
    if _feed(parser, head):
        raise FramingError("upgrade")
    if not got.done:
        raise FramingError("incomplete")
    version = _version(parser.get_http_version())
    if _STATUS_LINE.fullmatch(head, 0, max(head.find(b"\r\n"), 0)) is None:
        raise FramingError("status_line", "not exactly VERSION SP STATUS SP REASON")  # llhttp allows more
    fields = tuple(got.fields)
    reason = got.reason.decode("latin-1")
    return ResponseHead(parser.get_status_code(), reason, version, fields, _connection_close(fields, version))


NO_BODY = -1
"""`response_framing`: the answer has no body (HEAD, 1xx, 204, 304)."""
CHUNKED = -2
"""`response_framing`: a chunked body."""
UNTIL_CLOSE = -3
"""`response_framing`: the body runs until the server closes."""


def response_framing(head: ResponseHead, method: str) -> tuple[int, bool]:
    """How the body of an answer to `method` is framed (RFC 9112 §6.3): (its length, or `NO_BODY`,
    `CHUNKED`, `UNTIL_CLOSE`; whether the framing is in doubt, so the connection must not carry another
    request: a 1xx, 204 or 304 that declares a body it cannot have). `FramingError` on a transfer coding
    other than chunked."""
    length, chunked = _body_fields(head.fields, head.version)
    status = head.status
    if 100 <= status <= 199 or status == 204:
        return NO_BODY, chunked or bool(length)
    if status == 304:
        return NO_BODY, chunked
    if method == "HEAD":
        return NO_BODY, False
    if chunked:
        return CHUNKED, False
    if length is not None:
        return length, False
    return UNTIL_CLOSE, False


_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")
"""A chunk-size line: at most 16 hex digits (64 bits), no whitespace in the size or before its `;` (RFC 9112
allows BWS before the `;`; llhttp and h11 do not, and neither do we)."""
_TRAILER_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n")


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (with its CRLF): hex digits only, then optional extensions, which are
    ignored; `FramingError` otherwise (`0x2`, `+2`, ` 2`, `2 `, a bare LF)."""
    match = _CHUNK_LINE.fullmatch(line)
    if match is None:
        raise FramingError("chunk_size", repr(line[:40]))
    return int(match[1], 16)


def check_trailer(line: bytes) -> None:
    """A trailer field line (with its CRLF) is `token ":" value` without controls; `FramingError` else."""
    if line.count(b"\n") != 1:
        raise FramingError("line_ending", "bare LF")
    if _TRAILER_LINE.fullmatch(line) is None or line[:1] in (b" ", b"\t"):
        raise FramingError("trailer", repr(line[:40]))


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def request_head(
    method: str, target: str, host: str, headers: dict[str, str], length: int | None, *, close: bool = True
) -> bytes:
    """The request line and fields (`Connection: close` unless the connection is kept; `Content-Length`
    when there is a body). ValueError on a method, target, name or value that would split the head."""
    if _TOKEN.fullmatch(method) is None or not target or " " in target or _CONTROL.search(target + host):
        raise ValueError(f"request line {method[:20]!r} {target[:80]!r} cannot be sent")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"] + (["Connection: close"] if close else [])
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) is None or _CONTROL.search(value):
            raise ValueError(f"header {name[:40]!r} cannot be sent as given")
        lines.append(f"{name}: {value}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@cache
def reason_phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Unknown"


def response_head(
    status: int, content_type: str, length: int, *, close: bool, date: bytes | None = None
) -> bytes:
    """A response head for a body of `length` bytes (`Connection: close` when the server closes after)."""
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s" % (
        status,
        reason_phrase(status),
        content_type.encode("latin-1"),
        length,
        b"Date: %s\r\n" % date if date is not None else b"",
        b"Connection: close\r\n\r\n" if close else b"\r\n",
    )
