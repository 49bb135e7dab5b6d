"""The fleet simulator scraped live by a REAL Prometheus: faults injected over the control API produce exactly
the expected quarantine plan (the same path the controller takes, without the Kubernetes API)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from controller.health.decide import plan_quarantine
from controller.health.observe import Observer
from controller.health.plan import HealthPlan
from controller.health.policy import policy_from_config
from gpuwarden.config.health import HealthConfig
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start

NODES = [f"sim-node-{i}" for i in range(6)]
CFG = HealthConfig.model_validate(
    {"max_sample_age_seconds": 10, "gpu_missing_grace_seconds": 3, "xid": {"event_window_seconds": 30},
     "breaker": {"max_absolute": 10}}
)  # fmt: skip


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "nodeInfo": {"bootID": "b"}}}  # fmt: skip


@pytest_asyncio.fixture
async def fleet(tmp_path: Any) -> AsyncIterator[tuple[RunningSimulator, LocalPrometheus]]:
    scenario = parse_scenario({"fleet": {"nodes": len(NODES), "node_name_pattern": "sim-node-{index}"},
                               "exporter": {"tick": 0.5}})  # fmt: skip
    sim = await start(scenario)
    prom = LocalPrometheus(
        tmp_path, [scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1)]
    )
    try:
        await prom.start()
        await prom.wait_for_up("dcgm")
        yield sim, prom
    finally:
        await prom.stop()
        await sim.stop()


async def plan_now(prom: LocalPrometheus) -> HealthPlan:
    async with prom.client() as client:
        snap = await Observer(CFG).observe(client, [node_obj(n) for n in NODES], None, time.time())
    return plan_quarantine(snap, policy_from_config(CFG), snap.taken_at)


def outcome(plan: HealthPlan) -> dict[str, str]:
    got = {a.node: f"{a.kind}:{a.reason}" for a in plan.actions}
    got.update({s.node: f"skip:{s.reason}" for s in plan.skips})
    return got


async def test_injected_faults_produce_exactly_the_expected_plan(
    fleet: tuple[RunningSimulator, LocalPrometheus],
) -> None:
    sim, prom = fleet
    assert outcome(await plan_now(prom)) == {}  # a quiet fleet: nothing to do, nothing skipped
    faults = [
        {"kind": "xid", "node": "sim-node-0", "gpu": 3, "code": 79},
        {"kind": "xid", "node": "sim-node-1", "gpu": 0, "code": 13, "count": 50},
        {"kind": "ecc", "node": "sim-node-2", "gpu": 5, "error": "dbe"},
        {"kind": "gpu_missing", "node": "sim-node-3", "gpu": 7},
        {"kind": "row_remap_failure", "node": "sim-node-4", "gpu": 1},
        {"kind": "exporter_down", "node": "sim-node-5"},
    ]
    async with httpx.AsyncClient() as http:
        (await http.post(f"{sim.url}/control/faults", json=faults)).raise_for_status()
    expected = {
        "sim-node-0": "quarantine:xid-79",
        "sim-node-1": "skip:not-quarantining",
        "sim-node-2": "quarantine:ecc-dbe",
        "sim-node-3": "quarantine:gpu-missing",
        "sim-node-4": "quarantine:row-remap-failure",
        "sim-node-5": "skip:telemetry-unknown",
    }
    deadline = time.monotonic() + 30
    got: dict[str, str] = {}
    while time.monotonic() < deadline:  # scrapes every second; the GPU-missing grace is 3 s
        got = outcome(await plan_now(prom))
        if got == expected:
            break
        await asyncio.sleep(1)
    assert got == expected


async def test_prometheus_down_means_every_node_unknown(
    fleet: tuple[RunningSimulator, LocalPrometheus],
) -> None:
    sim, prom = fleet
    async with httpx.AsyncClient() as http:
        body = {"kind": "xid", "node": "sim-node-0", "gpu": 0, "code": 79}
        (await http.post(f"{sim.url}/control/faults", json=body)).raise_for_status()
    async with prom.client(retries=0) as client:
        await prom.stop()
        snap = await Observer(CFG).observe(client, [node_obj(n) for n in NODES], None, time.time())
    plan = plan_quarantine(snap, policy_from_config(CFG), snap.taken_at)
    assert plan.actions == () and {s.reason for s in plan.skips} == {"prometheus-unavailable"}
    assert len(plan.skips) == len(NODES)
