"""The typed snapshot the quarantine decision is made from: one `FleetSnapshot` per loop.

Why a separate module: `observe.py` (Prometheus + Kubernetes I/O) builds it and `decide.py` (pure) reads it;
neither may import the other's dependencies. Tests and `gpuwarden plan` build snapshots by hand.

What it must not do: no I/O, no interpretation. Values are what Prometheus and the API said, with `None`
meaning "this signal is not exported here" (ECC counters are off by default in dcgm-exporter), which is
different from 0. Whether a value is bad, stale or missing is decided in `findings.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuwarden.gpusharing import GpuSharing
from gpuwarden.quarantine import DeviceRef
from gpuwarden.wellknown import EXCLUDE as EXCLUDE_LABEL
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from gpuwarden.wellknown import RELEASE as RELEASE_ANNOTATION
from gpuwarden.wellknown import RELEASE_NOW

GPU_RESOURCE = "nvidia.com/gpu"

DeviceRulesApi = Literal["served", "not-served", "unknown"]
Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
EFFECT_STRENGTH: dict[str, int] = {"PreferNoSchedule": 0, "NoSchedule": 1, "NoExecute": 2}


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint as the API has it."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class ConditionState:
    """Our `GPUHealthy` node condition as currently set (None on the node when never set)."""

    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class XidObservation:
    """One XID code seen on one GPU.

    `recent` means an occurrence started within the detection window (the sticky gauge changed to this code,
    or its series appeared, or the windowed count was > 0); `count` is how many occurrences the repeat window
    holds as far as the metrics can tell (the sticky gauge cannot tell two identical XIDs apart, so without
    `DCGM_EXP_XID_ERRORS_COUNT` it is at most the number of distinct episodes).
    """

    code: int
    recent: bool
    count: int = 1
    first_seen: float | None = None
    source: Literal["gauge", "count"] = "gauge"


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """Everything Prometheus says about one GPU (keyed by UUID). `None` = metric not exported."""

    uuid: str
    index: str = ""
    last_sample: float | None = None  # unix seconds of the newest sample of the presence metric
    xid_last: int | None = None  # current value of the sticky DCGM_FI_DEV_XID_ERRORS (None: no series)
    xids: tuple[XidObservation, ...] = ()
    dbe_volatile: float | None = None
    dbe_volatile_increase: float | None = None  # increase within the detection window
    sbe_volatile_rate: float | None = None  # single-bit errors per second over the detection window
    retired_pending: float | None = None
    retired_sbe: float | None = None
    retired_dbe: float | None = None
    retired_dbe_increase_week: float | None = None
    uncorrectable_remapped_rows: float | None = None
    row_remap_failure: float | None = None
    recovery_action: int | None = None  # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 reset, 2 reboot, 3, 4
    # Fabric and degradation signals (signals.py names the series). None = not exported / nothing to say.
    nvlink_error_rate: float | None = None  # NVLink CRC flit+data, replay, recovery errors per second
    pcie_replay_rate: float | None = None  # PCIe replays per second
    clock_event_reasons: int | None = None  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS bit mask
    thermal_margin: float | None = None  # DCGM_FI_DEV_GPU_TEMP_LIMIT, degrees C before slowdown
    fabric_manager_status: int | None = None  # dcgmFabricManagerStatus_t
    fabric_manager_error: int | None = None  # DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE
    fabric_health_mask: int | None = None  # DCGM_FI_DEV_FABRIC_HEALTH_MASK (packed sub-fields)
    stalled: bool = False  # fresh samples, but the stall metric has not changed for signals.stall_seconds


@dataclass(frozen=True, slots=True)
class OwnedRule:
    """A DeviceTaintRule of ours as the API has it (name, its selector, taint value and effect)."""

    name: str
    node: str  # its `gpuwarden.io/quarantine-node` label
    device: DeviceRef
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class JobState:
    """A validation Job as the API has it: `running`, `succeeded` or `failed` (with the Job's own why)."""

    name: str
    state: Literal["running", "succeeded", "failed"]
    why: str = ""


@dataclass(frozen=True, slots=True)
class NodeState:
    """One Kubernetes node as the API has it, joined with its GPUs' telemetry.

    `gpus is None` means Prometheus has no series for this node at all (exporter down, not deployed, or
    node identity label mismatch): unknown, never healthy. Observe lists only GPUs with something to say
    (a finding-relevant value, or a stale presence) and counts the fresh ones in `fresh_gpus`; hand-made
    snapshots may list every GPU and leave the counts to be derived.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_capacity: int = 0
    boot_id: str = ""
    unschedulable: bool = False
    condition: ConditionState | None = None
    gpus: tuple[GpuTelemetry, ...] | None = None
    fresh_gpus: int | None = None  # GPUs with a fresh sample (observe counts them in Prometheus)
    newest_sample: float | None = None  # newest DCGM sample of the node (None: derive from `gpus`)
    ready_since: float | None = None  # Ready condition's lastTransitionTime while True: the (re)boot time
    gpu_allocatable: int | None = None  # status.allocatable of the GPU resource (None: not advertised)
    degraded: ConditionState | None = None  # our GPUDegraded condition as currently set
    nvswitch_fatal: tuple[int, ...] = ()  # SXids of NVSwitches with DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS != 0
    nvswitch_non_fatal: tuple[int, ...] = ()  # ditto for non-fatal
    admission_failures: int | None = None  # pods rejected at admission within the window (None: not read)
    validation_jobs: Mapping[str, JobState] = field(default_factory=dict)  # our validation Jobs, by name
    sharing: GpuSharing | None = None
    """How the node shares its GPUs and how many physical GPUs it has (gpuwarden.gpusharing), from GFD's
    labels and what it advertises. None (hand-made snapshots): the GPU capacity is the physical count."""
    dra_devices: Mapping[str, DeviceRef] | None = None
    """A DRA-backed GPU node (`controller.gpus.dra`): GPU UUID -> its device in the node's ResourceSlices
    (read only when the node has something to say). None: not DRA-backed (the device plugin serves it)."""

    @property
    def gpu_node(self) -> bool:
        """Advertises GPUs in any form: whole, replicas (also renamed `.shared`), MIG instances, or DRA."""
        slots = self.sharing.slots if self.sharing is not None else 0
        return self.gpu_capacity > 0 or slots > 0 or self.dra_devices is not None

    @property
    def our_taint(self) -> Taint | None:
        """Our quarantine taint, if present (there is at most one per key and effect; take the first)."""
        return next((t for t in self.taints if t.key == TAINT_KEY), None)

    @property
    def excluded(self) -> bool:
        """`gpuwarden.io/exclude=true`: the operator asked us never to touch this node."""
        return self.labels.get(EXCLUDE_LABEL, "").lower() == "true"

    @property
    def release_requested(self) -> bool:
        """`gpuwarden.io/release=now`: lift the quarantine at once."""
        return self.annotations.get(RELEASE_ANNOTATION, "").lower() == RELEASE_NOW


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """A breaker transition's Event, owed until it is written: stored with the state that made it, so a
    leader killed between the two writes it later, under the same name (its reason and `at`)."""

    reason: str  # QuarantineBreakerOpen | QuarantineBreakerClosed
    at: float  # the opened_at of the episode it opens or closes (whole seconds): names the Event
    note: str


@dataclass(frozen=True, slots=True)
class BreakerState:
    """The quarantine circuit breaker, persisted in the API so a restart or a new leader resumes it."""

    open: bool = False
    opened_at: float | None = None
    clear_since: float | None = None  # first loop at which the trip condition no longer held
    reason: str = ""
    reset_requested: bool = False  # the operator asked for a reset (see act.py for how)
    starts: tuple[tuple[str, float], ...] = ()
    """(node, quarantine start) of the quarantines begun within the window: stored before their taints, so
    the window counts a quarantine after its release removed its record, and across a leader change."""
    owed: tuple[BreakerEvent, ...] = ()
    """Transition Events not yet written (cleared once written)."""


@dataclass(frozen=True, slots=True)
class Streak:
    """How many evaluations in a row one signal has held on one GPU (or node), and since when.

    The debounce state (`debounce.py`). It lives in the controller's memory between passes: a restart or a
    new leader starts every streak at zero, which only delays an action by `consecutive` passes (safe side).
    """

    count: int
    since: float


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The whole input of one decision. `prometheus_ok=False` makes every telemetry-driven change a skip."""

    taken_at: float
    nodes: tuple[NodeState, ...]
    prometheus_ok: bool = True
    prometheus_error: str = ""
    breaker: BreakerState = BreakerState()
    unmatched_telemetry: tuple[str, ...] = ()  # node identities in Prometheus with no Node object
    queries: int = 0  # Prometheus queries it took (for the bench and self-metrics)
    streaks: Mapping[str, Streak] = field(default_factory=dict)  # debounce state carried between passes
    device_rules: DeviceRulesApi = "not-served"
    """Whether the API server serves DeviceTaintRule `resource.k8s.io/v1` (listing ours answered), does not
    (404: before 1.37 or the gate off) or could not be asked (`unknown`): only `served` scopes a quarantine
    to devices; the other two fall back to the node taint (devicerules.py)."""
    device_rules_why: str = ""  # what the list answered when not `served`
    owned_rules: tuple[OwnedRule, ...] = ()  # our DeviceTaintRules (when `served`)
