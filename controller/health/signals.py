"""The fabric and degradation signals: their names, the dcgm-exporter series they are read from, bit decoding.

Why a module of its own: one table names every signal once — the name used in config
(`health.signals.<name>`), findings, the `GPUDegraded` condition, Events, metrics and docs/health.md — with
the exact DCGM series it comes from, and the bit layouts of the two packed fields (clock-event reasons, fabric
health mask) are decoded here and nowhere else. Field names and ids: ../shared/reference/gpu-health.md §1.2
and peers.md §2 (DCGM `dcgm_fields.h`, `dcgm_structs.h`; NVML's fabric-health mask layout).

What it must not do: no I/O, no thresholds (those are policy), no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Well-known names this capability adds (to be consolidated with the other gpuwarden.io/* names).

EVENT_DEGRADED = "GPUDegraded"
EVENT_DEGRADATION_CLEARED = "GPUDegradationCleared"

SignalName = Literal[
    "nvlink_errors",
    "nvswitch_fatal",
    "nvswitch_non_fatal",
    "fabric_manager",
    "fabric_health",
    "pcie_replay",
    "hw_slowdown",
    "hw_thermal",
    "sw_thermal",
    "power_brake",
    "thermal_margin",
    "admission_failures",
]

# --- series names (dcgm-exporter uses the DCGM field name verbatim; ids from dcgm_fields.h) ---------------
NVLINK_COUNTERS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",  # 409
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",  # 419
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
NVSWITCH_FATAL = "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS"  # 856, value = SXid; labels nvswitch, Hostname
NVSWITCH_NON_FATAL = "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS"
FABRIC_MANAGER_STATUS = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"  # 170
FABRIC_MANAGER_ERROR = "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"  # 171
FABRIC_HEALTH_MASK = "DCGM_FI_DEV_FABRIC_HEALTH_MASK"  # 174
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"  # 202, in the default CSV
CLOCK_EVENT_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"  # 112
THERMAL_MARGIN = "DCGM_FI_DEV_GPU_TEMP_LIMIT"  # 153, degrees C before slowdown

# --- DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits (DCGM_CLOCKS_EVENT_REASON_*) ------------------------------------
CLOCK_EVENT_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "power_brake",
    0x100: "display_clocks",
}
# The clock-event bits that are signals (the others are normal operation: idle, caps, boost).
CLOCK_EVENT_SIGNALS: dict[SignalName, int] = {
    "hw_slowdown": 0x008,
    "sw_thermal": 0x020,
    "hw_thermal": 0x040,
    "power_brake": 0x080,
}


def clock_event_reasons(mask: int) -> frozenset[str]:
    """The names of the bits set in a `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` value (unknown bits as hex)."""
    names = {name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit}
    unknown = mask & ~sum(CLOCK_EVENT_BITS)
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.add(f"0x{bit:x}")
        bit <<= 1
    return frozenset(names)


# --- dcgmFabricManagerStatus_t (dcgm_structs.h) -------------------------------------------------------------
FABRIC_MANAGER_STATUSES: dict[int, str] = {
    0: "not_supported",
    1: "not_started",
    2: "in_progress",
    3: "success",
    4: "failure",
    5: "unrecognized",
    6: "nvml_too_old",
}


def fabric_manager_status(value: int) -> str:
    return FABRIC_MANAGER_STATUSES.get(value, f"unknown({value})")


# --- DCGM_FI_DEV_FABRIC_HEALTH_MASK (NVML_GPU_FABRIC_HEALTH_MASK_*) ----------------------------------------
@dataclass(frozen=True, slots=True)
class MaskField:
    """One packed sub-field: `(mask >> shift) & width`; `fault_values`: the values that are a fault."""

    name: str
    shift: int
    width: int
    fault_values: frozenset[int]


# Boolean sub-fields: 0 not supported, 1 TRUE (the fault is asserted), 2 FALSE (explicitly healthy), so a
# healthy GPU reports a non-zero mask. Incorrect configuration: 0 not supported, 1 none, >= 2 a fault.
FABRIC_HEALTH_FIELDS: tuple[MaskField, ...] = (
    MaskField("degraded_bw", 0, 0x3, frozenset({1})),
    MaskField("route_recovery", 2, 0x3, frozenset({1})),
    MaskField("route_unhealthy", 4, 0x3, frozenset({1})),
    MaskField("access_timeout_recovery", 6, 0x3, frozenset({1})),
    MaskField("incorrect_configuration", 8, 0xF, frozenset(range(2, 16))),
)


def fabric_health_faults(mask: int) -> tuple[str, ...]:
    """The sub-fields of a fabric health mask that are in their fault state (never "non-zero = bad")."""
    return tuple(f.name for f in FABRIC_HEALTH_FIELDS if (mask >> f.shift) & f.width in f.fault_values)
