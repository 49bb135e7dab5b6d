"""Render a discovered topology as the `gpuwarden.io/gpu-topology` node annotation.

Why it exists: the scheduler extender (controller/gpus/topology.py `parse_annotation`) reads this
annotation to keep a job's GPUs on one NUMA node, PCIe switch or NVLink domain. The format is theirs:
`{"<id>": {"numa": 0, "pcie": "<switch id>", "nvlink": "nvl<k>", "uuid": "GPU-..."}, ...}`, and on a
MIG-enabled GPU `"mig": [{"uuid": "MIG-...", "gi": 1, "ci": 0, "profile": "1g.10gb"}, ...]` (drain and idle
tie the kubelet's opaque MIG device IDs to their GPU and instance with it). The GPU id must
be the id the NVIDIA device plugin hands to kubelet (`--device-id-strategy`: the UUID by default, or the
index), or the extender's claims would name GPUs that kubelet does not know.

Pure and deterministic (same topology, same bytes, so an unchanged node is never re-patched). An unknown
value is left out, never filled in: the extender treats an absent key as "does not align".
"""

from __future__ import annotations

import json
from typing import Any, Literal

from nodeagent.topology.model import DiscoveredTopology, GpuDevice, TopologyReadError

IdStrategy = Literal["uuid", "index"]


def nvlink_domains(gpus: tuple[GpuDevice, ...]) -> dict[str, str]:
    """Bus id -> "nvl<k>": connected components of the NVLink peer graph, k the smallest index in each.

    Links count in both directions (a peer listed on one side only still joins the two). GPUs without any
    link are absent from the result.
    """
    parent = {g.pci_bus_id: g.pci_bus_id for g in gpus}

    def root(bus_id: str) -> str:
        while parent[bus_id] != bus_id:
            parent[bus_id] = parent[parent[bus_id]]
            bus_id = parent[bus_id]
        return bus_id

    linked: set[str] = set()
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer not in parent:
                raise TopologyReadError(f"GPU {gpu.index}: NVLink peer {peer} is not a GPU of this node")
            linked.update((gpu.pci_bus_id, peer))
            parent[root(peer)] = root(gpu.pci_bus_id)
    smallest: dict[str, int] = {}
    for gpu in gpus:
        if gpu.pci_bus_id in linked:
            component = root(gpu.pci_bus_id)
            smallest[component] = min(smallest.get(component, gpu.index), gpu.index)
    return {g.pci_bus_id: f"nvl{smallest[root(g.pci_bus_id)]}" for g in gpus if g.pci_bus_id in linked}


def render(topo: DiscoveredTopology, id_strategy: IdStrategy) -> str:
    """The annotation value: compact JSON, GPUs in index order, attributes in a fixed order."""
    domains = nvlink_domains(topo.gpus)
    doc: dict[str, dict[str, Any]] = {}
    for gpu in sorted(topo.gpus, key=lambda g: g.index):
        if id_strategy == "uuid":
            if gpu.uuid is None:
                raise TopologyReadError(
                    f"GPU {gpu.index} ({gpu.pci_bus_id}) has no known UUID, so it cannot be named for "
                    "--device-id-strategy=uuid (read NVML, or use the index strategy)"
                )
            key = gpu.uuid
        else:
            key = str(gpu.index)
        if key in doc:
            raise TopologyReadError(f"GPU id {key!r} would appear twice in the annotation")
        attrs: dict[str, Any] = {}
        if gpu.numa is not None:
            attrs["numa"] = gpu.numa
        if gpu.pcie_switch is not None:
            attrs["pcie"] = gpu.pcie_switch
        if gpu.pci_bus_id in domains:
            attrs["nvlink"] = domains[gpu.pci_bus_id]
        if gpu.uuid is not None:
            attrs["uuid"] = gpu.uuid
        if gpu.mig:
            attrs["mig"] = [
                {"uuid": m.uuid, "gi": m.gi, "ci": m.ci, **({"profile": m.profile} if m.profile else {})}
                for m in gpu.mig
            ]
        doc[key] = attrs
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
