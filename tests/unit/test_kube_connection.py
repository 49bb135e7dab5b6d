"""`gpuwarden.kube.connection`: the plain kubeconfig cases read without `kubernetes` must mean exactly what
the `kubernetes` package's loader makes of them (compared field by field), and anything else is left to it.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.kube.client import load_configuration
from gpuwarden.kube.connection import Connection, from_kubeconfig, in_cluster


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], *, context: str = "ctx") -> Path:
    (tmp_path / "ca.crt").write_text("CA FILE\n")
    (tmp_path / "client.crt").write_text("CERT FILE\n")
    (tmp_path / "client.key").write_text("KEY FILE\n")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": cluster},
            {"name": "other", "cluster": {"server": "https://o"}},
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ns"}},
            {"name": "other", "context": {"cluster": "other", "user": "u"}},
        ],
        "current-context": context,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def effective(configuration: Any) -> dict[str, Any]:
    """What a connection amounts to: server, TLS material by content, verification, token."""

    def content(name: str | None) -> str | None:
        return Path(name).read_text() if name else None

    auth = configuration.auth_settings().get("BearerToken") or {}
    return {
        "host": configuration.host,
        "ca": getattr(configuration, "ca_cert_data", None) or content(configuration.ssl_ca_cert),
        "cert": content(configuration.cert_file),
        "key": content(configuration.key_file),
        "verify": configuration.verify_ssl,
        "server_name": getattr(configuration, "tls_server_name", None) or None,
        "auth": auth.get("value"),
    }


PLAIN = [
    pytest.param({"server": "https://k:6443"}, {"token": "t"}, id="token"),
    pytest.param({"server": "https://k:6443/"}, {}, id="no-credentials-trailing-slash"),
    pytest.param(
        {"server": "https://k", "certificate-authority-data": b64("CA DATA\n")},
        {"client-certificate-data": b64("CERT DATA\n"), "client-key-data": b64("KEY DATA\n")},
        id="embedded-certificates",
    ),
    pytest.param(
        {"server": "https://k", "certificate-authority": "ca.crt", "tls-server-name": "api.internal"},
        {"client-certificate": "client.crt", "client-key": "client.key"},
        id="certificate-files-relative-to-the-kubeconfig",
    ),
    pytest.param({"server": "https://k", "insecure-skip-tls-verify": True}, {"token": "t"}, id="insecure"),
    pytest.param({"server": "http://127.0.0.1:8080"}, {}, id="plain-http"),
]


@pytest.mark.parametrize(("cluster", "user"), PLAIN)
def test_plain_kubeconfigs_mean_what_the_kubernetes_package_makes_of_them(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]
) -> None:
    from kubernetes.client import Configuration
    from kubernetes.config import load_kube_config

    path = write(tmp_path, cluster, user)
    ours = from_kubeconfig(path)
    assert isinstance(ours, Connection)
    theirs = Configuration()
    load_kube_config(config_file=str(path), client_configuration=theirs, persist_config=False)  # type: ignore[no-untyped-call]
    assert effective(ours) == effective(theirs)
    loaded = load_configuration(kubeconfig=path)  # the client takes this path, without `kubernetes`
    assert isinstance(loaded, Connection) and effective(loaded) == effective(ours)


def test_the_named_context_is_used(tmp_path: Path) -> None:
    connection = from_kubeconfig(write(tmp_path, {"server": "https://k"}, {}), context="other")
    assert connection is not None and connection.host == "https://o"


@pytest.mark.parametrize(
    ("cluster", "user", "context"),
    [
        pytest.param({"server": "https://k"}, {"exec": {"command": "aws"}}, "ctx", id="exec-plugin"),
        pytest.param({"server": "https://k"}, {"auth-provider": {"name": "oidc"}}, "ctx", id="auth-provider"),
        pytest.param({"server": "https://k"}, {"tokenFile": "/t"}, "ctx", id="token-file"),
        pytest.param({"server": "https://k"}, {"username": "a", "password": "b"}, "ctx", id="basic-auth"),
        pytest.param({"server": "https://k", "proxy-url": "http://p:3128"}, {}, "ctx", id="proxy"),
        pytest.param({"server": "https://k"}, {"client-certificate": "client.crt"}, "ctx", id="cert-no-key"),
        pytest.param(
            {"server": "https://k", "certificate-authority": "nope.crt"}, {}, "ctx", id="missing-ca"
        ),
        pytest.param({"server": "https://k"}, {}, "nope", id="unknown-context"),
        pytest.param({"server": "k:6443"}, {}, "ctx", id="server-without-scheme"),
    ],
)
def test_anything_else_is_left_to_the_kubernetes_package(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str
) -> None:
    assert from_kubeconfig(write(tmp_path, cluster, user, context=context)) is None


def test_unreadable_kubeconfig_is_left_to_the_kubernetes_package(tmp_path: Path) -> None:
    (tmp_path / "bad").write_text("{not yaml")
    assert from_kubeconfig(tmp_path / "bad") is None
    assert from_kubeconfig(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("env", "files", "host"),
    [
        pytest.param({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                     ("token", "ca.crt"), "https://10.0.0.1:443", id="ipv4"),
        pytest.param({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
                     ("token", "ca.crt"), "https://[fd00::1]:443", id="ipv6"),
        pytest.param({}, ("token", "ca.crt"), None, id="not-in-a-pod"),
        pytest.param({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "443"},
                     ("ca.crt",), None, id="no-token"),
    ],
)  # fmt: skip
def test_in_cluster(tmp_path: Path, env: dict[str, str], files: tuple[str, ...], host: str | None) -> None:
    for name in files:
        (tmp_path / name).write_text(f"{name}-content\n")
    connection = in_cluster(env, tmp_path)
    if host is None:
        assert connection is None
        return
    assert connection is not None and connection.host == host
    assert connection.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert connection.auth_settings()["BearerToken"]["value"] == "Bearer token-content"
