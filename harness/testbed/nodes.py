"""Fake GPU nodes for the test bed.

gpuwarden schedules and heals GPU workloads, so the test bed needs nodes that advertise ``nvidia.com/gpu`` the
way the NVIDIA device plugin and GPU feature discovery would: allocatable GPUs, the usual ``nvidia.com/gpu.*``
labels and, optionally, gpuwarden's ``gpuwarden.io/gpu-topology`` annotation. kwok (running with
``--manage-all-nodes``) keeps a Node's ``status.allocatable``/``capacity`` as created, marks it Ready and runs
its pods, so a GPU node is simply a Node object created with that status. No addresses are set, so nothing can
ever try to dial a fake node IP.

Shared GPUs (`GpuNodeSpec.sharing`, helpers `time_sliced_node` / `mig_single_node` / `mig_mixed_node`): the
node advertises what NVIDIA's device plugin advertises and carries GPU feature discovery's labels for it
(reference/gpu-sharing.md sections 1-3): time-slicing or MPS offer each GPU `replicas` times (`nvidia.com/gpu`
= GPUs x replicas) with `nvidia.com/gpu.count` = physical GPUs, `nvidia.com/gpu.replicas`,
`nvidia.com/gpu.sharing-strategy` and a `-SHARED` product; MIG single offers every MIG instance as one
`nvidia.com/gpu` (`nvidia.com/gpu.count` = instances, product `<model>-MIG-<profile>`); MIG mixed offers
`nvidia.com/mig-<profile>` resources with per-profile labels.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.gpusharing import (
    GFD_COUNT,
    GFD_MIG_STRATEGY,
    GFD_PRODUCT,
    GFD_REPLICAS,
    GFD_SHARING_STRATEGY,
    MIG_RESOURCE_PREFIX,
)
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from harness.simulator import racks as nvl72
from harness.testbed.cluster import Cluster
from harness.testbed.waiting import poll

GPU_RESOURCE = "nvidia.com/gpu"

TESTBED_LABEL = "gpuwarden.io/testbed-node"


SHARING_MODES = ("whole", "time-slicing", "mps", "mig-single", "mig-mixed")
GFD_MEMORY = "nvidia.com/gpu.memory"


def mig_memory_mb(profile: str) -> int:
    """GFD's `*.memory` of a MIG profile's instance (`1g.10gb` -> 9984)."""
    gb = profile.split(".", 1)[1].removesuffix("+me").removesuffix("gb") if "." in profile else "0"
    return int(gb) * 1024 - 256 if gb.isdigit() else 0


@dataclass(frozen=True)
class NodeSharing:
    """How the node's device plugin shares its GPUs (GFD labels and advertised resources follow from it).

    `mode`: one of SHARING_MODES. `replicas`: time-slicing / mps, per GPU. `mig_profile`, `mig_instances`:
    MIG single, the profile and instances per GPU. `mig_layout`: MIG mixed, profile -> instances per GPU."""

    mode: str = "whole"
    replicas: int = 4
    mig_profile: str = "1g.10gb"
    mig_instances: int = 7
    mig_layout: Mapping[str, int] = field(default_factory=dict)

    def scenario(self) -> dict[str, Any]:
        """The same sharing as the fleet simulator's scenario writes it (`fleet.node_sharing.<node>`), so
        a kwok node and its simulated dcgm-exporter agree on replicas and MIG instances."""
        if self.mode in ("time-slicing", "mps"):
            return {"mode": self.mode, "replicas": self.replicas}
        if self.mode == "mig-single":
            return {"mode": self.mode, "mig_instances": [self.mig_profile] * self.mig_instances}
        if self.mode == "mig-mixed":
            layout = [p for p, n in self.mig_layout.items() for _ in range(n)]
            return {"mode": self.mode, "mig_instances": layout}
        return {"mode": "whole"}

    def __post_init__(self) -> None:
        if self.mode not in SHARING_MODES:
            raise ValueError(f"sharing mode {self.mode!r} is not one of {', '.join(SHARING_MODES)}")
        if self.mode in ("time-slicing", "mps") and self.replicas < 2:
            raise ValueError("time-slicing needs replicas >= 2 (the device plugin refuses fewer)")


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
    sharing: NodeSharing | None = None
    """Shared GPUs; None (or mode `whole`): one `nvidia.com/gpu` per physical GPU."""

    def gpu_slots(self) -> int | None:
        """What the node advertises as `nvidia.com/gpu` (None: not at all, as under MIG mixed)."""
        sh = self.sharing
        if sh is None or sh.mode == "whole":
            return self.gpus
        if sh.mode in ("time-slicing", "mps"):
            return self.gpus * sh.replicas
        if sh.mode == "mig-single":
            return self.gpus * sh.mig_instances
        return None

    def gfd_labels(self) -> dict[str, str]:
        """GPU feature discovery's `nvidia.com/*` labels for this node's GPUs and sharing."""
        labels = {
            "nvidia.com/gpu.present": "true",
            GFD_PRODUCT: self.gpu_product,
            GFD_COUNT: str(self.gpus),
            GFD_MEMORY: str(self.gpu_memory_mib),
        }
        sh = self.sharing
        if sh is None or sh.mode == "whole":
            return labels
        if sh.mode in ("time-slicing", "mps"):
            labels |= {
                GFD_PRODUCT: f"{self.gpu_product}-SHARED",
                GFD_REPLICAS: str(sh.replicas),
                GFD_SHARING_STRATEGY: sh.mode,
            }
            if sh.mode == "mps":
                labels["nvidia.com/mps.capable"] = "true"
            return labels
        labels |= {"nvidia.com/mig.capable": "true", GFD_SHARING_STRATEGY: "none"}
        if sh.mode == "mig-single":
            return labels | {
                GFD_MIG_STRATEGY: "single",
                GFD_PRODUCT: f"{self.gpu_product}-MIG-{sh.mig_profile}",
                GFD_COUNT: str(self.gpus * sh.mig_instances),
                GFD_MEMORY: str(mig_memory_mb(sh.mig_profile)),
                GFD_REPLICAS: "1",
            }
        labels |= {GFD_MIG_STRATEGY: "mixed", GFD_REPLICAS: "0"}
        for profile, per_gpu in sh.mig_layout.items():
            prefix = f"{MIG_RESOURCE_PREFIX}{profile}"
            labels |= {
                f"{prefix}.count": str(self.gpus * per_gpu),
                f"{prefix}.memory": str(mig_memory_mb(profile)),
                f"{prefix}.product": f"{self.gpu_product}-MIG-{profile}",
                f"{prefix}.replicas": "1",
                f"{prefix}.sharing-strategy": "none",
            }
        return labels

    def gpu_resources(self) -> dict[str, str]:
        """The GPU resources the device plugin advertises (capacity = allocatable here)."""
        slots = self.gpu_slots()
        resources = {GPU_RESOURCE: str(slots)} if slots is not None else {}
        sh = self.sharing
        if sh is not None and sh.mode == "mig-mixed":
            for profile, per_gpu in sh.mig_layout.items():
                resources[f"{MIG_RESOURCE_PREFIX}{profile}"] = str(self.gpus * per_gpu)
        return resources

    def manifest(self) -> dict[str, Any]:
        """The Node object (with status) to create."""
        labels = {
            "type": "kwok",
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            TESTBED_LABEL: "true",
            **self.gfd_labels(),
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
            **self.gpu_resources(),
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


def nvl72_node_specs(racks: int, prefix: str = "nvl72-", **kwargs: Any) -> list[GpuNodeSpec]:
    """The trays of `racks` GB200 NVL72 racks (harness.simulator.racks): 4 GPUs each, labelled with their
    rack's `nvidia.com/gpu.clique`, named as the simulator names them so DCGM series and Nodes agree."""
    extra = dict(kwargs.pop("labels", {}))
    return [
        GpuNodeSpec(
            name=name,
            gpus=nvl72.GPUS_PER_TRAY,
            gpu_product=nvl72.GB200_PRODUCT,
            gpu_memory_mib=nvl72.GB200_MEMORY_MIB,
            labels={nvl72.CLIQUE_LABEL: clique, **extra},
            **kwargs,
        )
        for name, clique in nvl72.trays(racks, prefix)
    ]


