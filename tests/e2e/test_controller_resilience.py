"""The controller process rides out an API-server restart and a watch expiry (issue 32).

A real `gpuwarden controller` process leads on the session's control plane and watches four kwok GPU nodes
`cr-node-0..3`, whose DCGM metrics come from the fleet simulator through a real Prometheus. The tests stop
and start kube-apiserver under it (`Cluster.restart_apiserver`: same etcd, port and certificates):

* a plain restart: every stream and the Lease fail for a while; a fault injected afterwards is quarantined
  (taint and exactly one `GPUQuarantined` Event) - the time from the API server's /readyz to the taint is
  printed beside the same time for a fault before the restart. (The restarted API server's watch cache
  starts at the revision of its first list and answers 410 Gone to any older resourceVersion, so this
  restart already makes the controller relist nodes and pods: the log shows `watch expired, relisting`.)
* a watch expiry: the API server serves node watches from etcd (`--watch-cache-sizes=nodes#0`; the watch
  cache would answer an old resourceVersion from memory) and compacts every 2 s; after a quiet spell with no
  node writes the controller's last node resourceVersion is compacted, so the restart makes its resumed node
  watch get 410 Gone: it relists (`gpuwarden_transient_failures_total{component="watch nodes",
  cause="watch-expired"}`, one more node LIST) and handles a later fault.

Both check the outage in the controller's own log: counted in `gpuwarden_transient_failures_total`, one
warning per component and cause (not one per failed pass or retry), and no traceback.
Times are printed, not asserted (the waits are generous bounds).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from controller.health.act import BREAKER_CONFIGMAP
from gpuwarden.wellknown import QUARANTINE_RECORD, QUARANTINE_TAINT
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, parse_scenario, start
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, ensure_namespace
from harness.testbed.nodes import delete_nodes
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.e2e

NODES = [f"cr-node-{i}" for i in range(4)]
NS = "gpuwarden-resilience-e2e"
LEASE = "gpuwarden-resilience-e2e"
LOOP_INTERVAL_S = 1
NO_NODE_WATCH_CACHE = {"watch-cache-sizes": "nodes#0", "etcd-compaction-interval": "2s"}
"""Node watches served from etcd, compacted every 2 s: a resumed watch can really expire."""
TRANSIENT = "gpuwarden_transient_failures_total"


@pytest.fixture(scope="module")
def cr_nodes(cluster: Cluster) -> Iterator[list[str]]:
    add_gpu_nodes(cluster, [GpuNodeSpec(name=n, gpus=8) for n in NODES])
    ensure_namespace(cluster, NS)
    try:
        yield NODES
    finally:
        delete_nodes(cluster, NODES)


def reset_nodes(cluster: Cluster) -> None:
    """Our taint, record and condition off every node of this module; the breaker's ConfigMap gone."""
    for n in NODES:
        node = cluster.get_json("node", n)
        taints = [t for t in node["spec"].get("taints", []) if t.get("key") != QUARANTINE_TAINT]
        patch = {"spec": {"taints": taints or None}, "metadata": {"annotations": {QUARANTINE_RECORD: None}}}
        cluster.kubectl("patch", "node", n, "--type=merge", "-p", json.dumps(patch))
        drop = {"status": {"conditions": [{"type": "GPUHealthy", "$patch": "delete"}]}}
        cluster.kubectl(
            "patch", "node", n, "--subresource=status", "--type=strategic", "-p", json.dumps(drop)
        )
    cluster.kubectl("delete", "configmap", BREAKER_CONFIGMAP, "-n", NS, "--ignore-not-found")


def controller_config(cluster: Cluster, prometheus_url: str, port: int) -> dict[str, Any]:
    return {
        "prometheus": {"url": prometheus_url},
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": NS,
            "leader_election": {
                "lease_name": LEASE,
                "identity": "resilience",
                "lease_duration_seconds": 4,
                "renew_deadline_seconds": 3,
                "retry_period_seconds": 0.5,
            },
        },
        "health": {
            "loop_interval_seconds": LOOP_INTERVAL_S,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "gpu_missing_grace_seconds": 5,
            "xid": {"event_window_seconds": 30},
            "breaker": {"max_absolute": 3, "max_percent": 0, "max_new_per_window": 10, "window_seconds": 60,
                        "hold_seconds": 5},
        },
        "extender": {"enabled": False, "bind_address": "127.0.0.1", "port": port},
        "nominations": {"enabled": False},
        "logging": {"format": "json"},
    }  # fmt: skip


