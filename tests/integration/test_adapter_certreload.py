"""Serving-certificate rotation on the real listener: the adapter (with a REAL Prometheus behind it) serves
cert A on loopback, the files are swapped to B and a fresh TLS handshake gets B — no restart. A corrupt swap
and a half-finished rotation (new certificate, old key) keep B serving; completing the rotation serves C.

The reloader polls every 0.1 s here; the test waits (bounded) for its counter rather than timing it.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from prometheus_client import CollectorRegistry

from adapter import tls
from adapter.app import Adapter
from gpuwarden.config.root import Config
from gpuwarden.localprom import LocalPrometheus
from gpuwarden.ports import free_port

A, B, C = (tls.self_signed([f"{n}.test"]) for n in "abc")


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

    async def handshake(self) -> tuple[str, bytes]:
        """(sha256 of the served certificate, the /healthz response) over a fresh TLS connection."""
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
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


@pytest_asyncio.fixture
async def served(prometheus: LocalPrometheus, tmp_path: Path) -> AsyncIterator[Served]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(A[0])
    key.write_bytes(A[1])
    port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": prometheus.url},
            "adapter": {
                "bind_address": "127.0.0.1",
                "secure_port": port,
                "authentication": {"enabled": False},
                "tls": {"cert_file": str(cert), "key_file": str(key), "reload_interval_seconds": 0.1},
            },
        }
    )
    registry = CollectorRegistry()
    adapter = Adapter(config, registry=registry)
    await adapter.start()
    await adapter.listen()
    try:
        yield Served(adapter, registry, cert, key, port)
    finally:
        await adapter.stop()


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
