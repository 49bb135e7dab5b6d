"""The fabric and degradation signal queries against a REAL Prometheus, with exact backfilled DCGM history.

dcgm-exporter's shapes: per-GPU series with `gpu`, `UUID`, `device`, `Hostname`; NVSwitch series with
`nvswitch` and `Hostname` and no UUID. Every 15 s for 20 min ending at T, written with promtool, then observed
at T and decided for three passes (the default debounce): which node is quarantined, degraded, observed,
left alone or unknown — and how many queries a pass takes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio

from controller.health.decide import plan_quarantine
from controller.health.observe import Observer
from controller.health.plan import HealthPlan
from controller.health.policy import policy_from_config
from controller.health.snapshot import FleetSnapshot, NodeState, Streak
from gpuwarden.config.health import HealthConfig
from harness.localprom import LocalPrometheus, backfill_openmetrics

STEP = 15
SPAN = 20 * 60
GPUS = 4
HEALTHY_MASK = 0x1AA  # every boolean sub-field FALSE (explicitly healthy), configuration NONE
NVLINK = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)

# f(age seconds before T) -> value, or None for no sample
Value = Callable[[float], float | None]


def const(v: float) -> Value:
    return lambda a: v


def counter(per_second: float, start: float = 1000.0) -> Value:
    return lambda a: start + per_second * (SPAN - a)


def frozen_after(age: float, per_second: float) -> Value:
    """A counter that stopped moving `age` seconds before T (the exporter serves its last value)."""
    return lambda a: 1000.0 + per_second * (SPAN - max(a, age))


def gpu_defaults(nvlink: bool = True) -> dict[str, Value]:
    out: dict[str, Value] = {
        "DCGM_FI_DEV_GPU_TEMP": const(40),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": counter(60_000.0),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": const(3),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": const(0x1),  # idle: normal
        "DCGM_FI_DEV_GPU_TEMP_LIMIT": const(25),
    }
    if nvlink:
        out |= {name: const(0) for name in NVLINK}
        out |= {
            "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": const(3),
            "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE": const(0),
            "DCGM_FI_DEV_FABRIC_HEALTH_MASK": const(HEALTHY_MASK),
        }
    else:  # a PCIe-only GPU: no NVLink counters at all, Fabric Manager "not supported", mask 0
        out |= {"DCGM_FI_DEV_FABRIC_MANAGER_STATUS": const(0), "DCGM_FI_DEV_FABRIC_HEALTH_MASK": const(0)}
    return out


# node -> {gpu index: overrides}; gpu -1: NVSwitch series {(metric, switch): value}
FLEET: dict[str, dict[int, dict[str, Value]]] = {
    "node-ok": {},
    "node-fm": {0: {"DCGM_FI_DEV_FABRIC_MANAGER_STATUS": const(4),
                    "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE": const(7)}},
    "node-mask": {1: {"DCGM_FI_DEV_FABRIC_HEALTH_MASK": const(0x1A6)}},
    "node-nvlink": {0: {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": counter(300.0)}},
    "node-hot": {2: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": const(0x41)}},
    "node-margin": {3: {"DCGM_FI_DEV_GPU_TEMP_LIMIT": const(-3)}},
    "node-pcie": {1: {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": counter(1.0)}},
    "node-brake-observed": {0: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": const(0x20)}},  # sw_thermal: observe
    "node-stalled": {1: {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": frozen_after(600, 60_000.0),
                         "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": const(4)}},
    "node-switch": {},
    "node-pcieonly": {},
}  # fmt: skip
SWITCHES = {"node-switch": {("DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", 0): 12.0,
                            ("DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS", 1): 20034.0,
                            ("DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", 2): 0.0}}  # fmt: skip


def history(t_end: int) -> str:
    fams: dict[str, list[str]] = {}
    for node, special in FLEET.items():
        for g in range(GPUS):
            base = f'gpu="{g}",UUID="GPU-{node}-{g}",device="nvidia{g}",Hostname="{node}"'
            series = gpu_defaults(nvlink=node != "node-pcieonly") | special.get(g, {})
            for i in range(SPAN // STEP + 1):
                age = SPAN - i * STEP
                for name, f in series.items():
                    v = f(age)
                    if v is not None:
                        fams.setdefault(name, []).append(f"{name}{{{base}}} {v} {t_end - age}")
    for node, switches in SWITCHES.items():
        for (name, sw), v in switches.items():
            for i in range(SPAN // STEP + 1):
                ts = t_end - SPAN + i * STEP
                fams.setdefault(name, []).append(f'{name}{{nvswitch="{sw}",Hostname="{node}"}} {v} {ts}')
    out = []
    for name, lines in fams.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    return "\n".join(out) + "\n# EOF\n"


def node_obj(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": str(GPUS)}, "nodeInfo": {"bootID": "b-1"}},
    }


@dataclass
class Env:
    prom: LocalPrometheus
    t: float


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    workdir = tmp_path_factory.mktemp("health-signals-prom")
    t_end = (int(time.time()) // 3600 - 3) * 3600
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield Env(prom, float(t_end))


async def observe(env: Env, cfg: HealthConfig, streaks: dict[str, Streak] | None = None) -> FleetSnapshot:
    obs = Observer(cfg)
    async with env.prom.client() as prom:
        return await obs.observe(prom, [node_obj(n) for n in FLEET], None, env.t, streaks=streaks)


def by_name(snap: FleetSnapshot) -> dict[str, NodeState]:
    return {n.name: n for n in snap.nodes}


@pytest.mark.asyncio(loop_scope="module")
async def test_signal_readings(env: Env) -> None:
    snap = await observe(env, HealthConfig())
    assert snap.prometheus_ok, snap.prometheus_error
    nodes = by_name(snap)

    def gpu(node: str, i: int) -> object:
        return next(g for g in nodes[node].gpus or () if g.uuid == f"GPU-{node}-{i}")

    fm = gpu("node-fm", 0)
    assert (fm.fabric_manager_status, fm.fabric_manager_error) == (4, 7)  # type: ignore[attr-defined]
    assert gpu("node-mask", 1).fabric_health_mask == 0x1A6  # type: ignore[attr-defined]
    assert gpu("node-nvlink", 0).nvlink_error_rate == pytest.approx(300.0)  # type: ignore[attr-defined]
    assert gpu("node-hot", 2).clock_event_reasons == 0x41  # type: ignore[attr-defined]
    assert gpu("node-margin", 3).thermal_margin == -3.0  # type: ignore[attr-defined]
    assert gpu("node-pcie", 1).pcie_replay_rate == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert gpu("node-stalled", 1).stalled is True  # type: ignore[attr-defined]
    assert nodes["node-switch"].nvswitch_fatal == (12,)
    assert nodes["node-switch"].nvswitch_non_fatal == (20034,)
    # Healthy values are filtered in Prometheus: quiet nodes report no GPU at all (only their counts).
    for quiet in ("node-ok", "node-pcieonly"):
        assert nodes[quiet].gpus == (), quiet
        assert nodes[quiet].fresh_gpus == GPUS
    # the 12 XID/ECC queries + 5 for the signals + 1 as a packed field (mask, clock reasons) holds a fault
    assert snap.queries == 18


async def three_passes(env: Env, cfg: HealthConfig) -> list[HealthPlan]:
    policy = policy_from_config(cfg)
    streaks: dict[str, Streak] = {}
    plans = []
    for i in range(3):
        snap = await observe(env, cfg, streaks)
        plan = plan_quarantine(snap, policy, env.t + i)
        streaks = plan.streaks
        plans.append(plan)
    return plans


def outcome(plan: HealthPlan) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a in plan.actions:
        out.setdefault(a.node, set()).add(f"{a.kind}:{a.reason}")
    for s in plan.skips:
        out.setdefault(s.node, set()).add(f"skip:{s.reason}")
    return out


@pytest.mark.asyncio(loop_scope="module")
async def test_three_passes_grade_every_node(env: Env) -> None:
    plans = await three_passes(env, HealthConfig.model_validate({"breaker": {"max_absolute": 10}}))
    assert outcome(plans[-1]) == {
        "node-fm": {"quarantine:fabric-manager"},
        "node-mask": {"quarantine:fabric-health"},
        "node-nvlink": {"quarantine:nvlink-errors"},
        "node-switch": {"quarantine:nvswitch-fatal", "skip:signal-observed"},  # non-fatal SXid: observe
        "node-hot": {"degrade:hw-thermal"},
        "node-margin": {"degrade:thermal-margin"},
        "node-pcie": {"degrade:pcie-replay"},
        "node-brake-observed": {"skip:signal-observed"},
        "node-stalled": {"skip:telemetry-stalled"},  # its Fabric Manager failure is not acted on: unknown
    }
    first = outcome(plans[0])
    assert first["node-fm"] == {"skip:signal-debouncing"}
    assert "node-ok" not in first and "node-pcieonly" not in first
    assert plans[-1].stalled_gpus == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_the_breaker_counts_signal_quarantines(env: Env) -> None:
    plan = (await three_passes(env, HealthConfig()))[-1]  # 11 GPU nodes: at most max(3, 10 %) = 3
    assert len(plan.actions_of("quarantine")) == 3
    assert len(plan.skips_of("breaker-open")) == 1
    assert plan.breaker.after.open


@pytest.mark.asyncio(loop_scope="module")
async def test_signals_off_send_no_query(env: Env) -> None:
    off = {"action": "off"}
    names = ["nvlink_errors", "nvswitch_fatal", "nvswitch_non_fatal", "fabric_manager", "fabric_health",
             "pcie_replay", "hw_slowdown", "hw_thermal", "sw_thermal", "power_brake",
             "thermal_margin"]  # fmt: skip
    cfg = HealthConfig.model_validate({"signals": {**{n: off for n in names}, "stall_unknown_count": 0}})
    snap = await observe(env, cfg)
    assert snap.queries == 12
    plans = await three_passes(env, cfg)
    assert outcome(plans[-1]) == {}


@pytest.mark.asyncio(loop_scope="module")
async def test_absent_series_are_named(env: Env) -> None:
    from controller.health.series import absent_series, presence_query

    cfg = HealthConfig()
    async with env.prom.client() as prom:
        result = await prom.query(presence_query(cfg), time=env.t)
    present = {s.labels["__name__"] for s in result.samples}  # type: ignore[union-attr]
    missing = {line.split(":")[0] for line in absent_series(cfg, present)}
    # This history has the signal series but none of the XID / ECC / recovery-action ones.
    assert missing == {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    }
