"""Pick a topology source and return a validated reading: the one entry point the node agent calls.

Why it exists: the choice of source is policy (`auto` prefers NVML, the only source that sees NVLink and
UUIDs, and falls back to sysfs when libnvidia-ml is not there), kept apart from the readers so each reader
stays a plain "read this source" function. An explicitly requested source that is unavailable is an error,
never a silent fallback. Whatever the source, the result passes `validate` or raises `TopologyReadError`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from nodeagent.topology.file import read_file
from nodeagent.topology.model import DiscoveredTopology, TopologyReadError, validate
from nodeagent.topology.nvml import load_nvml, read_nvml
from nodeagent.topology.sysfs import read_sysfs

Source = Literal["auto", "nvml", "sysfs", "file"]


def discover(
    source: Source,
    *,
    topology_file: Path | None = None,
    sys_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    nvml_loader: Callable[[], Any | None] = load_nvml,
) -> DiscoveredTopology:
    """This node's GPU topology from `source` ("auto": NVML when it loads, else sysfs), validated."""
    if source == "file":
        if topology_file is None:
            raise TopologyReadError("topology source 'file' needs a topology file path (none configured)")
        topo = read_file(topology_file)
    elif source == "sysfs":
        topo = read_sysfs(sys_root, proc_root)
    elif source in ("auto", "nvml"):
        nvml = nvml_loader()
        if nvml is not None:
            topo = read_nvml(nvml, sys_root=sys_root)
        elif source == "nvml":
            raise TopologyReadError(
                "topology source 'nvml' requested but NVML is not available (Python package nvidia-ml-py "
                "or libnvidia-ml.so.1 not found); use 'auto' or 'sysfs' to read sysfs instead"
            )
        else:
            topo = read_sysfs(sys_root, proc_root)
    else:
        raise TopologyReadError(f"unknown topology source {source!r} (auto, nvml, sysfs or file)")
    validate(topo)
    return topo
