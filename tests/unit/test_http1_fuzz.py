"""Differential fuzzing of the `http1` room's framing against h11 (hypothesis): requests through the server
core's `RequestFramer` (fed in random pieces), answers through the client's `read_reply`, on generated
messages and on the same messages mutated byte by byte.

The property, for every message: when we accept it, h11 accepts it too, with the same method and target
(or status and reason), the same fields, the same body bytes and the same end (the bytes left over after
the message are the same); when we refuse it and h11 accepts it, our reason is one of the deliberate
refusals in `head.STRICTER_THAN_H11`; when we wait for more bytes, so does h11 or it refuses.

Budget: `EXAMPLES` cases per test (4 tests), derandomized so `make test` runs the same cases every time
(a few seconds in all; docs/architecture.md has the measured time). `GPUWARDEN_FUZZ_EXAMPLES=20000` runs
more, with fresh randomness.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from itertools import pairwise

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.http1.head import STRICTER_THAN_H11, FramingError
from gpuwarden.http1.pool import read_reply
from gpuwarden.http1.server import RequestFramer

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "600"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize="GPUWARDEN_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- generating messages -------------------------------------------------------------------------------

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
tokens = st.text(TOKEN_CHARS, min_size=1, max_size=12).map(str.encode)
field_names = st.one_of(
    tokens, st.sampled_from([b"Content-Type", b"Accept", b"User-Agent", b"X-Trace", b"Connection"])
)
VALUE_BYTES = bytes(range(0x21, 0x7F)) + b"\x80\xa0\xff"
field_values = st.one_of(
    st.binary(max_size=0),
    st.lists(st.binary(min_size=1, max_size=6).filter(lambda b: all(c in VALUE_BYTES for c in b)), max_size=3)
    .filter(bool)
    .map(b" ".join),
    st.sampled_from([b"keep-alive", b"close", b"application/json", b"a, b"]),
)
extra_fields = st.lists(st.tuples(field_names, field_values), max_size=4).map(
    lambda fs: [(n, v) for n, v in fs if n.lower() not in (b"content-length", b"transfer-encoding", b"host")]
)
paths = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~/%?=&", max_size=20).map(lambda p: b"/" + p.encode())
bodies = st.binary(max_size=40)


def chunked(body: bytes, cuts: list[int], extension: bool, trailer: bool) -> bytes:
    """`body` chunk-encoded, cut at `cuts`."""
    edges = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    out = b""
    for start, end in pairwise(edges):
        if end > start:
            out += b"%x%s\r\n%s\r\n" % (end - start, b";ext=1" if extension else b"", body[start:end])
    return out + b"0\r\n" + (b"X-Trailer: t\r\n" if trailer else b"") + b"\r\n"


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(
        st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD", b"REPORT"])
    )
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    fields = [(b"Host", b"gpuwarden.test"), *draw(extra_fields)]
    body = draw(bodies)
    framing = draw(st.sampled_from(["length", "length", "chunked", "none"]))
    if framing == "length":
        fields.append((draw(st.sampled_from([b"Content-Length", b"content-length"])), b"%d" % len(body)))
        payload = body
    elif framing == "chunked" and version == b"1.1":
        fields.append((b"Transfer-Encoding", b"chunked"))
        payload = chunked(body, draw(st.lists(st.integers(0, 40), max_size=3)), draw(st.booleans()), False)
    else:
        payload = b""
    fields = draw(st.permutations(fields))
    ows = draw(st.sampled_from([b"", b" ", b"  ", b"\t"]))
    head = b"%s %s HTTP/%s\r\n" % (method, draw(paths), version)
    # llhttp refuses a TAB after `chunked` (a quirk on the safe side; STRICTER_THAN_H11 "transfer_encoding")
    te_ows = ows.replace(b"\t", b" ")
    head += b"".join(
        b"%s:%s%s%s\r\n"
        % (n, te_ows if v == b"chunked" else ows, v, (te_ows if v == b"chunked" else ows) if v else b"")
        for n, v in fields
    )
    return head + b"\r\n" + payload + draw(st.sampled_from([b"", b"GET / HTTP/1.1\r\n"]))


STATUSES = [100, 103, 200, 201, 204, 206, 301, 304, 400, 404, 409, 410, 429, 500, 503]


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, str]:
    status = draw(st.sampled_from(STATUSES))
    method = draw(st.sampled_from(["GET", "GET", "POST", "HEAD"]))
    reason = draw(st.sampled_from([b" OK", b" Not Found", b"", b" ", b" with  spaces\t"]))
    fields = draw(extra_fields)
    body = draw(bodies)
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    framing = draw(st.sampled_from(["length", "length", "chunked", "close"]))
    if version == b"1.0" and framing == "chunked":  # faulty framing in HTTP/1.0 (RFC 9112 §6.1)
        framing = "length"
    no_body = method == "HEAD" or status in (204, 304) or status < 200
    if framing == "length":
        declared = draw(st.booleans()) if status == 204 else False  # a server that sends one anyway
        fields.append(
            (
                b"Content-Length",
                b"%d" % (0 if status < 200 or (status == 204 and not declared) else len(body)),
            )
        )
        payload = body if declared else b"" if no_body else body
    elif framing == "chunked" and not (status in (204, 304) or status < 200):
        fields.append((b"Transfer-Encoding", b"chunked"))
        trailer = draw(st.booleans())
        payload = (
            b"" if no_body else chunked(body, draw(st.lists(st.integers(0, 40), max_size=3)), True, trailer)
        )
    else:
        payload = b"" if no_body else body
    head = b"HTTP/%s %d%s\r\n" % (version, status, reason)
    head += b"".join(b"%s: %s\r\n" % (n, v) for n, v in draw(st.permutations(fields)))
    message = head + b"\r\n" + payload
    if status < 200:  # an interim answer, then the final one
        message += b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            b"" if method == "HEAD" else body,
        )
    return message, method


INTERESTING = [
    *(b"\r", b"\n", b"\r\n", b" ", b"\t", b"\x00", b"\x01", b"\x7f", b"\xff", b":", b",", b";", b"+", b"-"),
    *(b"0x", b"0", b"9", b"f", b"\r\n ", b"\r\n\r\n", b"HTTP/1.1", b"chunked", b"\r\nHost: b"),
    *(b"\r\nContent-Length: 3", b"\r\nContent-Length: 0", b"\r\nTransfer-Encoding: chunked"),
]


def anchors(data: bytes) -> list[int]:
    """Where framing lives: line starts and ends, and just after each colon (and its space)."""
    found = [0, len(data)]
    for sep, after in ((b"\r\n", 2), (b"\r\n", 0), (b":", 1), (b": ", 2)):
        at = data.find(sep)
        while at >= 0:
            found.append(at + after)
            at = data.find(sep, at + 1)
    return sorted(set(found))


def numbers(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each hex-digit run that starts a line or a field value: lengths and chunk sizes."""
    found = []
    for match in re.finditer(rb"(?:^|\r\n|[Ll]ength:[ \t]*)([0-9A-Fa-f]+)(?=[ \t]*\r\n|;)", data):
        found.append((match.start(1), match.end(1)))
    return found


