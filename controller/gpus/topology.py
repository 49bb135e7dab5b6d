"""Where each GPU of a node sits: NUMA node, PCIe switch, NVLink domain (and its UUID when known).

Why it exists: kube-scheduler counts `nvidia.com/gpu` but not where the GPUs are; a 4-GPU job split across
NUMA nodes loses 15-50 % of its speed. Two sources describe the layout:

* the NodeResourceTopology CRD (topology.node.k8s.io/v1alpha2, written by nfd-topology-updater or RTE): one
  zone of `type: Node` per NUMA node with the GPU resource's capacity there. It gives NUMA membership only;
  GPU ids are numbered in NUMA order unless a zone attribute `gpuwarden.io/gpu-ids` lists them;
* the node annotation `gpuwarden.io/gpu-topology`: JSON, GPU id -> attributes, e.g.
  `{"0": {"numa": 0, "pcie": "pci0", "nvlink": "nvl0", "uuid": "GPU-..."}, ...}`; a list of objects with an
  `"id"` key, or either form under a top-level `"gpus"` key, is accepted too. A MIG-enabled GPU may list its
  MIG devices, `"mig": [{"uuid": "MIG-...", "gi": 1, "ci": 0, "profile": "1g.10gb"}, ...]`: modern MIG
  UUIDs are opaque (nothing in `MIG-<uuid>` names the GPU it lives on), and the kubelet's PodResources name
  a MIG pod's device by it, so this list is what ties a MIG device to its physical GPU (drain) and to
  dcgm-exporter's per-instance series (`UUID` = the parent's, `GPU_I_ID` = `gi`; idle).

The NRT object wins when it describes the GPU resource (docs/architecture.md). Parsing is pure and strict
about types; an unreadable source yields a `TopologyError` whose message is shown to users in filter reasons.
It must not guess: an attribute that is absent stays `None` and never satisfies an alignment requirement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from gpuwarden.wellknown import NRT_GPU_IDS_ATTRIBUTE
from gpuwarden.wellknown import gpu_id_key as gpu_sort_key

_NUMA_KEYS = ("numa", "numaNode", "numa_node")
_PCIE_KEYS = ("pcie", "pcieSwitch", "pcie_switch")
_NVLINK_KEYS = ("nvlink", "nvlinkDomain", "nvlink_domain")
_TRAILING_INT = re.compile(r"(\d+)$")


class TopologyError(ValueError):
    """The topology source exists but cannot be read; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device of a GPU: its UUID (the device ID the device plugin hands to the kubelet), GPU
    instance and compute instance ids (NVML's; `gi` is dcgm-exporter's `GPU_I_ID`), and its profile."""

    uuid: str
    gi: int | None = None
    ci: int | None = None
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU. `id` is what `gpuwarden.io/gpu-ids` lists (the device-plugin index, e.g. "3")."""

    id: str
    numa: int | None = None
    pcie: str | None = None
    nvlink: str | None = None
    uuid: str | None = None
    mig: tuple[MigDevice, ...] = ()
    """Its MIG devices, when the publisher listed them (empty: not MIG-enabled, or not published)."""


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """A node's GPUs in id order, and where the description came from ("nrt", "annotation", "count")."""

    gpus: tuple[Gpu, ...]
    source: str

    @property
    def known(self) -> bool:
        """False for the count-only stand-in built when no topology is published."""
        return self.source != "count"


def uuid_map(*sources: NodeTopology | None) -> dict[str, str]:
    """GPU UUID -> id from whichever sources know UUIDs (the NodeResourceTopology CRD carries none; the
    node agent's annotation does), earlier sources first."""
    out: dict[str, str] = {}
    for source in sources:
        for gpu in source.gpus if source is not None else ():
            if gpu.uuid:
                out.setdefault(gpu.uuid, gpu.id)
    return out


def mig_devices(*sources: NodeTopology | None) -> dict[str, tuple[Gpu, MigDevice]]:
    """MIG UUID -> (the physical GPU it lives on, the MIG device), from whichever sources list MIG devices,
    earlier sources first."""
    out: dict[str, tuple[Gpu, MigDevice]] = {}
    for source in sources:
        for gpu in source.gpus if source is not None else ():
            for mig in gpu.mig:
                out.setdefault(mig.uuid, (gpu, mig))
    return out


def count_only(count: int) -> NodeTopology:
    """Stand-in for a node that publishes no topology: ids 0..count-1, every attribute unknown."""
    return NodeTopology(tuple(Gpu(str(i)) for i in range(max(0, count))), "count")


def _first(raw: Mapping[str, Any], keys: Sequence[str]) -> Any:
    return next((raw[k] for k in keys if k in raw and raw[k] is not None), None)


def _gpu(gpu_id: Any, raw: Any) -> Gpu:
    if not isinstance(raw, Mapping):
        raise TopologyError(f"GPU {gpu_id!r}: expected an object, got {type(raw).__name__}")
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, int | str) or str(gpu_id) == "":
        raise TopologyError(f"GPU id {gpu_id!r} is not a string or integer")
    numa = _first(raw, _NUMA_KEYS)
    if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
        if isinstance(numa, str) and numa.isdigit():
            numa = int(numa)
        else:
            raise TopologyError(f"GPU {gpu_id}: numa must be a non-negative integer, got {numa!r}")
    pcie, nvlink, uuid = _first(raw, _PCIE_KEYS), _first(raw, _NVLINK_KEYS), raw.get("uuid")
    for name, value in (("pcie", pcie), ("nvlink", nvlink), ("uuid", uuid)):
        if value is not None and not isinstance(value, str | int):
            raise TopologyError(f"GPU {gpu_id}: {name} must be a string, got {value!r}")
    return Gpu(
        id=str(gpu_id),
        numa=numa,
        pcie=None if pcie is None else str(pcie),
        nvlink=None if nvlink is None else str(nvlink),
        uuid=None if uuid is None else str(uuid),
        mig=_mig_devices(gpu_id, raw.get("mig")),
    )


