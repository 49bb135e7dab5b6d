"""Idle GPUs end to end: real control plane, kwok GPU nodes, the fleet simulator's per-GPU utilization scraped
by a real Prometheus, and the idle loop's pass against the real API server.

Kubernetes pods are placed (nodeName) on the GPUs the simulator models, with `gpuwarden.io/gpu-ids`: one on
the GPU of the simulator's busy workload (same namespace and name as the simulator's pod, so the exporter's
pod labels agree), idle ones on GPUs no workload uses. After the 60 s window has passed over their lifetime,
one pass reports the idle pod (annotation + Events), marks the one under a prefer-as-victim rule
`idle-reclaimable` too, leaves the busy and the acknowledged one alone, evicts the one whose rule says evict,
and is refused by a PodDisruptionBudget for the protected one.

Both tests' workloads are created by the module's fixture, on disjoint GPUs and in their own namespaces
(each test's loop excludes the other's), so one 60 s window covers both: the window is the floor the config
allows (`window_seconds` >= 60), and waiting it once per test doubled the module's time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.loop import IdleLoop
from gpuwarden.config.root import Config
from gpuwarden.kube import LIVE_PODS, PODS, Informer, KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import GPU_IDS, IDLE_ACK_UNTIL, IDLE_RECLAIMABLE, IDLE_SINCE
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import parse_scenario, start
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, ensure_namespace
from harness.testbed.nodes import delete_nodes
from tests.e2e.conftest import pod_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

NODES = [f"idle-node-{i}" for i in range(2)]
NS = "sim"  # the simulator's workload namespace: the busy pod has the simulator pod's name here
SCALE_NS = "sim-scale"  # the scale-down test's Deployments
WINDOW = 60


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def config(cluster: Cluster, prom_url: str, other: str) -> Config:
    """The idle loop's config for one test; `other` is the other test's namespace, never judged here."""
    return Config.model_validate({
        "prometheus": {"url": prom_url, "retries": 0},
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
        "idle": {"enabled": True, "dry_run": False, "window_seconds": WINDOW, "warmup_seconds": 1,
                 "exclude_namespaces": ["kube-system", other],
                 "scrape_interval_seconds": 1, "evict_after_seconds": 600,
                 "rules": [{"name": "evictable", "match_labels": {"idle": "evict"}, "action": "evict"},
                           {"name": "lendable", "match_labels": {"idle": "prefer"},
                            "action": "prefer-as-victim"}]},
    })  # fmt: skip


@dataclass
class Env:
    cluster: Cluster
    prom: LocalPrometheus
    busy: tuple[str, str, list[int]]  # simulator pod name, node, GPUs
    free: list[tuple[str, int]]
    running_at: float  # monotonic: when every workload of both tests was running

    async def window_passed(self) -> None:
        """Wait until the idle window fits inside every workload's lifetime."""
        await asyncio.sleep(max(0.0, self.running_at + WINDOW + 3 - time.monotonic()))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp_path = tmp_path_factory.mktemp("idle")
    add_gpu_nodes(cluster, [GpuNodeSpec(name=n, gpus=8) for n in NODES])
    ensure_namespace(cluster, NS)
    ensure_namespace(cluster, SCALE_NS)
    scenario = parse_scenario({
        "fleet": {"nodes": len(NODES), "node_name_pattern": "idle-node-{index}"},
        "exporter": {"tick": 0.5},
        "workloads": [{"name": "busy", "namespace": NS, "replicas": 1, "gpus_per_pod": 1, "qps_per_gpu": 10,
                       "load": [{"at": 0, "qps": 8}]}],
    })  # fmt: skip
    sim = await start(scenario)
    prom = LocalPrometheus(
        tmp_path / "prom", [scrape_target("dcgm", f"127.0.0.1:{sim.port}", scrape_interval_seconds=1.0)]
    )
    await prom.start()
    try:
        await prom.wait_for_up("dcgm")
        async with httpx.AsyncClient() as http:
            state = (await http.get(f"{sim.url}/control/state")).json()
        [busy] = [(p["pod"], p["node"], [int(g) for g in p["gpus"]]) for p in state["pods"]]
        used = {(busy[1], g) for g in busy[2]}
        free = sorted({(n, g) for n in NODES for g in range(8)} - used)
        cluster.apply(*report_workloads(busy, free[:5]), *scale_workloads(free[5:7]))
        cluster.kubectl(
            "wait", "--for=jsonpath={.status.phase}=Running", "pod", "--all", "-n", NS, "--timeout=60s"
        )
        cluster.kubectl(
            "rollout", "status", "deployment/serving", "deployment/floored", "-n", SCALE_NS, "--timeout=90s"
        )
        yield Env(cluster, prom, busy, free, time.monotonic())
    finally:
        await prom.stop()
        await sim.stop()
        cluster.kubectl("delete", "pods,pdb", "--all", "-n", NS, "--ignore-not-found", "--wait=false")
        cluster.kubectl(
            "delete", "deployments,hpa,pods", "--all", "-n", SCALE_NS, "--ignore-not-found", "--wait=false"
        )
        delete_nodes(cluster, NODES)


