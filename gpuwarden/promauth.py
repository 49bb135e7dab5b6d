"""Credentials and TLS for the Prometheus client: rotating token/password files, CA and client certificates.

Why this module exists: Kubernetes rotates projected service-account tokens and mounted secrets in place, so a
credential read once at start-up expires under a long-running adapter. `SecretFile` re-reads its file whenever
its identity (inode, size, mtime) changes — a `stat()` per request, no polling thread — and keeps serving
the last good value if the file briefly vanishes during an atomic `..data` symlink swap.

What it must not do: send requests or decide retries (that is `gpuwarden.promclient`). Failures to read a
credential raise `PrometheusError` naming the file, never an `OSError`.
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.request
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.errors import PrometheusError
from gpuwarden.httpxlib import httpx

if TYPE_CHECKING:
    from gpuwarden.config.prometheus import TLS, PrometheusConfig


class SecretFile:
    """A small secret file (token, password) re-read when it changes on disk."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._identity: tuple[int, int, int] | None = None
        self._value: str | None = None
        self.reads = 0  # how many times the file was actually read; tests check rotation with it

    def value(self) -> str:
        """The current secret, stripped of surrounding whitespace; re-read only if the file changed."""
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_size, st.st_mtime_ns)
            if identity != self._identity:
                value = self.path.read_text(encoding="utf-8").strip()
                self._identity, self._value = identity, value
                self.reads += 1
        except OSError as exc:
            if self._value is None:
                raise PrometheusError(f"cannot read {self.what} {self.path}: {exc.strerror or exc}") from None
        assert self._value is not None
        if not self._value:
            raise PrometheusError(f"{self.what} {self.path} is empty")
        return self._value


class BearerTokenAuth(httpx.Auth):
    """`Authorization: Bearer <token>` with the token from a file that may rotate."""

    def __init__(self, token_file: Path) -> None:
        self.token = SecretFile(token_file, "bearer token file")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token.value()}"
        yield request


class FileBasicAuth(httpx.Auth):
    """HTTP basic auth with the password from a file that may rotate."""

    def __init__(self, username: str, password_file: Path) -> None:
        self.username = username
        self.password = SecretFile(password_file, "basic-auth password file")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        userpass = f"{self.username}:{self.password.value()}".encode()
        request.headers["Authorization"] = "Basic " + base64.b64encode(userpass).decode("ascii")
        yield request


def build_auth(config: PrometheusConfig) -> httpx.Auth | None:
    """The auth flow the config asks for (the config guarantees at most one)."""
    if config.bearer_token_file is not None:
        return BearerTokenAuth(config.bearer_token_file)
    if config.basic_auth is not None:
        return FileBasicAuth(config.basic_auth.username, config.basic_auth.password_file)
    return None


def plain_http_verify() -> ssl.SSLContext | bool:
    """httpx's `verify` for a plain-HTTP Prometheus (no TLS settings): a context that trusts nothing.

    Why: httpx loads certifi's whole CA bundle into a new SSL context when a client is made (~2 MiB of RSS
    for the adapter's life), though a client that only requests `http://` URLs without following
    redirects never speaks TLS. Through a proxy from the environment (`HTTPS_PROXY`, ...) it might, so
    then httpx's default (`True`) stays. The context refuses every server (no CA loaded, verification
    required): TLS reached by some path not foreseen here fails closed.
    """
    if urllib.request.getproxies():
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def build_ssl_context(tls: TLS) -> ssl.SSLContext:
    """An SSL context with the configured CA and client certificate; system CAs when no CA is given."""
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
        if tls.cert_file is not None and tls.key_file is not None:
            ctx.load_cert_chain(certfile=str(tls.cert_file), keyfile=str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise PrometheusError(f"cannot load TLS files for Prometheus: {exc}") from None
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