def time_sliced_node(
    name: str, gpus: int = 8, replicas: int = 4, *, mps: bool = False, **kwargs: Any
) -> GpuNodeSpec:
    """A node whose device plugin time-slices (or, `mps`, shares with MPS) each GPU `replicas` ways:
    `nvidia.com/gpu` = gpus x replicas, `nvidia.com/gpu.count` = gpus."""
    mode = "mps" if mps else "time-slicing"
    return GpuNodeSpec(name=name, gpus=gpus, sharing=NodeSharing(mode, replicas=replicas), **kwargs)


def mig_single_node(
    name: str, gpus: int = 8, profile: str = "1g.10gb", instances_per_gpu: int = 7, **kwargs: Any
) -> GpuNodeSpec:
    """A node with MIG strategy single: `instances_per_gpu` instances of `profile` on each of `gpus` GPUs,
    each one `nvidia.com/gpu` (`nvidia.com/gpu.count` = the instances; no label says how many GPUs)."""
    sharing = NodeSharing("mig-single", mig_profile=profile, mig_instances=instances_per_gpu)
    return GpuNodeSpec(name=name, gpus=gpus, sharing=sharing, **kwargs)


def mig_mixed_node(name: str, layout: Mapping[str, int], gpus: int = 8, **kwargs: Any) -> GpuNodeSpec:
    """A node with MIG strategy mixed: `layout` (profile -> instances per GPU) on every GPU, advertised as
    `nvidia.com/mig-<profile>`; `nvidia.com/gpu.count` stays the physical GPUs."""
    return GpuNodeSpec(
        name=name, gpus=gpus, sharing=NodeSharing("mig-mixed", mig_layout=dict(layout)), **kwargs
    )


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
    want = {s.name: s.gpu_resources() for s in specs}

    def all_ready() -> bool:
        items = cluster.get_json("nodes", "-l", TESTBED_LABEL)["items"]
        by_name = {n["metadata"]["name"]: n for n in items}
        return all(
            n in by_name
            and _node_ready(by_name[n])
            and all(by_name[n]["status"].get("allocatable", {}).get(k) == v for k, v in want[n].items())
            for n in names
        )

    poll(all_ready, timeout=timeout, what=f"nodes {', '.join(names)} Ready with their GPU resources")
    return names


def delete_nodes(cluster: Cluster, names: Iterable[str]) -> None:
    """Delete nodes (pods bound to them are garbage-collected by kube-controller-manager)."""
    names = list(names)
    if names:
        cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false")
