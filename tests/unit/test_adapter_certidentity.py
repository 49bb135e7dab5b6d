"""Who a client certificate names, and how often it is judged (issue 44, X1 and X2).

X2: Kubernetes names the user `chain[0].Subject.CommonName`, which Go's pkix fills with the *last* CN;
`x509lite` reads the same one, and a subject with other than exactly one CN names no user at all (nor a
front proxy among allowed names). X1: a certificate OpenSSL accepts and `cryptography` refuses is a
verdict remembered like any other - one child process for it, not one per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from cryptography import x509
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

from adapter import auth, certjudge
from gpuwarden import x509lite
from gpuwarden.x509lite import Certificate
from harness.testbed.pki import make_ca
from tests.unit.x509_support import cert_with_subject, with_version

pytestmark = pytest.mark.filterwarnings("ignore:Attribute's length:UserWarning")

CA = make_ca("client-ca")
CN, ORG = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME


def subject(*attrs: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    rdns = [x509.RelativeDistinguishedName([x509.NameAttribute(oid, v, _validate=False)]) for oid, v in attrs]
    return x509.Name(rdns)


TWO_CNS = subject((CN, "alice"), (ORG, "team-a"), (CN, "mallory"))
MULTI_VALUED = x509.Name(
    [x509.RelativeDistinguishedName([x509.NameAttribute(CN, "alice"), x509.NameAttribute(CN, "mallory")])]
)


@pytest.mark.parametrize(
    ("name", "common_name", "common_names"),
    [
        pytest.param(subject((CN, "alice")), "alice", ("alice",), id="one-cn"),
        pytest.param(TWO_CNS, "mallory", ("alice", "mallory"), id="two-cns-last-wins"),
        pytest.param(subject((ORG, "team-a")), "", (), id="no-cn"),
    ],
)
def test_common_name_is_the_last_as_go_pkix_reads_it(
    name: x509.Name, common_name: str, common_names: tuple[str, ...]
) -> None:
    cert = x509lite.parse(cert_with_subject(CA, name))
    assert (cert.common_name, cert.common_names) == (common_name, common_names)


@pytest.mark.parametrize(
    ("name", "user"),
    [
        pytest.param(subject((CN, "alice"), (ORG, "g")), auth.UserInfo("alice", ("g",)), id="one-cn"),
        pytest.param(TWO_CNS, None, id="two-cns-refused"),
        pytest.param(MULTI_VALUED, None, id="two-cns-in-one-rdn-refused"),
        pytest.param(subject((ORG, "g")), None, id="no-cn-refused"),
        pytest.param(subject((CN, "")), None, id="empty-cn-refused"),
    ],
)
def test_a_client_certificate_names_a_user_only_with_exactly_one_cn(
    name: x509.Name, user: auth.UserInfo | None
) -> None:
    assert auth.cert_user(x509lite.parse(cert_with_subject(CA, name))) == user


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        pytest.param(subject((CN, "front-proxy-client")), True, id="allowed-name"),
        pytest.param(subject((CN, "front-proxy-client"), (CN, "x")), False, id="allowed-first-of-two"),
        pytest.param(subject((CN, "x"), (CN, "front-proxy-client")), False, id="allowed-last-of-two"),
    ],
)
def test_a_front_proxy_among_allowed_names_has_exactly_one_cn(name: x509.Name, allowed: bool) -> None:
    cfg = auth.RequestHeaderConfig(ca=(), allowed_names=("front-proxy-client",))
    assert auth.front_proxy(cfg, x509lite.parse(cert_with_subject(CA, name)), issued=True) is allowed


def test_a_certificate_cryptography_refuses_is_judged_once() -> None:
    der = with_version(cert_with_subject(CA, subject((CN, "alice"))), 5)
    x509lite.parse(der)  # the serving process reads it (OpenSSL did too) ...
    assert certjudge.answer(der, [], [])["readable"] is False  # ... cryptography does not
    calls = 0

    async def counted(cert: bytes, rh: Sequence[Certificate], client: Sequence[Certificate]) -> auth.Verdict:
        nonlocal calls
        calls += 1
        return await auth.judge_in_child(cert, rh, client)

    ca = tuple(x509lite.load_pem(CA.cert_pem))
    authenticator = auth.Authenticator(None, ca, None, judge=counted)

    async def three_requests() -> list[auth.UserInfo | None]:
        return [await authenticator.authenticate(der, {}) for _ in range(3)]

    assert asyncio.run(three_requests()) == [None, None, None]
    assert calls == 1


def test_remembered_verdicts_are_bounded_least_recently_used_first() -> None:
    class Judge:
        calls = 0

        async def __call__(self, cert: bytes, rh: object, client: object) -> auth.Verdict:
            Judge.calls += 1
            lite = x509lite.parse(cert)
            return auth.Verdict(False, True, lite.common_names, lite.organizations)

    ca = tuple(x509lite.load_pem(CA.cert_pem))
    authenticator = auth.Authenticator(None, ca, None, judge=Judge())
    ders = [cert_with_subject(CA, subject((CN, f"u{i}"))) for i in range(auth.SEEN_CERTIFICATES + 1)]

    async def run() -> None:
        for der in ders:
            await authenticator.authenticate(ders[0], {})  # kept in use: never the one dropped
            await authenticator.authenticate(der, {})

    asyncio.run(run())
    assert Judge.calls == len(ders)
    asyncio.run(authenticator.authenticate(ders[0], {}))
    assert Judge.calls == len(ders)  # still remembered
    asyncio.run(authenticator.authenticate(ders[1], {}))
    assert Judge.calls == len(ders) + 1  # the least recently used was dropped


def test_a_non_ascii_teletex_string_is_refused() -> None:
    """Found by the differential fuzzer: `cryptography` (and Go) read a TeletexString's bytes as UTF-8,
    x509lite read them as Latin-1 - two names for one certificate. Only ASCII reads alike everywhere."""
    name = x509.Name([x509.NameAttribute(CN, "caf\u00e9", _type=_ASN1Type.T61String)])
    with pytest.raises(ValueError):
        x509lite.parse(cert_with_subject(CA, name))
    ascii_name = x509.Name([x509.NameAttribute(CN, "cafe", _type=_ASN1Type.T61String)])
    assert x509lite.parse(cert_with_subject(CA, ascii_name)).common_names == ("cafe",)
