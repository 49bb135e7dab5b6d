"""The node agent's config without pydantic, when the file is plainly valid; else the full loader decides.

Why it exists: pydantic and the models of every section cost ~13 MiB in a process whose idle goal is
≤ 40 MiB (issue 29), and the node agent reads three sections of a small file. Decision: this loader is a
*fast path that never judges*. It reads the same file with the same overrides (`overrides.py`), and accepts
only values it is sure the models accept with the same result (plain YAML types, or the strings an
environment variable carries); anything else — another section, an unknown key, a wrong type, a value out
of range, a string it is unsure how pydantic would coerce — makes it return None, and the caller runs the
full `load_config`, whose errors name the field (all at once, as ever). So a bad config is still rejected
by the models, with the same messages, and only a valid node-agent file is read without them.
`tests/unit/test_config_lean.py` holds it to that: the same fields and defaults as the models, and every
value it accepts accepted by the models with the same result.

What it must not do: report config errors of its own, accept a key the models would reject, or know
sections other than the node agent's (`node_agent`, `logging`, and the API-server access of `kubernetes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from gpuwarden.config.overrides import apply_override, cli_overrides, env_overrides
from gpuwarden.config.yamlsource import parse_yaml

Accept = Callable[[Any], tuple[bool, Any]]
"""A value → (True, the value the model would hold) when certainly valid, else (False, None)."""

NO = (False, None)
_NUMBER = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?\Z")


def text(pattern: str | None = None, *, min_length: int = 0, max_length: int | None = None) -> Accept:
    def accept(value: Any) -> tuple[bool, Any]:
        if not isinstance(value, str) or "\n" in value or len(value) < min_length:
            return NO
        if max_length is not None and len(value) > max_length:
            return NO
        if pattern is not None and not re.search(pattern, value):
            return NO
        return True, value

    return accept


def texts(pattern: str) -> Accept:
    """A list of strings, each matching `pattern` (anything else: the full loader decides)."""
    one = text(pattern)

    def accept(value: Any) -> tuple[bool, Any]:
        if not isinstance(value, list) or not all(one(v)[0] for v in value):
            return NO
        return True, list(value)

    return accept


def optional_text(value: Any) -> tuple[bool, Any]:
    return (True, None) if value is None else text()(value)


def optional_path(value: Any) -> tuple[bool, Any]:
    if value is None:
        return True, None
    return (True, Path(value)) if isinstance(value, str) and value and "\n" not in value else NO


def flag(value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool):
        return True, value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return True, value.lower() == "true"
    return NO


def seconds(minimum: float = 0.0) -> Accept:
    """`fieldtypes.Seconds` (> 0, ≤ 7 days, never a bool) and an optional `ge`."""

    def accept(value: Any) -> tuple[bool, Any]:
        if isinstance(value, str) and _NUMBER.match(value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return NO
        number = float(value)
        return (True, number) if 0 < number <= 7 * 86400 and number >= minimum else NO

    return accept


def one_of(*choices: str, lower: bool = False) -> Accept:
    def accept(value: Any) -> tuple[bool, Any]:
        if not isinstance(value, str):
            return NO
        value = value.lower() if lower else value
        return (True, value) if value in choices else NO

    return accept


# ------------------------------------------------------------------ the node agent's view of the file
@dataclass(frozen=True)
class LeanDevicePlugin:
    """`node_agent.device_plugin` (the same fields and defaults as `DevicePluginConfig`)."""

    enabled: bool = False
    socket_name: str = "gpuwarden-gpu.sock"
    visible_devices_env: str = "NVIDIA_VISIBLE_DEVICES"
    device_nodes: bool = False
    admission_wait_seconds: float = 2.0
    dra_drivers: list[str] = field(default_factory=lambda: ["gpu.nvidia.com"])


@dataclass(frozen=True)
class LeanNodeAgent:
    """`node_agent` (the same fields and defaults as `NodeAgentConfig`)."""

    node_name: str = ""
    dry_run: bool = False
    resource_name: str = "nvidia.com/gpu"
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    topology_source: Literal["auto", "nvml", "sysfs", "file"] = "auto"
    topology_file: str = ""
    publish_topology: bool = True
    kubelet_root_dir: str = "/var/lib/kubelet"
    pod_resources_socket: str = ""
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    reconcile_interval_seconds: float = 5.0
    min_read_interval_seconds: float = 0.2
    topology_interval_seconds: float = 60.0
    listen: str = "0.0.0.0:9402"
    device_plugin: LeanDevicePlugin = field(default_factory=LeanDevicePlugin)

    @property
    def pod_resources_path(self) -> str:
        """The PodResources socket path actually used (as `NodeAgentConfig.pod_resources_path`)."""
        return self.pod_resources_socket or f"{self.kubelet_root_dir.rstrip('/')}/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class LeanKubernetes:
    """The part of `kubernetes` the node agent uses (the other fields keep their defaults: not read here)."""

    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_seconds: float = 30.0
    field_manager: str = "gpuwarden"


@dataclass(frozen=True)
class LeanLogging:
    """`logging` without per-logger levels (a file that sets `loggers` takes the full loader)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text", "auto"] = "auto"


