"""Serving-certificate rotation without a restart: poll the cert/key files, serve a valid new pair.

Why: cert-manager and kubelet rotate certificates by rewriting the mounted files; prometheus-adapter
(k8s.io/apiserver's dynamiccertificates) notices and serves the new pair, so a drop-in replacement must too.
Both listeners that serve mounted certificates use it - the adapter's HTTPS port and the controller's
extender port - which is why it is the kernel's: one rotation logic, one set of outcomes.
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
the caller's reload counter (`gpuwarden_adapter_certificate_reloads_total{outcome}`,
`gpuwarden_extender_certificate_reloads_total{outcome}`) and otherwise ignored: the old pair keeps serving,
and the same bad content is not retried until the files change again. The loaded bytes are the validated
bytes (through a private temporary copy), never a second read that could race the rotation.

The trusted client CA files (the adapter's front-proxy `requestheader_client_ca_file` and `client_ca_file`,
the extender's `tls.client_ca_file`) are watched on the
same interval, as dynamiccertificates does: a file whose certificates changed (judged by `decide_cas`: it
must hold at least one PEM certificate) goes into the next serving context, so the TLS layer verifies
client certificates against it, and `on_cas` hands the same sets to the authenticator — both in one step
of the event loop, so no handshake or request sees one without the other. A bad CA file keeps the previous
CAs and is counted as `outcome="invalid"` like a bad pair (the log names the file).

CAs read from the kube-system/extension-apiserver-authentication ConfigMap (the kinds without a file) are
re-read on the same interval through `ca_fetch` (one GET; kube-apiserver rewrites the ConfigMap when its own
front-proxy or client CA files change) and judged exactly like files. A failed read, or a key that went
missing, keeps the previous CAs: an API hiccup must not make the adapter distrust the aggregator.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import hashlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuwarden import x509lite
from gpuwarden.tlscontext import load_pair
from gpuwarden.x509lite import Certificate

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0


class ContextFactory(Protocol):
    """(certificate PEM, key PEM, trusted client CAs) -> a new server context, or `ssl.SSLError`/`OSError`."""

    def __call__(
        self, cert_pem: bytes, key_pem: bytes, /, *, client_cas: Sequence[Certificate]
    ) -> ssl.SSLContext: ...


class ReloadMetrics(Protocol):
    """What a reloader counts into: reloads by `outcome` and the served pair's expiry (unix seconds).
    Each deployable names its own series (`gpuwarden_adapter_...`, `gpuwarden_extender_...`)."""

    @property
    def certificate_reloads(self) -> Counter: ...

    @property
    def certificate_expiry(self) -> Gauge: ...


CaSets = Mapping[str, tuple[Certificate, ...]]
"""Trusted client CAs by kind ("requestheader", "client"), in the order the TLS layer is given them."""


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


def _no_password() -> bytes:
    raise ValueError("the key is encrypted")  # never OpenSSL's prompt on a terminal


def key_problem(leaf_pem: str, key_pem: bytes) -> tuple[Outcome, str] | None:
    """None if `key_pem` is an unencrypted PEM private key belonging to the certificate `leaf_pem`, else
    (INVALID or MISMATCHED, why) — judged by OpenSSL loading the pair into a throw-away context.

    At security level 0: this judges the pair, not its strength (the serving context refuses what it must
    when the pair is loaded into it, and that is reported as a rejection of its own)."""
    if b"ENCRYPTED" in key_pem or b"PRIVATE KEY-----" not in key_pem:
        return Outcome.INVALID, "key file is not an unencrypted PEM private key"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    try:
        load_pair(ctx, leaf_pem.encode(), key_pem, password=_no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return Outcome.MISMATCHED, "the private key does not belong to the certificate"
        return Outcome.INVALID, f"key file is not an unencrypted PEM private key: {exc}"
    except (OSError, ValueError) as exc:
        return Outcome.INVALID, f"key file is not an unencrypted PEM private key: {exc}"
    return None


def decide(loaded_digest: str | None, cert_pem: bytes, key_pem: bytes) -> Decision:
    """Whether the pair on disk should replace the pair loaded (`loaded_digest`; None: nothing yet).

    Pure but for OpenSSL's check of the key (`key_problem`, through a private temporary copy)."""
    digest = digest_of(cert_pem, key_pem)
    if digest == loaded_digest:
        return Decision(Outcome.UNCHANGED, digest)
    try:
        chain = x509lite.load_pem(cert_pem)
    except ValueError as exc:
        return Decision(Outcome.INVALID, digest, f"certificate file is not PEM certificates: {exc}")
    if not chain:
        return Decision(Outcome.INVALID, digest, "certificate file holds no certificate")
    leaf = chain[0]
    problem = key_problem(leaf.pem(), key_pem)
    if problem is not None:
        return Decision(problem[0], digest, problem[1])
    return Decision(Outcome.SUCCESS, digest, not_after=leaf.not_after, fingerprint=leaf.fingerprint())


@dataclass(frozen=True)
class CaDecision:
    """The verdict on a CA file: trust `cas` from now on (SUCCESS) or keep trusting what is loaded."""

    outcome: Outcome
    digest: str
    reason: str = ""
    cas: tuple[Certificate, ...] = ()


