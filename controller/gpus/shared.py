"""Nodes that share their GPUs (time-slicing, MPS, MIG): passed through by the extender, given no GPU set.

Why it exists: on such a node the GPU resource counts replicas or MIG instances, not GPUs (`gpusharing`).
The device plugin picks which replica or instance a container gets, and kubelet hands out replicas of the
same physical GPUs to several pods; a GPU set chosen by index would name GPUs that do not exist (0..31 on 8
GPUs), and a NUMA or PCIe promise about replicas cannot be kept (the plugin aligns only whole GPUs). So the
model marks these nodes like DRA-backed ones (`dra.py`): the extender passes them through with this reason
and an Event, records no set, and the capabilities that promise sets (make-room, GPU preemption) leave them
alone. kube-scheduler's own resource fit still counts the slots.

What it must not do: no I/O; it only words the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.gpus.objects import NodeInfo
from gpuwarden.gpusharing import GpuSharing


def shared_note(node: str, sharing: GpuSharing) -> str:
    """What the extender says about a node it passed through because it shares its GPUs."""
    return (
        f"node {node} shares its GPUs ({sharing.describe()}): the device plugin picks the replicas or MIG "
        "instances and no topology policy holds for them; gpuwarden records no GPU set there"
    )


def sharing_rows(infos: Iterable[NodeInfo]) -> list[dict[str, Any]]:
    """Per GPU node (one that advertises GPU slots in any form), its sharing mode and physical GPU count:
    what `gpuwarden plan` shows, sorted by node name."""
    rows = []
    for info in sorted(infos, key=lambda i: i.name):
        s = info.sharing
        if not (s.slots or s.physical or info.allocatable):
            continue
        rows.append(
            {
                "node": info.name,
                "mode": s.mode.value,
                "physical_gpus": s.physical,
                "source": s.source,
                "replicas": s.replicas,
                "slots": s.slots,
                "resource": s.resource,
                "mig_profile": s.mig_profile,
            }
        )
    return rows
