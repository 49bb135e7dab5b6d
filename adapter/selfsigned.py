"""The self-signed serving certificate, made with `cryptography`: in a short child process when serving.

Why a module of its own: `cryptography` costs ~7.5 MiB of RSS for the life of a process that imports it
(gpuwarden/x509lite.py says why the adapter does not). Generating a key pair needs it, once at start, so
`adapter.tls.self_signed_in_child` runs `python -m adapter.selfsigned` and reads the pair back; tests and
tools call `self_signed` directly.

Child protocol: a JSON request on stdin `{"names": [...], "days": int, "algorithm": "ecdsa" | "rsa"}`, the
pair on stdout as `{"cert": PEM, "key": PEM}`.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import sys
from collections.abc import Sequence
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


def main() -> int:
    request = json.load(sys.stdin)
    cert, key = self_signed(request["names"], int(request["days"]), algorithm=request["algorithm"])
    json.dump({"cert": cert.decode(), "key": key.decode()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
