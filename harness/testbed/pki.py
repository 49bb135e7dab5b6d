"""Throw-away X.509 material for the test bed.

kwokctl generates one CA and one admin certificate and reuses it for everything, including the API
server's front-proxy client certificate. An aggregated API server cannot then tell "the API server proxying
a user" from "any admin client", so the test bed gives kube-apiserver a separate front-proxy CA and client
certificate (the kubeadm layout: CN ``front-proxy-client``). The same helpers mint serving certificates for
local aggregated API servers, so an APIService can carry a real ``caBundle`` instead of
``insecureSkipTLSVerify``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import warnings
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FRONT_PROXY_CLIENT_CN = "front-proxy-client"
_VALIDITY = dt.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``<stem>.crt`` and ``<stem>.key`` (mode 0600) into ``directory``; return both paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert_path = directory / f"{stem}.crt"
        key_path = directory / f"{stem}.key"
        cert_path.write_bytes(self.cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(self.key_pem)
        return cert_path, key_path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def make_ca(common_name: str) -> KeyPair:
    """A self-signed CA certificate valid for two days."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def load_keypair(cert_path: Path, key_path: Path) -> KeyPair:
    """A certificate and key from PEM files (e.g. kwokctl's cluster CA, to sign node credentials)."""
    return KeyPair(cert_path.read_bytes(), key_path.read_bytes())


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by ``ca`` (server and/or client usage, optional SANs)."""
    with warnings.catch_warnings():
        # kwokctl's CA (signing the real node's credentials) has a serial number RFC 5280 disallows.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError("CA key must be an EC or RSA private key (make_ca() or kwokctl's pki/ca.key)")
    key = _new_key()
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if not usages:
        raise ValueError("a leaf certificate needs server and/or client usage")
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class FrontProxyPki:
    """Paths of the front-proxy CA and the API server's front-proxy client certificate."""

    ca_cert: Path
    client_cert: Path
    client_key: Path


def write_front_proxy_pki(directory: Path) -> FrontProxyPki:
    """Create the front-proxy CA and client cert (CN ``front-proxy-client``) under ``directory``."""
    ca = make_ca("gpuwarden-testbed-front-proxy-ca")
    client = issue(ca, FRONT_PROXY_CLIENT_CN, client=True)
    ca_cert, _ = ca.write(directory, "front-proxy-ca")
    client_cert, client_key = client.write(directory, "front-proxy-client")
    return FrontProxyPki(ca_cert=ca_cert, client_cert=client_cert, client_key=client_key)


def serving_cert_for_service(ca: KeyPair, service: str, namespace: str) -> KeyPair:
    """A serving cert valid for the names kube-aggregator verifies (``<svc>.<ns>.svc``) and 127.0.0.1."""
    return issue(
        ca,
        f"{service}.{namespace}.svc",
        dns_names=(f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", "localhost"),
        ip_addresses=("127.0.0.1",),
        server=True,
    )
