"""A front-proxy CA added to kube-system/extension-apiserver-authentication is trusted by the RUNNING adapter
within its reload interval - no restart - as prometheus-adapter's dynamic certificates are.

The adapter runs as `gpuwarden adapter` runs it (`run_adapter`), with no CA files: it reads the trusted
client CAs from the real ConfigMap kube-apiserver publishes. The test issues a front-proxy client certificate
from a NEW CA: refused at the TLS handshake; then appends that CA to the ConfigMap's
`requestheader-client-ca-file` (kube-apiserver's trust controller keeps extra CAs there, it merges rather than
replaces) and expects the same client, asserting a user in the X-Remote-* headers, to be authenticated and
authorized within seconds. The ConfigMap is restored afterwards.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuwarden.config.root import Config
from harness.testbed import Cluster, poll
from harness.testbed.pki import KeyPair, issue, make_ca, serving_cert_for_service
from tests.e2e.conftest import free_port
from tests.e2e.test_adapter_hpa import AdapterThread

pytestmark = pytest.mark.e2e

NAMESPACE, NAME = "kube-system", "extension-apiserver-authentication"
KEY = "requestheader-client-ca-file"
HEADERS = {"X-Remote-User": "gpuwarden-e2e-rotation", "X-Remote-Group": "system:masters"}


def _call(port: int, server_ca: Path, client: tuple[Path, Path] | None, path: str) -> int | str:
    """HTTP status of a GET (presenting `client` when given); "tls" when TLS refused the client
    certificate, "down" when nothing listens yet."""
    ctx = ssl.create_default_context(cafile=str(server_ca))
    ctx.check_hostname = False
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers=HEADERS)
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except urllib.error.URLError as exc:
        return "down" if isinstance(exc.reason, ConnectionRefusedError) else "tls"
    except (ssl.SSLError, ConnectionError):  # TLS 1.3: the server's verdict arrives with the response
        return "tls"


def _set_requestheader_cas(cluster: Cluster, pem: str) -> None:
    patch = json.dumps({"data": {KEY: pem}})
    cluster.kubectl("patch", "configmap", NAME, "-n", NAMESPACE, "--type=merge", "-p", patch)


def test_a_front_proxy_ca_added_to_the_configmap_is_trusted_without_a_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    original = cluster.get_json("configmap", NAME, "-n", NAMESPACE)["data"][KEY]
    rotated: KeyPair = make_ca("gpuwarden-e2e-rotated-front-proxy-ca")
    client = issue(rotated, "front-proxy-client", client=True).write(tmp_path / "client", "front-proxy")
    server_ca = make_ca("gpuwarden-e2e-adapter-ca")
    cert, key = serving_cert_for_service(server_ca, "gpuwarden-adapter-rotation", NAMESPACE).write(
        tmp_path / "tls", "serving"
    )
    (tmp_path / "ca.crt").write_bytes(server_ca.cert_pem)
    port = free_port()
    config = Config.model_validate(
        {
            "prometheus": {"url": f"http://127.0.0.1:{free_port()}", "retries": 0},
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
            "adapter": {
                "secure_port": port,
                "bind_address": "127.0.0.1",
                "tls": {"cert_file": str(cert), "key_file": str(key), "reload_interval_seconds": 1},
            },
        }
    )
    adapter = AdapterThread(config, CollectorRegistry()).start()
    path = "/apis/custom.metrics.k8s.io/v1beta2"
    try:
        poll(lambda: _call(port, tmp_path / "ca.crt", None, "/livez") == 200, timeout=60, what="adapter up")
        assert _call(port, tmp_path / "ca.crt", None, path) == 401  # no client certificate, no user
        assert _call(port, tmp_path / "ca.crt", client, path) == "tls"  # the new CA is not trusted yet

        _set_requestheader_cas(cluster, original.rstrip("\n") + "\n" + rotated.cert_pem.decode())
        poll(
            lambda: _call(port, tmp_path / "ca.crt", client, path) not in ("tls", 401, 403),
            timeout=30,
            what="a client of the CA added to the ConfigMap is authenticated by the running adapter",
        )
    finally:
        _set_requestheader_cas(cluster, original)
        adapter.stop()
