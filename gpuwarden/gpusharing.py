"""How a node shares its GPUs, and how many physical GPUs it has: the one notion every capability reads.

Why it exists: NVIDIA's device plugin advertises `nvidia.com/gpu` as *slots*, not GPUs. With time-slicing or
MPS each physical GPU is offered `replicas` times (8 GPUs x 4 = `nvidia.com/gpu: 32`, device IDs
`<uuid>::<n>`); with MIG `single` every MIG instance is one `nvidia.com/gpu` (56 on 8 H100s); with MIG
`mixed` instances are `nvidia.com/mig-<profile>` resources. GPU feature discovery (GFD) publishes what the
sharing is: `nvidia.com/gpu.count` (physical GPUs, *not* multiplied by replicas; but under MIG single it
counts instances), `nvidia.com/gpu.replicas`, `nvidia.com/gpu.sharing-strategy`, `nvidia.com/mig.strategy`
and a `-SHARED` / `-MIG-<profile>` suffix on `nvidia.com/gpu.product`. A capability that reads the capacity
as a GPU count quarantines a healthy time-sliced node as "24 GPUs missing" or records GPU sets 0..31 on a
node with 8 GPUs; so none does: each asks `node_sharing` (nodes) and `device_ref` (device IDs from
PodResources or the device plugin) here.

The operator's expected-GPUs label (`gpuwarden.io/expected-gpus`) still overrides the physical count.
Unknown stays unknown: where nothing published says how many physical GPUs there are (MIG single without
the label or a topology), `physical` is None and no capability may guess it (safety rule 1).

What it must not do: I/O, logging, reading the clock, or importing a deployable (every layer imports it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuwarden.wellknown import EXPECTED_GPUS

# GPU feature discovery's labels (NVIDIA k8s-device-plugin `internal/lm`); keys keep `nvidia.com/gpu.*` even
# when the resource is renamed to `nvidia.com/gpu.shared`.
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
GFD_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"
"""`renameByDefault: true` advertises `<resource>.shared` instead of `<resource>`."""

_REPLICA = re.compile(r"^(?P<id>.+)::(?P<n>\d+)$")
_LEGACY_MIG = re.compile(r"^MIG-(?P<parent>GPU-[^/]+)/(?P<gi>\d+)/(?P<ci>\d+)$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class SharingMode(StrEnum):
    """How the device plugin offers a node's GPUs (the whole node shares one way: the plugin applies one
    sharing config to every GPU of a node)."""

    WHOLE = "whole"
    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MIG_SINGLE = "mig-single"
    MIG_MIXED = "mig-mixed"


@dataclass(frozen=True, slots=True)
class GpuSharing:
    """A node's sharing mode and physical GPU count, with where the count came from."""

    mode: SharingMode = SharingMode.WHOLE
    physical: int | None = None
    """Physical GPUs on the node; None when nothing the node publishes says (never guessed)."""
    source: str = ""
    """Where `physical` came from, for reasons users read (e.g. `label nvidia.com/gpu.count`)."""
    replicas: int = 1
    """Slots per physical GPU under time-slicing or MPS (1 otherwise; 0 = unknown)."""
    slots: int = 0
    """What the device plugin advertises for the GPU resource (replicas, MIG instances or GPUs)."""
    resource: str = "nvidia.com/gpu"
    """The resource the slots are advertised under (`<resource>.shared` when the plugin renames it)."""
    mig_profile: str = ""
    """MIG single: the instances' profile (e.g. `1g.10gb`), from the product label."""

    @property
    def shared(self) -> bool:
        """More than one pod may hold one physical GPU, or a slot is less than a GPU: GPU ids from the
        resource are not physical GPUs, and topology promises about them cannot be kept."""
        return self.mode is not SharingMode.WHOLE

    def describe(self) -> str:
        """One line for reasons, Events and `gpuwarden plan`."""
        count = "unknown" if self.physical is None else str(self.physical)
        if self.mode is SharingMode.WHOLE:
            return f"whole GPUs: {count} physical"
        if self.mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
            per = f"{self.replicas} replicas each" if self.replicas > 0 else "replicas unknown"
            return f"{self.mode.value}: {count} physical GPUs, {per} ({self.slots} {self.resource})"
        if self.mode is SharingMode.MIG_SINGLE:
            profile = f" {self.mig_profile}" if self.mig_profile else ""
            return f"MIG single: {count} physical GPUs, {self.slots}{profile} instances as {self.resource}"
        return f"MIG mixed: {count} physical GPUs, instances as {MIG_RESOURCE_PREFIX}<profile> resources"


