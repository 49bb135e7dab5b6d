"""Validation before return to service on the real kubelet node: the Job really runs there.

The real node carries our taint and a quarantine record whose evidence is gone and whose healthy period is
over; the fleet simulator (scraped by a real Prometheus) reports its GPUs healthy. The health loop, with
`health.validation` on, must not release it before the operator's Job — the test bed's gwtool image, pinned
to the node and tolerating our taint — has run there: a Job that exits 1 keeps the quarantine and records
why; the next attempt, whose Job exits 0, releases the node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.health.loop import HealthLoop
from controller.health.plan import HealthPlan
from controller.health.snapshot import TAINT_KEY
from controller.health.validation import job_name
from gpuwarden.config.root import Config
from gpuwarden.kube import KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.quarantine import Evidence, QuarantineRecord, decode
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from harness.testbed import Cluster, ensure_namespace
from harness.testbed.images import TOOL_IMAGE
from harness.testbed.realnode import REAL_NODE_TAINT
from tests.e2e.conftest import REAL_NODE

pytestmark = pytest.mark.e2e
NS = "gpuwarden-validation-e2e"
TAINT = {"key": TAINT_KEY, "value": "nvlink-errors", "effect": "NoSchedule"}


def template(exit_code: int) -> str:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "validate"},
        "spec": {
            "template": {
                "spec": {
                    "automountServiceAccountToken": False,
                    "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "diag",
                            "image": TOOL_IMAGE.name,
                            "imagePullPolicy": "Never",
                            "args": ["--env", "GW_", "--sleep", "1", "--exit", str(exit_code)],
                            "env": [
                                {"name": "GW_NODE", "value": "{node}"},
                                {"name": "GW_GPUS", "value": "{gpus}"},
                            ],
                            "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
                        }
                    ],
                }
            }
        },
    }
    return yaml.safe_dump(job)


def config(cluster: Cluster, exit_code: int) -> Config:
    return Config.model_validate({
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "namespace": NS},
        "health": {
            "loop_interval_seconds": 1,
            "max_sample_age_seconds": 10,
            "healthy_period_seconds": 3,
            "validation": {"enabled": True, "job_template": template(exit_code), "timeout_seconds": 120,
                           "max_attempts": 3},
        },
    })  # fmt: skip


def quarantine(cluster: Cluster) -> None:
    """Our taint and a record whose evidence (an NVLink signal) went away an hour ago."""
    node = cluster.get_json("node", REAL_NODE)
    now = time.time()
    evidence = Evidence("nvlink-errors", gpu="GPU-x", value=500.0, first_seen=now - 7200)
    boot_id = node["status"]["nodeInfo"]["bootID"]
    record = QuarantineRecord(
        "quarantined",
        "nvlink-errors",
        "hw_link",
        evidence=(evidence,),
        quarantined_at=now - 7200,
        boot_id=boot_id,
        healthy_since=now - 3600,
    )
    taints = [t for t in node["spec"].get("taints", []) if t["key"] != TAINT_KEY] + [TAINT]
    patch = {"metadata": {"annotations": {RECORD_ANNOTATION: record.encode()}}, "spec": {"taints": taints}}
    cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))


def unquarantine(cluster: Cluster) -> None:
    node = cluster.get_json("node", REAL_NODE)
    taints = [t for t in node["spec"].get("taints", []) if t["key"] != TAINT_KEY]
    patch = {"metadata": {"annotations": {RECORD_ANNOTATION: None}}, "spec": {"taints": taints}}
    cluster.kubectl("patch", "node", REAL_NODE, "--type=merge", "-p", json.dumps(patch))


@pytest.fixture(scope="module")
def quarantined_real_node(node_cluster: Cluster) -> Iterator[Cluster]:
    ensure_namespace(node_cluster, NS)
    quarantine(node_cluster)
    try:
        yield node_cluster
    finally:
        unquarantine(node_cluster)
        node_cluster.kubectl("delete", "jobs", "--all", "-n", NS, check=False)


def record(cluster: Cluster) -> QuarantineRecord | None:
    rec, _ = decode(
        cluster.get_json("node", REAL_NODE)["metadata"].get("annotations", {}).get(RECORD_ANNOTATION)
    )
    return rec


def tainted(cluster: Cluster) -> bool:
    return any(t["key"] == TAINT_KEY for t in cluster.get_json("node", REAL_NODE)["spec"].get("taints", []))


async def passes_until(
    cluster: Cluster, cfg: Config, prom_url: str, done: Callable[[HealthPlan], bool], *, within: float = 120
) -> list[HealthPlan]:
    """The real HealthLoop (its own node informer), one pass a second, until `done(plan)`."""
    prom_cfg = cfg.prometheus.model_copy(update={"url": prom_url})
    async with (
        PrometheusClient(prom_cfg) as prom,
        KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube,
    ):
        loop = HealthLoop(cfg, prom, kube, registry=CollectorRegistry())
        watcher = asyncio.ensure_future(loop.informer.run())
        try:
            await asyncio.wait_for(loop.informer.synced.wait(), 30)
            deadline = time.monotonic() + within
            seen: list[HealthPlan] = []
            while True:
                plan = await loop.run_once()
                seen.append(plan)
                if done(plan):
                    return seen
                if time.monotonic() > deadline:
                    pytest.fail(f"not reached; last plan:\n{plan.render_table()}")
                await asyncio.sleep(1.0)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


def on_node(plan: HealthPlan) -> set[str]:
    got = {f"{a.kind}:{a.reason}" for a in plan.actions if a.node == REAL_NODE}
    return got | {f"skip:{s.reason}" for s in plan.skips if s.node == REAL_NODE}


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    items = cluster.get_json("events.events.k8s.io", "-A")["items"]
    return [e for e in items if e.get("reason") == reason and e["regarding"].get("name") == REAL_NODE]


def test_failed_validation_keeps_the_quarantine_then_a_passing_one_releases(
    quarantined_real_node: Cluster, tmp_path: Path
) -> None:
    asyncio.run(validate(quarantined_real_node, tmp_path))


async def validate(cluster: Cluster, tmp_path: Path) -> None:
    scenario = {"fleet": {"nodes": 1, "node_name_pattern": "real-node-{index}"}, "exporter": {"tick": 0.5}}
    sim = await start(parse_scenario(scenario))
    target = scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)
    prom = LocalPrometheus(tmp_path / "prom", [target])
    try:
        await prom.start()
        await prom.wait_for_up("dcgm")
        # Attempt 1: the Job exits 1 on the real node -> kept, why recorded, the healthy period restarts.
        failing = config(cluster, exit_code=1)
        seen = await passes_until(
            cluster, failing, prom.url, lambda p: "update-record:validation-failed" in on_node(p)
        )
        kinds = [on_node(p) - {"set-condition:condition-drift"} for p in seen]  # GPUHealthy set on pass 1
        assert kinds[0] == {"start-validation:validation-started"}, kinds
        assert all(k == {"skip:validation-running"} for k in kinds[1:-1]), kinds
        assert tainted(cluster)
        rec = record(cluster)
        assert rec is not None and rec.validation_attempts == 1 and rec.validation_job == ""
        first = job_name(REAL_NODE, 1, rec.quarantined_at)  # the quarantine is part of the name
        assert len(rec.validation_failures) == 1 and first in rec.validation_failures[0]
        job = cluster.get_json("job", first, "-n", NS)
        assert job["spec"]["template"]["spec"]["nodeName"] == REAL_NODE
        pods = cluster.get_json("pods", "-n", NS, "-l", f"job-name={first}")["items"]
        assert pods and all(
            p["spec"]["nodeName"] == REAL_NODE and p["status"]["phase"] == "Failed" for p in pods
        )
        logs = cluster.kubectl("logs", "-n", NS, f"job/{first}", check=False)
        assert f"GW_NODE={REAL_NODE}" in logs, logs  # it ran on the real node, with the template substituted
        assert events(cluster, "GPUValidationStarted") and events(cluster, "GPUValidationFailed")

        # Attempt 2: after the healthy period again, a Job that exits 0 -> released.
        passing = config(cluster, exit_code=0)
        seen = await passes_until(
            cluster, passing, prom.url, lambda p: "release:healthy-period" in on_node(p)
        )
        assert any(on_node(p) == {"start-validation:validation-started"} for p in seen)
        assert not tainted(cluster) and record(cluster) is None
        second = cluster.get_json("job", job_name(REAL_NODE, 2, rec.quarantined_at), "-n", NS)
        assert (second.get("status") or {}).get("succeeded") == 1
        released = next(a for p in seen for a in p.actions if a.kind == "release")
        assert "validation Job" in released.message and "succeeded" in released.message
        print(
            f"\n[e2e] validation: attempt 1 failed after {len(kinds)} passes; "
            f"attempt 2 released after {len(seen)}"
        )
    finally:
        await prom.stop()
        await sim.stop()
