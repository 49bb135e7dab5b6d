"""Observe against a REAL Prometheus with exact backfilled DCGM history → snapshot → the expected plan.

The history (every 15 s for 40 min, ending at T) is written with promtool, so each fault has a known first
sample and the assertions are exact: sticky XID gauge episodes, the windowed XID count, a DBE increase, a
GPU that stopped reporting, an exporter gone stale, both `Hostname` and `hostname` node labels.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio

from controller.health.decide import plan_quarantine
from controller.health.observe import Observer
from controller.health.policy import policy_from_config
from controller.health.snapshot import FleetSnapshot, GpuTelemetry, NodeState
from gpuwarden.config.health import HealthConfig
from gpuwarden.config.prometheus import PrometheusConfig
from gpuwarden.promclient import PrometheusClient
from harness.localprom import LocalPrometheus, backfill_openmetrics

STEP = 15
SPAN = 40 * 60
GPUS = 8

# node -> (node label name, {(gpu, metric): f(age_seconds) -> value | None}); None = no sample
Series = dict[tuple[int, str], Callable[[float], float | None]]


def since(age: float, value: float) -> Callable[[float], float | None]:
    """A series that exists only for samples younger than `age` seconds before T."""
    return lambda a: value if a <= age else None


def step_at(age: float, before: float, after: float) -> Callable[[float], float | None]:
    return lambda a: after if a <= age else before


FLEET: dict[str, tuple[str, Series]] = {
    "node-ok": ("Hostname", {}),
    "node-x79": ("Hostname", {(3, "xid:79"): since(60, 79)}),
    "node-x13": ("hostname", {(0, "xid:13"): since(100, 13)}),
    "node-old79": ("Hostname", {(1, "xid:79"): since(1800, 79)}),
    "node-dbe": ("Hostname", {(2, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): step_at(120, 0, 1)}),
    "node-count32": ("Hostname", {(4, "count:32"): since(60, 3)}),
    "node-remap": ("hostname", {(5, "DCGM_FI_DEV_ROW_REMAP_FAILURE"): lambda a: 1}),
    "node-missing": ("Hostname", {(7, "gone"): lambda a: None if a <= 200 else 1}),
    "node-stale": ("Hostname", {(g, "gone"): (lambda a: None if a <= 200 else 1) for g in range(GPUS)}),
    "node-gone": ("Hostname", {(g, "gone"): (lambda a: None if a <= 900 else 1) for g in range(GPUS)}),
}


def history(t_end: int) -> str:
    fams: dict[str, list[str]] = {}
    for node, (label, special) in FLEET.items():
        for g in range(GPUS):
            base = f'gpu="{g}",UUID="GPU-{node}-{g}",device="nvidia{g}",{label}="{node}"'
            gone = special.get((g, "gone"))
            for i in range(SPAN // STEP + 1):
                age = SPAN - i * STEP
                ts = t_end - age
                if gone is not None and gone(age) is None:
                    continue
                fams.setdefault("DCGM_FI_DEV_GPU_TEMP", []).append(f"DCGM_FI_DEV_GPU_TEMP{{{base}}} 40 {ts}")
                for name in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE"):
                    f = special.get((g, name))
                    v = f(age) if f else 0
                    fams.setdefault(name, []).append(f"{name}{{{base}}} {v} {ts}")
                for (gg, kind), f in special.items():
                    if gg != g or ":" not in kind:
                        continue
                    what, code = kind.split(":")
                    v = f(age)
                    if v is None:
                        continue
                    if what == "xid":
                        line = f'DCGM_FI_DEV_XID_ERRORS{{{base},err_code="{code}"}} {v} {ts}'
                        fams.setdefault("DCGM_FI_DEV_XID_ERRORS", []).append(line)
                    else:
                        labels = f'{base},xid="{code}",window_size_in_ms="300000"'
                        line = f"DCGM_EXP_XID_ERRORS_COUNT{{{labels}}} {v} {ts}"
                        fams.setdefault("DCGM_EXP_XID_ERRORS_COUNT", []).append(line)
    out = []
    for name, lines in fams.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    return "\n".join(out) + "\n# EOF\n"


def node_obj(name: str, gpus: int = GPUS) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "nodeInfo": {"bootID": "b-1"}},
    }


@dataclass
class Env:
    prom: LocalPrometheus
    t: float


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    workdir = tmp_path_factory.mktemp("health-prom")
    t_end = (int(time.time()) // 3600 - 3) * 3600
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield Env(prom, float(t_end))


def client(env: Env) -> PrometheusClient:
    return env.prom.client()


CFG = HealthConfig()


async def observe(env: Env, cfg: HealthConfig = CFG) -> FleetSnapshot:
    async with client(env) as prom:
        return await Observer(cfg).observe(prom, [node_obj(n) for n in FLEET], None, env.t)


def by_name(snap: FleetSnapshot) -> dict[str, NodeState]:
    return {n.name: n for n in snap.nodes}


def gpu(node: NodeState, index: int) -> GpuTelemetry:
    """GPU `index` of `node` (observe lists only GPUs with something to report)."""
    return next(g for g in node.gpus or () if g.uuid == f"GPU-{node.name}-{index}")


async def test_snapshot_reads_each_signal_exactly(env: Env) -> None:
    snap = await observe(env)
    nodes = by_name(snap)
    assert snap.prometheus_ok and snap.queries == 17 and snap.unmatched_telemetry == ()
    ok = nodes["node-ok"]
    assert ok.gpus == () and ok.fresh_gpus == GPUS and ok.newest_sample == env.t  # quiet: zeros filtered
    x79 = gpu(nodes["node-x79"], 3)
    assert x79.xid_last == 79 and len(x79.xids) == 1 and x79.last_sample == env.t
    assert x79.xids[0].code == 79 and x79.xids[0].recent and x79.xids[0].first_seen == env.t - 60
    old = gpu(nodes["node-old79"], 1)
    assert old.xid_last == 79 and not old.xids[0].recent  # sticky since 30 min: not an event
    assert gpu(nodes["node-x13"], 0).xids[0].code == 13  # `hostname` (lower case) label accepted
    dbe = gpu(nodes["node-dbe"], 2)
    assert dbe.dbe_volatile == 1 and dbe.dbe_volatile_increase is not None and dbe.dbe_volatile_increase >= 1
    c32 = gpu(nodes["node-count32"], 4)
    assert [(o.code, o.recent, o.count, o.source) for o in c32.xids] == [(32, True, 3, "count")]
    assert c32.xids[0].first_seen == env.t - 60
    assert gpu(nodes["node-remap"], 5).row_remap_failure == 1
    missing = nodes["node-missing"]
    assert missing.fresh_gpus == GPUS - 1 and gpu(missing, 7).last_sample == env.t - 210  # its last sample
    stale = nodes["node-stale"]
    assert (
        not stale.fresh_gpus
        and stale.gpus is not None
        and {g.last_sample for g in stale.gpus} == {env.t - 210}
    )
    assert nodes["node-gone"].gpus is None  # nothing within the lookback: no telemetry at all


async def test_injected_faults_produce_exactly_the_expected_plan(env: Env) -> None:
    snap = await observe(env)
    policy = policy_from_config(
        CFG.model_copy(
            update={"breaker": CFG.breaker.model_copy(update={"max_absolute": 10, "max_new_per_window": 10})}
        )
    )
    plan = plan_quarantine(snap, policy, env.t)
    acted = {(a.node, a.kind, a.reason) for a in plan.actions}
    assert acted == {
        ("node-x79", "quarantine", "xid-79"),
        ("node-dbe", "quarantine", "ecc-dbe"),
        ("node-count32", "quarantine", "xid-32"),
        ("node-remap", "quarantine", "row-remap-failure"),
        ("node-missing", "quarantine", "gpu-missing"),
    }
    skipped = {(s.node, s.reason) for s in plan.skips}
    assert skipped == {
        ("node-x13", "not-quarantining"),
        ("node-stale", "telemetry-unknown"),
        ("node-gone", "telemetry-unknown"),
    }
    assert plan.healthy == 2  # node-ok and node-old79 (sticky old XID is no event)
    x79 = next(a for a in plan.actions if a.node == "node-x79")
    assert x79.first_seen == env.t - 60


async def test_default_breaker_stops_the_fifth_quarantine(env: Env) -> None:
    plan = plan_quarantine(await observe(env), policy_from_config(CFG), env.t)
    assert len(plan.actions_of("quarantine")) == 3  # max_absolute 3 of 10 GPU nodes
    assert len(plan.skips_of("breaker-open")) == 2 and plan.breaker.after.open


async def test_prometheus_down_makes_every_node_unknown() -> None:
    prom = PrometheusClient(PrometheusConfig.model_validate({"url": "http://127.0.0.1:9", "retries": 0}))
    async with prom:
        snap = await Observer(CFG).observe(prom, [node_obj("node-x79")], None, time.time())
    assert not snap.prometheus_ok and snap.prometheus_error
    plan = plan_quarantine(snap, policy_from_config(CFG), snap.taken_at)
    assert plan.actions == () and [s.reason for s in plan.skips] == ["prometheus-unavailable"]


async def test_gauge_only_source_ignores_the_count_metric(env: Env) -> None:
    cfg = CFG.model_copy(update={"xid": CFG.xid.model_copy(update={"source": "gauge"})})
    snap = await observe(env, cfg)
    assert snap.queries == 14  # 9 XID/ECC + 5 for the fabric and degradation signals
    assert by_name(snap)["node-count32"].gpus == ()
