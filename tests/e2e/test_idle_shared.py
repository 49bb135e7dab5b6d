"""Idle reclaim on shared GPUs end to end: real control plane, kwok nodes built here with GPU feature
discovery's labels (a time-sliced node; a MIG-single node whose MIG devices are in the topology
annotation), dcgm-exporter-shaped series scraped by a real Prometheus, and the idle loop's pass against the
real API server.

The series are dcgm-exporter's shapes on shared GPUs (a static exposition served here: the fleet
simulator's shared-GPU series are another piece of work): one series per time-sliced GPU naming one sharer
(the exporter's last-wins attribution), one series per MIG instance (`GPU_I_ID`, `UUID` = the parent's)
naming its holder. Every pod was reported idle an hour ago and its rule says evict. One pass evicts the
sharer of the idle GPU and the holder of the idle instance, and never the pod whose GPU another sharer keeps
busy, though the exporter names that other sharer, not it, on the GPU's series.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.loop import IdleLoop
from gpuwarden import ports
from gpuwarden.config.root import Config
from gpuwarden.kube import LIVE_PODS, NODES, PODS, Informer, KubeClient
from gpuwarden.promclient import PrometheusClient
from gpuwarden.wellknown import GPU_IDS, GPU_IDS_SOURCE, GPU_IDS_SOURCE_KUBELET, IDLE_SINCE
from harness.localprom import LocalPrometheus, scrape_target
from harness.testbed import Cluster, GpuNodeSpec, add_gpu_nodes, delete_nodes, ensure_namespace
from tests.e2e.conftest import pod_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

POOL = f"is-{uuid.uuid4().hex[:5]}"
NS = f"{POOL}-work"
SLICED, MIG = f"{POOL}-sliced", f"{POOL}-mig"
POOL_TAINT = {"key": "gpuwarden.io/e2e-pool", "value": POOL, "effect": "NoSchedule"}
WINDOW = 60


def gpu_uuid(node: str, g: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}')}"


def mig_uuid(node: str, g: int, gi: int) -> str:
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{g}/{gi}')}"


A, B, D = gpu_uuid(SLICED, 0), gpu_uuid(SLICED, 1), gpu_uuid(MIG, 0)
# pod -> (node, kubelet device IDs)
HOLDINGS = {
    "ts-x": (SLICED, f"{A}::0"),  # shares GPU A with ts-y, which keeps it busy
    "ts-y": (SLICED, f"{A}::1"),
    "ts-z": (SLICED, f"{B}::0"),  # GPU B: idle
    "mig-1": (MIG, mig_uuid(MIG, 0, 1)),  # instance 1: idle
    "mig-2": (MIG, mig_uuid(MIG, 0, 2)),  # instance 2: busy
}
# dcgm-exporter's series: (node, gpu index, UUID, GPU_I_ID, the pod it names, GR_ENGINE_ACTIVE)
SERIES = [
    (SLICED, "0", A, "", "ts-y", 0.45),
    (SLICED, "1", B, "", "ts-z", 0.0),
    (MIG, "0", D, "1", "mig-1", 0.0),
    (MIG, "0", D, "2", "mig-2", 0.7),
]


def exposition() -> str:
    lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"]
    for node, gpu, uid, gi, pod, value in SERIES:
        labels = {"gpu": gpu, "UUID": uid, "Hostname": node, "modelName": "NVIDIA H100 80GB HBM3",
                  "namespace": NS, "pod": pod, "container": "main",
                  **({"GPU_I_ID": gi, "GPU_I_PROFILE": "1g.10gb"} if gi else {})}  # fmt: skip
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{text}}} {value}")
    return "\n".join(lines) + "\n"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Env:
    cluster: Cluster
    prom: LocalPrometheus
    running_at: float


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    sliced = GpuNodeSpec(
        name=SLICED, gpus=8, gpu_product="Tesla-T4-SHARED", taints=[POOL_TAINT],
        labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        topology={u: {"numa": 0, "uuid": u} for u in (A, B)},
    )  # fmt: skip
    mig = GpuNodeSpec(
        name=MIG, gpus=2, gpu_product="NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", taints=[POOL_TAINT],
        labels={"nvidia.com/mig.strategy": "single"},
        topology={D: {"numa": 0, "uuid": D, "mig": [{"uuid": mig_uuid(MIG, 0, gi), "gi": gi, "ci": 0}
                                                      for gi in (1, 2)]}},
    )  # fmt: skip
    add_gpu_nodes(cluster, [sliced, mig])
    ensure_namespace(cluster, NS)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=exposition())

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = ports.free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    tmp = tmp_path_factory.mktemp("idle-shared")
    prom = LocalPrometheus(
        tmp / "prom", [scrape_target("dcgm", f"127.0.0.1:{port}", scrape_interval_seconds=1.0)]
    )
    await prom.start()
    try:
        await prom.wait_for_up("dcgm")
        pods = []
        for name, (node, ids) in HOLDINGS.items():
            p = pod_manifest(name, gpus=1, labels={"app": name, "idle": "evict"}, nodeName=node,
                             tolerations=[{"operator": "Exists"}])  # fmt: skip
            p["metadata"] |= {
                "namespace": NS,
                "annotations": {
                    GPU_IDS: ids,
                    GPU_IDS_SOURCE: GPU_IDS_SOURCE_KUBELET,
                    IDLE_SINCE: rfc3339(time.time() - 3600),
                },
            }
            pods.append(p)
        cluster.apply(*pods)
        cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Running", "pod", "--all", "-n", NS,
                        "--timeout=60s")  # fmt: skip
        yield Env(cluster, prom, time.monotonic())
    finally:
        await prom.stop()
        await runner.cleanup()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, [SLICED, MIG])


def config(cluster: Cluster, prom_url: str) -> Config:
    return Config.model_validate({
        "prometheus": {"url": prom_url, "retries": 0},
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
        "idle": {"enabled": True, "dry_run": False, "window_seconds": WINDOW, "warmup_seconds": 1,
                 "scrape_interval_seconds": 1, "evict_after_seconds": 600, "max_evictions_per_hour": 20,
                 "rules": [{"name": "shared", "namespaces": [NS], "match_labels": {"idle": "evict"},
                            "action": "evict"},
                           {"name": "not-this-test", "action": "ignore"}]},
    })  # fmt: skip


async def test_idle_reclaim_never_evicts_a_pod_whose_gpu_another_sharer_keeps_busy(env: Env) -> None:
    await asyncio.sleep(max(0.0, env.running_at + WINDOW + 3 - time.monotonic()))
    cfg = config(env.cluster, env.prom.url)
    async with (
        PrometheusClient(cfg.prometheus) as prom,
        KubeClient.from_config(kubeconfig=env.cluster.kubeconfig) as kube,
    ):
        pods = Informer(kube, PODS, field_selector=LIVE_PODS)
        nodes = Informer(kube, NODES)
        watches = [asyncio.create_task(pods.run()), asyncio.create_task(nodes.run())]
        try:
            loop = IdleLoop(cfg, prom, kube, pods=pods, nodes=nodes, registry=CollectorRegistry())
            await asyncio.wait_for(loop.wait_ready(), 30)
            leading = asyncio.Event()
            leading.set()
            plan = await loop.run_once(leading)
            await loop.actuator.events.flush()
        finally:
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)

    got = {j.pod.name: j.verdict for j in plan.judgements if j.pod.namespace == NS}
    reasons: dict[str, Any] = {j.pod.name: j.reason for j in plan.judgements if j.pod.namespace == NS}
    assert got == {"ts-x": Verdict.BUSY, "ts-y": Verdict.BUSY, "ts-z": Verdict.IDLE, "mig-1": Verdict.IDLE,
                   "mig-2": Verdict.BUSY}, reasons  # fmt: skip
    assert reasons["ts-x"] == f"shared GPU {A} (all sharers) peaked at 45%"
    assert loop.last_result is not None
    assert sorted(loop.last_result.evicted) == [f"{NS}/mig-1", f"{NS}/ts-z"]
    left = {p["metadata"]["name"]: p["metadata"] for p in env.cluster.get_json("pods", "-n", NS)["items"]}
    for name in ("ts-x", "ts-y", "mig-2"):
        assert not left[name].get("deletionTimestamp"), name  # still running ...
        assert IDLE_SINCE not in (left[name].get("annotations") or {}), name  # ... and no longer reported
    for name in ("ts-z", "mig-1"):
        assert name not in left or left[name].get("deletionTimestamp"), name
