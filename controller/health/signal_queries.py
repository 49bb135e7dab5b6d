"""PromQL for the fabric and degradation signals: five fleet-wide queries per pass (six when a packed field
holds a fault), whatever the fleet size.

Why grouped: a 5,000-node fleet must not cost a query per signal per node. The level fields (Fabric Manager
status and error, thermal margin) come back from one query, both error-counter rates from another, the
NVSwitch SXids from a third and the stall test from a fourth. Each term is filtered in Prometheus to the
samples that can be a hit (a failing status, a margin below the minimum, a rate at its threshold), so a
healthy fleet answers with (almost) nothing. The two packed fields (fabric health mask, clock-event reasons)
are read in two steps: `count_values` gives the handful of distinct values in the fleet, `signals.py` decodes
them, and only values that hold a signal are asked for by GPU — bit arithmetic on every GPU's mask in PromQL
cost seconds at 40,000 GPUs (bench_health_signals). `label_replace` tags each term with a `field` label,
because `or` matches series ignoring their metric name and would otherwise drop one GPU's second field.

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
    fabric_health_faults,
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
    """The five queries (name → PromQL, "" when off) for `Queries`; `sel(name)` builds a selector."""
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
    packed = [n for n, sig in ((FABRIC_HEALTH_MASK, on["fabric_health"]), (CLOCK_EVENT_REASONS, any(
        on[name] for name in CLOCK_EVENT_SIGNALS))) if sig]  # fmt: skip
    if on["thermal_margin"]:
        levels.append(_tag(f"{sel(THERMAL_MARGIN)} < {s.thermal_margin.min_celsius:g}", "thermal_margin"))

    w = _dur(s.window_seconds)
    rates: list[str] = []
    if on["nvlink_errors"]:
        # One rate per counter, tagged apart: rate() drops the metric name, and the four counters of one GPU
        # would otherwise collide ("vector cannot contain metrics with the same labelset"). Zero rates are
        # dropped before the tagging and the `or`s: on a healthy fleet those see nothing (3.2 s -> see bench).
        per_counter = " or ".join(
            f'label_replace(rate({sel(name)}[{w}]) > 0, "counter", "{i}", "", "")'
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
        # The counter only rises, so "the same value now and stall_seconds ago" is "frozen for that long"; a
        # series younger than that has no earlier sample and is left out. Two instant lookups, not a range:
        # changes() + count_over_time() over every GPU took up to 2 s at 40,000 GPUs (bench_health_signals).
        stalled = f"max by ({keys}) (({e} - {e} offset {st}) == 0 and timestamp({e}) > time() - {fresh})"
    return {
        # The packed fields in two steps: which distinct values exist (a handful, whatever the fleet
        # size), then — only when one decodes to a fault — which GPUs hold them (`fault_values_query`).
        "signal_values": (
            f'count_values by (__name__) ("value", {{__name__=~"{"|".join(packed)}"{sep}{m}}})'
            if packed
            else ""
        ),
        "signal_levels": f"max by (field, {keys}) ({' or '.join(levels)})" if levels else "",
        "signal_rates": f"max by (field, {keys}) ({' or '.join(rates)})" if rates else "",
        "nvswitch": nvswitch,
        "stalled": stalled,
    }


def fault_values(cfg: HealthConfig, samples: list[Sample]) -> dict[str, list[int]]:
    """From `signal_values`' answer: per packed field, the distinct values that hold a signal."""
    s = cfg.signals
    out: dict[str, list[int]] = {}
    for sample in samples:
        name, raw = sample.labels.get("__name__", ""), sample.labels.get("value", "")
        try:
            value = int(float(raw))
        except ValueError:
            continue
        if name == FABRIC_HEALTH_MASK and s.fabric_health.action != "off":
            if [f for f in fabric_health_faults(value) if f not in s.fabric_health.ignore_faults]:
                out.setdefault(name, []).append(value)
        elif name == CLOCK_EVENT_REASONS:
            bits = [bit for sig, bit in CLOCK_EVENT_SIGNALS.items() if getattr(s, sig).action != "off"]
            if any(value & bit for bit in bits):
                out.setdefault(name, []).append(value)
    return {name: sorted(set(values)) for name, values in out.items()}


def fault_values_query(cfg: HealthConfig, values: Mapping[str, list[int]]) -> str:
    """The GPUs holding the fault values of the packed fields ("" when there are none: no query)."""
    node_keys = ", ".join(cfg.node_labels)
    keys = f"{node_keys}, {cfg.gpu_uuid_label}"
    m = cfg.label_matchers.strip().rstrip(",")
    terms = []
    for name, field in ((FABRIC_HEALTH_MASK, "fabric_mask"), (CLOCK_EVENT_REASONS, "clock_reasons")):
        if values.get(name):
            selector = f"{name}{{{m}}}"
            terms.append(_tag(" or ".join(f"{selector} == {v}" for v in values[name]), field))
    return f"max by (field, {keys}) ({' or '.join(terms)})" if terms else ""


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
