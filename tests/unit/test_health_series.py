"""Which series the configured checks need; the absent ones `gpuwarden plan` reports (unknown, not ok)."""

from __future__ import annotations

from controller.health.series import absent_series, presence_query, required_series
from gpuwarden.config.health import HealthConfig


def test_default_config_needs_every_signal_series() -> None:
    need = required_series(HealthConfig())
    assert need["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"] == "signal fabric_manager"
    assert (
        need["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == "signals hw_slowdown, sw_thermal, hw_thermal, power_brake"
    )
    assert need["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "stalled-exporter test"
    assert "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL" in need


def test_signals_off_are_not_required() -> None:
    clock = {n: {"action": "off"} for n in ("hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")}
    signals = {"fabric_manager": {"action": "off"}, "stall_unknown_count": 0, **clock}
    cfg = HealthConfig.model_validate({"quarantine_on_recovery_action": False, "signals": signals})
    need = required_series(cfg)
    for name in ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                 "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"):  # fmt: skip
        assert name not in need


def test_absent_series_lines() -> None:
    cfg = HealthConfig()
    present = set(required_series(cfg)) - {
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    }
    assert absent_series(cfg, present) == (
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK: signal fabric_health is unknown (series absent)",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION: GPU recovery action is unknown (series absent)",
    )
    renamed = present | {"DCGM_FI_DEV_GPU_RECOVERY_ACTION"}  # the field's newer name serves too
    assert absent_series(cfg, renamed) == ("DCGM_FI_DEV_FABRIC_HEALTH_MASK: signal fabric_health is unknown "
                                           "(series absent)",)  # fmt: skip
    assert absent_series(cfg, set(required_series(cfg))) == ()


def test_presence_query_carries_the_matchers() -> None:
    q = presence_query(HealthConfig.model_validate({"label_matchers": 'cluster="prod"'}))
    assert q.startswith('count by (__name__) ({__name__=~"DCGM_')
    assert q.endswith(',cluster="prod"})')
