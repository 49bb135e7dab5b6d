"""Certificates with a subject of the test's choosing, signed by a test CA, as DER.

Why: the identity rules (the last CN is Kubernetes' user, a subject with other than one CN names nobody)
and the differential fuzz test of `gpuwarden.x509lite` need subjects `harness.testbed.pki` does not make:
several CNs, none, multi-valued RDNs, every string type, other attributes between them.
"""

from __future__ import annotations

import datetime
from functools import cache

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness.testbed.pki import KeyPair


@cache
def _signer(ca: KeyPair) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return x509.load_pem_x509_certificate(ca.cert_pem).subject, key


_LEAF_KEY = ec.generate_private_key(ec.SECP256R1()).public_key()  # one leaf key: only the subject varies
_START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def cert_with_subject(ca: KeyPair, subject: x509.Name) -> bytes:
    """A leaf certificate (DER) with exactly this subject, signed by `ca`."""
    issuer, key = _signer(ca)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(_LEAF_KEY)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_START)
        .not_valid_after(_START + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.DER)
    )


def with_version(der: bytes, version: int) -> bytes:
    """`der` with its TBSCertificate's version INTEGER changed (v3 is 2): a certificate OpenSSL still reads
    and `cryptography` refuses (`InvalidVersion`); the signature no longer matters to either reader."""
    marker = bytes([0xA0, 0x03, 0x02, 0x01, 0x02])
    at = der.index(marker)
    return der[: at + 4] + bytes([version]) + der[at + 5 :]
