"""GPU-health quarantine end to end: real control plane, kwok GPU nodes, the fleet simulator, real Prometheus.

Six kwok nodes `hq-node-0..5` get DCGM metrics from the simulator, which a real Prometheus scrapes every
second. Each test injects faults through the simulator's control API and drives the quarantine loop — by
calling its pass directly, except the leader test, which runs two controller processes (`run_controller`,
the quarantine loop only: extender and nomination cleanup off) and SIGKILLs one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from controller.app import run_controller
from controller.health.act import BREAKER_CONFIGMAP
from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeNotFound
from gpuwarden.kube import LEASES, KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, ensure_namespace
from harness.testbed.nodes import delete_nodes
from tests.e2e.conftest import free_port, pod_manifest

pytestmark = pytest.mark.e2e

NODES = [f"hq-node-{i}" for i in range(6)]
NS = "gpuwarden-health-e2e"
LEASE = "gpuwarden-health-e2e"


def health_config(cluster: Cluster, **health: Any) -> Config:
    doc: dict[str, Any] = {
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": NS,
            "leader_election": {
                "lease_name": LEASE,
                "lease_duration_seconds": 4,
                "renew_deadline_seconds": 3,
                "retry_period_seconds": 0.5,
            },
        },
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "gpu_missing_grace_seconds": 5,
            "xid": {"event_window_seconds": 30},
            "breaker": {"max_absolute": 2, "max_percent": 0, "max_new_per_window": 10, "window_seconds": 60,
                        "hold_seconds": 5},
            **health,
        },
    }  # fmt: skip
    return Config.model_validate(doc)


@pytest.fixture(scope="module")
def hq_nodes(cluster: Cluster) -> Iterator[list[str]]:
    add_gpu_nodes(cluster, [GpuNodeSpec(name=n, gpus=8) for n in NODES])
    ensure_namespace(cluster, NS)
    try:
        yield NODES
    finally:
        delete_nodes(cluster, NODES)


def reset_cluster_state(cluster: Cluster) -> None:
    """Our taint, annotations and condition off every hq node; breaker ConfigMap gone."""
    for n in NODES:
        node = cluster.get_json("node", n)
        taints = [t for t in node["spec"].get("taints", []) if t.get("key") != TAINT_KEY]
        annotations = {RECORD_ANNOTATION: None, "gpuwarden.io/release": None}
        patch = {"spec": {"taints": taints or None}, "metadata": {"annotations": annotations}}
        cluster.kubectl("patch", "node", n, "--type=merge", "-p", json.dumps(patch))
        drop = {"status": {"conditions": [{"type": "GPUHealthy", "$patch": "delete"}]}}
        status = ("--subresource=status", "--type=strategic", "-p", json.dumps(drop))
        cluster.kubectl("patch", "node", n, *status)
    cluster.kubectl("delete", "configmap", BREAKER_CONFIGMAP, "-n", NS, "--ignore-not-found")


@dataclass
class Env:
    cluster: Cluster
    sim: RunningSimulator
    prom: LocalPrometheus
    config: Config
    workdir: Path

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

    def events(self, reason: str) -> list[dict[str, Any]]:
        items = self.cluster.get_json("events.events.k8s.io", "-A")["items"]
        return [e for e in items if e.get("reason") == reason]


@pytest_asyncio.fixture
async def env(cluster: Cluster, hq_nodes: list[str], tmp_path: Path) -> AsyncIterator[Env]:
    reset_cluster_state(cluster)
    scenario = parse_scenario(
        {"fleet": {"nodes": len(NODES), "node_name_pattern": "hq-node-{index}"}, "exporter": {"tick": 0.5}}
    )
    sim = await start(scenario)
    target = scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)
    prom = LocalPrometheus(tmp_path / "prom", [target])
    await prom.start()
    try:
        await prom.wait_for_up("dcgm")
        yield Env(cluster, sim, prom, health_config(cluster), tmp_path)
    finally:
        await prom.stop()
        await sim.stop()
        reset_cluster_state(cluster)


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


async def passes_until(
    hl: HealthLoop, done: Callable[[HealthPlan], bool], within: float = 30.0
) -> HealthPlan:
    """Run passes (1 s apart, like the loop) until `done(plan)`; fails with the last plan otherwise."""
    deadline = time.monotonic() + within
    while True:
        plan = await hl.run_once()
        if done(plan):
            return plan
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached; last plan:\n{plan.render_table()}")
        await asyncio.sleep(1.0)


async def eventually(check: Callable[[], bool | Awaitable[bool]], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if await got if not isinstance(got, bool) else got:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.5)


async def test_xid_79_taints_the_node_and_gpu_pods_stop_landing_there(env: Env, loop: HealthLoop) -> None:
    await env.fault({"kind": "xid", "node": "hq-node-1", "gpu": 3, "code": 79})
    await passes_until(loop, lambda p: any(a.kind == "quarantine" for a in p.actions))
    assert env.taints() == {"hq-node-1": "xid-79:NoSchedule"}
    node = env.cluster.get_json("node", "hq-node-1")
    record = json.loads(node["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record["xids"] == [79] and record["state"] == "quarantined" and len(record["gpus"]) == 1
    cond = next(c for c in node["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert cond["status"] == "False"
    assert any(e["regarding"]["name"] == "hq-node-1" for e in env.events("GPUQuarantined"))
    ns = f"hq-{uuid.uuid4().hex[:5]}"
    ensure_namespace(env.cluster, ns)
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "hq-node-1"}}
    env.cluster.apply(
        {**pod_manifest("on-bad", gpus=1, **pinned), "metadata": {"name": "on-bad", "namespace": ns}}
    )
    healthy = {"nodeSelector": {"kubernetes.io/hostname": "hq-node-2"}}
    env.cluster.apply(
        {**pod_manifest("on-ok", gpus=1, **healthy), "metadata": {"name": "on-ok", "namespace": ns}}
    )

    def scheduled(name: str) -> dict[str, Any]:
        pod = env.cluster.get_json("pod", name, "-n", ns)
        return next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})

    await eventually(lambda: scheduled("on-ok").get("status") == "True")
    await eventually(lambda: scheduled("on-bad").get("reason") == "Unschedulable")
    assert "untolerated taint" in scheduled("on-bad").get("message", "")
    env.cluster.kubectl("delete", "namespace", ns, "--wait=false")


async def test_xid_13_storm_across_the_fleet_taints_nothing(env: Env, loop: HealthLoop) -> None:
    await env.fault(
        [{"kind": "xid", "node": n, "gpu": g, "code": 13, "count": 20} for n in NODES for g in range(8)]
    )
    plan = await passes_until(loop, lambda p: len(p.skips_of("not-quarantining")) == len(NODES))
    assert plan.actions == () and env.taints() == {}
    for _ in range(3):
        assert (await loop.run_once()).actions == ()
    assert env.taints() == {}


async def test_prometheus_outage_changes_nothing(env: Env, loop: HealthLoop) -> None:
    await env.fault({"kind": "xid", "node": "hq-node-0", "gpu": 0, "code": 48})
    await passes_until(loop, lambda p: bool(p.actions_of("quarantine")))
    before = env.taints()
    await env.clear(reset=True)  # the evidence is gone, a release would follow...
    await env.fault({"kind": "xid", "node": "hq-node-4", "gpu": 0, "code": 79})  # ...and a new quarantine
    await env.prom.stop()  # ...but Prometheus is down
    for _ in range(5):
        plan = await loop.run_once()
        assert plan.actions == () and {s.reason for s in plan.skips} <= {"prometheus-unavailable", "excluded"}
        await asyncio.sleep(1.0)
    assert env.taints() == before == {"hq-node-0": "xid-48:NoSchedule"}


async def test_mass_hardware_fault_stops_at_the_breaker(env: Env, loop: HealthLoop) -> None:
    await env.fault([{"kind": "xid", "node": n, "gpu": 0, "code": 79} for n in NODES])
    plan = await passes_until(loop, lambda p: p.breaker.after.open)
    assert len(env.taints()) == 2  # max_absolute
    assert len(plan.skips_of("breaker-open")) == len(NODES) - 2
    assert env.events("QuarantineBreakerOpen")
    cm = env.cluster.get_json("configmap", BREAKER_CONFIGMAP, "-n", NS)
    assert json.loads(cm["data"]["state"])["open"] is True
    for _ in range(3):  # stays open: still no new taints
        await loop.run_once()
    assert len(env.taints()) == 2


async def test_healthy_period_releases_the_node(env: Env, loop: HealthLoop) -> None:
    await env.fault({"kind": "xid", "node": "hq-node-5", "gpu": 2, "code": 48})
    await passes_until(loop, lambda p: bool(p.actions_of("quarantine")))
    assert env.taints() == {"hq-node-5": "xid-48:NoSchedule"}
    # A GPU reset clears the sticky XID; the event leaves the 30 s window; the 3 s healthy period follows.
    await env.clear(node="hq-node-5", reset=True)
    await passes_until(loop, lambda p: bool(p.actions_of("release")), within=60)
    assert env.taints() == {}
    node = env.cluster.get_json("node", "hq-node-5")
    assert RECORD_ANNOTATION not in node["metadata"].get("annotations", {})
    cond = next(c for c in node["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert cond["status"] == "True" and env.events("GPUQuarantineReleased")


RUNNER = """
import asyncio, sys
from pathlib import Path
from gpuwarden.config.root import Config
from controller.app import run_controller
import json
cfg = Config.model_validate(json.loads(Path(sys.argv[1]).read_text()))
asyncio.run(run_controller(cfg))
"""


def controller_doc(doc: dict[str, Any], identity: str) -> dict[str, Any]:
    """The controller process as the quarantine loop alone, listening on its own loopback port."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    out["kubernetes"]["leader_election"]["identity"] = identity
    out["extender"] = {"enabled": False, "bind_address": "127.0.0.1", "port": free_port()}
    out["nominations"] = {"enabled": False}
    return out


