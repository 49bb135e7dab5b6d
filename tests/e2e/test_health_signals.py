"""Graded fabric and degradation signals end to end: real control plane, kwok GPU nodes, the fleet simulator's
new series, a real Prometheus scraping them every second, the quarantine loop's passes (1 s apart, streaks
carried by the loop as in production).

- Fabric Manager failure on one node → quarantined on the pass that completes the debounce (3 passes), the
  taint visible within loop + 2 s of that pass;
- an NVLink CRC burst on a node inside its boot grace (kwok nodes just turned Ready) → nothing, every pass;
- a HW-thermal clock event → `GPUDegraded=True` + Event, no taint; gone → condition back to False;
- a stalled exporter (fresh samples, frozen energy counter) → unknown, no taint, the stalled-GPUs gauge, and
  the shipped `GPUTelemetryStalled` alert firing in this Prometheus for that GPU only. The rule is taken from
  rules/gpuwarden.rules.yaml as shipped (expression, labels, annotations) with its durations scaled by 1/30
  (`[10m]` → `[20s]`, `for: 5m` → `for: 10s`): unscaled it needs 15 minutes of stall. The unscaled timing is
  promtool-tested (rules/tests/fabric.test.yaml, including a "must not fire yet" step).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from controller.health.snapshot import TAINT_KEY
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.quarantine import parse_iso
from gpuwarden.wellknown import DEGRADATION
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, ensure_namespace
from harness.testbed.nodes import delete_nodes

pytestmark = pytest.mark.e2e

NODES = [f"hs-node-{i}" for i in range(4)]
NS = "gpuwarden-signals-e2e"
RULES = Path(__file__).resolve().parents[2] / "rules" / "gpuwarden.rules.yaml"
STALL_ALERT = "GPUTelemetryStalled"
TIME_SCALE = {"[10m]": "[20s]", "5m": "10s"}  # the shipped windows and `for`, divided by 30


def scaled_stall_rule(source: Path, out: Path) -> Path:
    """The shipped GPUTelemetryStalled rule, unchanged but for its durations (TIME_SCALE), as a rule file."""
    groups = yaml.safe_load(source.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == STALL_ALERT]
    assert rule["expr"].count("[10m]") == 2 and rule["for"] == "5m", "the shipped rule changed: rescale it"
    scaled = {**rule, "expr": rule["expr"].replace("[10m]", TIME_SCALE["[10m]"]), "for": TIME_SCALE["5m"]}
    out.write_text(yaml.safe_dump({"groups": [{"name": "stall-scaled", "rules": [scaled]}]}, sort_keys=False))
    return out


def signals_config(cluster: Cluster) -> Config:
    doc: dict[str, Any] = {
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "namespace": NS},
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "breaker": {"max_absolute": 3, "max_percent": 0, "max_new_per_window": 10, "window_seconds": 60},
            "signals": {
                "window_seconds": 30,
                "stall_seconds": 30,
                "boot_grace_seconds": 900,  # every kwok node here became Ready minutes ago at most
                # Fabric Manager and thermal are tested outside the grace: on these just-booted nodes only
                # the NVLink signal keeps its (default) grace.
                "fabric_manager": {"boot_grace": False},
                "hw_thermal": {"boot_grace": False},
            },
        },
    }
    return Config.model_validate(doc)


@pytest.fixture(scope="module")
def hs_nodes(cluster: Cluster) -> Iterator[list[str]]:
    add_gpu_nodes(cluster, [GpuNodeSpec(name=n, gpus=8) for n in NODES])
    ensure_namespace(cluster, NS)
    try:
        yield NODES
    finally:
        delete_nodes(cluster, NODES)


def reset(cluster: Cluster) -> None:
    for n in NODES:
        node = cluster.get_json("node", n)
        taints = [t for t in node["spec"].get("taints", []) if t.get("key") != TAINT_KEY]
        annotations = {RECORD_ANNOTATION: None, DEGRADATION: None}
        patch = {"spec": {"taints": taints or None}, "metadata": {"annotations": annotations}}
        cluster.kubectl("patch", "node", n, "--type=merge", "-p", json.dumps(patch))
        for ctype in ("GPUHealthy", "GPUDegraded"):
            drop = {"status": {"conditions": [{"type": ctype, "$patch": "delete"}]}}
            cluster.kubectl(
                "patch", "node", n, "--subresource=status", "--type=strategic", "-p", json.dumps(drop)
            )


@dataclass
class Env:
    cluster: Cluster
    sim: RunningSimulator
    prom: LocalPrometheus
    config: Config

    async def fault(self, body: dict[str, Any] | list[dict[str, Any]]) -> None:
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.sim.url}/control/faults", json=body)).raise_for_status()

    async def clear(self, **body: Any) -> None:
        async with httpx.AsyncClient() as http:
            (await http.request("DELETE", f"{self.sim.url}/control/faults", json=body)).raise_for_status()

    def taints(self) -> dict[str, str]:
        out = {}
        for item in self.cluster.get_json("nodes")["items"]:
            for t in item["spec"].get("taints", []):
                if t["key"] == TAINT_KEY:
                    out[item["metadata"]["name"]] = f"{t['value']}:{t['effect']}"
        return out

    def condition(self, node: str, ctype: str) -> dict[str, Any]:
        conditions = self.cluster.get_json("node", node)["status"].get("conditions", [])
        return next((c for c in conditions if c["type"] == ctype), {})

    def events(self, reason: str) -> list[dict[str, Any]]:
        items = self.cluster.get_json("events.events.k8s.io", "-A")["items"]
        return [e for e in items if e.get("reason") == reason]

    async def alerts(self, name: str) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts of this name in the test's Prometheus (/api/v1/alerts)."""
        async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
            body = (await http.get(f"{self.prom.url}/api/v1/alerts")).json()
        return [a for a in body["data"]["alerts"] if a["labels"].get("alertname") == name]