def placed(
    name: str,
    node: str,
    gpus: list[int],
    labels: dict[str, str] | None = None,
    ann: dict[str, str] | None = None,
    namespace: str = NS,
) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=len(gpus), labels={"app": name, **(labels or {})}, nodeName=node)
    annotations = {GPU_IDS: ",".join(map(str, gpus)), **(ann or {})}
    pod["metadata"] |= {"namespace": namespace, "annotations": annotations}
    return pod


def report_workloads(busy: tuple[str, str, list[int]], free: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """The first test's pods (on the busy GPU and five free ones) and the PDB guarding one of them."""
    busy_name, busy_node, busy_gpus = busy
    (n1, g1), (n2, g2), (n3, g3), (n4, g4), (n5, g5) = free
    pods = [
        placed(busy_name, busy_node, busy_gpus),
        placed("notebook", n1, [g1]),
        placed("standby", n2, [g2], ann={IDLE_ACK_UNTIL: rfc3339(time.time() + 3600)}),
        placed("stale-nb", n3, [g3], {"idle": "evict"}, ann={IDLE_SINCE: rfc3339(time.time() - 3600)}),
        placed("guarded-nb", n4, [g4], {"idle": "evict"}, ann={IDLE_SINCE: rfc3339(time.time() - 3600)}),
        placed("lendable-nb", n5, [g5], {"idle": "prefer"}),
    ]
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": NS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded-nb"}}},
    }
    return [pdb, *pods]


async def test_one_pass_reports_idle_leaves_busy_and_acked_and_evicts_by_rule(
    env: Env, cluster: Cluster
) -> None:
    busy_name = env.busy[0]
    await env.window_passed()

    cfg = config(cluster, env.prom.url, SCALE_NS)
    async with (
        PrometheusClient(cfg.prometheus) as prom,
        KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube,
    ):
        informer = Informer(kube, PODS, field_selector=LIVE_PODS)
        watch = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            loop = IdleLoop(cfg, prom, kube, pods=informer, registry=CollectorRegistry())
            leading = asyncio.Event()
            leading.set()
            plan = await loop.run_once(leading)
            await loop.actuator.events.flush()
        finally:
            watch.cancel()

    verdicts = {j.pod.name: (j.verdict, j.acknowledged) for j in plan.judgements if j.pod.namespace == NS}
    assert verdicts == {
        busy_name: (Verdict.BUSY, False),
        "notebook": (Verdict.IDLE, False),
        "standby": (Verdict.IDLE, True),
        "stale-nb": (Verdict.IDLE, False),
        "guarded-nb": (Verdict.IDLE, False),
        "lendable-nb": (Verdict.IDLE, False),
    }, {j.pod.name: j.reason for j in plan.judgements}
    annotations = {p["metadata"]["name"]: p["metadata"].get("annotations") or {}
                   for p in cluster.get_json("pods", "-n", NS)["items"]}  # fmt: skip
    assert IDLE_SINCE in annotations["notebook"] and IDLE_RECLAIMABLE not in annotations["notebook"]
    assert IDLE_SINCE in annotations["lendable-nb"] and annotations["lendable-nb"][IDLE_RECLAIMABLE] == "true"
    assert IDLE_SINCE not in annotations[busy_name] and IDLE_SINCE not in annotations["standby"]
    assert loop.last_result is not None
    assert (loop.last_result.evicted, loop.last_result.blocked) == (["sim/stale-nb"], ["sim/guarded-nb"])
    gone = cluster.get_json("pod", "stale-nb", "-n", NS) if "stale-nb" in annotations else {}
    assert not gone or gone["metadata"].get("deletionTimestamp"), "evicted through the Eviction API"
    assert "guarded-nb" in annotations and not cluster.get_json("pod", "guarded-nb", "-n", NS)[
        "metadata"
    ].get("deletionTimestamp"), "the PodDisruptionBudget holds"
    events = cluster.get_json("events.events.k8s.io", "-n", NS)["items"]
    reasons = {(e["regarding"]["name"], e["reason"]) for e in events}
    assert {
        ("notebook", "GPUIdle"),
        ("stale-nb", "GPUIdlePodEvicted"),
        ("guarded-nb", "GPUIdleEvictionBlocked"),
    } <= reasons, json.dumps(sorted(reasons))