def _instance_id(gpu_id: Any, raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TopologyError(f"GPU {gpu_id}: MIG {key} must be a non-negative integer, got {value!r}")
    return value


def _mig_devices(gpu_id: Any, raw: Any) -> tuple[MigDevice, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TopologyError(f"GPU {gpu_id}: mig must be a list of MIG devices, got {type(raw).__name__}")
    out: list[MigDevice] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("uuid"), str) or not item["uuid"]:
            raise TopologyError(f'GPU {gpu_id}: mig[{index}] needs a "uuid" string')
        profile = item.get("profile")
        if profile is not None and not isinstance(profile, str):
            raise TopologyError(f"GPU {gpu_id}: mig[{index}] profile must be a string, got {profile!r}")
        out.append(
            MigDevice(
                str(item["uuid"]),
                _instance_id(gpu_id, item, "gi"),
                _instance_id(gpu_id, item, "ci"),
                profile,
            )
        )
    uuids = [m.uuid for m in out]
    if len(set(uuids)) != len(uuids):
        raise TopologyError(f"GPU {gpu_id}: a MIG UUID is listed twice")
    return tuple(out)


def _sorted(gpus: list[Gpu], source: str) -> NodeTopology:
    ids = [g.id for g in gpus]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1}, key=gpu_sort_key)
        raise TopologyError(f"GPU id(s) listed twice: {', '.join(dup)}")
    migs = [m.uuid for g in gpus for m in g.mig]
    if len(set(migs)) != len(migs):
        dup = sorted({m for m in migs if migs.count(m) > 1})
        raise TopologyError(f"MIG device(s) listed under two GPUs: {', '.join(dup)}")
    return NodeTopology(tuple(sorted(gpus, key=lambda g: gpu_sort_key(g.id))), source)


def parse_annotation(text: str) -> NodeTopology:
    """Parse the `gpuwarden.io/gpu-topology` annotation (see the module docstring for the format)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TopologyError(f"{TOPOLOGY_ANNOTATION} is not JSON: {exc}") from None
    if isinstance(doc, Mapping) and "gpus" in doc:
        doc = doc["gpus"]
    if isinstance(doc, Mapping):
        gpus = [_gpu(gpu_id, raw) for gpu_id, raw in doc.items()]
    elif isinstance(doc, list):
        gpus = []
        for index, raw in enumerate(doc):
            if not isinstance(raw, Mapping) or "id" not in raw:
                raise TopologyError(f'{TOPOLOGY_ANNOTATION}[{index}] needs an "id"')
            gpus.append(_gpu(raw["id"], raw))
    else:
        raise TopologyError(f"{TOPOLOGY_ANNOTATION} must be a JSON object or list")
    if not gpus:
        raise TopologyError(f"{TOPOLOGY_ANNOTATION} lists no GPUs")
    return _sorted(gpus, "annotation")


def _quantity_int(value: Any) -> int:
    """A whole-number Kubernetes quantity ("4", 4); device counts never carry suffixes."""
    if isinstance(value, bool):
        raise TopologyError(f"{value!r} is not a device count")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise TopologyError(f"{value!r} is not a device count")


def parse_nrt(obj: Mapping[str, Any], resource: str) -> NodeTopology | None:
    """GPU layout from a NodeResourceTopology object; None when no NUMA zone carries `resource`."""
    zones = obj.get("zones")
    if not isinstance(zones, list):
        return None
    found: list[tuple[int, int, list[str] | None]] = []
    for zone in zones:
        if not isinstance(zone, Mapping) or zone.get("type") != "Node":
            continue
        count = 0
        for res in zone.get("resources") or []:
            if isinstance(res, Mapping) and res.get("name") == resource:
                count = _quantity_int(res.get("allocatable", res.get("capacity", 0)))
        if count <= 0:
            continue
        match = _TRAILING_INT.search(str(zone.get("name", "")))
        if match is None:
            raise TopologyError(f"NodeResourceTopology zone {zone.get('name')!r} has no NUMA id in its name")
        ids: list[str] | None = None
        for attr in zone.get("attributes") or []:
            if isinstance(attr, Mapping) and attr.get("name") == NRT_GPU_IDS_ATTRIBUTE:
                ids = [p.strip() for p in str(attr.get("value", "")).split(",") if p.strip()]
                if len(ids) != count:
                    raise TopologyError(
                        f"zone {zone.get('name')}: {NRT_GPU_IDS_ATTRIBUTE} lists {len(ids)} ids "
                        f"for {count} GPUs"
                    )
        found.append((int(match.group(1)), count, ids))
    if not found:
        return None
    gpus: list[Gpu] = []
    next_id = 0
    for numa, count, ids in sorted(found, key=lambda z: z[0]):
        for i in range(count):
            gpu_id = ids[i] if ids is not None else str(next_id + i)
            gpus.append(Gpu(gpu_id, numa=numa))
        next_id += count
    return _sorted(gpus, "nrt")
