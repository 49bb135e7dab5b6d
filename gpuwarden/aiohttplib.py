"""Import aiohttp without its import-time load of the system CA bundle (the adapter's entry point).

Why: `aiohttp.connector` makes two default client SSL contexts when it is imported, and each reads the whole
system CA bundle (`/etc/ssl/certs/ca-certificates.crt`, ~140 certificates) into OpenSSL: ~1.9 MiB of RSS for
the life of the adapter, which never uses them — the Kubernetes transport passes its own context (the
cluster's CA, gpuwarden/kube/wire.py), and nothing else in the adapter is an aiohttp client. With
`SSL_CERT_FILE` pointing at an empty file during that import, OpenSSL sets up only its lazy directory lookup
(`SSL_CERT_DIR`, certificates read when a verification asks for one), so the two contexts still verify
against the system CAs wherever the hashed directory exists.

What it must not do: leave the environment changed (it is restored at once), or act once aiohttp is imported
(then nothing happens: the contexts exist already).
"""

from __future__ import annotations

import importlib
import os
import sys

CA_FILE_ENV = "SSL_CERT_FILE"


def import_without_ca_bundle() -> None:
    """Import `aiohttp` (client and server) with the bundle file hidden from OpenSSL; no-op if imported."""
    if "aiohttp" in sys.modules:
        return
    saved = os.environ.get(CA_FILE_ENV)
    os.environ[CA_FILE_ENV] = os.devnull
    try:
        importlib.import_module("aiohttp")
        importlib.import_module("aiohttp.connector")
    finally:
        if saved is None:
            del os.environ[CA_FILE_ENV]
        else:
            os.environ[CA_FILE_ENV] = saved
