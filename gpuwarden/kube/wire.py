"""What both HTTP transports to the API server share: the TLS context, the 2xx answer, JSON decoding and
the bearer credential.

Why a module of its own: `transport.py` (aiohttp, the adapter's and the controller's) and `minihttp.py`
(plain asyncio streams, the node agent's) must build TLS and credentials alike, and the node agent must not
import aiohttp to get them. It must not send anything.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from gpuwarden.errors import ConfigError, KubeError

INLINE_DECODE_BYTES = 256 << 10
"""Bodies up to this size are decoded on the event loop (~1 ms at most); larger ones (LIST pages) on a
pool thread."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A 2xx answer: status and raw body."""

    status: int
    body: bytes


def ssl_context(configuration: Any) -> ssl.SSLContext:
    """The TLS context the `kubernetes` client would build: the configured CA (or none at all when
    `verify_ssl` is false), the client certificate, hostname checking unless `assert_hostname` is False.
    Unreadable or mismatched files are a `ConfigError` naming `kubernetes.kubeconfig`."""
    try:
        return _ssl_context(configuration)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError([("kubernetes.kubeconfig", f"cannot set up TLS to the API server: {exc}")]) from exc


def _ssl_context(configuration: Any) -> ssl.SSLContext:
    cafile = getattr(configuration, "ssl_ca_cert", None)
    cadata = getattr(configuration, "ca_cert_data", None)
    if getattr(configuration, "verify_ssl", True):
        context = ssl.create_default_context(cafile=cafile, cadata=cadata)
        if getattr(configuration, "assert_hostname", None) is False:
            context.check_hostname = False
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert = getattr(configuration, "cert_file", None)
    if cert:
        context.load_cert_chain(cert, getattr(configuration, "key_file", None) or None)
    return context


def parse_object(data: bytes, status: int) -> dict[str, Any]:
    """A 2xx body as a JSON object ({} when empty), for both transports; anything else is a `KubeError`."""
    if not data:
        return {}
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise KubeError(f"API server answered with invalid JSON: {exc}", status=status) from None
    if not isinstance(parsed, dict):
        raise KubeError("API server answered with JSON that is not an object", status=status)
    return parsed


async def decode(answer: Answer, pool: Executor) -> dict[str, Any]:
    """The body as a JSON object (large bodies decoded on a pool thread)."""
    if len(answer.body) <= INLINE_DECODE_BYTES:
        return parse_object(answer.body, answer.status)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, parse_object, answer.body, answer.status)


class Credentials:
    """The Authorization value of a connection (`kubernetes` Configuration or `connection.Connection`)."""

    def __init__(self, configuration: Any, pool: Executor, ttl: float) -> None:
        self._configuration = configuration
        self._pool = pool
        self._ttl = ttl
        self._value: str | None = None
        self._at: float | None = None

    def _now(self) -> str | None:
        """The Authorization value from the configuration (its refresh hook may read a token file or run an
        exec plugin: called on a pool thread)."""
        auth = self._configuration.auth_settings().get("BearerToken")
        return str(auth["value"]) if auth and auth.get("value") else None

    async def value(self) -> str | None:
        """The Authorization value, asked of the configuration at most every `credential_ttl` seconds (its
        refresh hook rotates service-account and exec-plugin tokens) and never on the event loop when a
        hook exists (an exec plugin is a subprocess). A failing hook is a `KubeError`, never raw."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._at is not None and now - self._at < self._ttl:
            return self._value
        try:
            if getattr(self._configuration, "refresh_api_key_hook", None) is None:
                value = self._now()
            else:
                value = await loop.run_in_executor(self._pool, self._now)
        except Exception as exc:  # the kubernetes package raises ConfigException, OSError, ...
            message = f"cannot get credentials for the API server: {exc}"
            raise KubeError(message, reason="Credentials") from None
        self._value, self._at = value, loop.time()
        return value


def request_body(body: Any, content_type: str | None) -> tuple[bytes | None, str | None]:
    """A request's bytes and content type: bytes and None pass, a str is UTF-8, anything else JSON (and a
    body without a content type is `application/json`)."""
    if body is None or isinstance(body, bytes):
        content = body
    elif isinstance(body, str):
        content = body.encode()
    else:
        content = json.dumps(body).encode()
    if content is not None and not content_type:
        content_type = "application/json"
    return content, content_type


async def request_headers(credentials: Credentials, accept: str, content_type: str | None) -> dict[str, str]:
    """Accept, Content-Type and the current Authorization credential (refreshed as `Credentials` says)."""
    headers = {"Accept": accept}
    if content_type:
        headers["Content-Type"] = content_type
    credential = await credentials.value()
    if credential:
        headers["Authorization"] = credential
    return headers
