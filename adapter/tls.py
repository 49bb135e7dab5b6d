"""Serving TLS: the given certificate or a self-signed one made at start, and client-certificate CAs.

Why: kube-aggregator only speaks HTTPS to aggregated API servers, and the front-proxy identity arrives as a
client certificate on that same connection. Like k8s.io/apiserver's `MaybeDefaultWithSelfSignedCerts`, a
missing certificate is generated in memory (ECDSA P-256, valid for localhost, 127.0.0.1 and the given names)
so an APIService with `insecureSkipTLSVerify` works out of the box. Client certificates are optional at the
TLS layer (probes and token callers have none); which CA signed one is checked in `adapter.auth`. Every
serving context — the first and each one a certificate rotation builds (`gpuwarden.certreload`) — comes from
`context_for` (gpuwarden/tlscontext.py, shared with the controller's extender port), so they agree on protocol
versions and client-certificate verification. Certificates are read with `gpuwarden.x509lite` and generated in
a child process (`adapter.selfsigned`): the serving process does not import `cryptography`.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from gpuwarden import x509lite
from gpuwarden.tlscontext import context_for, load_pair
from gpuwarden.x509lite import Certificate

__all__ = [
    "context_for",
    "load_certificates",
    "load_pair",
    "self_signed",
    "self_signed_in_child",
    "server_context",
]


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