async def test_killing_the_leader_hands_over_within_the_lease(env: Env) -> None:
    cfg = env.config
    doc = json.loads(cfg.model_dump_json())
    doc["prometheus"]["url"] = env.prom.url
    path = env.workdir / "leader.json"
    path.write_text(json.dumps(controller_doc(doc, "leader-subprocess")))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RUNNER, str(path), cwd=Path(__file__).parents[2],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    stop = asyncio.Event()
    standby_task: asyncio.Task[None] | None = None
    try:
        async with KubeClient.from_config(kubeconfig=env.cluster.kubeconfig) as kube:
            le = cfg.kubernetes.leader_election

            async def holder() -> str:
                try:
                    lease = await kube.get(LEASES, LEASE, namespace=NS)
                except KubeNotFound:
                    return ""
                return str((lease.get("spec") or {}).get("holderIdentity", ""))

            await eventually(lambda: _is(holder(), "leader-subprocess"), within=30)
            await env.fault({"kind": "xid", "node": "hq-node-2", "gpu": 1, "code": 79})
            await eventually(lambda: "hq-node-2" in env.taints(), within=30)

            standby = Config.model_validate(controller_doc(doc, "standby"))
            standby_task = asyncio.create_task(run_controller(standby, stop=stop))
            await asyncio.sleep(2)
            assert await holder() == "leader-subprocess"
            os.killpg(proc.pid, signal.SIGKILL)  # a crash: no lease release
            killed = time.monotonic()
            await proc.wait()
            await eventually(lambda: _is(holder(), "standby"), within=30)
            handover = time.monotonic() - killed
            assert handover <= le.lease_duration_seconds + 2 * le.retry_period_seconds + 1.0, handover
            await env.fault({"kind": "xid", "node": "hq-node-3", "gpu": 1, "code": 79})
            await eventually(lambda: "hq-node-3" in env.taints(), within=30)  # the new leader acts
            lease_s = le.lease_duration_seconds
            print(f"\n[e2e] leader handover after SIGKILL: {handover:.1f}s (lease {lease_s:g}s)")
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        stop.set()
        if standby_task is not None:
            await asyncio.wait_for(standby_task, 20)