SCALABLE = {"idle": "scale"}


def deployment(name: str, node: str, gpu: int, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    """A Deployment whose pods sit on `node` and record GPU `gpu` (an idle one of the simulator's fleet)."""
    template = placed(name, node, [gpu], labels)
    template["metadata"].pop("name")
    template["metadata"].pop("namespace")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": SCALE_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


def replicas(cluster: Cluster, name: str) -> int:
    return int(cluster.get_json("deployment", name, "-n", SCALE_NS)["spec"]["replicas"])


def scale_workloads(free: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """The second test's two Deployments (two pods each, on one free GPU each) and the HPA flooring one."""
    (n1, g1), (n2, g2) = free
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "floored", "namespace": SCALE_NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "floored"},
            "minReplicas": 2, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }  # fmt: skip
    return [deployment("serving", n1, g1, 2, SCALABLE), deployment("floored", n2, g2, 2, SCALABLE), hpa]


async def test_idle_deployment_is_reported_then_scaled_down_never_below_its_hpa_floor_dry_run_changes_nothing(
    env: Env, cluster: Cluster
) -> None:
    await env.window_passed()

    base = config(cluster, env.prom.url, NS).model_dump()
    base["idle"]["scale_down_after_seconds"] = 30  # idle-since is written as now - window: due at once
    base["idle"]["rules"].insert(0, {"name": "scalable", "match_labels": SCALABLE, "action": "scale-down"})
    cfg = Config.model_validate(base)
    async with (
        PrometheusClient(cfg.prometheus) as prom,
        KubeClient.from_config(kubeconfig=cluster.kubeconfig) as kube,
    ):
        informer = Informer(kube, PODS, field_selector=LIVE_PODS)
        watch = asyncio.create_task(informer.run())
        leading = asyncio.Event()
        leading.set()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)

            def serving_pods() -> list[dict[str, Any]]:
                return [
                    o
                    for o in informer.objects()
                    if (o["metadata"].get("labels") or {}).get("app") == "serving"
                ]

            dry = IdleLoop(cfg, prom, kube, pods=informer, registry=CollectorRegistry(), dry_run=True)
            for _ in range(
                2
            ):  # the second dry pass "remembers" the marks: scale-down due, still nothing written
                await dry.run_once(leading)
            assert dry.last_result is not None and dry.last_result.scaled == [
                f"{SCALE_NS}/Deployment/serving"
            ]
            assert replicas(cluster, "serving") == 2
            assert all(IDLE_SINCE not in (p["metadata"].get("annotations") or {}) for p in serving_pods())

            loop = IdleLoop(cfg, prom, kube, pods=informer, registry=CollectorRegistry())
            await loop.run_once(leading)  # reports
            for _ in range(100):  # the watch brings the annotations the pass wrote
                if all(IDLE_SINCE in (p["metadata"].get("annotations") or {}) for p in serving_pods()):
                    break
                await asyncio.sleep(0.1)
            await loop.run_once(leading)  # scales down
            await loop.actuator.events.flush()
        finally:
            watch.cancel()

    assert [d.target.name for d in loop.last_scale.downs] == ["serving"]
    assert [h.reason for h in loop.last_scale.held] == [
        "HorizontalPodAutoscaler floored keeps minReplicas 2 (the Deployment has 2)"
    ]
    assert replicas(cluster, "serving") == 1 and replicas(cluster, "floored") == 2
    events = cluster.get_json("events.events.k8s.io", "-n", SCALE_NS)["items"]
    reasons = {(e["regarding"]["kind"], e["regarding"]["name"], e["reason"]) for e in events}
    assert {
        ("Deployment", "serving", "GPUIdleScaledDown"),
        ("Deployment", "floored", "GPUIdleScaleDownHeld"),
    } <= reasons, json.dumps(sorted(reasons))
