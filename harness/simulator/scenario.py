"""The scenario file of the fleet simulator: typed, documented, unknown keys rejected.

Why it exists: tests, the demo and benchmarks describe a simulated GPU fleet (size, GPU model, workloads and
their load over time, faults at given times) in one YAML file. This module turns that file into frozen
pydantic models and reports *every* problem at once, each naming its field (`faults[2].node: ...`).
It must not hold run-time state; `fleet.py` builds that from a validated `Scenario`.

Durations accept seconds (`90`, `1.5`) or Go-style strings (`250ms`, `90s`, `5m`, `1h30m`).
Field errors are all reported together; cross-field checks (fault targets exist, replicas fit the fleet)
run once every field is valid, and are likewise reported together.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, field_validator

from gpuwarden.config.base import Section
from gpuwarden.errors import ConfigError
from harness.simulator.workload import PlacementError, place_replicas

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> object:
    """Seconds from a number or a Go-style duration string; anything else is left for pydantic to reject."""
    if isinstance(value, str):
        text = value.strip()
        if text and _DURATION_PART.sub("", text) == "":
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
        try:
            return float(text)
        except ValueError:
            raise ValueError(
                f"not a duration: {value!r} (use seconds or e.g. '90s', '5m', '1h30m')"
            ) from None
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
"""Seconds, parsed from a number or a duration string."""


class GpuModel(Section):
    """What one simulated GPU looks like; defaults: an NVIDIA H100 SXM 80GB as dcgm-exporter shows it."""

    model_name: str = Field("NVIDIA H100 80GB HBM3", description="`modelName` label value")
    memory_mib: int = Field(81559, gt=0, description="framebuffer total (MiB) = FB_FREE + FB_USED + reserved")
    memory_reserved_mib: int = Field(555, ge=0, description="framebuffer reserved by the driver (MiB)")
    power_idle_watts: float = Field(70.0, ge=0, description="DCGM_FI_DEV_POWER_USAGE at 0 % utilization (W)")
    power_max_watts: float = Field(700.0, gt=0, description="DCGM_FI_DEV_POWER_USAGE at 100 % (W)")
    temp_idle_c: int = Field(32, description="DCGM_FI_DEV_GPU_TEMP at 0 % utilization (C)")
    temp_max_c: int = Field(78, description="DCGM_FI_DEV_GPU_TEMP at 100 % utilization (C)")
    driver_version: str = Field("570.148.08", description="`DCGM_FI_DRIVER_VERSION` label value")
    nvlink: bool = Field(
        True,
        description="NVLink + NVSwitch board (HGX): NVLink error counters, 4 NVSwitches, Fabric Manager "
        "status success. false: a PCIe-only card: no NVLink or NVSwitch series, Fabric Manager not supported",
    )
    slowdown_temp_c: int = Field(
        87, description="temperature of thermal slowdown; DCGM_FI_DEV_GPU_TEMP_LIMIT = this - GPU_TEMP (C)"
    )


_MIG_PROFILE = re.compile(r"^(?P<slices>[1-7])g\.(?P<gb>\d+)gb(?:\+me)?\Z")
MIG_SLICES_PER_GPU = 7
"""Compute slices of an A100/H100 (a GPU's MIG instances hold at most this many together)."""


def mig_slices(profile: str) -> int:
    """Compute slices of a MIG profile (`3g.40gb` -> 3); 0 when `profile` is not one."""
    m = _MIG_PROFILE.match(profile)
    return int(m.group("slices")) if m else 0


def mig_memory_mib(profile: str) -> int:
    """Framebuffer of an instance of `profile` as DCGM reports it (`1g.10gb` -> 9984 MiB)."""
    m = _MIG_PROFILE.match(profile)
    return int(m.group("gb")) * 1024 - 256 if m else 0


class SharingSpec(Section):
    """How the device plugin shares a node's GPUs, which decides the series dcgm-exporter emits for them.

    `whole`: one pod per GPU (the default, and every scenario written before sharing existed).
    `time-slicing` (or `mps`, the same series): each GPU offered `replicas` times, device IDs
    `<uuid>::<n>`; one series per GPU, attributed to the last pod mapped to a replica of it (dcgm-exporter
    keeps one pod per device), or per-pod copies with `vgpu=<n>` under `exporter.virtual_gpus`.
    `mig-single` / `mig-mixed`: each GPU split into the GPU instances of `mig_instances`; one series per
    instance with `GPU_I_PROFILE`, `GPU_I_ID`, `UUID` = the parent GPU's, no DCGM_FI_DEV_GPU_UTIL.
    """

    mode: Literal["whole", "time-slicing", "mps", "mig-single", "mig-mixed"] = Field(
        "whole", description="sharing strategy of the node's device plugin (GFD's labels follow from it)"
    )
    replicas: int = Field(
        4, ge=2, le=64, description="time-slicing / mps: replicas per GPU (the plugin requires >= 2)"
    )
    mig_instances: list[str] | None = Field(
        None,
        description="MIG: the GPU instance profiles on every GPU, in order (e.g. 7 x `1g.10gb`); "
        "default: 7 x 1g.10gb. mig-single needs one profile throughout",
    )

    @field_validator("mig_instances")
    @classmethod
    def _profiles(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one GPU instance profile")
        bad = [p for p in value if not mig_slices(p)]
        if bad:
            raise ValueError(f"not MIG profiles (<n>g.<m>gb): {', '.join(map(repr, bad))}")
        slices = sum(map(mig_slices, value))
        if slices > MIG_SLICES_PER_GPU:
            raise ValueError(f"{slices} compute slices do not fit one GPU ({MIG_SLICES_PER_GPU})")
        return value

    @property
    def mig(self) -> bool:
        return self.mode in ("mig-single", "mig-mixed")

    @property
    def time_sliced(self) -> bool:
        return self.mode in ("time-slicing", "mps")

    def profiles(self) -> list[str]:
        """MIG: the instance profiles of each GPU; [] otherwise."""
        if not self.mig:
            return []
        return list(self.mig_instances or ["1g.10gb"] * MIG_SLICES_PER_GPU)


class FleetSpec(Section):
    """Fleet shape: how many nodes, GPUs per node, NUMA nodes per node, and how nodes are named."""

    nodes: int = Field(4, ge=1, le=20000, description="number of simulated GPU nodes")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per node (indices 0..n-1)")
    numa_nodes: int = Field(
        2, ge=1, le=16, description="NUMA nodes per node; GPUs are split evenly, in order"
    )
    node_name_pattern: str = Field(
        "gpu-node-{index:03d}", description="str.format pattern with `index`; must give unique DNS names"
    )
    first_index: int = Field(0, ge=0, description="`index` of the first node")
    gpu: GpuModel = GpuModel()
    sharing: SharingSpec = Field(
        SharingSpec(), description="how every node shares its GPUs (default: whole GPUs)"
    )
    node_sharing: dict[str, SharingSpec] = Field(
        default_factory=dict, description="per node name: sharing different from `sharing`"
    )

    def sharing_of(self, node: str) -> SharingSpec:
        """The sharing of node `node`."""
        return self.node_sharing.get(node, self.sharing)

    @field_validator("node_name_pattern")
    @classmethod
    def _pattern_formats(cls, value: str) -> str:
        try:
            a, b = value.format(index=0), value.format(index=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"must be a str.format pattern using only {{index}}: {exc}") from None
        if a == b:
            raise ValueError("must use {index} so node names are unique")
        if not _DNS_SUBDOMAIN.match(a):
            raise ValueError(f"gives {a!r}, not a valid Kubernetes node name")
        return value

    def node_names(self) -> list[str]:
        return [
            self.node_name_pattern.format(index=i)
            for i in range(self.first_index, self.first_index + self.nodes)
        ]


MetricName = Literal[
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_GPU_TEMP_LIMIT",
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
    "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS",
    "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS",
]


class ExporterSpec(Section):
    """How the simulated dcgm-exporter renders; defaults follow the released exporter (4.5.x)."""

    hostname_label: Literal["Hostname", "hostname"] = Field(
        "Hostname", description="`Hostname` in released exporters; `hostname` on dcgm-exporter main (PR #655)"
    )
    kubernetes: bool = Field(True, description="add pod/namespace/container to GPUs a pod holds (-k)")
    metrics: list[MetricName] | None = Field(
        None, description="families to export (the exporter's CSV); default: every family the simulator knows"
    )
    xid_count_window: Duration = Field(300.0, description="DCGM_EXP_XID_ERRORS_COUNT window (exporter -x)")
    xid_zero_when_none: bool = Field(
        False,
        description="emit DCGM_FI_DEV_XID_ERRORS 0 before any XID (older exporters); default: no series",
    )
    tick: Duration = Field(
        1.0, gt=0, description="simulation step (s): counters advance and /metrics is cached per step"
    )
    virtual_gpus: bool = Field(
        False,
        description="KUBERNETES_VIRTUAL_GPUS (--kubernetes-virtual-gpus): every series of a GPU (or MIG "
        "instance) a pod holds is copied once per pod, with `vgpu=<replica>` for time-sliced replicas; "
        "DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED keep the device series and get per-pod values "
        "(with `pod_uid`), as dcgm-exporter does since 4.5.3-4.8.2. Default: one pod per device series",
    )
    cadvisor: bool = Field(
        False,
        description="also serve each mapped pod's cAdvisor container series (container_cpu_usage_seconds_"
        "total, container_memory_working_set_bytes with namespace, pod, container, node), as the kubelet "
        "would: what metrics.k8s.io resource rules read",
    )


class LoadPoint(Section):
    """One point of a piecewise-linear load curve."""

    at: Duration = Field(description="time since the curve starts (s or duration string)")
    qps: float = Field(ge=0, description="requests per second for the whole workload at `at`")


class Workload(Section):
    """A Deployment-like group of pods serving requests on GPUs; its load is split evenly over its pods."""

    name: str = Field(description="workload (Deployment) name; pods are named <name>-<i>")
    namespace: str = "default"
    container: str | None = Field(None, description="`container` label value; default: the workload name")
    replicas: int = Field(1, ge=0, description="pods placed on free GPUs at start (first fit, one NUMA node)")
    gpus_per_pod: int = Field(1, ge=1)
    qps_per_gpu: float = Field(100.0, gt=0, description="QPS one GPU serves at 100 % utilization")
    memory_mib_per_gpu: int = Field(
        16384, ge=0, description="DCGM_FI_DEV_FB_USED of a GPU the pod holds (MiB)"
    )
    load: list[LoadPoint] = Field(default_factory=lambda: [LoadPoint(at=0, qps=0)], min_length=1)
    loop: Duration | None = Field(None, gt=0, description="repeat the curve with this period (s)")
    engine: Literal["vllm", "tgi"] | None = Field(
        None,
        description="serve a serving engine's series per pod (queue, running, KV cache, TTFT, tokens) and "
        "router_queue_depth for the workload (harness/simulator/engine.py)",
    )

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value) or len(value) > 63:
            raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits, '-')")
        return value

    @field_validator("load")
    @classmethod
    def _increasing(cls, points: list[LoadPoint]) -> list[LoadPoint]:
        for before, after in itertools.pairwise(points):
            if after.at <= before.at:
                raise ValueError(f"points must have increasing `at` ({after.at:g} s follows {before.at:g} s)")
        return points


