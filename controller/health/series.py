"""Which DCGM series the health loop needs for the configured checks, and which of them Prometheus lacks.

Why: most fields gpuwarden reads are off in dcgm-exporter's default CSV, and an absent series gives no
finding — unknown, never healthy. An operator must be told which checks are blind, not left to assume a quiet
fleet is a healthy one. `gpuwarden plan` asks Prometheus once (`count by (__name__)` over these names; too
costly for every pass of the loop) and prints the absent ones with the check each one feeds.

What it must not do: query anything itself (the caller runs `presence_query`) or decide.
"""

from __future__ import annotations

from controller.health import signals as s
from gpuwarden.config.health import HealthConfig

PRESENCE = "DCGM_FI_DEV_GPU_TEMP"


def required_series(cfg: HealthConfig) -> dict[str, str]:
    """Series name → the check that needs it, for every check the config turns on."""
    out: dict[str, str] = {PRESENCE: "GPU presence and freshness (every check)"}
    if cfg.xid.source in ("auto", "gauge"):
        out["DCGM_FI_DEV_XID_ERRORS"] = "XID events"
    if cfg.xid.source == "count":
        out["DCGM_EXP_XID_ERRORS_COUNT"] = "XID counts"
    out["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = "ECC double-bit errors"
    out["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = "row-remap failure"
    out["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = "uncorrectable remapped rows"
    if cfg.quarantine_on_recovery_action:
        out["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] = "GPU recovery action"
    sig = cfg.signals

    def on(name: str) -> bool:
        return bool(getattr(sig, name).action != "off")

    if on("nvlink_errors"):
        out |= dict.fromkeys(s.NVLINK_COUNTERS, "signal nvlink_errors")
    if on("nvswitch_fatal"):
        out[s.NVSWITCH_FATAL] = "signal nvswitch_fatal"
    if on("nvswitch_non_fatal"):
        out[s.NVSWITCH_NON_FATAL] = "signal nvswitch_non_fatal"
    if on("fabric_manager"):
        out[s.FABRIC_MANAGER_STATUS] = "signal fabric_manager"
    if on("fabric_health"):
        out[s.FABRIC_HEALTH_MASK] = "signal fabric_health"
    if on("pcie_replay"):
        out[s.PCIE_REPLAY] = "signal pcie_replay"
    clock = [name for name in s.CLOCK_EVENT_SIGNALS if on(name)]
    if clock:
        out[s.CLOCK_EVENT_REASONS] = "signals " + ", ".join(clock)
    if on("thermal_margin"):
        out[s.THERMAL_MARGIN] = "signal thermal_margin"
    if sig.stall_unknown_count > 0:
        out[sig.stall_metric] = "stalled-exporter test"
    return out


def presence_query(cfg: HealthConfig) -> str:
    """One query answering which of the required series exist at all (one sample per name)."""
    names = "|".join(sorted(required_series(cfg)))
    m = cfg.label_matchers.strip().rstrip(",")
    return f'count by (__name__) ({{__name__=~"{names}"{"," if m else ""}{m}}})'


def absent_series(cfg: HealthConfig, present: set[str]) -> tuple[str, ...]:
    """Lines `<series>: <check> is unknown (series absent)` for every required series not in `present`."""
    need = required_series(cfg)
    present = set(present)
    if "DCGM_FI_DEV_GPU_RECOVERY_ACTION" in present:  # the field's newer name serves too
        present.add("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION")
    return tuple(
        f"{name}: {need[name]} is unknown (series absent)" for name in sorted(need) if name not in present
    )
