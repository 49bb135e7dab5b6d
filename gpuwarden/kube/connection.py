"""How to reach the API server, for the common cases, without importing the `kubernetes` package.

Why it exists: importing `kubernetes.config` imports the whole generated client (every model class, urllib3,
oauthlib, websocket-client): ~18 MiB of a node agent whose idle goal is ≤ 40 MiB (issue 29), all to read a
server URL, a CA, a client certificate or a token. Requests already go through our own async transport,
which needs only those facts. So the service account (in-cluster) and a kubeconfig whose cluster and user
use only plain fields are read here; anything else (exec plugins, auth providers, token files, proxies,
impersonation, ...) returns None and `client.load_configuration` hands it to the `kubernetes` package as
before, so no kubeconfig that worked stops working.

`Connection` offers the attributes the transport reads from a `kubernetes.client.Configuration` (`host`,
`ssl_ca_cert`, `ca_cert_data`, `verify_ssl`, `cert_file`, `key_file`, `tls_server_name`, `proxy`,
`auth_settings()`, `refresh_api_key_hook`).

What it must not do: read `~/.kube/config` or `$KUBECONFIG` (only a path it is given), guess at a field it
does not know (unknown means "let the `kubernetes` package decide"), or raise for a file it cannot handle.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

CLUSTER_FIELDS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
     "tls-server-name"}
)  # fmt: skip
USER_FIELDS = frozenset(
    {"token", "client-certificate", "client-certificate-data", "client-key", "client-key-data"}
)
"""The kubeconfig fields read here; a cluster or user with any other field is left to `kubernetes`."""


@dataclass
class Connection:
    """Server URL, TLS material and bearer token; a token file is re-read when asked (rotated tokens)."""

    host: str
    ssl_ca_cert: str | None = None
    ca_cert_data: str | None = None
    verify_ssl: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    proxy: None = None
    refresh_api_key_hook: Callable[[Any], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.token_file is not None:
            # Marks the token as "read a file": the transport then asks on a pool thread, never on the loop.
            self.refresh_api_key_hook = _no_op

    def auth_settings(self) -> dict[str, dict[str, str]]:
        """`{"BearerToken": {"value": "Bearer ..."}}` when there is a token, as `Configuration` answers."""
        token = self.token
        if self.token_file is not None:
            token = Path(self.token_file).read_text().strip()
        if not token:
            return {}
        return {"BearerToken": {"in": "header", "key": "authorization", "value": f"Bearer {token}"}}


def _no_op(_configuration: Any) -> None:
    return None


def in_cluster(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> Connection | None:
    """The pod's service account: `KUBERNETES_SERVICE_HOST/PORT`, its CA and (rotated) token file."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token, ca = account / "token", account / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return Connection(host=f"https://{host}:{port}", ssl_ca_cert=str(ca), token_file=str(token))


def _named(entries: Any, name: Any, key: str) -> dict[str, Any] | None:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            return dict(entry[key])
    return None


def from_kubeconfig(path: Path, context: str | None = None) -> Connection | None:
    """The connection a kubeconfig's context describes, when it uses only the plain fields; else None."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    ctx = _named(doc.get("contexts"), context or doc.get("current-context"), "context")
    if ctx is None or set(ctx) - {"cluster", "user", "namespace", "extensions"}:
        return None
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    user = _named(doc.get("users"), ctx.get("user"), "user") if ctx.get("user") else {}
    if cluster is None or user is None or set(cluster) - CLUSTER_FIELDS or set(user) - USER_FIELDS:
        return None
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        return None
    try:
        cert_file = _file(path, user, "client-certificate")
        key_file = _file(path, user, "client-key")
        ca_data = _decoded(cluster.get("certificate-authority-data"))  # in memory: no file needed
        ca_file = None if ca_data is not None else _file(path, cluster, "certificate-authority")
    except (ValueError, OSError, binascii.Error):
        return None
    if (cert_file is None) != (key_file is None):
        return None
    insecure = cluster.get("insecure-skip-tls-verify", False)
    token = user.get("token")
    if not isinstance(insecure, bool) or not isinstance(token, str | None):
        return None
    return Connection(
        host=server.rstrip("/"),
        ssl_ca_cert=ca_file,
        ca_cert_data=ca_data,
        verify_ssl=not insecure,
        cert_file=cert_file,
        key_file=key_file,
        tls_server_name=cluster.get("tls-server-name") or None,
        token=token or None,
    )


def _decoded(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("not base64 text")
    return base64.b64decode(value, validate=True).decode()


def _file(kubeconfig: Path, section: dict[str, Any], key: str) -> str | None:
    """`key` (a path, relative to the kubeconfig's directory) or `key-data` (written to a private temporary
    file, removed at exit, as the `kubernetes` package does: TLS libraries load certificates from files)."""
    data, location = section.get(f"{key}-data"), section.get(key)
    if data is not None:
        return _temp_file(_decoded(data) or "")
    if location is None:
        return None
    if not isinstance(location, str):
        raise ValueError(f"{key} is not a path")
    full = Path(location) if Path(location).is_absolute() else kubeconfig.parent / location
    if not full.is_file():
        raise ValueError(f"{full} does not exist")
    return str(full)


def _temp_file(content: str) -> str:
    fd, name = tempfile.mkstemp(prefix="gpuwarden-kube-")
    with os.fdopen(fd, "w") as out:
        out.write(content)
    atexit.register(_remove, name)
    return name


def _remove(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)
