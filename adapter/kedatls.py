"""TLS of the KEDA external scaler's gRPC port: serving pair and client CA, checked at start, rotated live.

Why a module: the gRPC server takes its certificates through gRPC's own credentials, not an `ssl.SSLContext`,
so the HTTPS port's reloader (`gpuwarden.certreload`) cannot serve it. gRPC asks a fetcher before every new
client handshake; the fetcher here re-reads `adapter.keda.tls`'s files only when their size or mtime changed
(cert-manager and the kubelet rewrite the Secret's files on rotation), judges the new pair with OpenSSL
first, and keeps the previous one on anything unusable — logged and counted, never a broken port. KEDA keeps
its connection, so rotation reaches it when it reconnects (a new handshake), as for any TLS server.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from adapter import tls
from adapter.selfmetrics import AdapterMetrics
from gpuwarden.errors import ConfigError

if TYPE_CHECKING:
    from gpuwarden.config.adapter import KedaScaler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Material:
    """PEM bytes the port serves: certificate chain, key, and the client CA (None: no client certs)."""

    cert: bytes
    key: bytes
    ca: bytes | None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.ca)


def check(material: Material, where: str) -> None:
    """ValueError naming `where` unless OpenSSL accepts the pair and the CA holds a certificate."""
    try:
        tls.context_for(material.cert, material.key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ValueError(f"{where}: not a usable certificate and key ({exc})") from None
    if material.ca is not None:
        try:
            usable = bool(tls.load_certificates(material.ca))
        except ValueError:
            usable = False
        if not usable:
            raise ValueError(f"{where}: no PEM certificate in the client CA file")


def _stat(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    st = path.stat()
    return st.st_mtime_ns, st.st_size


class FileMaterial:
    """`cert_file` / `key_file` / `client_ca_file`, re-read when they change (the gRPC fetcher)."""

    def __init__(self, cert: Path, key: Path, ca: Path | None, metrics: AdapterMetrics | None) -> None:
        self._paths = (cert, key, ca)
        self._metrics = metrics
        self._seen = self._stats()
        self.current = self._read()
        check(self.current, self._where)

    @property
    def _where(self) -> str:
        return " / ".join(str(p) for p in self._paths if p is not None)

    def _stats(self) -> tuple[tuple[int, int] | None, ...]:
        return tuple(_stat(p) for p in self._paths)

    def _read(self) -> Material:
        cert, key, ca = self._paths
        return Material(cert.read_bytes(), key.read_bytes(), ca.read_bytes() if ca is not None else None)

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.certificate_reloads.labels(outcome).inc()

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration when the files changed to a usable set, else None (keep serving)."""
        try:
            stats = self._stats()
            if stats == self._seen:
                return None
            material = self._read()
        except OSError as exc:
            log.warning(
                "KEDA scaler TLS files unreadable; keeping the current pair", extra={"error": str(exc)}
            )
            self._count("unreadable")
            return None
        self._seen = stats
        if material == self.current:
            return None
        try:
            check(material, self._where)
        except ValueError as exc:
            log.warning("KEDA scaler TLS files rejected; keeping the current pair", extra={"error": str(exc)})
            self._count("invalid")
            return None
        self.current = material
        self._count("success")
        log.info("KEDA scaler TLS pair reloaded", extra={"files": self._where})
        return material.configuration()


def server_credentials(
    cfg: KedaScaler,
    fallback_pair: Callable[[], tuple[bytes, bytes]],
    metrics: AdapterMetrics | None = None,
) -> grpc.ServerCredentials | None:
    """Credentials of the gRPC port (None: plaintext); `ConfigError` naming `adapter.keda.tls` when the
    files cannot serve. Without files: `fallback_pair()` (the adapter's serving pair, or self-signed)."""
    tcfg = cfg.tls
    if tcfg.plaintext:
        return None
    try:
        if tcfg.cert_file is not None and tcfg.key_file is not None:
            files = FileMaterial(tcfg.cert_file, tcfg.key_file, tcfg.client_ca_file, metrics)
            initial, fetcher = files.current, files.fetch
        else:
            cert, key = fallback_pair()
            ca = tcfg.client_ca_file.read_bytes() if tcfg.client_ca_file is not None else None
            initial = Material(cert, key, ca)
            check(initial, str(tcfg.client_ca_file) if ca is not None else "the adapter's serving pair")

            def fetcher() -> grpc.ServerCertificateConfiguration | None:
                return None

    except (OSError, ValueError) as exc:
        raise ConfigError([("adapter.keda.tls", str(exc))]) from None
    return grpc.dynamic_ssl_server_credentials(
        initial.configuration(), fetcher, require_client_authentication=initial.ca is not None
    )
