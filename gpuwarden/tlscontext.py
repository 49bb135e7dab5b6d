"""Server TLS contexts built from certificate and key bytes: the one way every listener gets its context.

Why in the kernel: the adapter's HTTPS port and the controller's extender port both serve a pair read from
mounted files and rotated without a restart (`gpuwarden.certreload`); each replacement context must be built
exactly like the first, so protocol versions and client-certificate verification never drift between the
first context and the ones a rotation makes, nor between the two deployables.

What it must not do: read files or judge certificates (the caller read the bytes; `certreload` judges
them), or import `cryptography` (the adapter's serving process does not carry it: `gpuwarden.x509lite`).
"""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden.x509lite import Certificate


def load_pair(
    ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, password: Callable[[], bytes] | None = None
) -> None:
    """`ctx.load_cert_chain` from bytes, via a private temporary directory (OpenSSL wants files)."""
    with tempfile.TemporaryDirectory(prefix="gpuwarden-tls-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key_pem)
        ctx.load_cert_chain(cert_path, key_path, password=password)


def context_for(
    cert_pem: bytes,
    key_pem: bytes,
    *,
    min_version: str = "TLSv1.2",
    client_cas: Sequence[Certificate] = (),
) -> ssl.SSLContext:
    """A new server SSLContext serving exactly this pair.

    `client_cas` are offered for optional client-certificate verification (`ssl.CERT_OPTIONAL`: a
    certificate presented must verify, none is needed at the TLS layer; who must present one is decided
    per request by the server). Raises `ssl.SSLError` (or `OSError`) when OpenSSL refuses the pair or a CA.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if min_version == "TLSv1.3" else ssl.TLSVersion.TLSv1_2
    load_pair(ctx, cert_pem, key_pem)
    if client_cas:
        bundle = "".join(c.pem() for c in client_cas)
        ctx.load_verify_locations(cadata=bundle)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
