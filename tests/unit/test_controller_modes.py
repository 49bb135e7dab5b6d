"""controller/modes.py: each capability's off / observe / act, read from the fields the loops honour."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.app import register_modes
from controller.modes import Mode, capability_modes
from gpuwarden.config.root import Config

DEFAULTS: dict[str, Mode] = {
    "health": "act",
    "nominations": "act",
    "preemption-throttle": "act",
    "gpu-preemption": "off",
    "drain": "off",
    "idle": "off",
    "extender": "act",
}
OBSERVE = {"dry_run": True}


@pytest.mark.parametrize(
    ("config", "dry_run", "expected"),
    [
        pytest.param({}, None, DEFAULTS, id="defaults-act"),
        pytest.param(
            {}, True, {k: "off" if v == "off" else "observe" for k, v in DEFAULTS.items()}, id="flag"
        ),
        pytest.param({"health": OBSERVE}, None, {**DEFAULTS, "health": "observe"}, id="health-observes"),
        pytest.param(
            {"idle": {"enabled": True}}, None, {**DEFAULTS, "idle": "observe"}, id="idle-dry-run-by-default"
        ),
        pytest.param(
            {"drain": {"enabled": True, "dry_run": False}, "preemption": {"make_room": {"enabled": True}}},
            None,
            {**DEFAULTS, "drain": "act", "gpu-preemption": "act"},
            id="opt-ins-act",
        ),
        pytest.param(
            {"nominations": {"enabled": False}, "extender": {"enabled": False}},
            None,
            {**DEFAULTS, "nominations": "off", "extender": "off"},
            id="switched-off",
        ),
    ],
)
def test_capability_modes(config: dict[str, Any], dry_run: bool | None, expected: dict[str, Mode]) -> None:
    assert capability_modes(Config.model_validate(config), dry_run=dry_run) == expected


def test_the_gauge_has_one_series_per_capability() -> None:
    registry = CollectorRegistry()
    register_modes(registry, {"health": "observe", "drain": "off"})
    assert (
        registry.get_sample_value("gpuwarden_capability_mode", {"capability": "health", "mode": "observe"})
        == 1
    )
    assert registry.get_sample_value("gpuwarden_capability_mode", {"capability": "drain", "mode": "off"}) == 1
    assert (
        registry.get_sample_value("gpuwarden_capability_mode", {"capability": "health", "mode": "act"})
        is None
    )
