"""PromQL for the fabric and degradation signals: four fleet-wide queries per pass, whatever the fleet size.

Why grouped: a 5,000-node fleet must not cost a query per signal per node. Every level-type field (Fabric
Manager status and error, fabric health mask, clock-event reasons, thermal margin) comes back from one query,
both error-counter rates from another, the NVSwitch SXids from a third and the stall test from a fourth. Each
term is filtered in Prometheus to the samples that can be a hit — a failing Fabric Manager status, a fabric
sub-field in its fault state (bit arithmetic in PromQL, `signals.fabric_fault_promql`), a clock-event bit
that is a signal, a margin below the minimum, a rate at its threshold — so a healthy fleet answers with
(almost) nothing. `label_replace` tags each term with a `field` label, because `or` matches series ignoring
their metric name and would otherwise drop one GPU's second field.

What it must not do: run queries or decide; thresholds are re-checked by `grading.py` on the values returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from controller.health.signals import (
    CLOCK_EVENT_REASONS,
    CLOCK_EVENT_SIGNALS,
    FABRIC_HEALTH_MASK,
    FABRIC_MANAGER_ERROR,
    FABRIC_MANAGER_STATUS,
    FABRIC_MANAGER_STATUSES,
    NVLINK_COUNTERS,
    NVSWITCH_FATAL,
    NVSWITCH_NON_FATAL,
    PCIE_REPLAY,
    THERMAL_MARGIN,
    fabric_fault_promql,
)
from gpuwarden.config.health import HealthConfig
from gpuwarden.promtypes import Sample

# `field` label value → GpuTelemetry attribute
LEVEL_FIELDS = {
    "fm_status": "fabric_manager_status",
    "fm_error": "fabric_manager_error",
    "fabric_mask": "fabric_health_mask",
    "clock_reasons": "clock_event_reasons",
    "thermal_margin": "thermal_margin",
}
RATE_FIELDS = {"nvlink": "nvlink_error_rate", "pcie_replay": "pcie_replay_rate"}


def _dur(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def _tag(expr: str, value: str) -> str:
    return f'label_replace({expr}, "field", "{value}", "", "")'


def signal_queries(cfg: HealthConfig, sel: Callable[..., str]) -> dict[str, str]:
    """The four queries (name → PromQL, "" when off) for `Queries`; `sel(name)` builds a selector."""
    s = cfg.signals
    on = {
        name: getattr(s, name).action != "off"
        for name in type(s).model_fields
        if hasattr(getattr(s, name), "action")
    }
    node_keys = ", ".join(cfg.node_labels)
    keys = f"{node_keys}, {cfg.gpu_uuid_label}"
    m = cfg.label_matchers.strip().rstrip(",")
    sep = "," if m else ""

    levels: list[str] = []
    if on["fabric_manager"]:
        codes = [
            c for c, name in FABRIC_MANAGER_STATUSES.items() if name in s.fabric_manager.failing_statuses
        ]
        status = sel(FABRIC_MANAGER_STATUS)
        levels.append(_tag(" or ".join(f"{status} == {c}" for c in codes), "fm_status"))
        levels.append(_tag(f"{sel(FABRIC_MANAGER_ERROR)} != 0", "fm_error"))
    if on["fabric_health"]:
        mask = sel(FABRIC_HEALTH_MASK)
        levels.append(_tag(f"{mask} and ({fabric_fault_promql(mask)})", "fabric_mask"))
    bits = [bit for name, bit in CLOCK_EVENT_SIGNALS.items() if on[name]]
    if bits:
        reasons = sel(CLOCK_EVENT_REASONS)
        tests = " or ".join(f"(floor({reasons} / {b}) % 2) == 1" for b in bits)
        levels.append(_tag(f"{reasons} and ({tests})", "clock_reasons"))
    if on["thermal_margin"]:
        levels.append(_tag(f"{sel(THERMAL_MARGIN)} < {s.thermal_margin.min_celsius:g}", "thermal_margin"))

    w = _dur(s.window_seconds)
    rates: list[str] = []
    if on["nvlink_errors"]:
        # One rate per counter, tagged apart: rate() drops the metric name, and the four counters of one GPU
        # would otherwise collide ("vector cannot contain metrics with the same labelset").
        per_counter = " or ".join(
            f'label_replace(rate({sel(name)}[{w}]), "counter", "{i}", "", "")'
            for i, name in enumerate(NVLINK_COUNTERS)
        )
        expr = f"sum by ({keys}) ({per_counter})"
        rates.append(_tag(f"{expr} >= {s.nvlink_errors.errors_per_second:g}", "nvlink"))
    if on["pcie_replay"]:
        per_second = s.pcie_replay.replays_per_minute / 60.0
        rates.append(
            _tag(f"max by ({keys}) (rate({sel(PCIE_REPLAY)}[{w}])) >= {per_second:g}", "pcie_replay")
        )

    switches = ((NVSWITCH_FATAL, "nvswitch_fatal"), (NVSWITCH_NON_FATAL, "nvswitch_non_fatal"))
    switch_names = [n for n, sig in switches if on[sig]]
    nvswitch = (
        f'max by (__name__, {node_keys}, nvswitch) ({{__name__=~"{"|".join(switch_names)}"{sep}{m}}} != 0)'
        if switch_names
        else ""
    )

    stalled = ""
    if s.stall_unknown_count > 0:
        e = sel(s.stall_metric)
        st = _dur(s.stall_seconds)
        fresh = _dur(cfg.max_sample_age_seconds)[:-1]
        stalled = (
            f"max by ({keys}) ((changes({e}[{st}]) == 0) and (count_over_time({e}[{st}]) > 2) "
            f"and (timestamp({e}) > time() - {fresh}))"
        )
    return {
        "signal_levels": f"max by (field, {keys}) ({' or '.join(levels)})" if levels else "",
        "signal_rates": f"max by (field, {keys}) ({' or '.join(rates)})" if rates else "",
        "nvswitch": nvswitch,
        "stalled": stalled,
    }


def read_nvswitch(
    samples: list[Sample], node_of: Callable[[Mapping[str, str]], str]
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per node identity: (fatal SXids, non-fatal SXids) of its NVSwitches."""
    fatal: dict[str, set[int]] = {}
    non_fatal: dict[str, set[int]] = {}
    for sample in samples:
        node = node_of(sample.labels)
        if not node or math.isnan(sample.value):
            continue
        target = fatal if sample.labels.get("__name__") == NVSWITCH_FATAL else non_fatal
        target.setdefault(node, set()).add(int(sample.value))
    return {
        n: (tuple(sorted(fatal.get(n, ()))), tuple(sorted(non_fatal.get(n, ()))))
        for n in {*fatal, *non_fatal}
    }
