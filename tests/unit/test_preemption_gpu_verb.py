"""The preempt verb with the GPU model (`PreemptionThrottle.use_gpu_model`), golden payloads in kubernetes
PR #135486 semantics: a candidate node sent without victims gets the victims that free a set the policy
accepts, or is omitted - never returned empty; the scheduler's own victims (chosen by count) are kept, with
GPU holders added when they free no such set; a node we do not model passes unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from controller.extender.metrics import extender_metrics
from controller.extender.server import ExtenderService, add_extender_routes
from controller.gpus.fit import Settings
from controller.preemption.hook import PreemptionThrottle
from gpuwarden.config.root import Config
from gpuwarden.kube import ADDED, SYNCED, WatchEvent
from tests.unit.extender_support import model, node, pod
from tests.unit.preemption_support import RecordSink

GOLDEN = Path(__file__).parent / "golden" / "preemption"
NOW = 1_700_000_000.0
S = Settings(fleet_max_numa_gpus=4)

PODS = [
    # frag: 2 + 2 across the NUMA nodes, 4 free by count (the scheduler would find no victim here)
    pod("a", 2, node="frag", ids="0,1", priority=10),
    pod("b", 2, node="frag", ids="4,5", priority=20),
    # short: 2 free by count; the scheduler's victim d frees 4,5 - no NUMA node gets 4 unless e goes too
    pod("c0", 3, node="short", ids="0,1,2", priority=500),
    pod("d", 2, node="short", ids="4,5", priority=10),
    pod("e", 1, node="short", ids="6", priority=10),
    # enough: the scheduler's victim frees NUMA0: kept exactly as sent
    pod("c", 3, node="enough", ids="0,1,2", priority=10),
    pod("f", 4, node="enough", ids="4,5,6,7", priority=500),
    # vip: only higher-priority pods - no victim can make room: omitted
    pod("v1", 2, node="vip", ids="0,1", priority=900),
    pod("v2", 2, node="vip", ids="4,5", priority=900),
]


async def test_zero_victim_and_count_chosen_candidates_get_topology_aware_victims() -> None:
    m = model([node(n) for n in ("frag", "short", "enough", "vip")], PODS)
    registry = CollectorRegistry()
    t = PreemptionThrottle(Config.model_validate({}), RecordSink(), registry=registry, clock=lambda: NOW)  # type: ignore[arg-type]
    for p in PODS:
        t.observer.on_pod(WatchEvent(ADDED, p))
    t.observer.pods.synced.set()
    t.observer.on_event(WatchEvent(SYNCED, {}))
    t.use_gpu_model(m, lambda: S)
    service = ExtenderService(m, S, extender_metrics(None), preempt_hook=t)
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(
            "/gpu-extender/preempt", data=(GOLDEN / "preempt_args_gpu.json").read_bytes()
        )
        body: Any = await resp.read()
    assert resp.status == 200
    assert body == (GOLDEN / "preempt_result_gpu.json").read_bytes().strip()
    assert b'"Pods":[]' not in body


async def test_without_the_gpu_model_candidates_pass_through_as_before() -> None:
    t = PreemptionThrottle(Config.model_validate({}), RecordSink(), clock=lambda: NOW)  # type: ignore[arg-type]
    t.observer.pods.synced.set()
    t.observer.on_event(WatchEvent(SYNCED, {}))
    service = ExtenderService(model([]), S, extender_metrics(None), preempt_hook=t)
    app = web.Application()
    add_extender_routes(app, service)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(
            "/gpu-extender/preempt", data=(GOLDEN / "preempt_args_gpu.json").read_bytes()
        )
        body = await resp.read()
    expected = (
        b'{"NodeNameToMetaVictims":{"short":{"Pods":[{"UID":"uid-d"}],"NumPDBViolations":0},'
        b'"enough":{"Pods":[{"UID":"uid-c"}],"NumPDBViolations":1},'
        b'"elsewhere":{"Pods":[{"UID":"uid-z"}],"NumPDBViolations":0}}}'
    )
    assert (resp.status, body) == (200, expected)