async def _is(value: Awaitable[str], want: str) -> bool:
    return await value == want


STALLED_RUNNER = """
import asyncio, sys, json
from pathlib import Path
from gpuwarden.config.root import Config
from gpuwarden.kube import EventRecorder
from controller.app import run_controller

async def stalled(self, *args, **kwargs):  # the leader freezes after its taints, before any named Event
    await asyncio.sleep(3600)
    return False

EventRecorder.emit_once = stalled
cfg = Config.model_validate(json.loads(Path(sys.argv[1]).read_text()))
asyncio.run(run_controller(cfg))
"""


async def test_a_leader_killed_after_its_taints_loses_no_event(env: Env) -> None:
    """The leader taints two nodes and is SIGKILLed before their GPUQuarantined Events: the next leader
    writes each Event exactly once (named after the record) and clears the record's pending mark."""
    cfg = env.config
    doc = json.loads(cfg.model_dump_json())
    doc["prometheus"]["url"] = env.prom.url
    path = env.workdir / "stalled.json"
    path.write_text(json.dumps(controller_doc(doc, "stalled-leader")))
    started = time.time()
    targets = ["hq-node-4", "hq-node-5"]

    def records() -> dict[str, Any]:
        out = {}
        for n in targets:
            raw = env.cluster.get_json("node", n)["metadata"].get("annotations", {}).get(RECORD_ANNOTATION)
            out[n] = json.loads(raw) if raw else None
        return out

    def quarantine_events(node: str) -> list[dict[str, Any]]:
        return [
            e for e in env.events("GPUQuarantined")
            if e["regarding"]["name"] == node and _epoch(e["eventTime"]) >= started - 1
        ]  # fmt: skip

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STALLED_RUNNER, str(path), cwd=Path(__file__).parents[2],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    stop = asyncio.Event()
    standby_task: asyncio.Task[None] | None = None
    try:
        async with KubeClient.from_config(kubeconfig=env.cluster.kubeconfig) as kube:

            async def holder() -> str:
                try:
                    lease = await kube.get(LEASES, LEASE, namespace=NS)
                except KubeNotFound:
                    return ""
                return str((lease.get("spec") or {}).get("holderIdentity", ""))

            await eventually(lambda: _is(holder(), "stalled-leader"), within=30)
            await env.fault([{"kind": "xid", "node": n, "gpu": 0, "code": 79} for n in targets])
            await eventually(lambda: set(targets) <= set(env.taints()), within=30)
            await eventually(lambda: all(r and r.get("event") == "pending" for r in records().values()))
            assert all(quarantine_events(n) == [] for n in targets), "the stalled leader wrote no Event"
            os.killpg(proc.pid, signal.SIGKILL)  # killed between the taints and their Events
            await proc.wait()
            killed = time.monotonic()

            standby = Config.model_validate(controller_doc(doc, "standby-events"))
            standby_task = asyncio.create_task(run_controller(standby, stop=stop))
            await eventually(lambda: all(r and "event" not in r for r in records().values()), within=40)
            finished = time.monotonic() - killed
            await asyncio.sleep(3)  # more passes of the new leader: still one Event each
            for n in targets:
                events = quarantine_events(n)
                assert len(events) == 1, (n, events)
                assert events[0]["reportingInstance"] == "standby-events"
            print(f"\n[e2e] missing GPUQuarantined Events written {finished:.1f}s after the SIGKILL")
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        stop.set()
        if standby_task is not None:
            await asyncio.wait_for(standby_task, 20)


def _epoch(micro: str) -> float:
    return datetime.fromisoformat(micro.replace("Z", "+00:00")).timestamp()
