"""Which GPU nodes are DRA-backed: where Dynamic Resource Allocation, not a device plugin, serves the GPUs.

Why it exists: from Kubernetes 1.37 (`DRAExtendedResource` GA) a pod asking for `nvidia.com/gpu: N` is served
by a DRA driver on every node whose `nvidia.com/gpu` allocatable is not above 0 while a DeviceClass names
the resource in `spec.extendedResourceName`; a node with a device plugin keeps the classic path
(kube-scheduler's NodeResourcesFit decides per node; docs/extender.md#dra-backed-nodes). Clusters mix the two.
On a DRA-backed node the scheduler's DRA plugin picks the devices in its Filter/Reserve/PreBind, before an
extender's bind: a GPU set gpuwarden chose or recorded there would be fiction. So the model marks those
nodes, the extender passes them through (no rejection, no score, no claim) and explains why, and the
capabilities that promise GPU sets (make-room, GPU preemption) leave them alone.

What it must not do: no I/O. Unknown is not DRA: without a DeviceClass naming the resource a node without
allocatable GPUs is simply a node without GPUs, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def extended_resource_classes(device_classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """extended resource name -> DeviceClass name, from `resource.k8s.io/v1` DeviceClass objects.

    When several classes name the same resource the scheduler uses the newest one (KEP-5004); the answer here
    only needs to know that one exists, so the first name in sorted order is kept, for a stable note."""
    out: dict[str, str] = {}
    for obj in sorted(device_classes, key=lambda o: str((o.get("metadata") or {}).get("name", ""))):
        resource = (obj.get("spec") or {}).get("extendedResourceName")
        name = str((obj.get("metadata") or {}).get("name", ""))
        if isinstance(resource, str) and resource and name and resource not in out:
            out[resource] = name
    return out


def dra_class_for_node(device_plugin: bool, resource: str, classes: Mapping[str, str]) -> str:
    """The DeviceClass serving `resource` on a node, "" when its device plugin does (or nothing does).

    `device_plugin`: the node's allocatable of `resource` is above 0 (kube-scheduler's test in v1.37's
    noderesources `shouldDelegateResourceToDRA`: a node at 0 is served by DRA when a class maps the name)."""
    if device_plugin:
        return ""
    return classes.get(resource, "")


def passthrough_note(node: str, device_class: str) -> str:
    """What the extender says about a DRA-backed node it passed through."""
    return (
        f"node {node} serves its GPUs through DRA (DeviceClass {device_class}): the scheduler's DRA plugin "
        "allocates the devices (see the pod's ResourceClaim); gpuwarden records no GPU set there"
    )
