"""Kubernetes group-resources as the metrics APIs name them, without a live RESTMapper.

Why: requests name objects by GroupResource strings (`pods`, `deployments.apps`, sometimes singular or with a
legacy group such as `deployments.extensions`), rules name them by label (`pod`, `kube_deployment`), and
responses describe them with a `kind` and `apiVersion`. prometheus-adapter resolves all of this through a
RESTMapper fed by API discovery; we use a fixed table of the resources HPAs actually scale on or that
metrics are labelled with, so the adapter needs no discovery calls and the naming stage stays pure.
Resources outside the table are still served when a rule names them explicitly through `overrides`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class GroupResource:
    """A (plural resource, API group) pair; `str()` gives the `resource.group` form used on the wire."""

    resource: str
    group: str = ""

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True)
class Kind:
    """What the table knows about one resource."""

    plural: str
    singular: str
    group: str
    version: str
    kind: str
    namespaced: bool

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.plural, self.group)


_KINDS = [
    Kind("pods", "pod", "", "v1", "Pod", True),
    Kind("nodes", "node", "", "v1", "Node", False),
    Kind("namespaces", "namespace", "", "v1", "Namespace", False),
    Kind("services", "service", "", "v1", "Service", True),
    Kind("persistentvolumes", "persistentvolume", "", "v1", "PersistentVolume", False),
    Kind("persistentvolumeclaims", "persistentvolumeclaim", "", "v1", "PersistentVolumeClaim", True),
    Kind("replicationcontrollers", "replicationcontroller", "", "v1", "ReplicationController", True),
    Kind("deployments", "deployment", "apps", "v1", "Deployment", True),
    Kind("statefulsets", "statefulset", "apps", "v1", "StatefulSet", True),
    Kind("daemonsets", "daemonset", "apps", "v1", "DaemonSet", True),
    Kind("replicasets", "replicaset", "apps", "v1", "ReplicaSet", True),
    Kind("jobs", "job", "batch", "v1", "Job", True),
    Kind("cronjobs", "cronjob", "batch", "v1", "CronJob", True),
    Kind("ingresses", "ingress", "networking.k8s.io", "v1", "Ingress", True),
    Kind(
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        True,
    ),
]
# Groups that older clients (and prometheus-adapter's tests) still use for the same resources.
_LEGACY_GROUPS = {
    ("deployments", "extensions"): "apps",
    ("replicasets", "extensions"): "apps",
    ("daemonsets", "extensions"): "apps",
    ("ingresses", "extensions"): "networking.k8s.io",
}
_BY_PLURAL = {k.plural: k for k in _KINDS}
_BY_SINGULAR = {k.singular: k for k in _KINDS}

PODS = GroupResource("pods")
NODES = GroupResource("nodes")
NAMESPACES = GroupResource("namespaces")
ROOT_SCOPED = frozenset({NODES, NAMESPACES, GroupResource("persistentvolumes")})


def lookup(name: str, group: str = "") -> Kind | None:
    """The table entry for a plural or singular resource name (case-insensitive), honouring `group`."""
    lowered = name.lower()
    kind = _BY_PLURAL.get(lowered) or _BY_SINGULAR.get(lowered)
    if kind is None:
        return None
    group = _LEGACY_GROUPS.get((kind.plural, group), group)
    if group and group != kind.group:
        return None
    return kind


def normalize(name: str, group: str = "") -> GroupResource:
    """Normalize as a RESTMapper would: plural, canonical group; unknown resources pass through lowered."""
    kind = lookup(name, group)
    return kind.group_resource if kind else GroupResource(name.lower(), group)


def parse(text: str) -> GroupResource:
    """`deployments.apps` -> GroupResource('deployments', 'apps'), normalized."""
    resource, _, group = text.partition(".")
    return normalize(resource, group)


def singular(gr: GroupResource) -> str:
    """The singular name a label template's `.Resource` expands to (`pods` -> `pod`)."""
    kind = lookup(gr.resource, gr.group)
    if kind:
        return kind.singular
    return gr.resource[:-1] if gr.resource.endswith("s") else gr.resource


def object_reference_fields(gr: GroupResource) -> tuple[str, str]:
    """(kind, apiVersion) for `describedObject`; unknown resources get a best-effort kind."""
    kind = lookup(gr.resource, gr.group)
    if kind:
        return kind.kind, f"{kind.group}/{kind.version}" if kind.group else kind.version
    name = singular(gr)
    return name[:1].upper() + name[1:], f"{gr.group}/v1" if gr.group else "v1"
