"""Serving-certificate rotation: the pure verdict on new file contents, and the reloader on a live context.

Handshakes here are real TLS, in memory (`ssl.MemoryBIO`): what a new client would be served is read from
the handshake, not from the reloader's own bookkeeping. Clients limited to one key type's cipher suites show
that a rotation to another key type leaves nothing of the old pair behind. The listener end to end is in
tests/integration/test_adapter_certreload.py.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import ssl
from pathlib import Path
from typing import Literal

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from adapter import tls
from adapter.selfmetrics import new_metrics
from gpuwarden.certreload import CertificateReloader, Outcome, decide, digest_of
from gpuwarden.x509lite import Certificate
from harness.testbed import pki

A = tls.self_signed(["a.test"])
B = tls.self_signed(["b.test"])
BY_KEY_TYPE = {"ecdsa": tls.self_signed(["ec.test"]), "rsa": tls.self_signed(["rsa.test"], algorithm="rsa")}
TLS12_SUITE = {"ecdsa": "ECDHE-ECDSA-AES128-GCM-SHA256", "rsa": "ECDHE-RSA-AES128-GCM-SHA256"}


def client_context(
    only: Literal["ecdsa", "rsa"] | None = None, cert: pki.KeyPair | None = None, tmp: Path | None = None
) -> ssl.SSLContext:
    """A client that checks nothing; `only`: TLS 1.2 with just that key type's suite; `cert`: presented."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    if only is not None:
        client.maximum_version = ssl.TLSVersion.TLSv1_2
        client.set_ciphers(TLS12_SUITE[only])
    if cert is not None:
        assert tmp is not None
        client.load_cert_chain(*cert.write(tmp, "client"))
    return client