@dataclass(frozen=True)
class LeanConfig:
    """What `gpuwarden node-agent` reads: the same attribute paths as `Config`."""

    node_agent: LeanNodeAgent = field(default_factory=LeanNodeAgent)
    kubernetes: LeanKubernetes = field(default_factory=LeanKubernetes)
    logging: LeanLogging = field(default_factory=LeanLogging)


DEVICE_PLUGIN: dict[str, Accept] = {
    "enabled": flag,
    "socket_name": text(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.sock$"),
    "visible_devices_env": text(),
    "device_nodes": flag,
    "admission_wait_seconds": seconds(),
    "dra_drivers": texts(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
}
NODE_AGENT: dict[str, Accept] = {
    "node_name": text(),
    "dry_run": flag,
    "resource_name": text(r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$"),
    "device_id_strategy": one_of("uuid", "index"),
    "topology_source": one_of("auto", "nvml", "sysfs", "file"),
    "topology_file": text(),
    "publish_topology": flag,
    "kubelet_root_dir": text(),
    "pod_resources_socket": text(),
    "device_plugin_dir": text(),
    "reconcile_interval_seconds": seconds(0.5),
    "min_read_interval_seconds": seconds(),
    "topology_interval_seconds": seconds(),
    "listen": text(r"^[^:]*:[0-9]{1,5}$"),
}
KUBERNETES: dict[str, Accept] = {
    "kubeconfig": optional_path,
    "context": optional_text,
    "request_timeout_seconds": seconds(),
    "field_manager": text(min_length=1, max_length=128),
}
LOGGING: dict[str, Accept] = {
    "level": one_of("debug", "info", "warning", "error", lower=True),
    "format": one_of("json", "text", "auto"),
}
"""Per section, the fields read here and how; a key not listed sends the file to the full loader."""


def _section(raw: Any, accepts: Mapping[str, Accept]) -> dict[str, Any] | None:
    """The accepted values of one mapping (None: not certainly valid here)."""
    if raw is None:
        return {}  # `section:` with every child commented out means the defaults
    if not isinstance(raw, dict) or not all(isinstance(k, str) and k in accepts for k in raw):
        return None
    out = {}
    for key, value in raw.items():
        ok, out[key] = accepts[key](value)
        if not ok:
            return None
    return out


def lean_config(raw: Mapping[Any, Any]) -> LeanConfig | None:
    """The node agent's config from merged raw data, or None when the full loader must decide."""
    if not set(raw) <= {"node_agent", "kubernetes", "logging"}:
        return None
    agent_raw = raw.get("node_agent")
    plugin_raw = agent_raw.get("device_plugin") if isinstance(agent_raw, dict) else None
    if isinstance(agent_raw, dict):
        agent_raw = {k: v for k, v in agent_raw.items() if k != "device_plugin"}
    agent, plugin = _section(agent_raw, NODE_AGENT), _section(plugin_raw, DEVICE_PLUGIN)
    kube, logging = _section(raw.get("kubernetes"), KUBERNETES), _section(raw.get("logging"), LOGGING)
    if agent is None or plugin is None or kube is None or logging is None:
        return None
    node_agent = LeanNodeAgent(**agent, device_plugin=LeanDevicePlugin(**plugin))
    if node_agent.topology_source == "file" and not node_agent.topology_file:
        return None  # the model's cross-field rule: its error names topology_file
    return LeanConfig(node_agent, LeanKubernetes(**kube), LeanLogging(**logging))


def load_lean(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, object] | None = None
) -> LeanConfig | None:
    """`load_config`'s reading (file < env < flags) for the node agent; None: call `load_config`."""
    raw: dict[Any, Any] = {}
    if path is not None:
        try:
            doc = parse_yaml(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None
        if doc.problems or (doc.data is not None and not isinstance(doc.data, dict)):
            return None
        raw = doc.data or {}
    from_env, env_problems = env_overrides(env)
    from_cli, cli_problems = cli_overrides(overrides or {})
    if env_problems or cli_problems:
        return None
    origins: dict[Any, str] = {}
    for data_path, value, origin in from_env + from_cli:
        if apply_override(raw, data_path, value, origin, origins) is not None:
            return None
    return lean_config(raw)


LEAN_SECTIONS = {
    LeanNodeAgent: NODE_AGENT,
    LeanDevicePlugin: DEVICE_PLUGIN,
    LeanKubernetes: KUBERNETES,
    LeanLogging: LOGGING,
}
"""Each dataclass and its accepted fields (the tests check they name the same fields)."""


def field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}