class _Fault(Section):
    at: Duration = Field(0.0, description="scenario: seconds after start; control API: must be 0")
    node: str = Field(description="node name, as generated from fleet.node_name_pattern")


class _GpuFault(_Fault):
    gpu: int | None = Field(None, ge=0, description="GPU index on the node; omitted: every GPU of the node")


class XidFault(_GpuFault):
    """The driver reports XID `code`: DCGM_FI_DEV_XID_ERRORS takes that value and keeps it (sticky)."""

    kind: Literal["xid"]
    code: int = Field(ge=1, le=65535)
    instance: int | None = Field(
        None,
        ge=0,
        description="MIG GPU: the GPU instance (0-based position in the GPU's layout) the XID is "
        "attributed to; its series carries it. Omitted on a MIG GPU: a GPU-wide XID, which dcgm-exporter's "
        "default (flex) mode shows on no series",
    )
    count: int = Field(1, ge=1, le=10000, description="how many times (DCGM_EXP_XID_ERRORS_COUNT)")


class EccFault(_GpuFault):
    """`count` ECC errors: both the volatile and the aggregate counter of that kind increase."""

    kind: Literal["ecc"]
    error: Literal["sbe", "dbe"]
    count: int = Field(1, ge=1)


class RetiredPagesFault(_GpuFault):
    """Pages retired (pre-Ampere memory repair) due to SBE or DBE, or pending retirement."""

    kind: Literal["retired_pages"]
    sbe: int = Field(0, ge=0)
    dbe: int = Field(0, ge=0)
    pending: int = Field(0, ge=0)