def sample(text: str, series: str) -> float:
    """One exposition line's value, by exact name and labels (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def transient_samples(text: str) -> dict[tuple[str, str], float]:
    """`gpuwarden_transient_failures_total` by (component, cause)."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith(TRANSIENT + "{"):
            labels = dict(
                part.split("=", 1) for part in line[len(TRANSIENT) + 1 : line.index("}")].split(",")
            )
            key = (labels["component"].strip('"'), labels["cause"].strip('"'))
            out[key] = float(line.split()[-1])
    return out


@dataclass
class Env:
    cluster: Cluster
    sim: RunningSimulator
    controller: asyncio.subprocess.Process
    log_path: Path
    metrics_url: str
    started: float
    """Wall clock when the test began: Events before it belong to earlier tests."""

    async def fault(self, node: str, gpu: int, code: int = 79) -> None:
        async with httpx.AsyncClient() as http:
            body = {"kind": "xid", "node": node, "gpu": gpu, "code": code}
            (await http.post(f"{self.sim.url}/control/faults", json=body)).raise_for_status()

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(self.metrics_url, timeout=5)).text

    def taints(self) -> dict[str, str]:
        out = {}
        for item in self.cluster.get_json("nodes")["items"]:
            for t in item["spec"].get("taints", []):
                if t["key"] == QUARANTINE_TAINT and item["metadata"]["name"] in NODES:
                    out[item["metadata"]["name"]] = f"{t['value']}:{t['effect']}"
        return out

    def quarantine_events(self, node: str) -> list[dict[str, Any]]:
        items = self.cluster.get_json("events.events.k8s.io", "-A")["items"]
        return [
            e for e in items
            if e.get("reason") == "GPUQuarantined" and e["regarding"]["name"] == node
            and _epoch(e.get("eventTime") or e["metadata"]["creationTimestamp"]) >= self.started - 1
        ]  # fmt: skip

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                out.append({"level": "raw", "msg": line})
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def eventually(check: Callable[[], Any], within: float, what: str) -> Any:
    """Poll `check` (sync or async) every 0.25 s until truthy; fail naming `what` after `within` s."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        got = check()
        last = await got if asyncio.iscoroutine(got) else got
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:.0f}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.25)


@pytest_asyncio.fixture
async def env(cluster: Cluster, cr_nodes: list[str], tmp_path: Path) -> AsyncIterator[Env]:
    reset_nodes(cluster)
    scenario = parse_scenario(
        {"fleet": {"nodes": len(NODES), "node_name_pattern": "cr-node-{index}"}, "exporter": {"tick": 0.5}}
    )
    sim = await start(scenario)
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)]
    )
    await prom.start()
    port = free_port()
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(controller_config(cluster, prom.url, port)))
    log_path = tmp_path / "controller.log"
    proc: asyncio.subprocess.Process | None = None
    try:
        await prom.wait_for_up("dcgm")
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuwarden", "controller", "--config", str(path),
                stdout=log, stderr=log, cwd=Path(__file__).parents[2],
            )  # fmt: skip
        e = Env(cluster, sim, proc, log_path, f"http://127.0.0.1:{port}/metrics", time.time())
        last_pass = "gpuwarden_health_last_pass_timestamp_seconds"

        async def passing() -> bool:
            try:
                return sample(await e.metrics(), last_pass) > 0
            except httpx.HTTPError:
                return False

        await eventually(passing, 60, "the controller's first quarantine pass")
        yield e
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await prom.stop()
        await sim.stop()
        reset_nodes(cluster)


async def quarantine(env: Env, node: str, gpu: int) -> float:
    """Inject an XID 79 on `node` and wait (generously) for its taint; the seconds it took."""
    t0 = time.monotonic()
    await env.fault(node, gpu)
    await eventually(lambda: node in env.taints(), 90, f"the taint on {node}")
    return time.monotonic() - t0


async def assert_one_event_each(env: Env, nodes: list[str]) -> None:
    """Each node's GPUQuarantined Event written, and only once (a few more passes run before counting)."""
    await eventually(lambda: all(env.quarantine_events(n) for n in nodes), 30, "GPUQuarantined Events")
    await asyncio.sleep(3 * LOOP_INTERVAL_S)
    for n in nodes:
        assert len(env.quarantine_events(n)) == 1, (n, env.quarantine_events(n))
    assert env.taints() == {n: "xid-79:NoSchedule" for n in nodes}


