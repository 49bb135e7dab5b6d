"""The node agent's HTTP/1.1 transport, its pure parts (the request head, the response head); the whole
transport runs every `test_kube_client.py` case against a local server, beside aiohttp's."""

from __future__ import annotations

import pytest

from gpuwarden.kube.minihttp import parse_head, request_head


def test_request_head() -> None:
    head = request_head(
        "PATCH", "/api/v1/nodes/n?fieldManager=x", "k:6443", {"Accept": "application/json"}, 2
    )
    assert head == (
        b"PATCH /api/v1/nodes/n?fieldManager=x HTTP/1.1\r\nHost: k:6443\r\nConnection: close\r\n"
        b"Accept: application/json\r\nContent-Length: 2\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("head", "expect"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
                     (200, "OK", {"content-length": "2"}), id="ok"),
        pytest.param(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\n\r\n",
                     (429, "Too Many Requests", {"retry-after": "1"}), id="reason-with-spaces"),
        pytest.param(b"HTTP/1.0 204\r\n\r\n", (204, "", {}), id="no-reason"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-A:  b c \r\n\r\n", (200, "OK", {"x-a": "b c"}), id="trimmed"),
    ],
)  # fmt: skip
def test_parse_head(head: bytes, expect: tuple[int, str, dict[str, str]]) -> None:
    assert parse_head(head) == expect


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/2 200\r\n\r\n", id="http2"),
        pytest.param(b"HTTP/1.1 OK 200\r\n\r\n", id="no-code"),
        pytest.param(b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", id="header-without-colon"),
    ],
)
def test_malformed_heads_are_value_errors(head: bytes) -> None:
    with pytest.raises(ValueError):
        parse_head(head)
