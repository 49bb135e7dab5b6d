"""A REAL Prometheus scrapes the simulator's shared-GPU nodes: every series ingested, dcgm-exporter's shapes.

examples/scenarios/shared.yaml (a whole, a time-sliced, a MIG-single and a MIG-mixed node of 8 GPUs) with
dcgm-exporter's virtual GPUs on, so the scrape carries every shape the simulator makes: MIG instance series,
per-pod copies with `vgpu`, per-process series beside the device series. Prometheus must hold one series per
exposed line (no duplicate label sets), and pods mapped onto replicas and instances through the control API
must show up on the right series, as must an XID attributed to one MIG instance.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector
from harness.localprom import LocalPrometheus, scrape_target
from harness.simulator import RunningSimulator, load_scenario, start

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "shared.yaml"
SLICED, MIG, MIXED = "gpu-node-001", "gpu-node-002", "gpu-node-003"


@dataclass
class Setup:
    sim: RunningSimulator
    prom: LocalPrometheus
    client: PrometheusClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    scenario = load_scenario(SCENARIO)
    scenario = scenario.model_copy(
        update={"exporter": scenario.exporter.model_copy(update={"virtual_gpus": True}), "faults": []}
    )
    sim = await start(scenario, "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        pods = [
            {"namespace": "ml", "pod": "ts-a", "node": SLICED, "gpus": [0], "workload": "ts"},
            {"namespace": "ml", "pod": "ts-b", "node": SLICED, "gpus": [0, 0], "workload": "ts"},
            {"namespace": "ml", "pod": "mig-a", "node": MIG, "gpus": [3], "slots": [1], "workload": "mig"},
        ]
        async with http.post(sim.url + "/control/pods", json={"pods": pods}) as resp:
            assert resp.status == 200, await resp.text()
        fault = {"kind": "xid", "node": MIG, "gpu": 3, "instance": 1, "code": 43}
        async with http.post(sim.url + "/control/faults", json=fault) as resp:
            assert resp.status == 200, await resp.text()
    prom = LocalPrometheus(
        tmp_path_factory.mktemp("prom-shared"),
        scrape_configs=[scrape_target("sim", f"127.0.0.1:{sim.port}")],
        scrape_interval_seconds=1.0,
    )
    try:
        await prom.start()
        await prom.wait_for_up("sim", timeout=30)
        async with prom.client(timeout_seconds=5, retries=0) as client:
            yield Setup(sim, prom, client)
    finally:
        await prom.stop()
        await sim.stop()


async def vector(client: PrometheusClient, promql: str) -> Vector:
    result = await client.query(promql)
    assert isinstance(result, Vector), result
    return result


async def values(setup: Setup, promql: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for s in (await vector(setup.client, promql)).samples]


async def test_the_scrape_is_ingested_whole(setup: Setup) -> None:
    async with aiohttp.ClientSession() as http, http.get(setup.sim.url + "/metrics") as resp:
        body = await resp.text()
    exposed = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    scraped = await values(setup, 'scrape_samples_scraped{job="sim"}')
    assert [v for _, v in scraped] == [exposed]
    held = await values(setup, 'count({job="sim", __name__!~"up|scrape_.+"})')
    assert [v for _, v in held] == [exposed]  # one series per line: no label set exposed twice


async def test_mig_nodes_have_instance_series_and_no_gpu_util(setup: Setup) -> None:
    per_node = await values(setup, 'count by (Hostname) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""})')
    assert sorted((lab["Hostname"], v) for lab, v in per_node) == [(MIG, 56.0), (MIXED, 32.0)]
    util = await values(setup, 'count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-node-00[23]"})')
    assert util == []
    uuids = await values(setup, f'count(count by (UUID) (DCGM_FI_DEV_GPU_TEMP{{Hostname="{MIG}"}}))')
    assert [v for _, v in uuids] == [8.0]  # 56 instance series, 8 physical GPUs


async def test_pods_on_replicas_and_instances_are_on_their_series(setup: Setup) -> None:
    copies = await values(setup, f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname="{SLICED}", gpu="0"}}')
    assert sorted((lab["pod"], lab["vgpu"]) for lab, _ in copies) == [
        ("ts-a", "0"),
        ("ts-b", "1"),
        ("ts-b", "2"),
    ]
    util = await values(setup, f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{SLICED}", gpu="0"}}')
    assert sorted((lab.get("pod", ""), "pod_uid" in lab) for lab, _ in util) == [
        ("", False),  # the device series stays beside the per-pod ones
        ("ts-a", True),
        ("ts-b", True),
        ("ts-b", True),
    ]
    mig = await values(setup, f'DCGM_FI_DEV_FB_FREE{{Hostname="{MIG}", pod="mig-a"}}')
    assert [(lab["gpu"], lab["GPU_I_PROFILE"], lab["GPU_I_ID"]) for lab, _ in mig] == [("3", "1g.10gb", "8")]


async def test_an_xid_on_one_instance_is_on_that_instance_only(setup: Setup) -> None:
    xid = await values(setup, f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{MIG}"}}')
    assert [(lab["gpu"], lab["GPU_I_ID"], lab["err_code"], v) for lab, v in xid] == [("3", "8", "43", 43.0)]
