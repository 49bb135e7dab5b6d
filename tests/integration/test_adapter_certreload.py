"""Serving-certificate rotation on the real listener: the adapter (with a REAL Prometheus behind it) serves
cert A on loopback, the files are swapped to B and a fresh TLS handshake gets B — no restart. A corrupt swap
and a half-finished rotation (new certificate, old key) keep B serving; completing the rotation serves C.
Rotating RSA -> ECDSA -> RSA, a TLS 1.2 client that offers only one key type's cipher suite gets the newest
certificate of that type or no handshake at all — never a previous one.

The reloader polls every 0.1 s here (the `Adapter` test override; the config allows 1 s at least); the
tests wait (bounded) for its counter rather than timing it.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from adapter import tls
from adapter.app import Adapter
from gpuwarden.config.root import Config
from gpuwarden.ports import free_port
from harness.localprom import LocalPrometheus

A, B, C = (tls.self_signed([f"{n}.test"]) for n in "abc")
RSA_1, RSA_2 = (tls.self_signed([f"rsa{n}.test"], algorithm="rsa") for n in "12")
TLS12_SUITE = {"ecdsa": "ECDHE-ECDSA-AES128-GCM-SHA256", "rsa": "ECDHE-RSA-AES128-GCM-SHA256"}


class Served:
    def __init__(self, adapter: Adapter, registry: CollectorRegistry, cert: Path, key: Path, port: int):
        self.adapter, self.registry, self.cert, self.key, self.port = adapter, registry, cert, key, port

    def swap(self, cert: bytes | None = None, key: bytes | None = None) -> None:
        for path, data in ((self.cert, cert), (self.key, key)):
            if data is not None:
                tmp = path.with_suffix(".new")
                tmp.write_bytes(data)
                tmp.replace(path)

    def reloads(self, outcome: str) -> float:
        labels = {"outcome": outcome}
        return self.registry.get_sample_value("gpuwarden_adapter_certificate_reloads_total", labels) or 0.0

    async def counted(self, outcome: str, n: float, within: float = 15.0) -> None:
        deadline = time.monotonic() + within
        while self.reloads(outcome) < n:
            assert time.monotonic() < deadline, f"no {outcome} reload within {within}s"
            await asyncio.sleep(0.05)

    async def handshake(self, only: Literal["ecdsa", "rsa"] | None = None) -> tuple[str, bytes]:
        """(sha256 of the served certificate, the /healthz response) over a fresh TLS connection;
        `only`: TLS 1.2 offering just that key type's cipher suite."""
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        if only is not None:
            client.maximum_version = ssl.TLSVersion.TLSv1_2
            client.set_ciphers(TLS12_SUITE[only])
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=client)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            body = await reader.read()
        finally:
            writer.close()
        return hashlib.sha256(der).hexdigest(), body


def fingerprint(pair: tuple[bytes, bytes]) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pair[0].decode())).hexdigest()


@asynccontextmanager
async def serve(
    prometheus: LocalPrometheus, tmp_path: Path, first: tuple[bytes, bytes]
) -> AsyncIterator[Served]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first[0])
    key.write_bytes(first[1])
    port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": prometheus.url},
            "adapter": {
                "bind_address": "127.0.0.1",
                "secure_port": port,
                "authentication": {"enabled": False},
                "tls": {"cert_file": str(cert), "key_file": str(key)},
            },
        }
    )
    registry = CollectorRegistry()
    adapter = Adapter(config, registry=registry, cert_reload_interval=0.1)
    await adapter.start()
    await adapter.listen()
    try:
        yield Served(adapter, registry, cert, key, port)
    finally:
        await adapter.stop()


@pytest_asyncio.fixture
async def served(prometheus: LocalPrometheus, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(prometheus, tmp_path, A) as s:
        yield s


async def test_rotated_certificate_is_served_without_restart(served: Served) -> None:
    served_fp, body = await served.handshake()
    assert served_fp == fingerprint(A)
    assert body.startswith(b"HTTP/1.1 200") and body.endswith(b"ok")

    served.swap(*B)
    await served.counted("success", 1)
    assert (await served.handshake())[0] == fingerprint(B)

    served.swap(cert=b"-----BEGIN CERTIFICATE-----\ncorrupt\n-----END CERTIFICATE-----\n")
    await served.counted("invalid", 1)
    served_fp, body = await served.handshake()
    assert served_fp == fingerprint(B)
    assert body.startswith(b"HTTP/1.1 200")

    served.swap(cert=C[0])  # half a rotation: C's certificate with B's key
    await served.counted("mismatched", 1)
    assert (await served.handshake())[0] == fingerprint(B)

    served.swap(key=C[1])
    await served.counted("success", 2)
    assert (await served.handshake())[0] == fingerprint(C)
    assert served.reloads("success") == 2


async def test_expiry_gauge_is_exported(served: Served) -> None:
    expiry = served.registry.get_sample_value(
        "gpuwarden_adapter_serving_certificate_expiry_timestamp_seconds"
    )
    assert expiry is not None and expiry > time.time() + 300 * 86400


async def test_rotation_across_key_types_serves_no_previous_certificate(
    prometheus: LocalPrometheus, tmp_path: Path
) -> None:
    async with serve(prometheus, tmp_path, RSA_1) as served:
        assert (await served.handshake(only="rsa"))[0] == fingerprint(RSA_1)

        served.swap(*A)  # RSA -> ECDSA
        await served.counted("success", 1)
        served_fp, body = await served.handshake(only="ecdsa")
        assert served_fp == fingerprint(A)
        assert body.startswith(b"HTTP/1.1 200")
        assert (await served.handshake())[0] == fingerprint(A)
        # Refused (an alert, or the server closing first), where RSA_1 used to be served.
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            await served.handshake(only="rsa")

        served.swap(*RSA_2)  # ECDSA -> RSA
        await served.counted("success", 2)
        assert (await served.handshake(only="rsa"))[0] == fingerprint(RSA_2)
        assert (await served.handshake())[0] == fingerprint(RSA_2)
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            await served.handshake(only="ecdsa")