def assert_outage_logged_once_per_episode(
    env: Env, counted: dict[tuple[str, str], float], outages: int
) -> None:
    """Every transient failure counted; at most one warning per component and cause per outage (not one per
    failure); no traceback of an expected failure and no `pass failed`."""
    records = env.log_records()
    tracebacks = [r for r in records if "exc" in r or r.get("msg") == "pass failed"]
    assert not tracebacks, tracebacks[:3]
    warnings = Counter(
        (str(r.get("component")), str(r.get("cause")))
        for r in records
        if r.get("level") == "warning" and "cause" in r
    )
    assert warnings, "the outage was not logged"
    for key, n in warnings.items():
        assert key in counted, (key, counted)
        assert n <= outages, (key, n, outages)
    print(f"[e2e] transient failures counted {dict(counted)}; warning lines {dict(warnings)}")


async def test_api_server_restart_then_a_fault_is_quarantined(env: Env) -> None:
    before = await quarantine(env, "cr-node-0", gpu=1)
    print(f"\n[e2e] fault -> taint before the restart: {before:.1f}s")
    base = transient_samples(await env.metrics())

    down = await asyncio.to_thread(env.cluster.restart_apiserver)
    after = await quarantine(env, "cr-node-1", gpu=2)
    print(f"[e2e] API server stop -> /readyz {down:.1f}s; then fault -> taint {after:.1f}s "
          f"(loop interval {LOOP_INTERVAL_S}s)")  # fmt: skip
    await assert_one_event_each(env, ["cr-node-0", "cr-node-1"])

    counted = transient_samples(await env.metrics())
    assert sum(counted.values()) > sum(base.values()), "the outage was not counted"
    assert_outage_logged_once_per_episode(env, counted, outages=1)
    assert env.controller.returncode is None, "the controller exited"


async def test_watch_expiry_relists_and_a_later_fault_is_quarantined(env: Env) -> None:
    expired = 'gpuwarden_transient_failures_total{cause="watch-expired",component="watch nodes"}'
    node_lists = 'gpuwarden_kube_requests_total{outcome="success",resource="nodes",verb="list"}'
    node_watches = 'gpuwarden_kube_requests_total{outcome="success",resource="nodes",verb="watch"}'
    try:
        # Node watches from etcd from now on; the controller's resumes from before the restart.
        watches = sample(await env.metrics(), node_watches)
        await asyncio.to_thread(env.cluster.restart_apiserver, NO_NODE_WATCH_CACHE)
        await eventually(
            lambda: _grown(env, node_watches, watches), 60, "the controller's node watch to be open again"
        )
        text = await env.metrics()
        expired_before, lists_before = sample(text, expired), sample(text, node_lists)
        base = transient_samples(text)
        # No node writes for five compaction intervals: the controller's last node resourceVersion is
        # compacted in etcd (the compactor compacts to the revision it saw one interval earlier).
        await asyncio.sleep(10)

        down = await asyncio.to_thread(env.cluster.restart_apiserver, NO_NODE_WATCH_CACHE)
        t_ready = time.monotonic()
        await eventually(lambda: _grown(env, expired, expired_before), 60, "the node watch's 410 Gone")
        await eventually(lambda: _grown(env, node_lists, lists_before), 60, "the node relist")
        relisted = time.monotonic() - t_ready
        handled = await quarantine(env, "cr-node-2", gpu=5)
        print(
            f"\n[e2e] API server stop -> /readyz {down:.1f}s; /readyz -> 410 Gone and relist {relisted:.1f}s;"
            f" then fault -> taint {handled:.1f}s (loop interval {LOOP_INTERVAL_S}s)"
        )
        await assert_one_event_each(env, ["cr-node-2"])
        logs = env.log_records()
        assert any(r.get("msg") == "watch expired, relisting" and r.get("resource") == "nodes" for r in logs)

        counted = transient_samples(await env.metrics())
        key = ("watch nodes", "watch-expired")
        assert counted.get(key, 0) > base.get(key, 0), counted
        assert_outage_logged_once_per_episode(env, counted, outages=2)
        assert env.controller.returncode is None, "the controller exited"
    finally:
        await asyncio.to_thread(env.cluster.restart_apiserver)  # the session's API server as it was


async def _grown(env: Env, series: str, before: float) -> bool:
    return sample(await env.metrics(), series) > before