class RemappedRowsFault(_GpuFault):
    """Rows remapped (Ampere+ memory repair) for correctable / uncorrectable errors."""

    kind: Literal["remapped_rows"]
    correctable: int = Field(0, ge=0)
    uncorrectable: int = Field(0, ge=0)


class RowRemapFailureFault(_GpuFault):
    """DCGM_FI_DEV_ROW_REMAP_FAILURE becomes 1 (until cleared, or for `duration`)."""

    kind: Literal["row_remap_failure"]
    duration: Duration | None = Field(None, gt=0, description="seconds until it clears by itself")


class GpuMissingFault(_GpuFault):
    """The GPU disappears from the exporter (every series of it stops), like a GPU fallen off the bus."""

    kind: Literal["gpu_missing"]
    duration: Duration | None = Field(None, gt=0, description="seconds until it comes back")


class ExporterDownFault(_Fault):
    """The node's exporter stops: its series leave /metrics and /nodes/<node>/metrics answers 503."""

    kind: Literal["exporter_down"]
    duration: Duration | None = Field(None, gt=0, description="seconds until it comes back")


SignalKind = Literal[
    "nvlink_errors", "pcie_replay", "clock_event", "thermal_margin", "fabric_manager", "fabric_health",
    "exporter_stall",
]  # fmt: skip
SIGNAL_KINDS: tuple[str, ...] = (
    "nvlink_errors", "pcie_replay", "clock_event", "thermal_margin", "fabric_manager", "fabric_health",
    "exporter_stall",
)  # fmt: skip


