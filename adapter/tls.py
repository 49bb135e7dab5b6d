"""Serving TLS: the given certificate or a self-signed one made at start, and client-certificate CAs.

Why: kube-aggregator only speaks HTTPS to aggregated API servers, and the front-proxy identity arrives as a
client certificate on that same connection. Like k8s.io/apiserver's `MaybeDefaultWithSelfSignedCerts`, a
missing certificate is generated in memory (ECDSA P-256, valid for localhost, 127.0.0.1 and the given names)
so an APIService with `insecureSkipTLSVerify` works out of the box. Client certificates are optional at the
TLS layer (probes and token callers have none); which CA signed one is checked in `adapter.auth`.
Every serving context — the first and each one a certificate rotation builds (`adapter.certreload`) — comes
from `context_for`, so they agree on protocol versions and client-certificate verification. Certificates are
read with `adapter.x509lite` and generated in a child process (`adapter.selfsigned`): the serving process
does not import `cryptography`.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from adapter import x509lite
from adapter.x509lite import Certificate


def self_signed(
    names: Sequence[str] = ("localhost",), days: int = 365, *, algorithm: Literal["ecdsa", "rsa"] = "ecdsa"
) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for `names` plus 127.0.0.1 and ::1; ECDSA P-256 or RSA 2048.

    In this process (imports `cryptography`): for tests and tools; the serving adapter uses
    `self_signed_in_child`."""
    from adapter import selfsigned

    return selfsigned.self_signed(names, days, algorithm=algorithm)


def self_signed_in_child(names: Sequence[str] = ("localhost",), days: int = 365) -> tuple[bytes, bytes]:
    """`self_signed`, made in a short child process so this one never imports `cryptography`
    (adapter/selfsigned.py). Raises `OSError` if the child fails."""
    request = json.dumps({"names": list(names), "days": days, "algorithm": "ecdsa"})
    done = subprocess.run(
        [sys.executable, "-m", "adapter.selfsigned"],
        input=request,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"generating the self-signed certificate failed: {done.stderr.strip()[-500:]}")
    pair = json.loads(done.stdout)
    return pair["cert"].encode(), pair["key"].encode()


def load_certificates(pem: bytes) -> list[Certificate]:
    """Every certificate in a PEM bundle (`ValueError` if one is malformed or there is none)."""
    return x509lite.load_pem(pem)


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

    `client_cas` are offered for optional client-certificate verification. Raises `ssl.SSLError` (or
    `OSError`) when OpenSSL refuses the pair or a CA.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if min_version == "TLSv1.3" else ssl.TLSVersion.TLSv1_2
    load_pair(ctx, cert_pem, key_pem)
    if client_cas:
        bundle = "".join(c.pem() for c in client_cas)
        ctx.load_verify_locations(cadata=bundle)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def server_context(
    cert_file: Path | None,
    key_file: Path | None,
    *,
    min_version: str = "TLSv1.2",
    client_cas: Sequence[Certificate] = (),
    names: Sequence[str] = ("localhost",),
    pair: tuple[bytes, bytes] | None = None,
) -> tuple[ssl.SSLContext, bytes]:
    """(server SSLContext, serving certificate PEM); self-signed when no files are given.

    `pair`: (certificate, key) PEM already read from the files, so a caller watching them for rotation
    knows exactly which bytes were loaded. `client_cas` as in `context_for`.
    """
    if pair is None and cert_file is not None and key_file is not None:
        pair = cert_file.read_bytes(), key_file.read_bytes()
    cert_pem, key_pem = pair if pair is not None else self_signed(names)
    return context_for(cert_pem, key_pem, min_version=min_version, client_cas=client_cas), cert_pem
