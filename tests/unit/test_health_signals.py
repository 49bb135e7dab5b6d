"""Bit decoding of the packed DCGM fields, the signal config (unknown keys rejected), the PromQL bit test."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.health.signals import (
    FABRIC_HEALTH_FIELDS,
    clock_event_reasons,
    fabric_health_faults,
    fabric_manager_status,
)
from gpuwarden.config.health import HealthConfig
from gpuwarden.config.health_signals import SignalPolicy, SignalsConfig


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        pytest.param(0x0, set(), id="nothing"),
        pytest.param(0x1, {"gpu_idle"}, id="idle-only"),
        pytest.param(0x8, {"hw_slowdown"}, id="hw-slowdown"),
        pytest.param(0x20, {"sw_thermal"}, id="sw-thermal"),
        pytest.param(0x40, {"hw_thermal"}, id="hw-thermal"),
        pytest.param(0x80, {"power_brake"}, id="power-brake"),
        pytest.param(0x48, {"hw_slowdown", "hw_thermal"}, id="slowdown-and-thermal"),
        pytest.param(0x1FF, {"gpu_idle", "clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                             "sw_thermal", "hw_thermal", "power_brake", "display_clocks"}, id="all-known"),
        pytest.param(0x1000 | 0x4, {"sw_power_cap", "0x1000"}, id="unknown-bit-named-in-hex"),
    ],
)  # fmt: skip
def test_clock_event_reasons(mask: int, expected: set[str]) -> None:
    assert clock_event_reasons(mask) == frozenset(expected)


def _mask(**fields: int) -> int:
    by_name = {f.name: f for f in FABRIC_HEALTH_FIELDS}
    return sum(v << by_name[k].shift for k, v in fields.items())


HEALTHY = dict(degraded_bw=2, route_recovery=2, route_unhealthy=2, access_timeout_recovery=2)


@pytest.mark.parametrize(
    ("mask", "faults"),
    [
        pytest.param(0, (), id="all-not-supported"),
        pytest.param(_mask(**HEALTHY, incorrect_configuration=1), (), id="healthy-gpu-has-a-nonzero-mask"),
        pytest.param(0x80, (), id="access-timeout-recovery-false-is-healthy"),
        pytest.param(_mask(**{**HEALTHY, "degraded_bw": 1}), ("degraded_bw",), id="degraded-bandwidth"),
        pytest.param(_mask(**{**HEALTHY, "route_unhealthy": 1}), ("route_unhealthy",), id="route-unhealthy"),
        pytest.param(_mask(route_recovery=1, access_timeout_recovery=1), ("route_recovery",
                     "access_timeout_recovery"), id="two-faults"),
        pytest.param(_mask(**HEALTHY, incorrect_configuration=5), ("incorrect_configuration",),
                     id="insufficient-nvlinks-config"),
        pytest.param(_mask(degraded_bw=3), (), id="reserved-value-3-is-not-a-fault"),
    ],
)  # fmt: skip
def test_fabric_health_faults(mask: int, faults: tuple[str, ...]) -> None:
    assert fabric_health_faults(mask) == faults


@pytest.mark.parametrize(
    ("value", "name"),
    [(0, "not_supported"), (1, "not_started"), (2, "in_progress"), (3, "success"), (4, "failure"),
     (5, "unrecognized"), (6, "nvml_too_old"), (9, "unknown(9)")],
)  # fmt: skip
def test_fabric_manager_status(value: int, name: str) -> None:
    assert fabric_manager_status(value) == name


def test_every_signal_has_a_policy_with_an_action() -> None:
    cfg = SignalsConfig()
    from typing import get_args

    from controller.health.signals import SignalName

    for name in get_args(SignalName):
        assert isinstance(getattr(cfg, name), SignalPolicy), name


@pytest.mark.parametrize(
    ("signal", "action"),
    [("nvlink_errors", "quarantine"), ("nvswitch_fatal", "quarantine"), ("nvswitch_non_fatal", "observe"),
     ("fabric_manager", "quarantine"), ("fabric_health", "quarantine"), ("pcie_replay", "degrade"),
     ("hw_slowdown", "degrade"), ("hw_thermal", "degrade"), ("sw_thermal", "observe"),
     ("power_brake", "degrade"), ("thermal_margin", "degrade"), ("admission_failures", "quarantine")],
)  # fmt: skip
def test_documented_default_actions(signal: str, action: str) -> None:
    assert getattr(SignalsConfig(), signal).action == action


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        pytest.param({"nvlink_errors": {"treshold": 5}}, ("signals", "nvlink_errors", "treshold"), id="typo"),
        pytest.param({"pcie_replay": {"action": "taint"}}, ("signals", "pcie_replay", "action"),
                     id="bad-action"),
        pytest.param({"fabric_manager": {"failing_statuses": ["down"]}},
                     ("signals", "fabric_manager", "failing_statuses", 0), id="bad-fm-status"),
        pytest.param({"fabric_manager": {"failing_statuses": []}},
                     ("signals", "fabric_manager", "failing_statuses"), id="empty-fm-statuses"),
        pytest.param({"hw_thermal": {"consecutive": 0}}, ("signals", "hw_thermal", "consecutive"), id="zero"),
        pytest.param({"hw_thermal": {"consecutive": True}}, ("signals", "hw_thermal", "consecutive"),
                     id="bool-is-not-a-count"),
        pytest.param({"fabric_health": {"ignore_faults": ["bogus"]}},
                     ("signals", "fabric_health", "ignore_faults", 0), id="bad-fault-name"),
        pytest.param({"nosuch_signal": {}}, ("signals", "nosuch_signal"), id="unknown-signal"),
    ],
)  # fmt: skip
def test_bad_signal_config_names_the_field(raw: dict[str, object], loc: tuple[object, ...]) -> None:
    with pytest.raises(ValidationError) as err:
        HealthConfig.model_validate({"signals": raw})
    assert loc in [tuple(e["loc"]) for e in err.value.errors()]


def test_good_signal_config() -> None:
    cfg = HealthConfig.model_validate(
        {
            "signals": {
                "boot_grace_seconds": 300,
                "fabric_manager": {"failing_statuses": ["failure", "not_started"]},
                "pcie_replay": {"action": "quarantine", "consecutive": 5},
                "sw_thermal": {"action": "off"},
            }
        }
    )
    assert cfg.signals.fabric_manager.failing_statuses == ["failure", "not_started"]
    assert cfg.signals.pcie_replay.action == "quarantine"
    assert cfg.signals.sw_thermal.action == "off"
    assert cfg.signals.hw_thermal.action == "degrade"  # untouched siblings keep their defaults


def test_every_signal_field_is_documented() -> None:
    for name, info in SignalsConfig.model_fields.items():
        assert info.description, name
    for model in {type(getattr(SignalsConfig(), n)) for n in SignalsConfig.model_fields}:
        if isinstance(model, type) and issubclass(model, SignalPolicy):
            for name, info in model.model_fields.items():
                assert info.description, f"{model.__name__}.{name}"


def test_docs_table_names_every_signal_with_its_default_action() -> None:
    from pathlib import Path
    from typing import get_args

    from controller.health.signals import SignalName

    doc = (Path(__file__).resolve().parents[2] / "docs" / "health.md").read_text()
    rows = {}
    for line in doc.splitlines():
        if line.startswith("| `") and "health.signals" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    cfg = SignalsConfig()
    for name in get_args(SignalName):
        assert name in rows, f"docs/health.md lacks a row for {name}"
        assert rows[name][3] == getattr(cfg, name).action, name
        policy = getattr(cfg, name)
        assert rows[name][4] == f"{policy.consecutive} / {'yes' if policy.boot_grace else 'no'}", name


def test_packed_values_are_decoded_before_any_gpu_is_asked_for() -> None:
    from controller.health.signal_queries import fault_values, fault_values_query
    from gpuwarden.promtypes import Sample

    mask, clock = "DCGM_FI_DEV_FABRIC_HEALTH_MASK", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    answer = [
        Sample({"__name__": mask, "value": "426"}, 0.0, 39990),  # 0x1AA: healthy, non-zero
        Sample({"__name__": mask, "value": "0"}, 0.0, 8),  # not supported
        Sample({"__name__": mask, "value": "422"}, 0.0, 2),  # 0x1A6: route recovery
        Sample({"__name__": clock, "value": "1"}, 0.0, 39000),  # idle
        Sample({"__name__": clock, "value": "53"}, 0.0, 5),  # 0x35: SW thermal (observe) + normal bits
        Sample({"__name__": clock, "value": "65"}, 0.0, 3),  # 0x41: HW thermal
    ]
    cfg = HealthConfig()
    values = fault_values(cfg, answer)
    assert values == {mask: [422], clock: [53, 65]}
    q = fault_values_query(cfg, values)
    assert f"{mask}{{}} == 422" in q and f"{clock}{{}} == 53 or {clock}{{}} == 65" in q
    quiet = [s for s in answer if s.labels["value"] in ("426", "0", "1")]
    assert fault_values(cfg, quiet) == {} and fault_values_query(cfg, {}) == ""  # no second query
    signals = {"sw_thermal": {"action": "off"}, "fabric_health": {"ignore_faults": ["route_recovery"]}}
    off = HealthConfig.model_validate({"signals": signals})
    assert fault_values(off, answer) == {clock: [65]}