@st.composite
def mutated(draw: st.DrawFn, messages: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(messages))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.one_of(st.integers(0, len(data)), st.sampled_from(anchors(bytes(data)))))
        kind = draw(st.sampled_from(["insert", "replace", "delete", "duplicate-line", "number", "number"]))
        piece = draw(st.sampled_from(INTERESTING))
        if kind == "insert":
            data[at:at] = piece
        elif kind == "replace":
            data[at : at + len(piece)] = piece
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 4))]
        elif kind == "number" and (starts := numbers(bytes(data))):
            # a length or chunk size made lenient: a sign, a 0x, a space, a leading zero, on either side
            first, last = draw(st.sampled_from(starts))
            where = draw(st.sampled_from([first, first, last]))
            data[where:where] = draw(st.sampled_from([b"+", b"0x", b" ", b"-", b"\t", b"0", b"_"]))
        elif kind == "duplicate-line":
            start = data.rfind(b"\r\n", 0, at) + 2 if data.rfind(b"\r\n", 0, at) >= 0 else 0
            end = data.find(b"\r\n", at)
            if end > start:
                data[end:end] = b"\r\n" + data[start:end]
    return bytes(data)


# --- the two sides -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Framed:
    """A verdict: `refused` (a reason, or "" for h11), `waiting` (no whole message yet), or the message."""

    refused: str | None = None
    waiting: bool = False
    start: tuple[object, ...] = ()
    fields: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes | None = None
    rest: bytes = b""
    head_length: int = 0


def ours_request(data: bytes, cuts: list[int]) -> Framed:
    framer = RequestFramer()
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    head = None
    try:
        for start, end in pairwise(edges):
            framer.feed(data[start:end])
            head = framer.head()  # as the server asks after every read
    except FramingError as exc:
        return Framed(refused=exc.reason)
    if head is None:
        return Framed(waiting=True)
    start = (head.method, head.target, head.version)
    if head.chunked:  # the core hands chunked requests on (aiohttp) or answers 411: compare the head only
        return Framed(start=start, fields=head.fields, head_length=data.find(b"\r\n\r\n") + 4)
    body = framer.body()
    if body is None:
        return Framed(waiting=True)
    framer.take()
    return Framed(start=start, fields=head.fields, body=body, rest=bytes(framer.buf))


def h11_events(conn: h11.Connection) -> list[object]:
    events: list[object] = []
    while True:
        event = conn.next_event()
        events.append(event)
        if event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return events