def _count(value: Any) -> int | None:
    """A non-negative integer quantity or label value ("8", 8); None when absent or not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def is_gpu_resource(name: str, resource: str = "nvidia.com/gpu") -> bool:
    """Whether an extended resource hands out (a share of) a GPU: the GPU resource, its `.shared` rename, or
    a MIG-mixed `nvidia.com/mig-<profile>` (and its `.shared` rename)."""
    if name == resource or name.startswith(MIG_RESOURCE_PREFIX):
        return True
    return name.endswith(SHARED_SUFFIX) and name[: -len(SHARED_SUFFIX)] == resource


def is_gpu_uuid(text: str) -> bool:
    """An NVML GPU UUID (`GPU-` and 8-4-4-4-12 hex digits): an exact identity, unlike an index, a MIG UUID
    or a peer's compound ID (HAMi's `<uuid>-<i>`), which only name a GPU through something else."""
    return _GPU_UUID.match(text) is not None


def mig_profile(product: str) -> str:
    """The MIG profile in a GFD product name (`NVIDIA-H100-80GB-HBM3-MIG-1g.10gb` -> `1g.10gb`), or ""."""
    _, sep, tail = product.partition("-MIG-")
    if not sep:
        return ""
    profile = tail.removesuffix("-SHARED")
    return "" if profile == "INVALID" else profile


def node_sharing(
    labels: Mapping[str, str],
    capacity: Mapping[str, Any],
    resource: str = "nvidia.com/gpu",
    *,
    expected_label: str = EXPECTED_GPUS,
    topology_gpus: int | None = None,
) -> GpuSharing:
    """The node's sharing mode and physical GPU count from GFD's labels and what it advertises.

    `capacity`: `status.capacity` (or allocatable) of the node; `topology_gpus`: how many physical GPUs the
    node's published topology lists (the node agent's annotation), used only where GFD gives no count.
    The expected-GPUs label, when a positive integer, is the physical count whatever the mode.
    """
    product = labels.get(GFD_PRODUCT, "")
    strategy = labels.get(GFD_SHARING_STRATEGY, "").strip().lower()
    replicas_label = _count(labels.get(GFD_REPLICAS))
    gfd_count = _count(labels.get(GFD_COUNT))
    plain = _count(capacity.get(resource)) or 0
    renamed = _count(capacity.get(resource + SHARED_SUFFIX)) or 0
    mig_slots = sum(
        _count(v) or 0
        for k, v in capacity.items()
        if isinstance(k, str) and k.startswith(MIG_RESOURCE_PREFIX) and not k.endswith(SHARED_SUFFIX)
    )
    mig_labels = any(k.startswith(MIG_RESOURCE_PREFIX) and k.endswith(".count") for k in labels)
    profile = mig_profile(product)
    mig = labels.get(GFD_MIG_STRATEGY, "").strip().lower()

    mode = SharingMode.WHOLE
    if mig == "single" and profile:
        mode = SharingMode.MIG_SINGLE
    elif mig == "mixed" and (mig_slots > 0 or mig_labels):
        mode = SharingMode.MIG_MIXED
    elif strategy == "mps":
        mode = SharingMode.MPS
    elif (
        strategy == "time-slicing"
        or (replicas_label or 0) > 1
        or product.endswith("-SHARED")
        or (renamed > 0 and plain == 0)
    ):
        mode = SharingMode.TIME_SLICING

    slot_resource = resource + SHARED_SUFFIX if renamed > 0 and plain == 0 else resource
    slots = renamed if slot_resource != resource else plain

    override = _count(labels.get(expected_label))
    physical: int | None
    if override:
        physical, source = override, f"label {expected_label}"
    elif mode is SharingMode.WHOLE:
        # the advertised count is the GPU count; GFD's count only where nothing is advertised
        if plain or gfd_count is None:
            physical, source = plain, "node advertises"
        else:
            physical, source = gfd_count, f"label {GFD_COUNT}"
    elif mode is SharingMode.MIG_SINGLE:
        # GFD's count is the instances here: only a published topology says how many GPUs there are
        physical, source = topology_gpus, "node topology" if topology_gpus else ""
    elif gfd_count is not None:
        physical, source = gfd_count, f"label {GFD_COUNT}"
    else:
        physical, source = topology_gpus, "node topology" if topology_gpus else ""
    if physical == 0 and mode is not SharingMode.WHOLE:
        physical = None
    if physical is None:
        source = f"unknown ({expected_label} not set)"

    replicas = 1
    if mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
        if replicas_label and replicas_label > 1:
            replicas = replicas_label
        elif physical and slots and slots % physical == 0:
            replicas = slots // physical
        else:
            replicas = 0
    if mode is SharingMode.MIG_MIXED:
        slots = mig_slots
    return GpuSharing(mode, physical, source, replicas, slots, slot_resource, profile)


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A device-plugin device ID resolved to the physical GPU it lives on, where the ID says so.

    `gpu`: the physical GPU's UUID (or index, with `DEVICE_ID_STRATEGY=index`); "" when the ID is an opaque
    MIG UUID whose parent only NVML or dcgm-exporter can name. `replica`: the time-slicing/MPS replica
    number; `mig`: the MIG device's UUID."""

    device_id: str
    gpu: str
    replica: int | None = None
    mig: str = ""
    gi: int | None = None
    ci: int | None = None


def device_ref(device_id: str) -> DeviceRef:
    """Resolve one device ID as kubelet's PodResources or the device plugin gives it.

    `GPU-<uuid>` and `3` are whole GPUs; `<id>::<n>` is replica n of `<id>` (time-slicing, MPS); the
    legacy `MIG-GPU-<uuid>/<gi>/<ci>` names its parent; a modern `MIG-<uuid>` is opaque (parent "")."""
    text = device_id.strip()
    replica: int | None = None
    m = _REPLICA.match(text)
    if m:
        text, replica = m.group("id"), int(m.group("n"))
    legacy = _LEGACY_MIG.match(text)
    if legacy:
        gi, ci = int(legacy.group("gi")), int(legacy.group("ci"))
        return DeviceRef(device_id, legacy.group("parent"), replica, text, gi, ci)
    if text.startswith("MIG-"):
        return DeviceRef(device_id, "", replica, text)
    return DeviceRef(device_id, text, replica)