def _ders(cas: Sequence[Certificate]) -> tuple[bytes, ...]:
    return tuple(c.der for c in cas)


def decide_cas(judged_digest: str | None, loaded: Sequence[Certificate], pem: bytes) -> CaDecision:
    """Pure: whether the CA bundle `pem` should replace the CAs trusted now (`loaded`).

    `judged_digest`: the sha256 of the file content last looked at (None: none yet). Content holding the
    very certificates loaded (the first look, a comment or whitespace edit) is UNCHANGED, not a reload.
    """
    digest = hashlib.sha256(pem).hexdigest()
    if digest == judged_digest:
        return CaDecision(Outcome.UNCHANGED, digest)
    try:
        cas = tuple(x509lite.load_pem(pem))
    except ValueError as exc:
        return CaDecision(Outcome.INVALID, digest, f"CA file is not PEM certificates: {exc}")
    if not cas:
        return CaDecision(Outcome.INVALID, digest, "CA file holds no certificate")
    if _ders(cas) == _ders(loaded):
        return CaDecision(Outcome.UNCHANGED, digest, cas=cas)
    return CaDecision(Outcome.SUCCESS, digest, cas=cas)


def expiry_of(cert_pem: bytes) -> float | None:
    """Unix time the first certificate of a PEM bundle expires, or None if there is none."""
    try:
        chain = x509lite.load_pem(cert_pem)
    except ValueError:
        return None
    return chain[0].not_after.timestamp() if chain else None


CaFetch = Callable[[], Awaitable[Mapping[str, bytes]]]
"""Reads CA bundles from elsewhere than a file: kind -> PEM as it is now (a kind left out is unchanged)."""


