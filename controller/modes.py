"""What each controller capability does in this process: off, observe or act (docs/install.md, Observe).

Why a module of its own: a fresh install observes (the chart's `mode: observe` sets each section's `dry_run`),
and the one question a platform team asks before `--set mode=act` is "what is acting now?". The answer is read
from the same config fields and `--dry-run` flag the loops honour, never restated: observe is each loop's own
dry-run (plan, log, event, count with `dry_run="true"`; patch nothing). Exported as
`gpuwarden_capability_mode{capability, mode} 1` so dashboards and alerts can tell an observing install from an
acting one. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from gpuwarden.config.root import Config

Mode = Literal["off", "observe", "act"]

METRIC = "gpuwarden_capability_mode"


def capability_modes(config: Config, *, dry_run: bool | None) -> dict[str, Mode]:
    """Each capability's mode; `dry_run` is `gpuwarden controller --dry-run` (it makes every loop observe).
    The extender has no dry-run of its own for filter/prioritize; its bind follows the flag."""
    forced = bool(dry_run)
    sections = {
        "health": (config.health.enabled, config.health.dry_run),
        "nominations": (config.nominations.enabled, config.nominations.dry_run),
        "preemption-throttle": (config.preemption.enabled, config.preemption.dry_run),
        "gpu-preemption": (config.preemption.make_room.enabled, config.preemption.make_room.dry_run),
        "drain": (config.drain.enabled, config.drain.dry_run),
        "idle": (config.idle.enabled, config.idle.dry_run),
        "extender": (config.extender.enabled, False),
    }
    return {
        name: ("off" if not enabled else "observe" if (forced or observe) else "act")
        for name, (enabled, observe) in sections.items()
    }


def mode_samples(modes: dict[str, Mode]) -> dict[tuple[str, ...], float]:
    """The gauge's samples: one series per capability, its mode as a label."""
    return {(name, mode): 1.0 for name, mode in modes.items()}
