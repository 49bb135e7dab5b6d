"""Which trusted CA signed a client certificate, checked with `cryptography`: the child process of
`adapter.auth.judge_in_child`.

Why a child: the serving adapter does not import `cryptography` (~7.5 MiB of RSS for the life of the
process; gpuwarden/x509lite.py). The TLS handshake has already verified a client certificate against every
trusted CA; authentication must know *which* set signed it (the front-proxy CAs, whose certificates may
assert users in headers, or the client CAs, whose certificates are users), which takes a signature check.
The verdict is remembered per certificate and trust (`auth.Authenticator`), so this runs once per client
certificate the adapter sees, not per request.

It also reads the certificate's subject (every CN, every O, in order) with `cryptography`, so the serving
process takes an identity from a certificate only when its own reader (`x509lite`) reads the same.

A certificate `cryptography` cannot read (OpenSSL accepted it in the handshake; `cryptography` is
stricter) is a verdict too - `readable: false`, signed by no trusted CA - not a failure of the child: the
serving process remembers it like any other verdict instead of starting a child for it on every request.

Child protocol: a JSON request on stdin `{"cert": DER base64, "requestheader": [DER base64], "client":
[DER base64]}`, the verdict on stdout as `{"readable": bool, "requestheader": bool, "client": bool,
"common_names": [str], "organizations": [str]}` (`error`: why, when not readable).
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID


def issued_by(cert: x509.Certificate, cas: Sequence[x509.Certificate]) -> bool:
    """Whether one of `cas` directly signed `cert` (the TLS layer already checked validity)."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):
            continue
    return False


def verdict(cert_der: bytes, requestheader: Sequence[bytes], client: Sequence[bytes]) -> tuple[bool, bool]:
    """(signed by a front-proxy CA, signed by a client CA)."""
    cert = x509.load_der_x509_certificate(cert_der)
    load = x509.load_der_x509_certificate
    return issued_by(cert, [load(d) for d in requestheader]), issued_by(cert, [load(d) for d in client])


def subject(cert_der: bytes) -> tuple[list[str], list[str]]:
    """(every CN of the subject, every O), in order, as `cryptography` reads them."""
    name = x509.load_der_x509_certificate(cert_der).subject
    return [str(a.value) for a in name.get_attributes_for_oid(NameOID.COMMON_NAME)], [
        str(a.value) for a in name.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    ]


def answer(cert: bytes, requestheader: Sequence[bytes], client: Sequence[bytes]) -> dict[str, object]:
    """The child's verdict on one certificate; one `cryptography` cannot read is `readable: false`."""
    try:
        front, by_client = verdict(cert, requestheader, client)
        common_names, organizations = subject(cert)
    except Exception as exc:  # ValueError, InvalidVersion, a Rust panic: unreadable whichever it is
        return {
            "readable": False,
            "requestheader": False,
            "client": False,
            "common_names": [],
            "organizations": [],
            "error": f"{type(exc).__name__}: {exc}"[:300],
        }
    return {
        "readable": True,
        "requestheader": front,
        "client": by_client,
        "common_names": common_names,
        "organizations": organizations,
    }


def main() -> int:
    request = json.load(sys.stdin)

    def ders(key: str) -> list[bytes]:
        return [base64.b64decode(d) for d in request[key]]

    cert = base64.b64decode(request["cert"])
    json.dump(answer(cert, ders("requestheader"), ders("client")), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
