"""The adapter's own X.509 reader (gpuwarden/x509lite.py) reads what `cryptography` reads — the subject's CN
and O, the issuer and subject names, notAfter, the fingerprint — for ECDSA and RSA leaves, CAs, client
certificates and every CA of the system bundle; and refuses what is not a certificate. The signature checks
and the self-signed pair, done in child processes, agree with `cryptography` in this process."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Sequence
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from adapter import auth, certjudge, tls
from gpuwarden import x509lite
from gpuwarden.x509lite import Certificate
from harness.testbed import pki

CA = pki.make_ca("front-proxy-ca")
OTHER_CA = pki.make_ca("other-ca")
ALICE = pki.issue(CA, "alice", organizations=("team-a", "team-b"), client=True)
SYSTEM_BUNDLE = Path(ssl.get_default_verify_paths().openssl_cafile)


def bundles() -> list[bytes]:
    out = [
        tls.self_signed(["ec.test"])[0],
        tls.self_signed(["rsa.test"], algorithm="rsa")[0],
        CA.cert_pem,
        ALICE.cert_pem,
        ALICE.cert_pem + CA.cert_pem,
    ]
    if SYSTEM_BUNDLE.is_file():
        out.append(SYSTEM_BUNDLE.read_bytes())
    return out


@pytest.mark.filterwarnings("ignore::cryptography.utils.CryptographyDeprecationWarning")
@pytest.mark.parametrize("pem", bundles())
def test_reads_what_cryptography_reads(pem: bytes) -> None:
    theirs, ours = x509.load_pem_x509_certificates(pem), x509lite.load_pem(pem)
    assert len(ours) == len(theirs)
    for c, lite in zip(theirs, ours, strict=True):
        names = [str(a.value) for a in c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        orgs = tuple(str(a.value) for a in c.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
        assert lite.common_names == tuple(names)
        assert lite.common_name == (names[-1] if names else "")  # Go's pkix: the last CN
        assert lite.organizations == orgs
        assert lite.not_after == c.not_valid_after_utc
        assert lite.issuer == c.issuer.public_bytes() and lite.subject == c.subject.public_bytes()
        assert lite.fingerprint() == c.fingerprint(hashes.SHA256()).hex()
        assert lite.der == c.public_bytes(serialization.Encoding.DER)
        assert x509.load_pem_x509_certificate(lite.pem().encode()) == c


def test_client_certificate_fields() -> None:
    alice = x509lite.load_pem(ALICE.cert_pem)[0]
    assert (alice.common_name, alice.organizations) == ("alice", ("team-a", "team-b"))
    assert alice.issuer == x509lite.load_pem(CA.cert_pem)[0].subject


def der_of(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


@pytest.mark.parametrize(
    "pem",
    [
        pytest.param(b"hello", id="no-pem"),
        pytest.param(ALICE.cert_pem[:200], id="truncated-pem"),
        pytest.param(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n", id="not-base64"),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\n"
            + base64.encodebytes(der_of(ALICE.cert_pem)[:-10])
            + b"-----END CERTIFICATE-----\n",
            id="truncated-der",
        ),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\n"
            + base64.encodebytes(b"\x30\x03\x02\x01\x05")
            + b"-----END CERTIFICATE-----\n",
            id="not-a-certificate",
        ),
    ],
)
def test_refuses_what_is_not_a_certificate(pem: bytes) -> None:
    with pytest.raises(ValueError):
        x509lite.load_pem(pem)
    with pytest.raises(ValueError):
        x509.load_pem_x509_certificates(pem)


def test_blank_input_holds_no_certificate() -> None:
    assert x509lite.load_pem(b" \n") == []


@pytest.mark.parametrize(
    ("cert", "expected"),
    [
        pytest.param(ALICE, (True, False), id="front-proxy-ca"),
        pytest.param(pki.issue(OTHER_CA, "bob", client=True), (False, True), id="client-ca"),
        pytest.param(pki.issue(pki.make_ca("stranger"), "eve", client=True), (False, False), id="neither"),
    ],
)
def test_judge_in_child_checks_signatures_like_cryptography(
    cert: pki.KeyPair, expected: tuple[bool, bool]
) -> None:
    rh, client = x509lite.load_pem(CA.cert_pem), x509lite.load_pem(OTHER_CA.cert_pem)
    der = der_of(cert.cert_pem)
    assert certjudge.verdict(der, [c.der for c in rh], [c.der for c in client]) == expected
    lite = x509lite.parse(der)
    assert asyncio.run(auth.judge_in_child(der, rh, client)) == auth.Verdict(
        *expected, lite.common_names, lite.organizations
    )


class Judged:
    """A judge whose subject reading is given: stands in for the child to test the cross-check."""

    def __init__(self, verdict: auth.Verdict) -> None:
        self.verdict, self.calls = verdict, 0

    async def __call__(
        self, der: bytes, rh: Sequence[Certificate], client: Sequence[Certificate]
    ) -> auth.Verdict:
        self.calls += 1
        return self.verdict


@pytest.mark.parametrize(
    ("common_names", "organizations", "user"),
    [
        pytest.param(("bob",), (), auth.UserInfo("bob", ()), id="readers-agree"),
        pytest.param(("mallory",), (), None, id="common-name-differs"),
        pytest.param(("bob", "mallory"), (), None, id="common-names-differ"),
        pytest.param(("bob",), ("system:masters",), None, id="organizations-differ"),
    ],
)
def test_an_identity_is_taken_only_when_both_readers_agree(
    common_names: tuple[str, ...], organizations: tuple[str, ...], user: auth.UserInfo | None
) -> None:
    bob = der_of(pki.issue(OTHER_CA, "bob", client=True).cert_pem)
    judge = Judged(auth.Verdict(False, True, common_names, organizations))
    authn = auth.Authenticator(None, tuple(x509lite.load_pem(OTHER_CA.cert_pem)), None, judge=judge)
    assert asyncio.run(authn.authenticate(bob, {})) == user


def test_self_signed_in_child_is_a_serving_pair() -> None:
    cert_pem, key_pem = tls.self_signed_in_child(["adapter.test"], days=2)
    tls.context_for(cert_pem, key_pem)  # OpenSSL takes the pair
    cert = x509.load_pem_x509_certificate(cert_pem)
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "adapter.test" in alt.get_values_for_type(x509.DNSName)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 2 * 86400 <= lifetime.total_seconds() <= 2 * 86400 + 600
