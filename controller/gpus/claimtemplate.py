"""A topology policy as a DRA ResourceClaimTemplate: GPU alignment where DRA, not gpuwarden, allocates.

Why it exists: on a DRA-backed node (dra.py) the scheduler's DRA plugin picks the devices, and the claim it
generates for `nvidia.com/gpu: N` has no constraint at all, so nothing aligns those GPUs. A claim can ask
for it: `constraints[].matchAttribute` makes every device share one value of a standard attribute —
`resource.kubernetes.io/numaNode` (from Kubernetes 1.37, when the driver publishes it) or
`resource.kubernetes.io/pcieRoot` — and a prioritized list (`firstAvailable`, GA in 1.36) expresses
"aligned if possible". This module turns the pod annotation's policy (`gpuwarden.io/topology-policy`) and a
GPU count into that template; `gpuwarden dra claim-template` prints it (docs/extender.md#topology-on-dra-nodes
says why a generator and not a mutating webhook).

What it must not do: no I/O, no guessing of a driver's attributes beyond the standard ones.
"""

from __future__ import annotations

from typing import Any

from controller.gpus.fit import Policy
from gpuwarden.wellknown import TOPOLOGY_POLICY

NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
REQUEST = "gpus"
"""The claim's request name; a container refers to the pod's claim, not to this."""

_MATCH = {Policy.SINGLE_NUMA: NUMA_ATTRIBUTE, Policy.SINGLE_PCIE: PCIE_ATTRIBUTE}


class TemplateError(ValueError):
    """A request that no template can express; the message names the option."""


def template_name(gpus: int, policy: Policy) -> str:
    """`gpus-<n>-<policy>`: one template per shape, shared by every pod of a namespace that wants it."""
    return f"gpus-{gpus}-{policy.value}"


def claim_template(
    *, gpus: int, policy: str, device_class: str, namespace: str, name: str = ""
) -> dict[str, Any]:
    """The ResourceClaimTemplate (`resource.k8s.io/v1`) for `gpus` devices of `device_class` under `policy`.

    single-numa / single-pcie: one request of exactly `gpus` devices that must share the attribute.
    prefer-numa: a prioritized list - the aligned subrequest first, any `gpus` devices second.
    none: no constraint (what the scheduler generates for `nvidia.com/gpu`, as a template)."""
    if gpus < 1:
        raise TemplateError(f"--gpus must be at least 1, not {gpus}")
    if not device_class.strip():
        raise TemplateError("--device-class must name the DeviceClass of the GPUs (e.g. gpu.nvidia.com)")
    try:
        chosen = Policy(policy.strip().lower())
    except ValueError:
        allowed = ", ".join(p.value for p in Policy)
        raise TemplateError(f"--policy must be one of {allowed}, not {policy!r}") from None
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": gpus}
    devices: dict[str, Any]
    if chosen in _MATCH:
        devices = {
            "requests": [{"name": REQUEST, "exactly": exactly}],
            "constraints": [{"requests": [REQUEST], "matchAttribute": _MATCH[chosen]}],
        }
    elif chosen is Policy.PREFER_NUMA:
        devices = {
            "requests": [
                {
                    "name": REQUEST,
                    "firstAvailable": [{"name": "aligned", **exactly}, {"name": "any", **exactly}],
                }
            ],
            "constraints": [{"requests": [f"{REQUEST}/aligned"], "matchAttribute": NUMA_ATTRIBUTE}],
        }
    else:
        devices = {"requests": [{"name": REQUEST, "exactly": exactly}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name or template_name(gpus, chosen),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuwarden"},
            "annotations": {TOPOLOGY_POLICY: chosen.value},
        },
        "spec": {"spec": {"devices": devices}},
    }


def pod_usage(template: str, container: str = "main") -> dict[str, Any]:
    """The pod fragment that uses the template: `spec.resourceClaims` and the container's `claims`."""
    return {
        "spec": {
            "resourceClaims": [{"name": REQUEST, "resourceClaimTemplateName": template}],
            "containers": [{"name": container, "resources": {"claims": [{"name": REQUEST}]}}],
        }
    }