class SignalFault(_GpuFault):
    """A fabric or degradation signal on the GPU(s), until cleared or for `duration`.

    `value` per kind: nvlink_errors — NVLink CRC flit errors per second; pcie_replay — PCIe replays per
    second; clock_event — the DCGM_FI_DEV_CLOCKS_EVENT_REASONS mask (0x40 HW thermal, 0x80 power brake);
    thermal_margin — DCGM_FI_DEV_GPU_TEMP_LIMIT in C; fabric_manager — the status (4 failure, 1 not started);
    fabric_health — DCGM_FI_DEV_FABRIC_HEALTH_MASK; exporter_stall — ignored (the GPU's energy counter
    freezes while its samples stay fresh, as a stalled exporter serves its last reading).
    """

    kind: SignalKind
    value: float = Field(0.0, description="see the class docstring")
    error_code: int = Field(0, ge=0, description="fabric_manager: DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE")
    duration: Duration | None = Field(None, gt=0, description="seconds until it clears by itself")


class NvswitchFault(_Fault):
    """An NVSwitch of the node reports SXid `sxid` (fatal or not), until cleared or for `duration`."""

    kind: Literal["nvswitch"]
    sxid: int = Field(ge=1, le=65535)
    fatal: bool = True
    switch: int = Field(0, ge=0, le=3, description="NVSwitch index (an HGX board has 4)")
    duration: Duration | None = Field(None, gt=0, description="seconds until it clears by itself")


Fault = Annotated[
    XidFault
    | EccFault
    | RetiredPagesFault
    | RemappedRowsFault
    | RowRemapFailureFault
    | GpuMissingFault
    | ExporterDownFault
    | SignalFault
    | NvswitchFault,
    Field(discriminator="kind"),
]
FAULT_KINDS = (
    "xid",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "row_remap_failure",
    "gpu_missing",
    "exporter_down",
    *SIGNAL_KINDS,
    "nvswitch",
)
fault_adapter: TypeAdapter[Fault] = TypeAdapter(Fault)


