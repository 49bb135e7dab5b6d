"""CA stores the adapter does not need are not loaded (issue 29, adapter RSS): httpx's for a plain-HTTP
Prometheus, aiohttp's two import-time default contexts. What stays: verification wherever TLS is spoken."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys

import pytest

from gpuwarden.promauth import plain_http_verify

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def test_plain_http_prometheus_gets_a_context_that_trusts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    ctx = plain_http_verify()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.cert_store_stats()["x509"] == 0
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_a_proxy_from_the_environment_keeps_httpx_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example:3128")
    assert plain_http_verify() is True


def _aiohttp_contexts(helper: bool, env: dict[str, str]) -> list[str]:
    code = (
        "import os\n"
        + ("from gpuwarden import aiohttplib\naiohttplib.import_without_ca_bundle()\n" if helper else "")
        + "import aiohttp.connector as c\n"
        "print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()['x509'])\n"
        "print(c._SSL_CONTEXT_UNVERIFIED.cert_store_stats()['x509'])\n"
        "print(os.environ.get('SSL_CERT_FILE', '<unset>'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("cert_file", [None, "/etc/ssl/certs/ca-certificates.crt"])
def test_aiohttp_imported_without_the_ca_bundle_and_the_environment_restored(cert_file: str | None) -> None:
    bundle = cert_file or ssl.get_default_verify_paths().openssl_cafile
    if not os.path.isfile(bundle):
        pytest.skip(f"no CA bundle at {bundle}: nothing to avoid loading")
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    if cert_file is not None:
        env["SSL_CERT_FILE"] = cert_file
    verified, unverified, after = _aiohttp_contexts(True, env)
    assert (verified, unverified) == ("0", "0")
    assert after == (cert_file or "<unset>")
    plain = _aiohttp_contexts(False, env)
    assert int(plain[0]) > 0  # what the helper avoids: aiohttp's own import loads the bundle
