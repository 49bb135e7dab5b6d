"""Health on shared GPUs end to end: a time-sliced and a MIG-single kwok node, the fleet simulator emitting
dcgm-exporter's series for them (one series per time-sliced GPU; one per MIG instance with `GPU_I_ID` and
the parent's `UUID`), a real Prometheus and the real control plane.

A healthy node of each kind is never quarantined (the baseline is physical GPUs, never the 32 replicas or 56
instances advertised); an XID on one physical GPU of each quarantines that GPU, named once, with the record
saying what it carries.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start
from harness.testbed import Cluster, add_gpu_nodes, ensure_namespace, mig_single_node, time_sliced_node
from harness.testbed.nodes import delete_nodes
from tests.e2e.test_health_quarantine import passes_until

pytestmark = pytest.mark.e2e

TS, MIG = "sg-node-0", "sg-node-1"
NODES = [TS, MIG]
NS = "gpuwarden-shared-e2e"


def health_config(cluster: Cluster) -> Config:
    doc: dict[str, Any] = {
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "namespace": NS},
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "gpu_missing_grace_seconds": 5,
            "xid": {"event_window_seconds": 30},
            "breaker": {"max_absolute": 2, "max_percent": 0, "max_new_per_window": 10, "window_seconds": 60,
                        "hold_seconds": 5},
        },
    }  # fmt: skip
    return Config.model_validate(doc)


@pytest.fixture(scope="module")
def shared_nodes(cluster: Cluster) -> Iterator[list[str]]:
    add_gpu_nodes(cluster, [time_sliced_node(TS, gpus=8, replicas=4), mig_single_node(MIG, gpus=8)])
    ensure_namespace(cluster, NS)
    try:
        yield NODES
    finally:
        delete_nodes(cluster, NODES)


def taints(cluster: Cluster) -> dict[str, str]:
    out = {}
    for name in NODES:
        for t in cluster.get_json("node", name)["spec"].get("taints", []):
            if t["key"] == TAINT_KEY:
                out[name] = t["value"]
    return out


def untaint(cluster: Cluster) -> None:
    for n in NODES:
        node = cluster.get_json("node", n)
        kept = [t for t in node["spec"].get("taints", []) if t.get("key") != TAINT_KEY]
        patch = {"spec": {"taints": kept or None}, "metadata": {"annotations": {RECORD_ANNOTATION: None}}}
        cluster.kubectl("patch", "node", n, "--type=merge", "-p", json.dumps(patch))


class Env:
    def __init__(self, cluster: Cluster, sim: RunningSimulator, prom: LocalPrometheus) -> None:
        self.cluster, self.sim, self.prom = cluster, sim, prom

    async def fault(self, body: dict[str, Any]) -> None:
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.sim.url}/control/faults", json=body)).raise_for_status()


@pytest_asyncio.fixture
async def env(cluster: Cluster, shared_nodes: list[str], tmp_path: Path) -> AsyncIterator[Env]:
    untaint(cluster)
    scenario = parse_scenario(
        {
            "fleet": {
                "nodes": 2,
                "node_name_pattern": "sg-node-{index}",
                "node_sharing": {
                    TS: {"mode": "time-slicing", "replicas": 4},
                    MIG: {"mode": "mig-single", "mig_instances": ["1g.10gb"] * 7},
                },
            },
            "exporter": {"tick": 0.5},
        }
    )
    sim = await start(scenario)
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)]
    )
    await prom.start()
    try:
        await prom.wait_for_up("dcgm")
        yield Env(cluster, sim, prom)
    finally:
        await prom.stop()
        await sim.stop()
        untaint(cluster)


@pytest_asyncio.fixture
async def loop(env: Env) -> AsyncIterator[HealthLoop]:
    config = health_config(env.cluster)
    prom_cfg = config.prometheus.model_copy(update={"url": env.prom.url})
    async with (
        PrometheusClient(prom_cfg) as prom,
        KubeClient.from_config(kubeconfig=env.cluster.kubeconfig) as kube,
    ):
        hl = HealthLoop(config, prom, kube, registry=CollectorRegistry())
        watcher = asyncio.create_task(hl.informer.run())
        await asyncio.wait_for(hl.informer.synced.wait(), 30)
        try:
            yield hl
        finally:
            watcher.cancel()


def judged_healthy(plan: HealthPlan) -> bool:
    """Both nodes judged on fresh telemetry (no 'unknown' skip for either) and nothing to do."""
    unknown = {s.node for s in plan.skips if "unknown" in s.reason or "stale" in s.reason}
    return not plan.actions and not (unknown & set(NODES))


async def test_healthy_time_sliced_and_mig_nodes_are_never_quarantined(env: Env, loop: HealthLoop) -> None:
    await passes_until(loop, judged_healthy)
    for _ in range(6):  # past the missing-GPU grace: 32 replicas and 56 instances on 8 GPUs each, all fine
        plan = await loop.run_once()
        assert not plan.actions_of("quarantine"), plan.render_table()
        await asyncio.sleep(1.0)
    assert taints(env.cluster) == {}


@pytest.mark.parametrize(
    ("node", "fault", "carries"),
    [
        (TS, {"kind": "xid", "node": TS, "gpu": 2, "code": 79}, "time-slicing: 8 physical GPUs, 4 replicas"),
        (MIG, {"kind": "xid", "node": MIG, "gpu": 5, "instance": 3, "code": 79}, "MIG single"),
    ],
    ids=["time-sliced", "mig-single"],
)
async def test_an_xid_on_one_physical_gpu_quarantines_that_gpu(
    env: Env, loop: HealthLoop, node: str, fault: dict[str, Any], carries: str
) -> None:
    await passes_until(loop, judged_healthy)
    await env.fault(fault)
    await passes_until(loop, lambda p: any(a.kind == "quarantine" and a.node == node for a in p.actions))
    assert taints(env.cluster) == {node: "xid-79"}
    record = json.loads(env.cluster.get_json("node", node)["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record["xids"] == [79] and len(record["gpus"]) == 1, record  # the one physical GPU, once
    assert record["sharing"].startswith(carries), record
