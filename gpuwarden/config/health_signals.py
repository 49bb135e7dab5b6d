"""The `health.signals:` section — fabric and degradation signals, graded quarantine, degrade or observe.

Why: what GPU fleets lose the most time to is not XIDs but fabric faults (Fabric Manager down, NVSwitch SXids,
a fabric health mask asserting a fault), NVLink errors, and slow degradation (PCIe replays, HW slowdown,
thermal and power-brake clock events, a shrinking thermal margin) — see ../shared/reference/peers.md §2. They
are not equally serious, so each signal has an `action`:

- `quarantine`: our taint, as for XIDs (the circuit breaker counts it);
- `degrade`: node condition `GPUDegraded=True` + an Event + a metric, no taint;
- `observe`: the metric only;
- `off`: not read at all.

Each signal is debounced (`consecutive` evaluations in a row before it counts; NVSentinel's fix for boot-time
NVLINK_DOWN false positives, PR #1715) and, where a reboot's own link training and Fabric Manager start-up
look like faults, ignored for `boot_grace_seconds` after the node's (re)boot. Defaults and their sources are
in docs/health.md ("Fabric and degradation signals").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import Count, MetricName, PositiveCount, QualifiedName, Seconds
from gpuwarden.wellknown import EXPECTED_GPUS

SignalAction = Literal["quarantine", "degrade", "observe", "off"]
FabricManagerStatus = Literal[
    "not_supported", "not_started", "in_progress", "success", "failure", "unrecognized", "nvml_too_old"
]
FabricFault = Literal[
    "degraded_bw", "route_recovery", "route_unhealthy", "access_timeout_recovery", "incorrect_configuration"
]


class SignalPolicy(Section):
    """What one signal does once confirmed. Each signal below overrides the defaults it needs."""

    action: SignalAction = Field(
        default="degrade",
        description="quarantine (taint), degrade (GPUDegraded condition + Event + metric), observe (metric "
        "only) or off (not read).",
    )
    consecutive: PositiveCount = Field(
        default=3,
        description="Evaluations in a row (one per health.loop_interval_seconds) the signal must hold before "
        "it counts. 3 after NVSentinel's debounce for boot-time NVLink flaps (PR #1715) and its power-brake "
        "watch (3 consecutive polls, PR #1668).",
    )
    boot_grace: bool = Field(
        default=True,
        description="Ignore the signal for signals.boot_grace_seconds after the node's (re)boot.",
    )


class NvlinkErrors(SignalPolicy):
    """NVLink CRC flit/data, replay and recovery error counters, summed per GPU, as a rate."""

    action: SignalAction = Field(
        default="quarantine",
        description="EKS' node monitoring agent treats NVLink policy violations as fatal; NVSentinel maps "
        "NVLINK_CRC_ERROR_THRESHOLD to CONTACT_SUPPORT.",
    )
    errors_per_second: float = Field(
        default=100.0,
        gt=0,
        description="Summed NVLink error rate per GPU that counts. 100/s: DCGM's health watch says CRC "
        "errors 'only matter at rates of 100+ per second' (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR).",
    )


class NvswitchFatal(SignalPolicy):
    """DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS != 0 on any NVSwitch of the node (the value is the SXid)."""

    action: SignalAction = Field(
        default="quarantine",
        description="A fatal SXid needs the fabric reset (EKS: fatal; NVSentinel: "
        "NVSWITCH_FATAL_ERROR → CONTACT_SUPPORT).",
    )
    consecutive: PositiveCount = Field(
        default=2, description="Two evaluations: one stray sample of a fatal SXid is not acted on."
    )


class NvswitchNonFatal(SignalPolicy):
    """DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS != 0 on any NVSwitch of the node."""

    action: SignalAction = Field(
        default="observe", description="Non-fatal SXids are informational (EKS: Warning event)."
    )


class FabricManager(SignalPolicy):
    """DCGM_FI_DEV_FABRIC_MANAGER_STATUS in `failing_statuses` (the error code is reported with it)."""

    action: SignalAction = Field(
        default="quarantine",
        description="A GPU whose fabric failed to train cannot run multi-GPU work (EKS: "
        "FabricManagerNotRunning, fatal). NVSentinel #889: FM down after maintenance went 20 days unseen.",
    )
    failing_statuses: list[FabricManagerStatus] = Field(
        default_factory=lambda: list[FabricManagerStatus](["failure"]),
        min_length=1,
        description="Statuses that count. Default [failure] like EKS: GB200/GB300 report not_started where "
        "no host Fabric Manager runs, and in_progress during boot-time training. On HGX H100/B200 (host "
        "Fabric Manager) add not_started: that is how a Fabric Manager that never came back looks "
        "(NVSentinel #889).",
    )


class FabricHealth(SignalPolicy):
    """DCGM_FI_DEV_FABRIC_HEALTH_MASK decoded sub-field by sub-field; only a fault state counts."""

    action: SignalAction = Field(
        default="quarantine", description="EKS: NvidiaFabricError, fatal (replace the node)."
    )
    ignore_faults: list[FabricFault] = Field(
        default_factory=list,
        description="Sub-fields not to act on, e.g. [degraded_bw] to only warn on lost bandwidth.",
    )


class PcieReplay(SignalPolicy):
    """rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER) per GPU; exported by dcgm-exporter's default CSV."""

    action: SignalAction = Field(
        default="degrade", description="EKS: NvidiaPCIeError is a Warning (event only), not a repair."
    )
    replays_per_minute: float = Field(
        default=8.0,
        gt=0,
        description="PCIe replays per minute that count. DCGM's PCIe health watch reports a replay *rate* "
        "(DCGM_FR_PCI_REPLAY_RATE, per minute); 8/min is our choice, not a quoted DCGM constant.",
    )


