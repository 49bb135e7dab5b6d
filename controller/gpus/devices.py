"""DRA devices on a node, and which of them a pod holds: read from ResourceSlices and ResourceClaims.

Why it exists: on a DRA-backed GPU node (`dra.py`) no `gpuwarden.io/gpu-ids` annotation tells which GPUs a
pod holds, and a quarantine names GPUs by the UUID DCGM reports. Two readings bridge that, and both the
health loop (which device to taint) and the drain (which pods hold it) need the same ones:

- `devices_by_uuid`: the node's ResourceSlices (`resource.k8s.io/v1`) list its devices under
  driver / pool / name, each with attributes; a GPU driver publishes the GPU's UUID as the attribute `uuid`
  (NVIDIA's DRA driver: `uuid`, in its own domain `gpu.nvidia.com`). Only the newest generation of a pool
  counts (older slices are on their way out).
- `pod_devices`: a pod's claims (`spec.resourceClaims`, the names generated for templates in
  `status.resourceClaimStatuses`, and the claim the scheduler made for a DRA-backed extended resource in
  `status.extendedResourceClaimStatus`) and, per claim, `status.allocation.devices.results[]` {driver, pool,
  device}.

What it must not do: no I/O, no guessing. A claim the caller could not find or that is not allocated makes
the pod's devices unknown (None), never "none": the drain then widens to the whole node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuwarden.quarantine import DeviceRef

Obj = Mapping[str, Any]
UUID_ATTRIBUTE = "uuid"
"""The attribute GPU DRA drivers publish a GPU's UUID under (qualified names ending in `/uuid` count)."""


def _uuid(attributes: Mapping[str, Any]) -> str:
    for name in sorted(attributes):
        if name == UUID_ATTRIBUTE or name.endswith("/" + UUID_ATTRIBUTE):
            value = attributes[name]
            if isinstance(value, Mapping) and isinstance(value.get("string"), str):
                return str(value["string"])
    return ""


def devices_by_uuid(slices: Iterable[Obj], node: str) -> dict[str, DeviceRef]:
    """GPU UUID -> device, from the ResourceSlices of `node` (newest generation of each pool)."""
    newest: dict[tuple[str, str], int] = {}
    mine: list[Obj] = []
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool.get("name", "")))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(newest.get(key, generation), generation)
        mine.append(obj)
    out: dict[str, DeviceRef] = {}
    for obj in mine:
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        driver, pool_name = str(spec.get("driver", "")), str(pool.get("name", ""))
        if int(pool.get("generation") or 0) != newest[(driver, pool_name)]:
            continue
        for device in spec.get("devices") or []:
            uuid = _uuid(device.get("attributes") or {})
            name = str(device.get("name", ""))
            if uuid and name and driver and pool_name:
                out.setdefault(uuid, DeviceRef(driver, pool_name, name, uuid))
    return out


def claim_names(pod: Obj) -> tuple[str, ...] | None:
    """The names of the ResourceClaims a pod uses (same namespace); None when one is not known yet (a
    template's claim not generated, so not listed in the status)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {
        str(s.get("name", "")): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    names: list[str] = []
    for ref in spec.get("resourceClaims") or []:
        direct = ref.get("resourceClaimName")
        name = direct if direct else generated.get(str(ref.get("name", "")))
        if not name:
            if ref.get("resourceClaimTemplateName"):
                return None  # the claim is not generated (or not recorded) yet: unknown
            continue
        names.append(str(name))
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        names.append(str(extended["resourceClaimName"]))
    return tuple(sorted(set(names)))


def allocated_devices(claim: Obj) -> frozenset[DeviceRef] | None:
    """The devices a ResourceClaim's allocation holds; None when it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    return frozenset(
        DeviceRef(str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in (allocation.get("devices") or {}).get("results") or []
    )


def pod_devices(pod: Obj, claims: Mapping[tuple[str, str], Obj]) -> frozenset[DeviceRef] | None:
    """The DRA devices `pod` holds (UUIDs left empty), from `claims` keyed by (namespace, name);
    None when any of its claims is unknown or unallocated."""
    names = claim_names(pod)
    if names is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    held: set[DeviceRef] = set()
    for name in names:
        claim = claims.get((namespace, name))
        devices = allocated_devices(claim) if claim is not None else None
        if devices is None:
            return None
        held |= devices
    return frozenset(held)


def holds_any(held: Iterable[DeviceRef], faulty: Iterable[DeviceRef]) -> bool:
    """Whether a pod's devices include a faulty one (compared by driver/pool/device, not UUID)."""
    keys = {d.key for d in faulty}
    return any(d.key in keys for d in held)