class CertificateReloader:
    """Keeps the listener context `ctx` handing every new connection the newest valid pair and CAs on disk."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        cert_file: Path | None,
        key_file: Path | None,
        *,
        loaded: tuple[bytes, bytes],
        metrics: ReloadMetrics,
        make_context: ContextFactory,
        interval: float = DEFAULT_INTERVAL,
        client_cas: CaSets | None = None,
        ca_files: Mapping[str, Path] | None = None,
        on_cas: Callable[[CaSets], None] | None = None,
        ca_fetch: CaFetch | None = None,
        ca_fetch_source: str = "",
        on_pair: Callable[[bytes, bytes], None] | None = None,
    ) -> None:
        """`ctx`: the listener's context, serving `loaded` (the (cert, key) PEM in it, so the first poll
        does not reload them); its `sni_callback` is taken over. `cert_file`/`key_file` None: the pair is
        not watched (a self-signed one). `make_context` builds each replacement with the listener's
        settings. `client_cas`: the CAs `ctx` trusts, by kind; `ca_files`: the kinds read from a file, to
        watch; `on_cas` is told every new CA set (all kinds) as it goes into the serving context.
        `ca_fetch` reads the kinds that come from elsewhere (`ca_fetch_source` names it in logs), once per
        interval before the files are looked at (`fetch`). `on_pair` is told each new (cert, key) PEM as
        it goes into the serving context (a client presenting the same pair follows it).
        `interval` is not bounded here: tests poll faster than the config allows."""
        self.ctx = ctx
        self.current = ctx  # what new connections are served; replaced whole, never modified
        self.cert_file, self.key_file = cert_file, key_file
        self.interval = interval
        self._make_context = make_context
        self._metrics = metrics
        self._pair = loaded
        self._judged = digest_of(*loaded)  # the last content looked at, good or bad: each is judged once
        self.client_cas: CaSets = dict(client_cas or {})
        self._ca_files = dict(ca_files or {})
        self._ca_judged: dict[str, str] = {}  # kind -> digest of the CA file content last looked at
        self._on_cas = on_cas
        self._on_pair = on_pair
        self._ca_fetch = ca_fetch
        self._ca_fetch_source = ca_fetch_source
        self._ca_fetched: dict[str, bytes] = {}  # kind -> PEM as last read through `ca_fetch`
        self._fetch_error = ""  # the last failure reported, so a lasting one is logged once
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

    def _check_pair(self) -> tuple[Outcome, Decision | None, tuple[bytes, bytes]]:
        """(outcome, the decision if a valid new pair, the pair to serve) — rejections already reported."""
        if self.cert_file is None or self.key_file is None:
            return Outcome.UNCHANGED, None, self._pair
        try:
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            unreadable = Decision(Outcome.UNREADABLE, f"unreadable:{exc.errno}", exc.strerror or str(exc))
            return self._reject(unreadable), None, self._pair
        decision = decide(self._judged, cert_pem, key_pem)
        if decision.outcome is Outcome.UNCHANGED:
            return decision.outcome, None, self._pair
        if decision.outcome is not Outcome.SUCCESS:
            return self._reject(decision), None, self._pair
        return Outcome.SUCCESS, decision, (cert_pem, key_pem)

    async def fetch(self) -> None:
        """Read the CA kinds `ca_fetch` serves; on failure keep what was read last (logged once)."""
        if self._ca_fetch is None:
            return
        try:
            fetched = dict(await self._ca_fetch())
        except Exception as exc:  # e.g. KubeError: the API server is briefly unreachable
            if str(exc) != self._fetch_error:
                self._fetch_error = str(exc)
                log.warning(
                    "client CAs not re-read; still trusting the previous CAs",
                    extra={"source": self._ca_fetch_source, "error": str(exc)},
                )
            return
        self._fetch_error = ""
        self._ca_fetched.update(fetched)

    def _where(self, kind: str) -> dict[str, str]:
        """Log fields naming where a CA kind comes from."""
        path = self._ca_files.get(kind)
        return {"ca_file": str(path)} if path is not None else {"source": self._ca_fetch_source}

    def _ca_contents(self) -> list[tuple[str, bytes | OSError]]:
        """(kind, current PEM or why it is unreadable) for every watched CA kind: files, then fetched."""
        out: list[tuple[str, bytes | OSError]] = []
        for kind, path in self._ca_files.items():
            try:
                out.append((kind, path.read_bytes()))
            except OSError as exc:
                out.append((kind, exc))
        out.extend((kind, pem) for kind, pem in self._ca_fetched.items() if kind not in self._ca_files)
        return out

    def _check_cas(self) -> tuple[Outcome, dict[str, CaDecision]]:
        """(worst outcome, kind -> decision for each CA source with valid new CAs); rejections reported."""
        outcome, changed = Outcome.UNCHANGED, {}
        for kind, pem in self._ca_contents():
            if isinstance(pem, OSError):
                decision = CaDecision(Outcome.UNREADABLE, f"unreadable:{pem.errno}", pem.strerror or str(pem))
            else:
                decision = decide_cas(self._ca_judged.get(kind), self.client_cas.get(kind, ()), pem)
            if decision.outcome is Outcome.SUCCESS:
                changed[kind] = decision
                outcome = outcome if outcome is not Outcome.UNCHANGED else Outcome.SUCCESS
            elif decision.outcome is Outcome.UNCHANGED:
                self._ca_judged[kind] = decision.digest
            elif decision.digest != self._ca_judged.get(kind):
                self._ca_judged[kind] = decision.digest
                self._report_ca(kind, decision)
                outcome = decision.outcome
        return outcome, changed

    def poll(self) -> Outcome:
        """Look at the files (and the CAs last fetched) once; serve them to new connections if they changed
        and are valid.

        The outcome is the pair's, else the CAs' (a rejection before a success)."""
        pair_outcome, pair_decision, pair = self._check_pair()
        ca_outcome, ca_changes = self._check_cas()
        outcome = pair_outcome if pair_outcome is not Outcome.UNCHANGED else ca_outcome
        if pair_decision is None and not ca_changes:
            return outcome
        cas = {**self.client_cas, **{kind: d.cas for kind, d in ca_changes.items()}}
        try:
            fresh = self._make_context(*pair, client_cas=[ca for group in cas.values() for ca in group])
        except (ssl.SSLError, OSError) as exc:
            for kind, d in ca_changes.items():
                self._ca_judged[kind] = d.digest
                self._report_ca(kind, CaDecision(Outcome.INVALID, d.digest, f"OpenSSL refused: {exc}"))
            if pair_decision is None:
                return Outcome.INVALID
            return self._reject(
                Decision(Outcome.INVALID, pair_decision.digest, f"OpenSSL refused the pair: {exc}")
            )
        # from here to the end no await and no failure: the context and the authenticator change together
        self.current = fresh
        if ca_changes:
            self.client_cas = cas
            if self._on_cas is not None:
                self._on_cas(cas)
            for kind, d in ca_changes.items():
                self._ca_judged[kind] = d.digest
                self._metrics.certificate_reloads.labels(Outcome.SUCCESS.value).inc()
                log.info(
                    "client CAs reloaded",
                    extra={
                        "kind": kind,
                        **self._where(kind),
                        "sha256": [c.fingerprint() for c in d.cas],
                    },
                )
        if pair_decision is not None:
            self._pair = pair
            self._judged = pair_decision.digest
            if self._on_pair is not None:
                self._on_pair(*pair)
            self._metrics.certificate_reloads.labels(Outcome.SUCCESS.value).inc()
            assert pair_decision.not_after is not None
            self._metrics.certificate_expiry.set(pair_decision.not_after.timestamp())
            log.info(
                "serving certificate reloaded",
                extra={
                    "cert_file": str(self.cert_file),
                    "sha256": pair_decision.fingerprint,
                    "not_after": pair_decision.not_after.isoformat(),
                },
            )
        return outcome

    def _report_ca(self, kind: str, decision: CaDecision) -> None:
        self._metrics.certificate_reloads.labels(decision.outcome.value).inc()
        log.error(
            "client CAs not reloaded; still trusting the previous CAs",
            extra={
                "outcome": decision.outcome.value,
                "reason": decision.reason,
                "kind": kind,
                **self._where(kind),
            },
        )

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
                await self.fetch()
                self.poll()
            except Exception:  # a reload bug must never take the listener down
                log.exception("certificate check failed")