class ClockEvent(SignalPolicy):
    """One bit of DCGM_FI_DEV_CLOCKS_EVENT_REASONS held set."""


class ThermalMargin(SignalPolicy):
    """DCGM_FI_DEV_GPU_TEMP_LIMIT (field 153: degrees C left before thermal slowdown) below a minimum."""

    min_celsius: float = Field(
        default=0.0,
        description="Margin (°C) below which the signal counts. 0: at or past the slowdown threshold; "
        "NVSentinel's GpuThermalMarginWatch fails below the per-SKU HW-slowdown offset (-2 °C H100/GB200).",
    )


class AdmissionFailures(SignalPolicy):
    """Pods on the node that failed admission (kubelet reasons) within a window: a 'black-hole' node."""

    action: SignalAction = Field(
        default="quarantine",
        description="A node that rejects every pod stays Ready and attracts more (pytorch/ci-infra PR #1058: "
        "554 pods rejected in 1h46m); the taint stops the scheduler sending them.",
    )
    consecutive: PositiveCount = Field(default=1, description="The window already smooths the count.")
    boot_grace: bool = Field(default=False, description="Admission failures are not a boot artefact.")
    min_failures: PositiveCount = Field(
        default=5,
        description="Failed admissions within window_seconds that count (one is a retry, five a pattern).",
    )
    window_seconds: Seconds = Field(
        default=600.0, description="Window for min_failures, by the pod's creation time."
    )
    reasons: list[str] = Field(
        default_factory=lambda: ["UnexpectedAdmissionError", "OutOfnvidia.com/gpu"],
        min_length=1,
        description="Pod status.reason values that count: the kubelet's device-plugin Allocate failure "
        "(UnexpectedAdmissionError) and a GPU the node advertised but could not give (OutOf<resource>).",
    )


class SignalsConfig(Section):
    """Fabric and degradation signals (each: action, consecutive, boot_grace, thresholds)."""

    boot_grace_seconds: Seconds = Field(
        default=600.0,
        description="After a node's (re)boot — its Ready condition turning True — signals with boot_grace "
        "are ignored this long. 10 min covers NVLink training and Fabric Manager start-up (NVSentinel #1701: "
        "NVLINK_DOWN on every GB200 boot).",
    )
    window_seconds: Seconds = Field(
        default=300.0,
        ge=30,
        description="Window for the error-counter rates (NVLink, PCIe replay). 5 min = Prometheus' lookback.",
    )
    stall_seconds: Seconds = Field(
        default=300.0,
        ge=30,
        description="A GPU whose stall_metric has fresh samples but has not changed for this long is "
        "stalled: the node is unknown (never healthy), no taint added or removed (NVSentinel #1748).",
    )
    stall_metric: MetricName = Field(
        default="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        description="A counter that moves whenever the exporter really reads the GPU. Energy since boot (mJ, "
        "in dcgm-exporter's default CSV) rises even on an idle GPU. Absent: stall detection is off.",
    )
    expected_gpus_label: QualifiedName = Field(
        default=EXPECTED_GPUS,
        description="Node label with the node's expected GPU count (a per-node baseline). A node reporting "
        "fewer GPUs than this (or than its capacity, when the label is absent) is gpu-missing.",
    )
    nvlink_errors: NvlinkErrors = Field(default_factory=NvlinkErrors, description="NVLink error rate.")
    nvswitch_fatal: NvswitchFatal = Field(default_factory=NvswitchFatal, description="Fatal SXid.")
    nvswitch_non_fatal: NvswitchNonFatal = Field(
        default_factory=NvswitchNonFatal, description="Non-fatal SXid."
    )
    fabric_manager: FabricManager = Field(default_factory=FabricManager, description="Fabric Manager status.")
    fabric_health: FabricHealth = Field(default_factory=FabricHealth, description="Fabric health mask.")
    pcie_replay: PcieReplay = Field(default_factory=PcieReplay, description="PCIe replay rate.")
    hw_slowdown: ClockEvent = Field(
        default_factory=ClockEvent, description="Clock event bit 0x08 HW slowdown (EKS: Warning)."
    )
    hw_thermal: ClockEvent = Field(
        default_factory=ClockEvent, description="Clock event bit 0x40 HW thermal slowdown (EKS: Warning)."
    )
    sw_thermal: ClockEvent = Field(
        default_factory=lambda: ClockEvent(action="observe"),
        description="Clock event bit 0x20 SW thermal slowdown: the driver's own, milder response; observe.",
    )
    power_brake: ClockEvent = Field(
        default_factory=ClockEvent,
        description="Clock event bit 0x80 HW power brake (NVSentinel GpuPowerBrakeWatch, 3 polls, PR #1668).",
    )
    thermal_margin: ThermalMargin = Field(default_factory=ThermalMargin, description="Thermal margin.")
    admission_failures: AdmissionFailures = Field(
        default_factory=AdmissionFailures, description="Pods rejected at admission on the node."
    )
    stall_unknown_count: Count = Field(
        default=1,
        description="Stalled GPUs on a node that make the whole node unknown. 1: a stalled monitor can hide "
        "a failing GPU (NVSentinel #1748). 0 disables stall detection.",
    )
