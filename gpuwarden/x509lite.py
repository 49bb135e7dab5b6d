"""What the serving processes read from X.509 certificates, without the `cryptography` package.

In the kernel because certificate rotation (`gpuwarden.certreload`) reads certificates for both the adapter
and the controller's extender port; the adapter's reasons for not importing `cryptography` are these:

Why: `cryptography` costs the adapter ~7.5 MiB of RSS for the life of the process (its Rust library's pages
and the x509 modules), while a serving adapter only reads a few fields of a few certificates — the trusted
client CAs (to hand OpenSSL as PEM, to compare across reloads, to log fingerprints), the serving certificate's
expiry, a client certificate's common names and organizations. This reads exactly those from the DER
encoding. Everything that needs cryptography proper — checking which CA signed a client certificate,
generating the self-signed serving pair — runs in a short child process (`adapter.certjudge`,
`adapter.selfsigned`), and OpenSSL itself (through `ssl`) verifies the TLS handshake and matches keys.

Which CN is "the" common name: Kubernetes' authenticators take `chain[0].Subject.CommonName`, and Go's
`pkix.Name.FillFromRDNSequence` assigns every CN attribute in turn, so the *last* one wins; `common_name` is
that one. A subject with several CNs (or none) gives no identity at all (`adapter.auth.sole_common_name`):
a certificate whose readers could disagree on who it names is refused rather than read one way.

What it must not do: accept what it cannot read (malformed DER is a `ValueError`, as `cryptography`'s loader
raises), or judge trust: nothing here checks a signature.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import re
import ssl
from dataclasses import dataclass

SEQUENCE, SET, OID, BIT_STRING, INTEGER = 0x30, 0x31, 0x06, 0x03, 0x02
VERSION = 0xA0  # [0] EXPLICIT, first in the TBSCertificate when present
COMMON_NAME = bytes([0x55, 0x04, 0x03])  # 2.5.4.3
ORGANIZATION = bytes([0x55, 0x04, 0x0A])  # 2.5.4.10
_STRINGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x16: "ascii",  # IA5String
    0x14: "ascii",  # TeletexString: ASCII only (readers disagree on the rest: Latin-1, UTF-8, T.61)
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n(.*?)-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Certificate:
    """One certificate: its DER and the fields the adapter reads."""

    der: bytes
    issuer: bytes  # the DER of the issuer Name, for comparisons
    subject: bytes  # the DER of the subject Name
    common_name: str  # the last CN of the subject, as Go's pkix reads it; "" when it has none
    common_names: tuple[str, ...]  # every CN of the subject, in order
    organizations: tuple[str, ...]  # every O of the subject, in order
    not_after: datetime.datetime  # UTC

    def pem(self) -> str:
        return ssl.DER_cert_to_PEM_cert(self.der)

    def fingerprint(self) -> str:
        """sha256 of the DER, hex (what `openssl x509 -fingerprint -sha256` shows, without colons)."""
        return hashlib.sha256(self.der).hexdigest()


def _element(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at `pos`, which must end by `end`."""
    if pos + 2 > end:
        raise ValueError("truncated DER element")
    tag, length = data[pos], data[pos + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("DER tag numbers above 30 are not used in certificates")
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > end:
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    if pos + length > end:
        raise ValueError("truncated DER element")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, element start, content start, content end) of every element in data[start:end]."""
    out = []
    pos = start
    while pos < end:
        tag, content, stop = _element(data, pos, end)
        out.append((tag, pos, content, stop))
        pos = stop
    return out


def _expect(items: list[tuple[int, int, int, int]], index: int, tag: int, what: str) -> tuple[int, int, int]:
    if index >= len(items) or items[index][0] != tag:
        raise ValueError(f"certificate {what}: not the DER expected")
    return items[index][1], items[index][2], items[index][3]


def _attributes(data: bytes, start: int, end: int, oid: bytes) -> tuple[str, ...]:
    """The string values of every `oid` attribute in a Name's content (RDNs in order)."""
    values = []
    for tag, _, rdn_start, rdn_end in _children(data, start, end):
        if tag != SET:
            raise ValueError("certificate name: an RDN is not a SET")
        for atag, _, a_start, a_end in _children(data, rdn_start, rdn_end):
            parts = _children(data, a_start, a_end) if atag == SEQUENCE else []
            if len(parts) != 2 or parts[0][0] != OID:
                raise ValueError("certificate name: an attribute is not (OID, value)")
            if data[parts[0][2] : parts[0][3]] != oid:
                continue
            vtag, _, v_start, v_end = parts[1]
            if vtag not in _STRINGS:
                raise ValueError(f"certificate name: value type 0x{vtag:02x} is not a string")
            values.append(data[v_start:v_end].decode(_STRINGS[vtag]))
    return tuple(values)


