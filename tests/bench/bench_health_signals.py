"""Graded fabric/degradation signals benchmark: a 5,000 x 8 fleet with every signal on, before and after.

Prints numbers, asserts nothing about time. "Before" is the same pass with every signal `off` (what the
health loop did before the signals existed: the 12 XID/ECC queries); "after" is the default config (every
signal on).

1. decide: `plan_quarantine` over N nodes x 8 GPUs, synthetic snapshots — every GPU carrying a healthy value
   for every signal field (worst case: observe filters healthy values out in Prometheus) and 1 % of nodes
   holding a signal — three passes so the debounce confirms; median of runs per pass.
2. observe: the real queries against a real Prometheus scraping the fleet simulator at N x 8 with every family
   the health loop reads (faults injected on a few nodes), queries per pass and wall time, before and after.

Run: `python -m tests.bench health_signals` (or `make bench`); `GPUWARDEN_BENCH_NODES=500` for a quicker run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from controller.health.decide import plan_quarantine
from controller.health.observe import Observer
from controller.health.policy import HealthPolicy, policy_from_config
from controller.health.snapshot import FleetSnapshot, GpuTelemetry, NodeState, Streak
from gpuwarden.config.health import HealthConfig
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.promtypes import Vector
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from tests.bench.summary import record

NODES = int(os.environ.get("GPUWARDEN_BENCH_NODES", "5000"))
GPUS = 8
SIGNALS = ["nvlink_errors", "nvswitch_fatal", "nvswitch_non_fatal", "fabric_manager", "fabric_health",
           "pcie_replay", "hw_slowdown", "hw_thermal", "sw_thermal", "power_brake", "thermal_margin",
           "admission_failures"]  # fmt: skip
OFF: dict[str, Any] = {**{s: {"action": "off"} for s in SIGNALS}, "stall_unknown_count": 0}
FAMILIES = [
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_GPU_TEMP_LIMIT", "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
    "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE", "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS",
]  # fmt: skip


KEYS = "Hostname, hostname, UUID"
_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
ALTERNATIVES = {
    "one NVLink counter, rate over 5m": f"max by ({KEYS}) (rate({_FLIT}[300s])) >= 100",
    "one NVLink counter, rate over 2m": f"max by ({KEYS}) (rate({_FLIT}[120s])) >= 100",
    "one NVLink counter, offset difference": f"max by ({KEYS}) ({_FLIT} - {_FLIT} offset 300s) >= 30000",
}


def synthetic(n: int, now: float) -> FleetSnapshot:
    """Every GPU with healthy readings of every field; 1 % of nodes with a signal on GPU 0."""
    nodes = []
    faults: list[dict[str, Any]] = [
        {"fabric_manager_status": 4},
        {"clock_event_reasons": 0x40},
        {"nvlink_error_rate": 500.0},
        {"pcie_replay_rate": 1.0},
        {"thermal_margin": -3.0},
    ]
    for i in range(n):
        gpus = []
        for g in range(GPUS):
            fields: dict[str, Any] = dict(
                nvlink_error_rate=0.0, pcie_replay_rate=0.0, clock_event_reasons=0x1, thermal_margin=30.0,
                fabric_manager_status=3, fabric_manager_error=0, fabric_health_mask=0x1AA,
            )  # fmt: skip
            if i % 100 == 5 and g == 0:
                fields |= faults[(i // 100) % len(faults)]
            gpus.append(GpuTelemetry(f"GPU-{i}-{g}", str(g), now - 3, **fields))
        node = NodeState(f"node-{i:05d}", gpu_capacity=GPUS, boot_id="b", gpus=tuple(gpus))
        if i % 250 == 9:
            node = replace(node, nvswitch_fatal=(12,))
        nodes.append(node)
    return FleetSnapshot(now, tuple(nodes))


def bench_decide() -> None:
    now = time.time()
    base = synthetic(NODES, now)
    off = SignalsConfig.model_validate(OFF)
    third: list[float] = []  # the third pass's median (debounce confirmed), before and after
    for label, policy in (
        ("before (signals off)", HealthPolicy(signals=off, breaker_max_absolute=500)),
        ("after (every signal on)", HealthPolicy(breaker_max_absolute=500)),
    ):
        per_pass: list[list[float]] = [[], [], []]
        plan = None
        for _ in range(3):
            streaks: dict[str, Streak] = {}
            for p in range(3):
                snap = replace(base, streaks=streaks, taken_at=now + 10 * p)
                t0 = time.perf_counter()
                plan = plan_quarantine(snap, policy, now + 10 * p)
                per_pass[p].append(time.perf_counter() - t0)
                streaks = plan.streaks
        assert plan is not None
        med = [statistics.median(t) * 1000 for t in per_pass]
        quarantines, degrades = len(plan.actions_of("quarantine")), len(plan.actions_of("degrade"))
        print(f"decide {label}: {NODES} nodes x {GPUS} GPUs: plan_quarantine median per pass "
              f"{med[0]:.0f} / {med[1]:.0f} / {med[2]:.0f} ms; third pass: {quarantines} quarantines, "
              f"{degrades} degrades, {len(plan.skips)} skips")  # fmt: skip
        third.append(med[2])
    record(
        "health_signals",
        f"plan_quarantine, third pass, {NODES:,} nodes, every signal on",
        third[1],
        "ms",
        anchor="same, every signal off",
        anchor_value=third[0],
    )


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}, "annotations": {}}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(GPUS)}, "nodeInfo": {"bootID": "b"}}}  # fmt: skip


async def bench_observe(workdir: Path) -> None:
    scenario = parse_scenario({"fleet": {"nodes": NODES, "gpus_per_node": GPUS},
                               "exporter": {"metrics": FAMILIES, "tick": 5}})  # fmt: skip
    sim = await start(scenario)
    prom = LocalPrometheus(workdir / "prom", [scrape_target("dcgm", f"127.0.0.1:{sim.port}",
                                                           scrape_interval_seconds=15)])  # fmt: skip
    try:
        await prom.start()
        await prom.wait_for_up("dcgm", timeout=300)
        faults: list[dict[str, Any]] = [
            {"kind": "fabric_manager", "node": "gpu-node-001", "gpu": 0, "value": 4},
            {"kind": "clock_event", "node": "gpu-node-002", "gpu": 1, "value": 0x40},
            {"kind": "nvlink_errors", "node": "gpu-node-003", "gpu": 2, "value": 5000},  # rate over 5 min
            {"kind": "nvswitch", "node": "gpu-node-004", "sxid": 12},
        ]
        async with httpx.AsyncClient() as http:
            (await http.post(f"{sim.url}/control/faults", json=faults)).raise_for_status()
        await asyncio.sleep(35)  # two scrapes with the faults (rates need two samples)
        nodes = [node_obj(f"gpu-node-{i:03d}") for i in range(NODES)]
        passes: list[tuple[int, float]] = []  # (queries per pass, median ms), before and after
        for label, cfg in (
            ("before (signals off)", HealthConfig.model_validate({"signals": OFF})),
            ("after (every signal on)", HealthConfig()),
        ):
            observer = Observer(cfg)
            # 60 s, not the default 10 s: on a loaded 2-core machine the default timed out (measure, not fail)
            async with prom.client(timeout_seconds=60, retries=0) as client:
                times, snap = [], None
                for _ in range(3):
                    t0 = time.perf_counter()
                    snap = await observer.observe(client, nodes, None, time.time())
                    times.append(time.perf_counter() - t0)
                each = []
                for name, promql in observer.queries.all().items():  # one at a time: which query costs what
                    t0 = time.perf_counter()
                    result = await client.query(promql)
                    size = len(result.samples) if isinstance(result, Vector) else 0
                    each.append(f"{name} {(time.perf_counter() - t0) * 1000:.0f} ms/{size}")
            assert snap is not None
            t0 = time.perf_counter()
            plan = plan_quarantine(snap, policy_from_config(cfg), snap.taken_at)
            decide_ms = (time.perf_counter() - t0) * 1000
            held = sorted({f"{s.node}:{s.signal}" for s in plan.signals})
            med, low = statistics.median(times) * 1000, min(times) * 1000
            print(f"observe {label}: {NODES} nodes x {GPUS} GPUs: {snap.queries} queries per pass, median "
                  f"{med:.0f} ms (min {low:.0f}); ok={snap.prometheus_ok}; decide {decide_ms:.0f} ms; "
                  f"signals holding: {held or 'none'}")  # fmt: skip
            print(f"  one query at a time (ms/series answered): {', '.join(each)}")
            passes.append((snap.queries, med))
        (q_off, ms_off), (q_on, ms_on) = passes
        anchor = "same pass, every signal off"
        record(
            "health_signals",
            f"observe, {NODES:,} nodes: queries per pass",
            q_on,
            "queries",
            anchor=anchor,
            anchor_value=q_off,
        )
        record("health_signals", "observe median", ms_on, "ms", anchor=anchor, anchor_value=ms_off)
        async with prom.client(timeout_seconds=60, retries=0) as client:
            for label, promql in ALTERNATIVES.items():  # cheaper forms of the rate query, measured
                t0 = time.perf_counter()
                await client.query(promql)
                print(f"  alternative {label}: {(time.perf_counter() - t0) * 1000:.0f} ms")
    finally:
        await prom.stop()
        await sim.stop()


async def main() -> None:
    bench_decide()
    with tempfile.TemporaryDirectory(prefix="bench-health-signals-") as tmp:
        await bench_observe(Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
