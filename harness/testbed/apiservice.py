"""Registering local processes as aggregated APIs of the test bed cluster.

gpuwarden's adapter serves ``custom.metrics.k8s.io`` / ``external.metrics.k8s.io`` behind kube-apiserver's
aggregation layer. In the test bed the adapter is a process on this machine, and there is no kube-proxy, so a
ClusterIP would lead nowhere (and Endpoints may not hold loopback IPs). The working route, also used by
kwokctl for metrics-server: a Service of ``type: ExternalName`` with ``externalName: 127.0.0.1``; with
aggregator routing off, kube-aggregator then dials ``https://127.0.0.1:<APIService.spec.service.port>``
and the availability controller skips the Endpoints checks for non-ClusterIP services.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from harness.testbed.cluster import LOCALHOST, Cluster
from harness.testbed.waiting import poll


@dataclass(frozen=True)
class LocalAPIService:
    """What was registered; pass it to :func:`delete_local_apiservice`."""

    name: str
    group: str
    version: str
    service_name: str
    namespace: str
    port: int


def apiservice_name(group: str, version: str) -> str:
    """Kubernetes' naming rule for APIService objects: ``<version>.<group>``."""
    return f"{version}.{group}"


def register_local_apiservice(
    cluster: Cluster,
    *,
    group: str,
    version: str,
    port: int,
    service_name: str,
    namespace: str = "kube-system",
    ca_bundle: bytes | None = None,
    group_priority_minimum: int = 100,
    version_priority: int = 100,
) -> LocalAPIService:
    """Create the ExternalName Service -> 127.0.0.1 and the APIService for ``group/version`` on ``port``.

    With ``ca_bundle`` the aggregator verifies the backend's serving cert for ``<service>.<namespace>.svc``;
    without it the APIService sets ``insecureSkipTLSVerify``.
    """
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name,
            "namespace": namespace,
            "labels": {"gpuwarden.io/testbed": "true"},
        },
        "spec": {"type": "ExternalName", "externalName": LOCALHOST},
    }
    spec: dict[str, Any] = {
        "group": group,
        "version": version,
        "service": {"name": service_name, "namespace": namespace, "port": port},
        "groupPriorityMinimum": group_priority_minimum,
        "versionPriority": version_priority,
    }
    if ca_bundle:
        spec["caBundle"] = base64.b64encode(ca_bundle).decode()
    else:
        spec["insecureSkipTLSVerify"] = True
    name = apiservice_name(group, version)
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name, "labels": {"gpuwarden.io/testbed": "true"}},
        "spec": spec,
    }
    cluster.apply(service, apiservice)
    return LocalAPIService(name, group, version, service_name, namespace, port)


def apiservice_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    """The ``Available`` condition of an APIService (empty dict if none yet)."""
    obj = cluster.get_json("apiservice", name)
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available":
            return dict(cond)
    return {}


def wait_apiservice_available(cluster: Cluster, name: str, *, timeout: float = 60.0) -> dict[str, Any]:
    """Wait for ``Available=True``; the timeout error carries the last condition (reason, message)."""
    last: dict[str, Any] = {}

    def available() -> dict[str, Any] | None:
        nonlocal last
        last = apiservice_condition(cluster, name)
        return last if last.get("status") == "True" else None

    try:
        return poll(available, timeout=timeout, interval=0.5, what=f"APIService {name} Available=True")
    except TimeoutError as exc:
        raise TimeoutError(f"APIService {name} not Available after {timeout:.0f}s: {last}") from exc


def delete_local_apiservice(cluster: Cluster, registered: LocalAPIService) -> None:
    """Delete the APIService first, then its Service (the order kube-aggregator copes with best)."""
    cluster.kubectl("delete", "apiservice", registered.name, "--ignore-not-found", check=False)
    cluster.kubectl(
        "delete",
        "service",
        registered.service_name,
        "-n",
        registered.namespace,
        "--ignore-not-found",
        check=False,
    )