@pytest_asyncio.fixture
async def env(cluster: Cluster, hs_nodes: list[str], tmp_path: Path) -> AsyncIterator[Env]:
    reset(cluster)
    scenario = parse_scenario(
        {"fleet": {"nodes": len(NODES), "node_name_pattern": "hs-node-{index}"}, "exporter": {"tick": 0.5}}
    )
    sim = await start(scenario)
    target = scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)
    rules = scaled_stall_rule(RULES, tmp_path / "stall.rules.yaml")
    prom = LocalPrometheus(tmp_path / "prom", [target], rule_files=[rules])  # rules evaluated every 1 s
    await prom.start()
    try:
        await prom.wait_for_up("dcgm")
        yield Env(cluster, sim, prom, signals_config(cluster))
    finally:
        await prom.stop()
        await sim.stop()
        reset(cluster)


@pytest_asyncio.fixture
async def loop(env: Env) -> AsyncIterator[HealthLoop]:
    prom_cfg = env.config.prometheus.model_copy(update={"url": env.prom.url})
    async with (
        PrometheusClient(prom_cfg) as prom,
        KubeClient.from_config(kubeconfig=env.cluster.kubeconfig) as kube,
    ):
        hl = HealthLoop(env.config, prom, kube, registry=CollectorRegistry())
        watcher = asyncio.create_task(hl.informer.run())
        await asyncio.wait_for(hl.informer.synced.wait(), 30)
        try:
            yield hl
        finally:
            watcher.cancel()


async def passes(hl: HealthLoop, n: int) -> list[HealthPlan]:
    out = []
    for _ in range(n):
        started = time.monotonic()
        out.append(await hl.run_once())
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return out


async def passes_until(
    hl: HealthLoop, done: Callable[[HealthPlan], bool], within: float = 60.0
) -> list[HealthPlan]:
    deadline = time.monotonic() + within
    seen: list[HealthPlan] = []
    while True:
        started = time.monotonic()
        plan = await hl.run_once()
        seen.append(plan)
        if done(plan):
            return seen
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached; last plan:\n{plan.render_table()}")
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def on(plan: HealthPlan, node: str) -> set[str]:
    got = {f"{a.kind}:{a.reason}" for a in plan.actions if a.node == node}
    return got | {f"skip:{s.reason}" for s in plan.skips if s.node == node}


