"""Serving-certificate rotation: the pure verdict on new file contents, and the reloader on a live context.

Handshakes here are real TLS, in memory (`ssl.MemoryBIO`): what a new client would be served is read from
the handshake, not from the reloader's own bookkeeping. The listener end to end is in
tests/integration/test_adapter_certreload.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from prometheus_client import CollectorRegistry

from adapter import tls
from adapter.certreload import CertificateReloader, Outcome, decide, digest_of
from adapter.selfmetrics import new_metrics

A = tls.self_signed(["a.test"])
B = tls.self_signed(["b.test"])


def served_fingerprint(ctx: ssl.SSLContext) -> str:
    """sha256 of the certificate `ctx` presents to a fresh client (an in-memory handshake)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_side=False)
    s = ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for end in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
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


def reloader_for(tmp: Path) -> tuple[CertificateReloader, Files, CollectorRegistry]:
    files = Files(tmp, A)
    registry = CollectorRegistry()
    ctx, _ = tls.server_context(files.cert, files.key)
    reloader = CertificateReloader(
        ctx, files.cert, files.key, loaded=A, metrics=new_metrics(registry), interval=1.0
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
    with caplog.at_level(logging.ERROR, logger="adapter.certreload"):
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
