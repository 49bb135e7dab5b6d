"""Serving-certificate rotation without a restart: poll the cert/key files, serve a valid new pair.

Why: cert-manager and kubelet rotate certificates by rewriting the mounted files; prometheus-adapter
(k8s.io/apiserver's dynamiccertificates) notices and serves the new pair, so a drop-in replacement must too.
Every `interval` the two files are read and hashed (they are a few KiB; reading beats trusting mtime on
filesystems with coarse timestamps). A new digest is judged by `decide` — pure, table-tested — and only a
parseable pair whose key matches the certificate is built into a NEW `ssl.SSLContext` (by the factory the
listener's own context came from, so versions and client-certificate verification are the same; OpenSSL
refusing it is a rejection too).

Why a new context rather than `load_cert_chain` into the live one: OpenSSL keeps one certificate per key
type, so an ECDSA pair loaded over an RSA one leaves the RSA certificate in place, and a client offering only
RSA cipher suites would go on being served the old (perhaps revoked) certificate. The listener's context
keeps its place in the socket; its `sni_callback` — which OpenSSL calls on every ClientHello, with or
without SNI — moves each new connection onto the newest context before a certificate is chosen.

A bad pair (half-written during a rotation, corrupt, mismatched) is logged, counted in
`gpuwarden_adapter_certificate_reloads_total{outcome}` and otherwise ignored: the old pair keeps serving,
and the same bad content is not retried until the files change again. The loaded bytes are the validated
bytes (through a private temporary copy), never a second read that could race the rotation.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import hashlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes, PublicKeyTypes

from adapter.selfmetrics import AdapterMetrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0

ContextFactory = Callable[[bytes, bytes], ssl.SSLContext]
"""(certificate PEM, key PEM) -> a new server context serving them, or `ssl.SSLError`/`OSError`."""


class Outcome(enum.StrEnum):
    """What one look at the files concluded; every value but UNCHANGED is a counter label."""

    UNCHANGED = "unchanged"
    SUCCESS = "success"
    INVALID = "invalid"
    MISMATCHED = "mismatched"
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class Decision:
    """The verdict on the current file contents: load them (SUCCESS) or keep serving what is loaded."""

    outcome: Outcome
    digest: str
    reason: str = ""
    not_after: datetime.datetime | None = None
    fingerprint: str = ""


def digest_of(cert_pem: bytes, key_pem: bytes) -> str:
    """Content identity of a pair (sha256 of both files)."""
    return hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()


def _spki(public: CertificatePublicKeyTypes | PublicKeyTypes) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def decide(loaded_digest: str | None, cert_pem: bytes, key_pem: bytes) -> Decision:
    """Pure: whether the pair on disk should replace the pair loaded (`loaded_digest`; None: nothing yet)."""
    digest = digest_of(cert_pem, key_pem)
    if digest == loaded_digest:
        return Decision(Outcome.UNCHANGED, digest)
    try:
        chain = x509.load_pem_x509_certificates(cert_pem) if cert_pem.strip() else []
    except ValueError as exc:
        return Decision(Outcome.INVALID, digest, f"certificate file is not PEM certificates: {exc}")
    if not chain:
        return Decision(Outcome.INVALID, digest, "certificate file holds no certificate")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        return Decision(Outcome.INVALID, digest, f"key file is not an unencrypted PEM private key: {exc}")
    leaf = chain[0]
    if _spki(leaf.public_key()) != _spki(key.public_key()):
        return Decision(Outcome.MISMATCHED, digest, "the private key does not belong to the certificate")
    return Decision(
        Outcome.SUCCESS,
        digest,
        not_after=leaf.not_valid_after_utc,
        fingerprint=leaf.fingerprint(hashes.SHA256()).hex(),
    )


def expiry_of(cert_pem: bytes) -> float | None:
    """Unix time the first certificate of a PEM bundle expires, or None if there is none."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return None
    return chain[0].not_valid_after_utc.timestamp() if chain else None


class CertificateReloader:
    """Keeps the listener context `ctx` handing every new connection the newest valid pair on disk."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        cert_file: Path,
        key_file: Path,
        *,
        loaded: tuple[bytes, bytes],
        metrics: AdapterMetrics,
        make_context: ContextFactory,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        """`ctx`: the listener's context, serving `loaded` (the (cert, key) PEM in it, so the first poll
        does not reload them); its `sni_callback` is taken over. `make_context` builds each replacement
        with the listener's settings. `interval` is not bounded here: tests poll faster than the config
        allows."""
        self.ctx = ctx
        self.current = ctx  # what new connections are served; replaced whole, never modified
        self.cert_file, self.key_file = cert_file, key_file
        self.interval = interval
        self._make_context = make_context
        self._metrics = metrics
        self._judged = digest_of(*loaded)  # the last content looked at, good or bad: each is judged once
        expiry = expiry_of(loaded[0])
        if expiry is not None:
            metrics.certificate_expiry.set(expiry)
        ctx.sni_callback = self._select

    def _select(
        self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, listener: ssl.SSLContext
    ) -> None:
        """OpenSSL's servername callback, on each ClientHello before the certificate is chosen."""
        current = self.current
        if conn.context is not current:
            conn.context = current

    def poll(self) -> Outcome:
        """Look at the files once; serve them to new connections if they changed and are a valid pair."""
        try:
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            return self._reject(
                Decision(Outcome.UNREADABLE, f"unreadable:{exc.errno}", exc.strerror or str(exc))
            )
        decision = decide(self._judged, cert_pem, key_pem)
        if decision.outcome is Outcome.UNCHANGED:
            return decision.outcome
        if decision.outcome is not Outcome.SUCCESS:
            return self._reject(decision)
        try:
            fresh = self._make_context(cert_pem, key_pem)
        except (ssl.SSLError, OSError) as exc:
            return self._reject(
                Decision(Outcome.INVALID, decision.digest, f"OpenSSL refused the pair: {exc}")
            )
        self.current = fresh
        self._judged = decision.digest
        self._metrics.certificate_reloads.labels(Outcome.SUCCESS.value).inc()
        assert decision.not_after is not None
        self._metrics.certificate_expiry.set(decision.not_after.timestamp())
        log.info(
            "serving certificate reloaded",
            extra={
                "cert_file": str(self.cert_file),
                "sha256": decision.fingerprint,
                "not_after": decision.not_after.isoformat(),
            },
        )
        return Outcome.SUCCESS

    def _reject(self, decision: Decision) -> Outcome:
        if decision.digest == self._judged:
            return Outcome.UNCHANGED  # already reported; wait for the files to change again
        self._judged = decision.digest
        self._metrics.certificate_reloads.labels(decision.outcome.value).inc()
        log.error(
            "serving certificate not reloaded; still serving the previous one",
            extra={
                "outcome": decision.outcome.value,
                "reason": decision.reason,
                "cert_file": str(self.cert_file),
                "key_file": str(self.key_file),
            },
        )
        return decision.outcome

    async def run(self) -> None:
        """Poll every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.poll()
            except Exception:  # a reload bug must never take the listener down
                log.exception("serving certificate check failed")