def _time(tag: int, raw: bytes) -> datetime.datetime:
    text = raw.decode("ascii")
    if tag == 0x17 and len(text) == 13 and text.endswith("Z"):  # UTCTime YYMMDDHHMMSSZ (RFC 5280)
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18 or len(text) != 15 or not text.endswith("Z"):  # GeneralizedTime YYYYMMDDHHMMSSZ
        raise ValueError("certificate validity: not an RFC 5280 time")
    parsed = datetime.datetime.strptime(text, "%Y%m%d%H%M%SZ")
    return parsed.replace(tzinfo=datetime.UTC)


def parse(der: bytes) -> Certificate:
    """The fields of one DER certificate; `ValueError` if it is not one."""
    tag, start, end = _element(der, 0, len(der))
    if tag != SEQUENCE or end != len(der):
        raise ValueError("not a DER certificate")
    outer = _children(der, start, end)
    if len(outer) != 3 or outer[0][0] != SEQUENCE or outer[1][0] != SEQUENCE or outer[2][0] != BIT_STRING:
        raise ValueError("not a DER certificate (tbsCertificate, signatureAlgorithm, signature)")
    tbs = _children(der, outer[0][2], outer[0][3])
    i = 1 if tbs and tbs[0][0] == VERSION else 0
    _expect(tbs, i, INTEGER, "serial number")
    _expect(tbs, i + 1, SEQUENCE, "signature algorithm")
    issuer_at, _, issuer_end = _expect(tbs, i + 2, SEQUENCE, "issuer")
    _, validity_start, validity_end = _expect(tbs, i + 3, SEQUENCE, "validity")
    subject_at, subject_start, subject_end = _expect(tbs, i + 4, SEQUENCE, "subject")
    _expect(tbs, i + 5, SEQUENCE, "public key")
    validity = _children(der, validity_start, validity_end)
    if len(validity) != 2:
        raise ValueError("certificate validity: not (notBefore, notAfter)")
    after_tag, _, after_start, after_end = validity[1]
    common_names = _attributes(der, subject_start, subject_end, COMMON_NAME)
    return Certificate(
        der=der,
        issuer=der[issuer_at:issuer_end],
        subject=der[subject_at:subject_end],
        common_name=common_names[-1] if common_names else "",
        common_names=common_names,
        organizations=_attributes(der, subject_start, subject_end, ORGANIZATION),
        not_after=_time(after_tag, der[after_start:after_end]),
    )


def load_pem(pem: bytes) -> list[Certificate]:
    """Every certificate of a PEM bundle, in order ([] for blank input); `ValueError` if a block is not a
    certificate or non-blank input holds none."""
    if not pem.strip():
        return []
    blocks = _PEM.findall(pem)
    if not blocks:
        raise ValueError("no PEM certificate found")
    out = []
    for block in blocks:
        try:
            der = base64.b64decode(b"".join(block.split()), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"a PEM certificate is not base64: {exc}") from None
        out.append(parse(der))
    return out
