"""DCGM telemetry from Prometheus: a constant number of fleet-wide PromQL queries → per-GPU readings.

Why it exists: the traps of dcgm-exporter's metrics (reference/gpu-health.md §1) are handled in one place.
`DCGM_FI_DEV_XID_ERRORS` is a sticky gauge holding the *last* XID, one series per `err_code`: an XID event is
a series that first appeared within the event window, found with `min_over_time(timestamp(...)[W:step])`
(the timestamp of the first sample), not `> 0`, which stays true for ever. `DCGM_EXP_XID_ERRORS_COUNT` (off by
default) gives real per-XID counts. ECC counters may not be exported at all: absent means `None`, never 0.
Node identity comes from the first present label of `health.node_labels` (`Hostname`, `hostname`, `node`).
Every query aggregates `by (<node labels>, <uuid>)`, so the answer size is the fleet size whatever the
exporter's extra labels, and the number of queries does not grow with the fleet.

What it must not do: decide anything, or talk to Kubernetes. Prometheus errors propagate as
`gpuwarden.errors.PrometheusError` for `observe.py` to turn into "unknown".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from controller.health.signal_queries import (
    LEVEL_FIELDS,
    RATE_FIELDS,
    fault_values,
    fault_values_query,
    read_nvswitch,
    signal_queries,
)
from controller.health.snapshot import GpuTelemetry, XidObservation
from gpuwarden.config.health import HealthConfig
from gpuwarden.promtypes import InstantResult, Sample, Vector

PRESENCE_METRIC = "DCGM_FI_DEV_GPU_TEMP"  # in dcgm-exporter's default CSV; present for every GPU it reports
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
LEVELS = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "dbe_volatile",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_dbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pending",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "uncorrectable_remapped_rows",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "recovery_action",
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": "recovery_action",
}
WEEK = 7 * 86400


class Querier(Protocol):
    """What we need of `gpuwarden.promclient.PrometheusClient`."""

    async def query(self, promql: str, time: float | None = None) -> InstantResult: ...


def _dur(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


@dataclass(frozen=True)
class Queries:
    """The PromQL of one observation; built once from config (golden-tested)."""

    node_fresh: str
    node_newest: str
    gpu_stale: str
    xid_current: str
    xid_first_seen: str
    count_recent: str
    count_first_seen: str
    count_repeat: str
    levels: str
    dbe_increase: str
    sbe_rate: str
    retired_dbe_week: str
    use_gauge: bool = True
    use_count: bool = True
    # Fabric and degradation signals (signal_queries.py); "" when every signal it serves is off.
    signal_values: str = ""
    signal_levels: str = ""
    signal_rates: str = ""
    nvswitch: str = ""
    stalled: str = ""

    def all(self) -> dict[str, str]:
        names = [
            "node_fresh",
            "node_newest",
            "gpu_stale",
            "levels",
            "dbe_increase",
            "sbe_rate",
            "retired_dbe_week",
        ]
        if self.use_gauge:
            names += ["xid_current", "xid_first_seen"]
        if self.use_count:
            names += ["count_recent", "count_first_seen", "count_repeat"]
        signal = ("signal_values", "signal_levels", "signal_rates", "nvswitch", "stalled")
        names += [n for n in signal if getattr(self, n)]
        return {n: getattr(self, n) for n in names}


def build_queries(cfg: HealthConfig, *, step: float | None = None) -> Queries:
    """Fleet-wide queries for the windows and labels in `cfg` (`step`: subquery resolution, ≤ scrape;
    default `cfg.subquery_step_seconds`)."""
    step = cfg.subquery_step_seconds if step is None else step
    node_keys = ", ".join(cfg.node_labels)
    keys = f"{node_keys}, {cfg.gpu_uuid_label}"
    m = cfg.label_matchers.strip().rstrip(",")
    sep = "," if m else ""
    w = _dur(cfg.xid.event_window_seconds)
    r = _dur(cfg.xid.escalation_window_seconds)
    stale = _dur(cfg.max_sample_age_seconds)
    # A GPU that vanished is still seen by the subquery for this long (+ Prometheus' 5 min lookback when no
    # staleness marker was written), enough to time the GPU-missing grace from its last sample.
    lookback = _dur(max(cfg.max_sample_age_seconds, cfg.gpu_missing_grace_seconds or 0.0) + 2 * step)
    s = _dur(step)

    def sel(name: str, extra: str = "") -> str:
        inner = ",".join(x for x in (m, extra) if x)
        return f"{name}{{{inner}}}"

    levels = "|".join(LEVELS)
    count_sel = sel(XID_COUNT, 'xid!=""')
    xid_sel = sel(XID_GAUGE, 'err_code!="0"')  # older exporters emit err_code="0" for "no XID"
    signal = signal_queries(cfg, sel)
    return Queries(
        **signal,
        # physical GPUs, not series: a MIG GPU reports once per instance and a time-sliced GPU once per pod
        # under KUBERNETES_VIRTUAL_GPUS, all under the physical GPU's UUID
        node_fresh=f"count by ({node_keys}) (max by ({keys}) (timestamp({sel(PRESENCE_METRIC)})) "
        f"> time() - {stale[:-1]})",
        node_newest=f"max by ({node_keys}) (timestamp({sel(PRESENCE_METRIC)}))",
        gpu_stale=f"max by ({keys}, gpu) (max_over_time(timestamp({sel(PRESENCE_METRIC)})[{lookback}:{s}])) "
        f"< time() - {stale[:-1]}",
        xid_current=f"max by ({keys}) ({sel(XID_GAUGE)}) != 0",
        xid_first_seen=f"min by ({keys}, err_code) (min_over_time(timestamp({xid_sel})[{w}:{s}]))",
        count_recent=f"max by ({keys}, xid) (max_over_time({count_sel}[{w}]))",
        count_first_seen=f"min by ({keys}, xid) (min_over_time(timestamp({count_sel})[{w}:{s}]))",
        count_repeat=f"max by ({keys}, xid) (max_over_time({count_sel}[{r}]))",
        # Zeros are filtered in Prometheus: a healthy fleet answers with (almost) nothing.
        levels=f'max by (__name__, {keys}) ({{__name__=~"{levels}"{sep}{m}}} != 0)',
        dbe_increase=f"max by ({keys}) (increase({sel('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[{w}])) > 0",
        sbe_rate=f"max by ({keys}) (rate({sel('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL')}[{w}])) > 0",
        retired_dbe_week=f"max by ({keys}) ({sel('DCGM_FI_DEV_RETIRED_DBE')} - "
        f"{sel('DCGM_FI_DEV_RETIRED_DBE')} offset {WEEK}s) > 0",
        use_gauge=cfg.xid.source in ("auto", "gauge"),
        use_count=cfg.xid.source in ("auto", "count"),
    )


GpuKey = tuple[str, str]  # (node identity, GPU UUID)


@dataclass
class Telemetry:
    """Per node identity, its GPUs; plus how many queries it took and series we could not attribute."""

    gpus: dict[str, dict[str, GpuTelemetry]] = field(default_factory=dict)
    fresh: dict[str, int] = field(default_factory=dict)
    newest: dict[str, float] = field(default_factory=dict)
    nvswitch: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict
    )  # fatal, non-fatal
    queries: int = 0
    unattributed: int = 0

    def for_node(self, identity: str) -> tuple[GpuTelemetry, ...] | None:
        """The GPUs with something to report; () for a node that reports and is quiet; None: no telemetry."""
        found = self.gpus.get(identity, {})
        if not found and identity not in self.newest:
            return None
        return tuple(sorted(found.values(), key=lambda g: (len(g.index), g.index, g.uuid)))

    def identities(self) -> set[str]:
        return set(self.gpus) | set(self.newest)


def _samples(result: InstantResult) -> list[Sample]:
    return result.samples if isinstance(result, Vector) else []


class _Builder:
    def __init__(self, node_labels: Iterable[str], uuid_label: str) -> None:
        self.node_labels = tuple(node_labels)
        self.uuid_label = uuid_label
        self.fields: dict[GpuKey, dict[str, object]] = {}
        self.xids: dict[GpuKey, dict[int, XidObservation]] = {}
        self.unattributed = 0

    def node(self, labels: Mapping[str, str]) -> str:
        return next((labels[n] for n in self.node_labels if labels.get(n)), "")

    def key(self, labels: Mapping[str, str]) -> GpuKey | None:
        node = self.node(labels)
        uuid = labels.get(self.uuid_label, "")
        if not node or not uuid:
            self.unattributed += 1
            return None
        return node, uuid

    def put(self, samples: list[Sample], attr: str, convert: type = float) -> None:
        for s in samples:
            k = self.key(s.labels)
            if k is not None and not math.isnan(s.value):
                self.fields.setdefault(k, {})[attr] = convert(s.value)

    def xid(self, k: GpuKey, code: int, **changes: object) -> None:
        obs = self.xids.setdefault(k, {}).get(code) or XidObservation(code, False, 1, None, "gauge")
        self.xids[k][code] = replace(obs, **changes)  # type: ignore[arg-type]


async def read_telemetry(prom: Querier, queries: Queries, cfg: HealthConfig, now: float) -> Telemetry:
    """Run every query at `now` (concurrently) and assemble per-GPU telemetry."""
    names = queries.all()
    results = await asyncio.gather(*(prom.query(q, time=now) for q in names.values()))
    got = dict(zip(names, map(_samples, results), strict=True))
    faulty = fault_values_query(cfg, fault_values(cfg, got.get("signal_values", [])))
    if faulty:  # a packed field holds a fault somewhere: which GPUs (one more query, only then)
        got["signal_levels"] = got.get("signal_levels", []) + _samples(await prom.query(faulty, time=now))
    b = _Builder(cfg.node_labels, cfg.gpu_uuid_label)
    window_start = now - cfg.xid.event_window_seconds
    out = Telemetry(queries=len(names) + bool(faulty))
    for s in got["node_fresh"]:
        out.fresh[b.node(s.labels)] = int(s.value)
    for s in got["node_newest"]:
        out.newest[b.node(s.labels)] = s.value
    b.put(got["gpu_stale"], "last_sample")
    for s in got["gpu_stale"]:
        k = b.key(s.labels)
        if k is not None and "gpu" in s.labels:
            b.fields[k]["index"] = s.labels["gpu"]
    for s in got["levels"]:
        attr = LEVELS.get(s.labels.get("__name__", ""))
        k = b.key(s.labels)
        if attr and k is not None and not math.isnan(s.value):
            b.fields.setdefault(k, {})[attr] = int(s.value) if attr == "recovery_action" else s.value
    b.put(got["dbe_increase"], "dbe_volatile_increase")
    b.put(got["sbe_rate"], "sbe_volatile_rate")
    b.put(got["retired_dbe_week"], "retired_dbe_increase_week")
    for s in got.get("signal_levels", []):
        attr = LEVEL_FIELDS.get(s.labels.get("field", ""))
        k = b.key(s.labels)
        if attr and k is not None and not math.isnan(s.value):
            b.fields.setdefault(k, {})[attr] = s.value if attr == "thermal_margin" else int(s.value)
    for s in got.get("signal_rates", []):
        attr = RATE_FIELDS.get(s.labels.get("field", ""))
        k = b.key(s.labels)
        if attr and k is not None and not math.isnan(s.value):
            b.fields.setdefault(k, {})[attr] = s.value
    for s in got.get("stalled", []):
        k = b.key(s.labels)
        if k is not None:
            b.fields.setdefault(k, {})["stalled"] = True
    out.nvswitch = read_nvswitch(got.get("nvswitch", []), b.node)
    if queries.use_gauge:
        b.put(got["xid_current"], "xid_last", int)
        for s in got["xid_first_seen"]:
            k, code = b.key(s.labels), _int(s.labels.get("err_code"))
            if k is not None and code:  # err_code="0" is "no XID" (some exporters emit it)
                recent = s.value > window_start  # the series began inside the window: a new episode
                b.xid(k, code, recent=recent, first_seen=s.value, source="gauge")
    if queries.use_count:
        first = {(b.key(s.labels), _int(s.labels.get("xid"))): s.value for s in got["count_first_seen"]}
        for s in got["count_recent"]:
            k, code = b.key(s.labels), _int(s.labels.get("xid"))
            if k is not None and code and s.value > 0:
                seen = first.get((k, code))
                b.xid(k, code, recent=True, count=max(1, int(s.value)), first_seen=seen, source="count")
        for s in got["count_repeat"]:
            k, code = b.key(s.labels), _int(s.labels.get("xid"))
            if k is not None and code and s.value > 0:
                prev = b.xids.get(k, {}).get(code)
                b.xid(k, code, count=max(int(s.value), prev.count if prev else 1), source="count")
    out.unattributed = b.unattributed
    for k in {*b.fields, *b.xids}:
        node, uuid = k
        f = b.fields.get(k, {})
        f.setdefault("last_sample", out.newest.get(node))  # not in the stale set: as fresh as its node
        xids = tuple(sorted(b.xids.get(k, {}).values(), key=lambda o: o.code))
        out.gpus.setdefault(node, {})[uuid] = GpuTelemetry(uuid=uuid, xids=xids, **f)  # type: ignore[arg-type]
    return out


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
