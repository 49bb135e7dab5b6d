"""Whether a DRA driver owns this node's GPUs, from the kubelet's plugin registry.

Why it exists: from Kubernetes 1.37 a DRA driver can serve `nvidia.com/gpu` on a node with no device plugin
for it (`DRAExtendedResource`); a device plugin registering the same resource there would put it in the
node's allocatable, take the node off DRA's path and hand the same GPUs out twice. A DRA kubelet plugin
registers through `<kubelet root>/plugins_registry/<driver>-reg.sock` (or
`<driver>-<pod uid or hash>-reg.sock` with rolling updates; k8s.io/dynamic-resource-allocation's
kubeletplugin), so the directory's entries say who is registered — no API access needed.

What it must not do: no I/O (the caller lists the directory).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SUFFIX = "-reg.sock"


def dra_owner(entries: Iterable[str], gpu_drivers: Sequence[str]) -> str:
    """The first of `gpu_drivers` with a registration socket among `entries` (file names), else ""."""
    names = [e for e in entries if e.endswith(SUFFIX)]
    for driver in gpu_drivers:
        for name in names:
            if name == f"{driver}{SUFFIX}" or name.startswith(f"{driver}-"):
                return driver
    return ""


def withheld_note(driver: str, resource: str) -> str:
    return (
        f"DRA driver {driver} is registered with this node's kubelet: the device plugin for {resource} is "
        "not served (the same GPUs under both would be handed out twice); remove the driver or "
        "node_agent.device_plugin.dra_drivers to serve it"
    )
