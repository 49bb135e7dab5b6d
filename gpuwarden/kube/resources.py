"""Resource descriptors: which URL an API kind lives at, and how objects are keyed and referenced.

Why it exists: with raw JSON instead of generated models, something must still know that Nodes are
cluster-scoped at `/api/v1/nodes` while Leases are namespaced under `/apis/coordination.k8s.io/v1`. A
`Resource` is that knowledge, declared once; callers add their own (e.g. NodeResourceTopology) the same way.
Also here: the small wire shapes several modules share (patch content types, a complete list), the
`namespace/name` cache key and JSON-pointer escaping.

Pure and tiny on purpose: no I/O, no discovery (we never ask the server what exists; the kinds we touch
are fixed by our RBAC).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One API resource: group ("" for core), version, plural, kind and scope."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """`v1` for the core group, else `group/version` (what goes into `apiVersion`)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path of the collection, or of one object (and its subresource).

        A namespaced resource without a namespace addresses all namespaces (lists and watches only).
        """
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.plural} are cluster-scoped; got namespace {namespace!r}")
        path = f"{base}/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError("object name must not be empty")
            path += f"/{quote(name, safe='')}"
        elif subresource:
            raise ValueError("a subresource needs an object name")
        if subresource:
            path += f"/{subresource}"
        return path


class PatchType(StrEnum):
    """The three patch flavours the API server accepts for built-in types (server-side apply not used)."""

    STRATEGIC = "application/strategic-merge-patch+json"
    MERGE = "application/merge-patch+json"
    JSON = "application/json-patch+json"


@dataclass(frozen=True)
class ObjectList:
    """A complete (all pages) list: the items and the list's resourceVersion to start a watch from."""

    items: list[JsonObject]
    resource_version: str


NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", namespaced=True)
CORE_EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
"""The same Events through core/v1: its field selectors include `reason` and `reportingComponent`."""
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True)
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", namespaced=True)

LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
"""Field selector for the pods that still hold (or may hold) resources: every cache of live pods uses it."""


def object_key(obj: JsonObject) -> str:
    """The cache key client-go uses: `namespace/name`, or just `name` for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def resource_version(obj: JsonObject) -> str:
    """`metadata.resourceVersion`, or "" when absent."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def json_pointer(*parts: str) -> str:
    """An RFC 6901 pointer; `json_pointer("metadata", "annotations", "a.io/b")` escapes `/` and `~`."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)
