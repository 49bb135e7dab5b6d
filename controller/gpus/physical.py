"""Which physical GPUs a pod's device IDs name on its node: the one reading drain (and idle) act on.

Why it exists: a fault, and a GPU's utilization, belong to a *physical* GPU; what a pod records is a device
ID. Without sharing the two coincide (a topology id, or the GPU's UUID under the device plugin's default
`--device-id-strategy=uuid`). With sharing they do not: time-slicing and MPS hand out replicas
`<uuid>::<n>`, MIG hands out MIG devices - legacy `MIG-GPU-<uuid>/<gi>/<ci>` names its GPU, a modern
`MIG-<uuid>` is opaque and only the node's published MIG devices (`gpuwarden.io/gpu-topology`, `mig`) tie it
to one. A capability that compared device IDs with the quarantine's GPU UUIDs would leave a replica holder
on a faulty GPU, or move every sharer of a healthy one; so each asks `physical_gpus` here.

Where it cannot be told - an opaque MIG UUID no topology lists, an id no topology knows, a compound ID of
another sharing layer (HAMi's `<uuid>-<i>`) - the ID is *unknown*, and the caller widens (safety rule 1):
unknown never narrows what a fault covers, and never makes a GPU idle.

The ID grammar is the kernel's (`gpuwarden.gpusharing.device_ref`); the topology is `topology.py`'s.
No I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.gpus.topology import NodeTopology, mig_devices
from gpuwarden.gpusharing import device_ref, is_gpu_uuid


@dataclass(frozen=True, slots=True)
class MigPlace:
    """Where a MIG device lives: its physical GPU (UUID, or the topology id when the GPU's UUID is not
    published) and its GPU instance id (dcgm-exporter's `GPU_I_ID`; None when not published)."""

    gpu: str
    gi: int | None = None


def mig_places(*sources: NodeTopology | None) -> dict[str, MigPlace]:
    """MIG UUID -> its place, from the MIG devices the node's topology lists (earlier sources first)."""
    return {uuid: MigPlace(gpu.uuid or gpu.id, mig.gi) for uuid, (gpu, mig) in mig_devices(*sources).items()}


@dataclass(frozen=True, slots=True)
class Device:
    """One device ID resolved: the physical GPU's UUID, how it was found, and its MIG instance if any."""

    device_id: str
    uuid: str
    via_id: bool = False
    """Found through the topology's id -> UUID (an index): only as good as the topology."""
    replica: int | None = None
    gi: int | None = None
    """The MIG device's GPU instance id, where the ID or the topology says."""
    mig: str = ""


@dataclass(frozen=True, slots=True)
class Held:
    """The physical GPUs a set of device IDs names, and the IDs that name none we can tell (with why)."""

    devices: tuple[Device, ...] = ()
    unknown: tuple[str, ...] = ()
    """`"<device id>: <why>"` per ID that cannot be resolved; non-empty means the holding is unknown."""

    @property
    def gpus(self) -> frozenset[str]:
        """The physical GPUs' UUIDs."""
        return frozenset(d.uuid for d in self.devices)

    @property
    def via_id(self) -> bool:
        return any(d.via_id for d in self.devices)


def _resolve(
    device_id: str, uuid_to_id: Mapping[str, str], by_id: Mapping[str, str], migs: Mapping[str, MigPlace]
) -> Device | str:
    """One device ID as a `Device`, or the reason it names no physical GPU that can be told."""
    ref = device_ref(device_id)
    gpu, gi = ref.gpu, ref.gi
    if not gpu:
        place = migs.get(ref.mig)
        if place is None:
            return f"{device_id}: an opaque MIG UUID the node's topology does not list (no parent GPU)"
        gpu, gi = place.gpu, place.gi
    elif ref.mig and ref.mig in migs:
        gi = migs[ref.mig].gi if gi is None else gi
    if gpu in uuid_to_id or is_gpu_uuid(gpu):
        return Device(device_id, gpu, False, ref.replica, gi, ref.mig)
    if gpu in by_id:
        return Device(device_id, by_id[gpu], True, ref.replica, gi, ref.mig)
    return f"{device_id}: names no GPU the node's topology lists with a UUID"


def physical_gpus(
    device_ids: Iterable[str], uuid_to_id: Mapping[str, str], migs: Mapping[str, MigPlace] | None = None
) -> Held:
    """The physical GPUs `device_ids` (kubelet PodResources IDs, or a recorded `gpu-ids` set) name.

    `uuid_to_id`: the node topology's GPU UUID -> id (`topology.uuid_map`); `migs`: its MIG devices
    (`mig_places`). A GPU UUID is an exact identity and needs no topology; an index needs the topology's
    UUID for it; a replica is its GPU; a MIG device is its parent GPU."""
    by_id = {gpu_id: uuid for uuid, gpu_id in uuid_to_id.items()}
    devices: list[Device] = []
    unknown: list[str] = []
    for device_id in device_ids:
        got = _resolve(device_id, uuid_to_id, by_id, migs or {})
        if isinstance(got, Device):
            devices.append(got)
        else:
            unknown.append(got)
    return Held(tuple(devices), tuple(unknown))
