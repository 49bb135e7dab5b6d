"""Fake GPU nodes for the test bed.

gpuwarden schedules and heals GPU workloads, so the test bed needs nodes that advertise ``nvidia.com/gpu`` the
way the NVIDIA device plugin and GPU feature discovery would: allocatable GPUs, the usual ``nvidia.com/gpu.*``
labels and, optionally, gpuwarden's ``gpuwarden.io/gpu-topology`` annotation. kwok (running with
``--manage-all-nodes``) keeps a Node's ``status.allocatable``/``capacity`` as created, marks it Ready and runs
its pods, so a GPU node is simply a Node object created with that status. No addresses are set, so nothing can
ever try to dial a fake node IP.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from harness.testbed.cluster import Cluster
from harness.testbed.waiting import poll

GPU_RESOURCE = "nvidia.com/gpu"

TESTBED_LABEL = "gpuwarden.io/testbed-node"


@dataclass(frozen=True)
class GpuNodeSpec:
    """One fake GPU node."""

    name: str
    gpus: int = 8
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    ephemeral_storage: str = "1Ti"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    topology: Mapping[str, Any] | Sequence[Any] | None = None
    """Serialized as JSON into the ``gpuwarden.io/gpu-topology`` annotation when given."""
    taints: Sequence[Mapping[str, str]] = ()
    extra_resources: Mapping[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """The Node object (with status) to create."""
        labels = {
            "type": "kwok",
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            TESTBED_LABEL: "true",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.gpu_product,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            **self.labels,
        }
        annotations = {"kwok.x-k8s.io/node": "fake", **self.annotations}
        if self.topology is not None:
            annotations[TOPOLOGY_ANNOTATION] = json.dumps(self.topology, separators=(",", ":"))
        resources = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": self.ephemeral_storage,
            GPU_RESOURCE: str(self.gpus),
            **self.extra_resources,
        }
        spec: dict[str, Any] = {}
        if self.taints:
            spec["taints"] = [dict(t) for t in self.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": annotations},
            "spec": spec,
            "status": {"allocatable": dict(resources), "capacity": dict(resources)},
        }


def gpu_node_specs(count: int, prefix: str = "gpu-node-", **kwargs: Any) -> list[GpuNodeSpec]:
    """``count`` identical specs named ``<prefix>0`` .. ``<prefix><count-1>``."""
    return [GpuNodeSpec(name=f"{prefix}{i}", **kwargs) for i in range(count)]


def _node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def add_gpu_nodes(cluster: Cluster, specs: Iterable[GpuNodeSpec], *, timeout: float = 60.0) -> list[str]:
    """Create the nodes and wait until kwok reports each Ready with the requested GPU allocatable."""
    specs = list(specs)
    if not specs:
        return []
    manifests = [s.manifest() for s in specs]
    # Plain create keeps .status (like a kubelet registering); apply would drop it for an existing node.
    doc = {"apiVersion": "v1", "kind": "List", "items": manifests}
    cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    names = [s.name for s in specs]
    want = {s.name: str(s.gpus) for s in specs}

    def all_ready() -> bool:
        items = cluster.get_json("nodes", "-l", TESTBED_LABEL)["items"]
        by_name = {n["metadata"]["name"]: n for n in items}
        return all(
            n in by_name
            and _node_ready(by_name[n])
            and by_name[n]["status"].get("allocatable", {}).get(GPU_RESOURCE) == want[n]
            for n in names
        )

    poll(all_ready, timeout=timeout, what=f"nodes {', '.join(names)} Ready with {GPU_RESOURCE}")
    return names


def delete_nodes(cluster: Cluster, names: Iterable[str]) -> None:
    """Delete nodes (pods bound to them are garbage-collected by kube-controller-manager)."""
    names = list(names)
    if names:
        cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false")