def handshake(
    ctx: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str | None = None
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """(client end, server end) after an in-memory handshake; raises `ssl.SSLError` if either refuses."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=server_hostname)
    s = ctx.wrap_bio(s_in, s_out, server_side=True)
    done: set[ssl.SSLObject] = set()
    for _ in range(10):
        for end in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
                done.add(end)
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    assert done == {c, s}, "the handshake did not finish"
    return c, s


def served_fingerprint(
    ctx: ssl.SSLContext, client: ssl.SSLContext | None = None, server_hostname: str | None = None
) -> str:
    """sha256 of the certificate `ctx` presents to a fresh client (an in-memory handshake)."""
    c, _ = handshake(ctx, client or client_context(), server_hostname)
    der = c.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def fingerprint(pair: tuple[bytes, bytes]) -> str:
    return x509.load_pem_x509_certificates(pair[0])[0].fingerprint(hashes.SHA256()).hex()


@pytest.mark.parametrize(
    ("loaded", "cert", "key", "outcome", "reason"),
    [
        pytest.param(A, *A, Outcome.UNCHANGED, "", id="unchanged"),
        pytest.param(A, *B, Outcome.SUCCESS, "", id="changed-and-valid"),
        pytest.param(None, *A, Outcome.SUCCESS, "", id="first-look"),
        pytest.param(A, B[0] + A[0], B[1], Outcome.SUCCESS, "", id="chain-leaf-first"),
        pytest.param(A, b"", B[1], Outcome.INVALID, "holds no certificate", id="empty-cert"),
        pytest.param(A, B[0][:200], B[1], Outcome.INVALID, "not PEM certificates", id="truncated-cert"),
        pytest.param(A, B[0], b"garbage", Outcome.INVALID, "not an unencrypted PEM", id="bad-key"),
        pytest.param(A, B[0], B[0], Outcome.INVALID, "not an unencrypted PEM", id="cert-as-key"),
        pytest.param(A, B[0], A[1], Outcome.MISMATCHED, "does not belong", id="new-cert-old-key"),
        pytest.param(A, A[0], B[1], Outcome.MISMATCHED, "does not belong", id="old-cert-new-key"),
    ],
)
def test_decide(
    loaded: tuple[bytes, bytes] | None, cert: bytes, key: bytes, outcome: Outcome, reason: str
) -> None:
    decision = decide(digest_of(*loaded) if loaded else None, cert, key)
    assert decision.outcome is outcome
    assert reason in decision.reason
    assert decision.digest == digest_of(cert, key)
    if outcome is Outcome.SUCCESS:
        assert decision.fingerprint == fingerprint((cert, key))
        assert decision.not_after is not None
    else:
        assert decision.not_after is None


class Files:
    def __init__(self, tmp: Path, pair: tuple[bytes, bytes]) -> None:
        self.cert, self.key = tmp / "tls.crt", tmp / "tls.key"
        self.write(*pair)

    def write(self, cert: bytes | None = None, key: bytes | None = None) -> None:
        for path, data in ((self.cert, cert), (self.key, key)):
            if data is not None:
                tmp = path.with_suffix(".new")
                tmp.write_bytes(data)
                tmp.replace(path)  # as a rotation does: the file is swapped, never half-visible


def reloader_for(
    tmp: Path, first: tuple[bytes, bytes] = A, client_cas: tuple[Certificate, ...] = ()
) -> tuple[CertificateReloader, Files, CollectorRegistry]:
    files = Files(tmp, first)
    registry = CollectorRegistry()
    reloader = CertificateReloader(
        tls.context_for(*first, client_cas=client_cas),
        files.cert,
        files.key,
        loaded=first,
        metrics=new_metrics(registry),
        make_context=tls.context_for,
        client_cas={"client": client_cas},
    )
    return reloader, files, registry


def reloads(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value("gpuwarden_adapter_certificate_reloads_total", {"outcome": outcome})
    return value or 0.0


def expiry(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("gpuwarden_adapter_serving_certificate_expiry_timestamp_seconds")


def test_valid_swap_serves_the_new_pair_on_the_next_handshake(tmp_path: Path) -> None:
    reloader, files, registry = reloader_for(tmp_path)
    assert served_fingerprint(reloader.ctx) == fingerprint(A)
    assert reloader.poll() is Outcome.UNCHANGED
    before = expiry(registry)
    files.write(*B)
    assert reloader.poll() is Outcome.SUCCESS
    assert served_fingerprint(reloader.ctx) == fingerprint(B)
    assert reloads(registry, "success") == 1
    assert reloader.poll() is Outcome.UNCHANGED
    assert reloads(registry, "success") == 1
    assert before is not None and expiry(registry) is not None


def test_touch_without_new_content_is_not_a_reload(tmp_path: Path) -> None:
    reloader, files, registry = reloader_for(tmp_path)
    files.write(*A)
    assert reloader.poll() is Outcome.UNCHANGED
    assert reloads(registry, "success") == 0


def test_bad_swaps_keep_the_old_pair_and_are_counted_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reloader, files, registry = reloader_for(tmp_path)
    files.write(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with caplog.at_level(logging.ERROR, logger="gpuwarden.certreload"):
        assert reloader.poll() is Outcome.INVALID
        assert reloader.poll() is Outcome.UNCHANGED  # the same bad content is reported once
    assert [r.__dict__["outcome"] for r in caplog.records] == ["invalid"]
    assert served_fingerprint(reloader.ctx) == fingerprint(A)
    files.write(cert=B[0])  # half a rotation: new certificate, old key
    assert reloader.poll() is Outcome.MISMATCHED
    assert served_fingerprint(reloader.ctx) == fingerprint(A)
    files.write(key=B[1])  # the rotation completes
    assert reloader.poll() is Outcome.SUCCESS
    assert served_fingerprint(reloader.ctx) == fingerprint(B)
    assert {o: reloads(registry, o) for o in ("success", "invalid", "mismatched")} == {
        "success": 1,
        "invalid": 1,
        "mismatched": 1,
    }


def test_missing_file_keeps_serving_then_recovers(tmp_path: Path) -> None:
    reloader, files, registry = reloader_for(tmp_path)
    files.key.unlink()
    assert reloader.poll() is Outcome.UNREADABLE
    assert reloader.poll() is Outcome.UNCHANGED
    assert reloads(registry, "unreadable") == 1
    assert served_fingerprint(reloader.ctx) == fingerprint(A)
    files.write(*B)
    assert reloader.poll() is Outcome.SUCCESS
    assert served_fingerprint(reloader.ctx) == fingerprint(B)


def test_expiry_gauge_follows_the_served_certificate(tmp_path: Path) -> None:
    short = tls.self_signed(["short.test"], days=2)
    reloader, files, registry = reloader_for(tmp_path)
    long_expiry = expiry(registry)
    files.write(*short)
    assert reloader.poll() is Outcome.SUCCESS
    short_expiry = expiry(registry)
    assert long_expiry is not None and short_expiry is not None
    assert 360 * 86400 < long_expiry - short_expiry < 366 * 86400


@pytest.mark.parametrize(("old", "new"), [("rsa", "ecdsa"), ("ecdsa", "rsa")])
def test_rotation_to_another_key_type_leaves_nothing_of_the_old_pair(
    tmp_path: Path, old: Literal["ecdsa", "rsa"], new: Literal["ecdsa", "rsa"]
) -> None:
    reloader, files, _ = reloader_for(tmp_path, BY_KEY_TYPE[old])
    assert served_fingerprint(reloader.ctx, client_context(only=old)) == fingerprint(BY_KEY_TYPE[old])
    files.write(*BY_KEY_TYPE[new])
    assert reloader.poll() is Outcome.SUCCESS
    assert served_fingerprint(reloader.ctx, client_context(only=new)) == fingerprint(BY_KEY_TYPE[new])
    assert served_fingerprint(reloader.ctx) == fingerprint(BY_KEY_TYPE[new])
    # A client that can only use the old key type gets no certificate at all, not the old one.
    with pytest.raises(ssl.SSLError, match=r"NO_SHARED_CIPHER|no shared cipher"):
        handshake(reloader.ctx, client_context(only=old))


@pytest.mark.parametrize("server_hostname", [None, "b.test", "elsewhere.test"])
def test_new_pair_is_served_with_and_without_sni(tmp_path: Path, server_hostname: str | None) -> None:
    """The swap happens in OpenSSL's servername callback, which runs even when the client sends no SNI."""
    reloader, files, _ = reloader_for(tmp_path)
    files.write(*B)
    assert reloader.poll() is Outcome.SUCCESS
    assert served_fingerprint(reloader.ctx, server_hostname=server_hostname) == fingerprint(B)


def test_client_certificate_verification_survives_a_reload(tmp_path: Path) -> None:
    ca, stranger = pki.make_ca("front-proxy-ca"), pki.make_ca("someone-else")
    trusted = pki.issue(ca, "front-proxy-client", client=True)
    untrusted = pki.issue(stranger, "front-proxy-client", client=True)
    cas = tuple(tls.load_certificates(ca.cert_pem))
    reloader, files, _ = reloader_for(tmp_path, client_cas=cas)
    files.write(*B)
    assert reloader.poll() is Outcome.SUCCESS
    c, s = handshake(reloader.ctx, client_context(cert=trusted, tmp=tmp_path / "t"))
    assert s.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(trusted.cert_pem.decode())
    assert c.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(B[0].decode())
    _, s = handshake(reloader.ctx, client_context())  # a client certificate stays optional
    assert s.getpeercert(binary_form=True) is None
    with pytest.raises(ssl.SSLError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        handshake(reloader.ctx, client_context(cert=untrusted, tmp=tmp_path / "u"))


def weak_rsa_pair() -> tuple[bytes, bytes]:
    """A well-formed RSA-1024 pair: `decide` accepts it, OpenSSL's default security level does not."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weak.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_a_pair_openssl_refuses_is_not_served(tmp_path: Path) -> None:
    weak = weak_rsa_pair()
    assert decide(None, *weak).outcome is Outcome.SUCCESS
    reloader, files, registry = reloader_for(tmp_path)
    files.write(*weak)
    assert reloader.poll() is Outcome.INVALID
    assert served_fingerprint(reloader.ctx) == fingerprint(A)
    assert reloads(registry, "invalid") == 1
