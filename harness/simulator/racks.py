"""NVL72-shaped fleets for the simulator and the test bed: racks of 18 compute trays of 4 GPUs, one NVLink
domain per rack, and the fault that takes one tray's NVLinks down.

Why it exists: domain health and placement inside a domain are only exercised by a fleet that has domains.
A GB200/GB300 NVL72 is 18 trays (Kubernetes nodes) of 4 GPUs on one fabric, labelled by GPU feature
discovery `nvidia.com/gpu.clique=<cluster uuid>.<clique id>` (../shared/reference/autoscalers-and-domains.md
§C.1). Racks here share one clique id under different cluster UUIDs, as two observed GB200 racks did
(dra-driver-nvidia-gpu #377), so a reader that keyed a domain by the clique id alone would merge them.
The simulated dcgm-exporter (scenario) and the kwok nodes (harness/testbed/nodes.py) are built from the same
names here, so a tray's DCGM series and its Node agree.

What it must not do: no I/O; it only shapes data.
"""

from __future__ import annotations

import uuid
from typing import Any

TRAYS_PER_RACK = 18
GPUS_PER_TRAY = 4
CLIQUE_ID = 17044
CLIQUE_LABEL = "nvidia.com/gpu.clique"
GB200_PRODUCT = "NVIDIA-GB200"
GB200_MEMORY_MIB = 189471
GB200_MODEL: dict[str, Any] = {
    "model_name": "NVIDIA GB200",
    "memory_mib": GB200_MEMORY_MIB,
    "power_idle_watts": 150.0,
    "power_max_watts": 1200.0,
}
"""The simulated GPU of a tray (dcgm-exporter's `modelName`; the memory and power are round figures)."""
# A fabric health mask with degraded_bw and route_unhealthy asserted (TRUE = 1), the other boolean
# sub-fields FALSE (2) and incorrect_configuration NONE (1): what a tray whose NVLinks went down reports.
NVLINKS_DOWN_MASK = 0b01 | (0b10 << 2) | (0b01 << 4) | (0b10 << 6) | (0b0001 << 8)
NVLINK_ERRORS_PER_SECOND = 5000.0


def tray_name(index: int, prefix: str = "nvl72-") -> str:
    """The `index`-th tray of the fleet (rack `index // 18`)."""
    return f"{prefix}{index:04d}"


def rack_of(index: int) -> int:
    return index // TRAYS_PER_RACK


def cluster_uuid(rack: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"rack-{rack}.nvl72.gpuwarden.test"))


def clique(rack: int) -> str:
    """The rack's `nvidia.com/gpu.clique` value: `<cluster uuid>.<clique id>`."""
    return f"{cluster_uuid(rack)}.{CLIQUE_ID}"


def trays(racks: int, prefix: str = "nvl72-") -> list[tuple[str, str]]:
    """(tray name, its clique) for every tray of `racks` racks, in order."""
    return [(tray_name(i, prefix), clique(rack_of(i))) for i in range(racks * TRAYS_PER_RACK)]


def scenario(racks: int, prefix: str = "nvl72-", **extra: Any) -> dict[str, Any]:
    """Simulator scenario data for `racks` NVL72 racks (`extra`: more top-level sections, e.g. exporter)."""
    fleet = {
        "nodes": racks * TRAYS_PER_RACK,
        "gpus_per_node": GPUS_PER_TRAY,
        "numa_nodes": 2,
        "node_name_pattern": prefix + "{index:04d}",
        "gpu": GB200_MODEL,
    }
    return {"fleet": fleet, **extra}


def nvlinks_down(node: str) -> list[dict[str, Any]]:
    """The faults (simulator control API) taking every NVLink of one tray down: its GPUs' fabric health
    mask asserts degraded bandwidth and an unhealthy route, and their NVLink error counters climb."""
    return [
        {"kind": "fabric_health", "node": node, "value": NVLINKS_DOWN_MASK},
        {"kind": "nvlink_errors", "node": node, "value": NVLINK_ERRORS_PER_SECOND},
    ]