async def test_fabric_manager_down_is_quarantined_when_the_debounce_completes(
    env: Env, loop: HealthLoop
) -> None:
    await env.fault({"kind": "fabric_manager", "node": "hs-node-0", "gpu": 5, "value": 4, "error_code": 7})
    seen = await passes_until(loop, lambda p: "skip:signal-debouncing" in on(p, "hs-node-0"), within=30)
    debounce_started = len(seen)
    seen += await passes_until(loop, lambda p: bool(p.actions_of("quarantine")), within=30)
    confirmed_at = time.monotonic()  # run_once returned: the confirming pass has written the taint
    holding = [on(p, "hs-node-0") for p in seen[debounce_started - 1 :]]
    assert holding == [{"skip:signal-debouncing"}] * 2 + [{"quarantine:fabric-manager"}]  # exactly 3 passes
    assert env.taints() == {"hs-node-0": "fabric-manager:NoSchedule"}
    visible = time.monotonic() - confirmed_at
    assert visible <= 1 + 2  # loop interval + 2 s (here: already written when the pass returns)
    record = json.loads(
        env.cluster.get_json("node", "hs-node-0")["metadata"]["annotations"][RECORD_ANNOTATION]
    )
    assert record["reason"] == "fabric-manager" and record["class"] == "hw_link" and len(record["gpus"]) == 1
    assert any(e["regarding"]["name"] == "hs-node-0" for e in env.events("GPUQuarantined"))
    print(
        f"\n[e2e] fabric-manager: debounce 3 passes, taint visible {visible:.2f}s after the confirming pass"
    )


async def test_nvlink_burst_inside_the_boot_grace_does_nothing(env: Env, loop: HealthLoop) -> None:
    ready = env.condition("hs-node-1", "Ready")
    ready_since = parse_iso(ready.get("lastTransitionTime"))
    assert ready.get("status") == "True" and ready_since is not None
    assert time.time() - ready_since < 900, "the kwok node is not inside the boot grace: test premise broken"
    await env.fault({"kind": "nvlink_errors", "node": "hs-node-1", "gpu": 2, "value": 50000})
    seen = await passes_until(loop, lambda p: "skip:boot-grace" in on(p, "hs-node-1"), within=30)
    for plan in seen[-1:] + await passes(loop, 5):
        assert on(plan, "hs-node-1") == {"skip:boot-grace"}
    assert env.taints() == {} and env.condition("hs-node-1", "GPUDegraded") == {}


async def test_thermal_clock_event_degrades_without_a_taint(env: Env, loop: HealthLoop) -> None:
    await env.fault({"kind": "clock_event", "node": "hs-node-2", "gpu": 0, "value": 0x41})
    await passes_until(loop, lambda p: bool(p.actions_of("degrade")), within=30)
    cond = env.condition("hs-node-2", "GPUDegraded")
    assert cond["status"] == "True" and cond["reason"] == "GPUDegradationSignals"
    assert "hw-thermal on GPU-" in cond["message"]
    assert env.taints() == {} and env.condition("hs-node-2", "GPUHealthy") == {}
    assert any(e["regarding"]["name"] == "hs-node-2" for e in env.events("GPUDegraded"))
    for plan in await passes(loop, 3):  # idempotent: nothing re-written while the set is unchanged
        assert on(plan, "hs-node-2") == set()
    await env.clear(node="hs-node-2")
    await passes_until(loop, lambda p: bool(p.actions_of("clear-degraded")), within=30)
    assert env.condition("hs-node-2", "GPUDegraded")["status"] == "False" and env.taints() == {}


async def test_stalled_exporter_is_unknown_and_never_tainted(env: Env, loop: HealthLoop) -> None:
    await env.fault({"kind": "exporter_stall", "node": "hs-node-3", "gpu": 4})
    seen = await passes_until(loop, lambda p: "skip:telemetry-stalled" in on(p, "hs-node-3"), within=90)
    # A fault that appears now is not acted on: the node is unknown while its exporter is stalled.
    await env.fault({"kind": "fabric_manager", "node": "hs-node-3", "gpu": 1, "value": 4})
    for plan in seen[-1:] + await passes(loop, 5):
        assert on(plan, "hs-node-3") == {"skip:telemetry-stalled"}
        assert plan.stalled_gpus == 1
    assert "hs-node-3" not in env.taints()
    (gauge,) = loop.metrics.stalled_gpus.collect()
    assert [s.value for s in gauge.samples] == [1.0]

    # The shipped alert fires for exactly the stalled GPU (bounded wait; the stall began before the passes).
    deadline = time.monotonic() + 60
    active = await env.alerts(STALL_ALERT)
    while not any(a["state"] == "firing" for a in active):
        assert time.monotonic() < deadline, f"{STALL_ALERT} not firing within 60 s; active: {active}"
        await asyncio.sleep(1)
        active = await env.alerts(STALL_ALERT)
    (alert,) = active  # no other GPU of the fleet, healthy ones included, is pending or firing
    labels = alert["labels"]
    assert (labels["Hostname"], labels["gpu"], labels["severity"]) == ("hs-node-3", "4", "warning"), labels
    assert alert["annotations"]["summary"] == "DCGM telemetry of GPU 4 on hs-node-3 is frozen"
    assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#gputelemetrystalled")
