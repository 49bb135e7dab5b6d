"""The `http1` room's pure parts as tables: request and response heads (what is read, what is refused and
why), body framing, chunk-size lines, the request writer's refusals, and the server's `RequestFramer`
fed a byte at a time. The differential fuzzers (`test_http1_fuzz.py`) cover the rest of the space."""

from __future__ import annotations

import pytest

from gpuwarden.http1.head import (
    CHUNKED,
    NO_BODY,
    UNTIL_CLOSE,
    FramingError,
    chunk_size,
    parse_request_head,
    parse_response_head,
    request_head,
    response_framing,
)
from gpuwarden.http1.server import RequestFramer

R = b"POST /x HTTP/1.1\r\nHost: a\r\n"


@pytest.mark.parametrize(
    ("head", "expect"),
    [
        pytest.param(R + b"Content-Length: 3\r\n\r\n", ("POST", "/x", 3, False, False), id="length"),
        pytest.param(R + b"Transfer-Encoding: chunked\r\n\r\n", ("POST", "/x", 0, True, False), id="chunked"),
        pytest.param(
            R + b"Connection: keep-alive, Close\r\n\r\n", ("POST", "/x", 0, False, True), id="close"
        ),
        pytest.param(b"GET /x?a=1 HTTP/1.0\r\n\r\n", ("GET", "/x?a=1", 0, False, True), id="http10-no-host"),
    ],
)
def test_request_heads_read(head: bytes, expect: tuple[str, str, int, bool, bool]) -> None:
    parsed = parse_request_head(head)
    assert (parsed.method, parsed.target, parsed.length, parsed.chunked, parsed.close) == expect


@pytest.mark.parametrize(
    ("head", "reason", "status"),
    [
        pytest.param(b"POST /x HTTP/1.1\r\n\r\n", "missing_host", 400, id="no-host"),
        pytest.param(R + b"Host: b\r\n\r\n", "repeated_host", 400, id="two-hosts"),
        pytest.param(R + b"Content-Length: +2\r\n\r\n", "content_length", 400, id="plus-length"),
        pytest.param(
            R + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n",
            "repeated_content_length",
            400,
            id="equal-lengths",
        ),
        pytest.param(
            R + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            "conflicting_framing",
            400,
            id="cl-te",
        ),
        pytest.param(R + b"Transfer-Encoding: gzip\r\n\r\n", "transfer_encoding", 400, id="gzip"),
        pytest.param(
            b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "transfer_encoding_http10",
            400,
            id="te-in-http10",
        ),
        pytest.param(R + b"X: a\nY: b\r\n\r\n", "line_ending", 400, id="bare-lf"),
        pytest.param(R + b"X: a\r\n b\r\n\r\n", "obs_fold", 400, id="obs-fold"),
        pytest.param(R + b"X: a\x00b\r\n\r\n", "header_value", 400, id="nul"),
        pytest.param(R + b"X : a\r\n\r\n", "header_name", 400, id="space-before-colon"),
        pytest.param(b"POST  /x HTTP/1.1\r\nHost: a\r\n\r\n", "request_line", 400, id="two-spaces"),
        pytest.param(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", "version", 400, id="http12"),
        pytest.param(R + b"X: " + b"a" * (8 << 10) + b"\r\n\r\n", "line_too_long", 431, id="long-line"),
        pytest.param(R + b"X: a\r\n" * 12000 + b"\r\n", "head_too_large", 431, id="large-head"),
    ],
)
def test_request_heads_refused(head: bytes, reason: str, status: int) -> None:
    with pytest.raises(FramingError) as refused:
        parse_request_head(head)
    assert (refused.value.reason, refused.value.status) in {(reason, status), (reason, 501), (reason, 505)}


@pytest.mark.parametrize(
    ("head", "method", "framing"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "GET", (5, False), id="length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", (CHUNKED, False), id="chunked"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\n", "GET", (UNTIL_CLOSE, False), id="until-close"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD", (NO_BODY, False), id="head"),
        pytest.param(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", "GET", (NO_BODY, False), id="304"
        ),
        pytest.param(
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
            "GET",
            (NO_BODY, True),
            id="204-declaring-a-body",
        ),
        pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", "GET", (NO_BODY, False), id="204"),
    ],
)
def test_response_framing(head: bytes, method: str, framing: tuple[int, bool]) -> None:
    assert response_framing(parse_response_head(head), method) == framing


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"\rHTTP/1.1 200 OK\r\n\r\n", id="leading-cr"),
        pytest.param(b"HTTP/1.1  200 OK\r\n\r\n", id="two-spaces"),
        pytest.param(b"HTTP/1.1 000 OK\r\n\r\n", id="status-000"),
        pytest.param(b"HTTP/2 200\r\n\r\n", id="http2"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", id="two-lengths"),
    ],
)
def test_response_heads_refused(head: bytes) -> None:
    with pytest.raises(FramingError):
        parse_response_head(head)


@pytest.mark.parametrize(
    ("line", "size"),
    [(b"0\r\n", 0), (b"1f\r\n", 31), (b"A;name=value\r\n", 10), (b"ffffffffffffffff\r\n", (1 << 64) - 1)],
)
def test_chunk_sizes(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


@pytest.mark.parametrize(
    "line",
    [
        b"0x2\r\n",
        b"+2\r\n",
        b" 2\r\n",
        b"2 \r\n",
        b"2 ;x\r\n",
        b"-1\r\n",
        b"\r\n",
        b"2\n",
        b"1" * 17 + b"\r\n",
    ],
)
def test_chunk_sizes_refused(line: bytes) -> None:
    with pytest.raises(FramingError):
        chunk_size(line)


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/a b", {}),
        ("GET", "/a\r\nX: 1", {}),
        ("GE T", "/", {}),
        ("GET", "/", {"X-A": "1\r\nInjected: yes"}),
        ("GET", "/", {"X A": "1"}),
    ],
)
def test_request_head_refuses_what_would_split_the_head(
    method: str, target: str, headers: dict[str, str]
) -> None:
    with pytest.raises(ValueError):
        request_head(method, target, "h", headers, None)


def test_the_framer_reads_a_request_fed_a_byte_at_a_time() -> None:
    message = R + b"Content-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n"
    framer = RequestFramer()
    heads = []
    for at in range(len(message)):
        framer.feed(message[at : at + 1])
        heads.append(framer.head())
    head = heads[-1]
    assert head is not None and heads.count(None) == len(R) + len(b"Content-Length: 3\r\n\r\n") - 1
    assert framer.body() == b"abc"
    framer.take()
    assert framer.head() is None and bytes(framer.buf) == b"GET / HTTP/1.1\r\n"


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        pytest.param(b"GET / HTTP/1.1\n", "line_ending", id="bare-lf-refused-as-it-arrives"),
        pytest.param(b"GET / HTTP/1.1\r\nX: " + b"a" * (8 << 10), "line_too_long", id="long-partial-line"),
        pytest.param(b"GET / HTTP/1.1\r\n" + b"X: a\r\n" * 11000, "head_too_large", id="large-partial-head"),
    ],
)
def test_the_framer_refuses_before_a_head_ends(stream: bytes, reason: str) -> None:
    framer = RequestFramer()
    framer.feed(stream)
    with pytest.raises(FramingError) as refused:
        framer.head()
    assert refused.value.reason == reason
