"""Serving TLS: the given certificate or a self-signed one made at start, and client-certificate CAs.

Why: kube-aggregator only speaks HTTPS to aggregated API servers, and the front-proxy identity arrives as a
client certificate on that same connection. Like k8s.io/apiserver's `MaybeDefaultWithSelfSignedCerts`, a
missing certificate is generated in memory (ECDSA P-256, valid for localhost, 127.0.0.1 and the given names)
so an APIService with `insecureSkipTLSVerify` works out of the box. Client certificates are optional at the
TLS layer (probes and token callers have none); which CA signed one is checked in `adapter.auth`.
Every serving context — the first and each one a certificate rotation builds (`adapter.certreload`) — comes
from `context_for`, so they agree on protocol versions and client-certificate verification.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def self_signed(
    names: Sequence[str] = ("localhost",), days: int = 365, *, algorithm: Literal["ecdsa", "rsa"] = "ecdsa"
) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for `names` plus 127.0.0.1 and ::1; ECDSA P-256 or RSA 2048."""
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if algorithm == "rsa"
        else ec.generate_private_key(ec.SECP256R1())
    )
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"gpuwarden-adapter@{int(now.timestamp())}")]
    )
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(names)]
    alt += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle."""
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


def load_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`ctx.load_cert_chain` from bytes, via a private temporary directory (OpenSSL wants files)."""
    with tempfile.TemporaryDirectory(prefix="gpuwarden-tls-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key_pem)
        ctx.load_cert_chain(cert_path, key_path)


def context_for(
    cert_pem: bytes,
    key_pem: bytes,
    *,
    min_version: str = "TLSv1.2",
    client_cas: Sequence[x509.Certificate] = (),
) -> ssl.SSLContext:
    """A new server SSLContext serving exactly this pair.

    `client_cas` are offered for optional client-certificate verification. Raises `ssl.SSLError` (or
    `OSError`) when OpenSSL refuses the pair or a CA.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if min_version == "TLSv1.3" else ssl.TLSVersion.TLSv1_2
    load_pair(ctx, cert_pem, key_pem)
    if client_cas:
        bundle = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in client_cas)
        ctx.load_verify_locations(cadata=bundle)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def server_context(
    cert_file: Path | None,
    key_file: Path | None,
    *,
    min_version: str = "TLSv1.2",
    client_cas: Sequence[x509.Certificate] = (),
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