class Scenario(Section):
    """A whole simulation: fleet, exporter flavour, workloads and scheduled faults."""

    fleet: FleetSpec = FleetSpec()
    exporter: ExporterSpec = ExporterSpec()
    workloads: list[Workload] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)


def field_path(loc: tuple[int | str, ...]) -> str:
    """`('faults', 2, 'xid', 'code')` -> `faults[2].code` (the union tag pydantic inserts is dropped)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in FAULT_KINDS and (i == 0 or isinstance(loc[i - 1], int)):
            continue  # the discriminated-union tag pydantic inserts after a list index
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def problems_of(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Every pydantic error as (field, message)."""
    return [(prefix + field_path(tuple(e["loc"])), e["msg"]) for e in exc.errors()]


def scenario_problems(scenario: Scenario) -> list[tuple[str, str]]:
    """Cross-field checks pydantic cannot do per field: fault targets exist, workloads fit the fleet."""
    problems: list[tuple[str, str]] = []
    names = scenario.fleet.node_names()
    known = set(names)
    if len(known) != len(names):
        problems.append(("fleet.node_name_pattern", "gives duplicate node names"))
    gpus = scenario.fleet.gpus_per_node
    for i, fault in enumerate(scenario.faults):
        if fault.node not in known:
            problems.append((f"faults[{i}].node", f"unknown node {fault.node!r} (e.g. {names[0]!r})"))
        gpu = getattr(fault, "gpu", None)
        if gpu is not None and gpu >= gpus:
            problems.append((f"faults[{i}].gpu", f"GPU {gpu} does not exist (gpus_per_node is {gpus})"))
        instance = getattr(fault, "instance", None)
        if instance is not None and fault.node in known:
            count = len(scenario.fleet.sharing_of(fault.node).profiles())
            if instance >= count:
                problems.append((f"faults[{i}].instance", f"{fault.node} has {count} MIG instances per GPU"))
    for name in scenario.fleet.node_sharing:
        if name not in known:
            problems.append((f"fleet.node_sharing.{name}", f"unknown node {name!r} (e.g. {names[0]!r})"))
    for where, sharing in [
        ("fleet.sharing", scenario.fleet.sharing),
        *((f"fleet.node_sharing.{n}", s) for n, s in scenario.fleet.node_sharing.items()),
    ]:
        if sharing.mode == "mig-single" and len(set(sharing.profiles())) > 1:
            problems.append((f"{where}.mig_instances", "mig-single needs one profile for every instance"))
        if sharing.mig_instances is not None and not sharing.mig:
            problems.append((f"{where}.mig_instances", f"only for MIG modes, not {sharing.mode}"))
    seen: set[tuple[str, str]] = set()
    for i, w in enumerate(scenario.workloads):
        if (w.namespace, w.name) in seen:
            problems.append((f"workloads[{i}].name", f"duplicate workload {w.namespace}/{w.name}"))
        seen.add((w.namespace, w.name))
        if w.gpus_per_pod > gpus:
            problems.append((f"workloads[{i}].gpus_per_pod", f"{w.gpus_per_pod} > gpus_per_node ({gpus})"))
        if w.loop is not None and w.loop < w.load[-1].at:
            problems.append((f"workloads[{i}].loop", "must be at least the last load point's `at`"))
    if not problems:
        try:
            place_replicas(scenario)
        except PlacementError as exc:
            problems.append((f"workloads[{exc.workload_index}].replicas", str(exc)))
    return problems


def parse_scenario(data: Mapping[str, Any] | None) -> Scenario:
    """Validate a decoded scenario document; raises ConfigError listing every problem."""
    try:
        scenario = Scenario.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(problems_of(exc)) from None
    problems = scenario_problems(scenario)
    if problems:
        raise ConfigError(problems)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file; raises ConfigError naming each bad field."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([("(file)", f"cannot read {path}: {exc.strerror or exc}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([("(file)", f"not valid YAML: {exc}")]) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError([("(top level)", f"expected a mapping, got {type(data).__name__}")])
    return parse_scenario(data)