def h11_request(data: bytes) -> Framed:
    conn = h11.Connection(h11.SERVER)
    try:
        conn.receive_data(data)
        events = h11_events(conn)
    except h11.RemoteProtocolError:
        return Framed(refused="")
    request = next((e for e in events if isinstance(e, h11.Request)), None)
    if request is None:
        return Framed(waiting=True)
    version = tuple(int(x) for x in request.http_version.split(b"."))
    start = (request.method.decode(), request.target.decode(), version)
    fields = tuple((bytes(n), bytes(v)) for n, v in request.headers)
    if not isinstance(events[-1], h11.EndOfMessage):
        return Framed(start=start, fields=fields, waiting=True)
    body = b"".join(bytes(e.data) for e in events if isinstance(e, h11.Data))
    return Framed(start=start, fields=fields, body=body, rest=bytes(conn.trailing_data[0]))


def ours_response(data: bytes, method: str) -> Framed:
    async def read() -> Framed:
        reader = asyncio.StreamReader(limit=64 << 10)
        reader.feed_data(data)
        reader.feed_eof()
        try:
            reply, _ = await read_reply(reader, method)
        except FramingError as exc:
            return Framed(refused=exc.reason)
        except asyncio.IncompleteReadError:
            return Framed(waiting=True)
        fields = tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items())
        rest = await reader.read()
        return Framed(start=(reply.status, reply.reason), fields=fields, body=reply.body, rest=rest)

    return LOOP.run_until_complete(read())


LOOP = asyncio.new_event_loop()


def h11_response(data: bytes, method: str) -> Framed:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "a"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    try:
        conn.receive_data(data)
        conn.receive_data(b"")
        events = []
        while True:
            batch = h11_events(conn)
            events += batch
            if not isinstance(batch[-1], h11.EndOfMessage) or any(
                isinstance(e, h11.Response) for e in events
            ):
                break
    except h11.RemoteProtocolError:
        return Framed(refused="")
    response = next((e for e in events if isinstance(e, h11.Response)), None)
    if response is None or not isinstance(events[-1], h11.EndOfMessage):
        return Framed(waiting=True)
    body = b"".join(bytes(e.data) for e in events if isinstance(e, h11.Data))
    fields = {bytes(n): bytes(v) for n, v in response.headers}  # as `Reply.headers`: the last one wins
    return Framed(
        start=(response.status_code, response.reason.decode("latin-1")),
        fields=tuple(fields.items()),
        body=body,
        rest=bytes(conn.trailing_data[0]),
    )


def agree(ours: Framed, theirs: Framed, message: bytes) -> None:
    """The property (module docstring)."""
    if ours.refused is not None:
        assert theirs.refused is not None or ours.refused in STRICTER_THAN_H11, (ours, theirs, message)
        return
    if ours.waiting:
        assert theirs.waiting or theirs.refused is not None, (ours, theirs, message)
        return
    assert theirs.refused is None, (ours, theirs, message)
    assert (ours.start, ours.fields) == (theirs.start, theirs.fields), (ours, theirs, message)
    if ours.body is not None:  # a chunked request's body is not ours to read (see `ours_request`)
        assert (ours.body, ours.rest) == (theirs.body, theirs.rest), (ours, theirs, message)


cut_lists = st.lists(st.integers(0, 1 << 16), max_size=4)


def agree_request(message: bytes, cuts: list[int]) -> Framed:
    ours = ours_request(message, cuts)
    if ours.refused is None and not ours.waiting and ours.body is None:
        # a chunked body is not the core's to read: h11's verdict on the head alone
        theirs = h11_request(message[: ours.head_length])
        assert theirs.refused is None and (ours.start, ours.fields) == (theirs.start, theirs.fields), (
            ours,
            theirs,
            message,
        )
    else:
        agree(ours, h11_request(message), message)
    return ours


@FUZZ
@given(requests(), cut_lists)
def test_generated_requests_frame_as_h11_frames_them(message: bytes, cuts: list[int]) -> None:
    ours = agree_request(message, cuts)
    assert ours.refused is None and not ours.waiting, (ours, message)  # every generated request is valid


@FUZZ
@given(mutated(requests()), cut_lists)
def test_mutated_requests_frame_as_h11_frames_them_or_are_refused(message: bytes, cuts: list[int]) -> None:
    agree_request(message, cuts)


@FUZZ
@given(responses())
def test_generated_answers_frame_as_h11_frames_them(case: tuple[bytes, str]) -> None:
    message, method = case
    ours = ours_response(message, method)
    assert ours.refused is None and not ours.waiting, (ours, message)
    agree(ours, h11_response(message, method), message)


@FUZZ
@given(mutated(responses().map(lambda c: c[0])), st.sampled_from(["GET", "POST", "HEAD"]))
def test_mutated_answers_frame_as_h11_frames_them_or_are_refused(message: bytes, method: str) -> None:
    agree(ours_response(message, method), h11_response(message, method), message)
