"""Whether this node shares its GPUs, from its own Node object: then the device plugin is not served.

Why it exists: on a node whose GPUs NVIDIA's device plugin offers as time-slicing or MPS replicas or as MIG
instances (GPU feature discovery's labels say so: gpuwarden.gpusharing), the GPU resource counts replicas or
instances with device IDs `<uuid>::<n>` or `MIG-...`. Our device plugin offers whole GPUs by index: were it
to register the same resource there, the kubelet would take its devices in place of NVIDIA's and the
sharing the operator configured would be gone (and pods already holding replicas would share with pods
handed whole GPUs). So enforce mode withholds the plugin on such nodes and says why, as it does when a DRA
driver owns the GPUs (draowner.py); topology and PodResources reconciliation go on.

What it must not do: no I/O (the caller passes the Node object from its informer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.gpusharing import GpuSharing, node_sharing


def node_shares_gpus(node: Mapping[str, Any] | None, resource: str) -> GpuSharing | None:
    """The node's sharing when it shares its GPUs, else None (also when the Node is not known yet)."""
    if node is None:
        return None
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    sharing = node_sharing(meta.get("labels") or {}, status.get("capacity") or {}, resource)
    return sharing if sharing.shared else None


def shared_note(sharing: GpuSharing, resource: str) -> str:
    return (
        f"this node shares its GPUs ({sharing.describe()}): the device plugin for {resource} is not served "
        "(its whole-GPU devices would replace the replicas or MIG instances NVIDIA's plugin offers); "
        "gpuwarden's topology and reconciliation go on"
    )
