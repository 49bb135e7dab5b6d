"""The extender port's TLS: the serving context (rotated without a restart), the client CAs the verbs
trust, and the client context a replica presents when it forwards bind to the binder.

Why it exists: `extender.tls` names files that cert-manager or the kubelet rewrite in place; the listener
must serve the new pair and trust the new client CAs without a restart, as the adapter does - with the same
reloader (`gpuwarden.certreload`) and the same context factory (`gpuwarden.tlscontext`), so both ports
rotate alike. The forwarding client follows the same files: under the leader bind protocol a follower
presents this replica's pair to the binder, whose verbs need a client certificate too.

What it must not do: decide who may call what (`peerauth.py`), or start a listener (the controller's).
Configuration errors found at start name the field.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuwarden import x509lite
from gpuwarden.certreload import CaSets, CertificateReloader
from gpuwarden.config.extender import ExtenderTLS
from gpuwarden.errors import ConfigError
from gpuwarden.tlscontext import context_for, load_pair
from gpuwarden.x509lite import Certificate

log = logging.getLogger(__name__)

CLIENT = "client"
"""The one CA kind the extender trusts (the reloader keeps CAs by kind)."""


@dataclass(frozen=True)
class TlsMetrics:
    certificate_reloads: Counter
    """`gpuwarden_extender_certificate_reloads_total{outcome}`: looks at the files that found a change."""
    certificate_expiry: Gauge
    """`gpuwarden_extender_serving_certificate_expiry_timestamp_seconds`."""
    refusals: Counter
    """`gpuwarden_extender_client_certificate_refusals_total`: verb requests refused without one."""


def tls_metrics(registry: CollectorRegistry | None) -> TlsMetrics:
    return TlsMetrics(
        certificate_reloads=Counter(
            "gpuwarden_extender_certificate_reloads",
            "Looks at the extender's certificate files that found a change, by outcome (success, "
            "invalid, mismatched, unreadable): a rejected file leaves the previous pair or CAs in use.",
            ["outcome"],
            registry=registry,
        ),
        certificate_expiry=Gauge(
            "gpuwarden_extender_serving_certificate_expiry_timestamp_seconds",
            "When the extender's serving certificate in use expires (unix seconds).",
            registry=registry,
        ),
        refusals=Counter(
            "gpuwarden_extender_client_certificate_refusals",
            "Requests for the extender's verbs refused (403) for want of a verified client certificate.",
            registry=registry,
        ),
    )


def peer_client_context(cert_pem: bytes, key_pem: bytes, cas: Sequence[Certificate]) -> ssl.SSLContext:
    """TLS towards another replica: its serving certificate is trusted when it is this one (one Secret for
    the Deployment; a leaf, so trusted as a partial chain) or issued by a client CA (the chart's one CA
    issues both); this replica's pair is presented as its client certificate. Replicas are reached by pod
    IP, so no host name is checked."""
    trusted = cert_pem.decode() + "".join(c.pem() for c in cas)
    context = ssl.create_default_context(cadata=trusted)
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    load_pair(context, cert_pem, key_pem)
    return context


class ForwardingClient:
    """The forwarding client's context, rebuilt when the reloader serves a new pair or new client CAs."""

    def __init__(self, pair: tuple[bytes, bytes], cas: tuple[Certificate, ...]) -> None:
        self._pair, self._cas = pair, cas
        self.context = peer_client_context(*pair, cas)

    def new_pair(self, cert_pem: bytes, key_pem: bytes) -> None:
        self._pair = (cert_pem, key_pem)
        self._rebuild()

    def new_cas(self, cas: CaSets) -> None:
        self._cas = cas.get(CLIENT, ())
        self._rebuild()

    def _rebuild(self) -> None:
        try:
            self.context = peer_client_context(*self._pair, self._cas)
        except (ssl.SSLError, OSError, ValueError) as exc:  # the reloader judged the files valid already
            log.error("forwarding client keeps its previous certificate", extra={"error": str(exc)})


@dataclass(frozen=True)
class ExtenderTls:
    """The listener's context (new connections follow `reloader`) and the forwarding client."""

    context: ssl.SSLContext
    reloader: CertificateReloader
    required: bool
    """Whether the verbs need a verified client certificate (`tls.client_auth_required()`)."""
    forwarding: ForwardingClient
    metrics: TlsMetrics

    def client_context(self) -> ssl.SSLContext:
        """The forwarding client's context for the pair and CAs in use now."""
        return self.forwarding.context

    async def run(self) -> None:
        await self.reloader.run()


def extender_tls(cfg: ExtenderTLS, metrics: TlsMetrics) -> ExtenderTls | None:
    """The extender port's TLS from `extender.tls` (None: plain HTTP). Raises `ConfigError` naming the
    field whose file cannot be read or used."""
    if cfg.cert_file is None or cfg.key_file is None:
        return None
    problems: list[tuple[str, str]] = []
    pair = (b"", b"")
    try:
        pair = cfg.cert_file.read_bytes(), cfg.key_file.read_bytes()
    except OSError as exc:
        problems.append(("extender.tls.cert_file", f"cannot read the pair: {exc}"))
    cas: tuple[Certificate, ...] = ()
    if cfg.client_ca_file is not None:
        try:
            cas = tuple(x509lite.load_pem(cfg.client_ca_file.read_bytes()))
            if not cas:
                problems.append(("extender.tls.client_ca_file", "holds no PEM certificate"))
        except (OSError, ValueError) as exc:
            problems.append(("extender.tls.client_ca_file", f"not a readable PEM CA bundle: {exc}"))
    if problems:
        raise ConfigError(problems)
    try:
        context = context_for(*pair, client_cas=cas)
        forwarding = ForwardingClient(pair, cas)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError([("extender.tls.cert_file", f"OpenSSL refused the pair or a CA: {exc}")]) from None
    reloader = CertificateReloader(
        context,
        cfg.cert_file,
        cfg.key_file,
        loaded=pair,
        metrics=metrics,
        make_context=context_for,
        interval=cfg.reload_interval_seconds,
        client_cas={CLIENT: cas} if cas else None,
        ca_files={CLIENT: cfg.client_ca_file} if cfg.client_ca_file is not None else None,
        on_cas=forwarding.new_cas,
        on_pair=forwarding.new_pair,
    )
    return ExtenderTls(context, reloader, cfg.client_auth_required(), forwarding, metrics)
