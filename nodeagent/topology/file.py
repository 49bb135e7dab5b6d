"""Read GPU topology from a YAML or JSON file, for simulated nodes (kwok, the demo) that have no hardware.

Why it exists: a simulated node must publish the same annotation a real one would, from a description a
person wrote, so the file is as strict as the hardware readers: unknown keys and wrong types are errors
naming the GPU and the field, all reported at once, never skipped.

Format (JSON is valid YAML, so one parser reads both):

    gpus:
      - {index: 0, uuid: GPU-..., pciBusId: "0000:3b:00.0", numa: 0, pcieSwitch: sw0,
         nvlinkPeers: ["0000:3c:00.0"], mig: [{uuid: MIG-..., gi: 1, ci: 0, profile: 1g.10gb}]}

`index` and `pciBusId` are required; `uuid`, `numa`, `pcieSwitch` may be omitted or null (unknown);
`nvlinkPeers` may be omitted or null (no links); `mig` (a simulated MIG-enabled GPU's MIG devices, as NVML
would list them: `uuid`, `gi`, `ci` required, `profile` optional) may be omitted or null (MIG off). Quote
bus ids in YAML: some (e.g. 0000:30:00.0) read as base-60 numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nodeagent.topology.model import (
    DiscoveredTopology,
    GpuDevice,
    MigDevice,
    TopologyReadError,
    bus_id_sort_key,
    normalise_bus_id,
    sorted_topology,
)

FIELDS = ("index", "uuid", "pciBusId", "numa", "pcieSwitch", "nvlinkPeers", "mig")
REQUIRED = ("index", "pciBusId")
MIG_FIELDS = ("uuid", "gi", "ci", "profile")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mig(where: str, raw: Any, problems: list[str]) -> tuple[MigDevice, ...]:
    """A GPU's `mig` list (empty when absent), adding what is wrong with it to `problems`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"{where}: mig must be a list of MIG devices, got {type(raw).__name__}")
        return ()
    out: list[MigDevice] = []
    for i, item in enumerate(raw):
        at = f"{where} mig[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{at}: expected a mapping, got {type(item).__name__}")
            continue
        bad = [
            f"{at}: unknown field {k!r} (known: {', '.join(MIG_FIELDS)})" for k in item if k not in MIG_FIELDS
        ]
        uuid, gi, ci, profile = (item.get(k) for k in MIG_FIELDS)
        if not isinstance(uuid, str) or not uuid:
            bad.append(f"{at}: uuid must be a non-empty string, got {uuid!r}")
        for key, value in (("gi", gi), ("ci", ci)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                bad.append(f"{at}: {key} must be a non-negative integer, got {value!r}")
        if profile is not None and (not isinstance(profile, str) or not profile):
            bad.append(f"{at}: profile must be a non-empty string or null, got {profile!r}")
        problems.extend(bad)
        if not bad and isinstance(uuid, str) and isinstance(gi, int) and isinstance(ci, int):
            out.append(MigDevice(uuid, gi, ci, profile))
    return tuple(out)


def _gpu(where: str, raw: Any, problems: list[str]) -> GpuDevice | None:
    """One entry of `gpus`, or None after adding what is wrong with it to `problems`."""
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping, got {type(raw).__name__}")
        return None
    before = len(problems)
    if _is_int(raw.get("index")):
        where = f"{where} (index {raw['index']})"
    for key in raw:
        if key not in FIELDS:
            problems.append(f"{where}: unknown field {key!r} (known: {', '.join(FIELDS)})")
    for key in REQUIRED:
        if raw.get(key) is None:
            problems.append(f"{where}: {key} is required")
    index, uuid, numa = raw.get("index"), raw.get("uuid"), raw.get("numa")
    bus_id, switch, peers = raw.get("pciBusId"), raw.get("pcieSwitch"), raw.get("nvlinkPeers")
    peers = [] if peers is None else peers
    if index is not None and (not _is_int(index) or index < 0):
        problems.append(f"{where}: index must be a non-negative integer, got {index!r}")
    if numa is not None and (not _is_int(numa) or numa < 0):
        problems.append(f"{where}: numa must be a non-negative integer or null, got {numa!r}")
    for key, value in (("uuid", uuid), ("pcieSwitch", switch)):
        if value is not None and (not isinstance(value, str) or not value):
            problems.append(f"{where}: {key} must be a non-empty string or null, got {value!r}")
    if bus_id is not None and not isinstance(bus_id, str):
        problems.append(f"{where}: pciBusId must be a string (quote it in YAML), got {bus_id!r}")
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        problems.append(f"{where}: nvlinkPeers must be a list of PCI bus id strings, got {peers!r}")
    mig = _mig(where, raw.get("mig"), problems)
    if len(problems) > before or not isinstance(bus_id, str) or not isinstance(index, int):
        return None
    try:
        normalised = normalise_bus_id(bus_id, f"{where} pciBusId")
        peer_ids = sorted({normalise_bus_id(p, f"{where} nvlinkPeers") for p in peers}, key=bus_id_sort_key)
    except TopologyReadError as exc:
        problems.append(str(exc))
        return None
    return GpuDevice(
        index=index,
        uuid=uuid,
        pci_bus_id=normalised,
        numa=numa,
        pcie_switch=switch,
        nvlink_peers=tuple(peer_ids),
        mig=mig,
    )


def parse_file(text: str, where: str) -> DiscoveredTopology:
    """The topology described by `text` (YAML or JSON); `where` (the path) prefixes every message."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyReadError(f"{where}: not YAML or JSON: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("gpus"), list):
        raise TopologyReadError(f"{where}: expected a mapping with a list under 'gpus'")
    problems = [f"unknown top-level field {key!r} (only 'gpus')" for key in doc if key != "gpus"]
    gpus = [_gpu(f"gpus[{i}]", raw, problems) for i, raw in enumerate(doc["gpus"])]
    if problems:
        raise TopologyReadError(f"{where}: {'; '.join(problems)}")
    return sorted_topology((g for g in gpus if g is not None), "file")


def read_file(path: Path) -> DiscoveredTopology:
    """The topology described by the file at `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyReadError(f"cannot read topology file {path}: {exc}") from None
    return parse_file(text, str(path))
