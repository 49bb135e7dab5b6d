"""The quarantine policy: every threshold and limit the pure decision reads, in one frozen value.

Why not pass the config model straight to `decide.py`: the decision wants seconds as floats, the merged
XID catalog and a per-class taint effect table, computed once at start-up; tests want to build a policy in
one line with `HealthPolicy(breaker_max_absolute=2)`. `policy_from_config` is the only place that knows the
config shape.

What it must not do: no I/O (the catalog is parsed in `catalog.py`), no clock reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.health.catalog import XID_CLASSES, XidCatalog, default_catalog, load_catalog
from gpuwarden.config.domains import DomainsConfig
from gpuwarden.config.health import HealthConfig
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.config.health_validation import ValidationConfig

# Non-XID reasons and the class (taint-effect row) they fall under.
REASON_CLASSES: dict[str, str] = {
    "ecc-dbe": "hw_mem",
    "sbe-rate": "hw_mem",
    "retired-pages": "hw_mem",
    "retired-dbe": "hw_mem",
    "retired-pending": "hw_mem",
    "uncorrectable-remapped-rows": "hw_mem",
    "row-remap-failure": "hw_mem",
    "gpu-missing": "hw_pcie",
    "recovery-action": "fw_drv",
    # Fabric and degradation signals (signals.py)
    "nvlink-errors": "hw_link",
    "nvswitch-fatal": "hw_link",
    "nvswitch-non-fatal": "hw_link",
    "fabric-manager": "hw_link",
    "fabric-health": "hw_link",
    "pcie-replay": "hw_pcie",
    "hw-slowdown": "info",
    "hw-thermal": "info",
    "sw-thermal": "info",
    "power-brake": "info",
    "thermal-margin": "info",
    "admission-failures": "fw_drv",
}


def _default_effects() -> dict[str, str]:
    return dict.fromkeys(XID_CLASSES, "NoSchedule")


@dataclass(frozen=True)
class HealthPolicy:
    """Thresholds, windows and limits; all durations in seconds. Defaults mirror `gpuwarden.config.health`."""

    catalog: XidCatalog = field(default_factory=default_catalog)
    xid_window: float = 300.0  # an XID / DBE increase younger than this is current evidence
    repeat_window: float = 86400.0  # occurrences counted for `escalate_after`
    quarantine_unknown_xid: bool = False  # an XID the catalog lacks: event + metric only
    staleness: float = 120.0  # a GPU whose newest sample is older than this is unknown
    healthy_period: float = 1800.0  # evidence must be gone this long before a release
    gpu_missing_grace: float | None = 120.0  # fewer GPUs than advertised for this long; None = never
    dbe_increase_threshold: float = 1.0  # volatile DBE increase within xid_window that quarantines
    sbe_rate_per_hour: float | None = None  # corrected errors per hour that quarantine; None = never
    retired_pages_limit: int = 63  # DCGM_LIMIT_MAX_RETIRED_PAGES (SBE + DBE)
    retired_dbe_soft_limit: int = 15  # DCGM: > 15 DBE retired pages and > 1 more in a week
    retired_pending_quarantines: bool = False  # NVIDIA: new workloads may still launch
    uncorrectable_remapped_rows_limit: int | None = 512  # DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE
    row_remap_failure_quarantines: bool = True
    recovery_action_quarantines: bool = True  # any non-zero DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION
    taint_effects: Mapping[str, str] = field(default_factory=_default_effects)
    breaker_max_absolute: int = 3
    breaker_max_percent: float = 10.0
    breaker_max_new_per_window: int = 5
    breaker_window: float = 3600.0
    breaker_hold: float = 900.0
    signals: SignalsConfig = field(default_factory=SignalsConfig)  # graded fabric/degradation signals
    validation: ValidationConfig = field(default_factory=ValidationConfig)  # a Job before each release
    device_taint_effect: str = "NoSchedule"  # a DeviceTaintRule's effect outside dry-run (devicerules.py)
    domains: DomainsConfig = field(default_factory=DomainsConfig)  # NVLink domain health (domains.py)
    dry_run: bool = False

    def effect_for(self, reason_class: str) -> str:
        return self.taint_effects.get(reason_class, "NoSchedule")

    def max_quarantined(self, gpu_nodes: int) -> int:
        """`max(absolute, percent of GPU nodes)`, the percent part rounded down (the safe side)."""
        return max(self.breaker_max_absolute, math.floor(self.breaker_max_percent * gpu_nodes / 100.0))


def policy_from_config(
    cfg: HealthConfig, *, dry_run: bool | None = None, domains: DomainsConfig | None = None
) -> HealthPolicy:
    """Build the policy from the `health:` config section (and the root `domains:` one, which health shares
    with the extender); `dry_run` (the CLI flag) wins when given."""
    catalog = load_catalog(dict(cfg.xid.overrides)) if cfg.xid.overrides else default_catalog()
    effects = _default_effects()
    effects.update(cfg.taint_effects.model_dump())
    ecc, brk = cfg.ecc, cfg.breaker
    return HealthPolicy(
        catalog=catalog,
        xid_window=cfg.xid.event_window_seconds,
        repeat_window=cfg.xid.escalation_window_seconds,
        quarantine_unknown_xid=cfg.xid.quarantine_unknown,
        staleness=cfg.max_sample_age_seconds,
        healthy_period=cfg.healthy_period_seconds,
        gpu_missing_grace=cfg.gpu_missing_grace_seconds,
        dbe_increase_threshold=float(ecc.dbe_volatile_increase),
        sbe_rate_per_hour=ecc.sbe_rate_per_hour,
        retired_pages_limit=ecc.retired_pages_max,
        retired_dbe_soft_limit=ecc.retired_dbe_pages_soft_limit,
        retired_pending_quarantines=ecc.quarantine_on_pending_retirement,
        uncorrectable_remapped_rows_limit=ecc.uncorrectable_remapped_rows_max,
        row_remap_failure_quarantines=ecc.quarantine_on_row_remap_failure,
        recovery_action_quarantines=cfg.quarantine_on_recovery_action,
        taint_effects=effects,
        breaker_max_absolute=brk.max_absolute,
        breaker_max_percent=brk.max_percent,
        breaker_max_new_per_window=brk.max_new_per_window,
        breaker_window=brk.window_seconds,
        breaker_hold=brk.hold_seconds,
        signals=cfg.signals,
        validation=cfg.validation,
        device_taint_effect=cfg.device_taint_effect,
        domains=domains if domains is not None else DomainsConfig(),
        dry_run=cfg.dry_run if dry_run is None else dry_run,
    )


def reason_class(reason: str, catalog: XidCatalog) -> str:
    """The taint-effect class of a reason string (`xid-79` → `hw_pcie`, `ecc-dbe` → `hw_mem`)."""
    if reason.startswith("xid-") and reason[4:].isdigit():
        return catalog.lookup(int(reason[4:])).xid_class
    return REASON_CLASSES.get(reason, "unknown")
