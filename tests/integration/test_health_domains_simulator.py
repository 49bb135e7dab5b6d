"""An NVL72 rack in the fleet simulator, scraped by a REAL Prometheus, through observe and the decision pass
after pass: one tray's NVLinks go down, its rack (its NVLink domain) is published degraded on all 18
members once debounced, the other rack stays healthy, and clearing the fault releases the domain after
healthy held as long (the tray itself stays quarantined by its own signal until its healthy period)."""

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
from controller.health.snapshot import Streak
from gpuwarden.config.domains import DomainsConfig
from gpuwarden.config.health import HealthConfig
from gpuwarden.wellknown import NVLINK_DOMAIN_HEALTH
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start
from harness.simulator import racks as nvl72

TRAYS = nvl72.trays(2)
CFG = HealthConfig.model_validate(
    {"max_sample_age_seconds": 10, "breaker": {"max_absolute": 10}, "signals": {"window_seconds": 30}}
)
DOMAINS = DomainsConfig()
POLICY = policy_from_config(CFG, domains=DOMAINS)


def node_obj(name: str, clique: str, published: dict[str, str]) -> dict[str, Any]:
    labels = {nvl72.CLIQUE_LABEL: clique}
    if name in published:
        labels[NVLINK_DOMAIN_HEALTH] = published[name]
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": "4"}, "nodeInfo": {"bootID": "b"}}}  # fmt: skip


@pytest_asyncio.fixture
async def racks(tmp_path: Any) -> AsyncIterator[tuple[RunningSimulator, LocalPrometheus]]:
    sim = await start(parse_scenario(nvl72.scenario(2, exporter={"tick": 0.5})))
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


class Passes:
    """Observe + decide, carrying the streaks like the loop, and applying the domain labels as act would."""

    def __init__(self, prom: LocalPrometheus) -> None:
        self.prom = prom
        self.streaks: dict[str, Streak] = {}
        self.published: dict[str, str] = {}

    async def plan(self) -> HealthPlan:
        nodes = [node_obj(n, c, self.published) for n, c in TRAYS]
        async with self.prom.client() as client:
            snap = await Observer(CFG).observe(client, nodes, None, time.time(), streaks=self.streaks)
        plan = plan_quarantine(snap, POLICY, snap.taken_at)
        self.streaks = plan.streaks
        for a in plan.actions:
            if a.domain is not None:
                if a.domain.label is None:
                    self.published.pop(a.node, None)
                else:
                    self.published[a.node] = a.domain.label
        return plan


async def until(passes: Passes, done: Any, seconds: float = 60) -> list[HealthPlan]:
    plans = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        plans.append(await passes.plan())
        if done(plans[-1]):
            break
        await asyncio.sleep(1)
    return plans


async def test_one_trays_nvlinks_down_degrades_its_rack_and_recovery_releases_it(
    racks: tuple[RunningSimulator, LocalPrometheus],
) -> None:
    sim, prom = racks
    passes = Passes(prom)
    first = await passes.plan()
    assert {d.state for d in first.domains} == {"healthy"} and len(first.domains) == 2
    down = TRAYS[3][0]
    async with httpx.AsyncClient() as http:
        (await http.post(f"{sim.url}/control/faults", json=nvl72.nvlinks_down(down))).raise_for_status()
    rack0 = {n for n, c in TRAYS if c == nvl72.clique(0)}
    plans = await until(passes, lambda p: bool(p.actions_of("domain-degrade")))
    degraded = plans[-1].actions_of("domain-degrade")
    assert {a.node for a in degraded} == rack0
    assert {d.domain: d.published for d in plans[-1].domains} == {
        nvl72.clique(0): "degraded",
        nvl72.clique(1): "",
    }
    assert any(d.state == "degraded" and not d.published for p in plans[:-1] for d in p.domains)  # debounced
    async with httpx.AsyncClient() as http:
        (await http.request("DELETE", f"{sim.url}/control/faults", json={"node": down})).raise_for_status()
    plans = await until(passes, lambda p: bool(p.actions_of("domain-release")))
    assert {a.node for a in plans[-1].actions_of("domain-release")} == rack0
    assert passes.published == {}
