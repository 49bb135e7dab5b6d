"""The gpu_utilization preset on shared GPUs, against a REAL Prometheus with dcgm-exporter-shaped series.

The series are the fleet simulator's (harness/simulator, dcgm-exporter's shapes per reference/gpu-sharing.md
section 4), rendered once and backfilled with promtool for ten minutes ending at T; the adapter's clock is
pinned to T. Four nodes, each one way of sharing, pods in namespace `ml`, 100 QPS = one busy GPU:

- n0, whole GPUs: `whole-0` on GPU 0 at 40 %.
- n1, time-sliced, dcgm-exporter's default attribution: `ts-a` and `ts-b` on replicas of GPU 0 at 30 % each;
  the GPU's one series (60 %) names the pod mapped last, `ts-b`; `ts-a` has no series, so no value.
- n2, MIG single (7 x 1g.10gb): `mig-a` (GPU 0) and `mig-b` (GPU 1) on one instance each, 3 % of a GPU's
  work = 21 % of a 1/7 instance; no DCGM_FI_DEV_GPU_UTIL there, DCGM_FI_PROF_GR_ENGINE_ACTIVE 0.1995.
- n3, time-sliced with KUBERNETES_VIRTUAL_GPUS: `tv-a`, `tv-b` (25 % each) and `tv-c` (10 % per replica) share
  GPU 0, and `tv-c` holds two replicas of GPU 1 too: per-pod copies (`vgpu`), the device series kept beside
  the per-process DCGM_FI_DEV_GPU_UTIL of each pod.

Expected values are worked out by hand from those loads. The same answers come from one grouped query per
namespace (cache mode) and per request.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from adapter.app import Adapter
from adapter.objects import LabelIndex
from adapter.resources import NODES, PODS
from gpuwarden.config.root import Config
from harness.localprom import LocalPrometheus, backfill_openmetrics
from harness.simulator.exposition import Renderer
from harness.simulator.fleet import Fleet, PodSpec
from harness.simulator.scenario import parse_scenario

pytestmark = pytest.mark.asyncio(loop_scope="module")

STEP, POINTS = 15, 41
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
FAMILIES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
)
WORKLOADS = {"whole": 40, "ts": 60, "tv": 50, "tv2": 30, "mig": 6}  # QPS per workload
PODS_ON = [  # (pod, workload, node, gpus, slots)
    ("whole-0", "whole", "n0", (0,), None),
    ("ts-a", "ts", "n1", (0,), None),
    ("ts-b", "ts", "n1", (0,), None),
    ("mig-a", "mig", "n2", (0,), (0,)),
    ("mig-b", "mig", "n2", (1,), (3,)),
    ("tv-a", "tv", "n3", (0,), None),
    ("tv-b", "tv", "n3", (0,), None),
    ("tv-c", "tv2", "n3", (0, 1, 1), None),
]


def fleet(virtual_gpus: bool) -> Fleet:
    doc = {
        "fleet": {
            "nodes": 4,
            "gpus_per_node": 2,
            "node_name_pattern": "n{index}",
            "node_sharing": {
                "n1": {"mode": "time-slicing", "replicas": 4},
                "n2": {"mode": "mig-single"},
                "n3": {"mode": "time-slicing", "replicas": 4},
            },
        },
        "exporter": {"virtual_gpus": virtual_gpus},
        "workloads": [
            {"name": w, "namespace": "ml", "replicas": 0, "qps_per_gpu": 100, "load": [{"at": 0, "qps": q}]}
            for w, q in WORKLOADS.items()
        ],
    }
    f = Fleet(parse_scenario(doc), start=0.0)
    f.set_pods([PodSpec("ml", p, n, g, w, slots=s) for p, w, n, g, s in PODS_ON], replace=False)
    return f


def exposition_lines() -> dict[str, list[str]]:
    """Family -> `name{labels} value` lines: nodes n0-n2 as the default exporter, n3 with virtual GPUs."""
    out: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for virtual, nodes in ((False, ("n0", "n1", "n2")), (True, ("n3",))):
        renderer = Renderer(fleet(virtual))
        for node in nodes:
            for line in renderer.render(node=node, apps=False).splitlines():
                name = line.split("{", 1)[0]
                if name in out:
                    out[name].append(line)
    return out


def history(t_end: int) -> str:
    text: list[str] = []
    for name, lines in exposition_lines().items():
        text.append(f"# TYPE {name} gauge")
        for i in range(POINTS):
            ts = t_end - (POINTS - 1 - i) * STEP
            text += [f"{line} {ts}" for line in lines]
    return "\n".join(text) + "\n# EOF\n"


async def test_the_series_have_dcgm_exporters_shapes() -> None:
    lines = exposition_lines()
    util = lines["DCGM_FI_DEV_GPU_UTIL"]
    assert not any('Hostname="n2"' in line for line in util)  # MIG: no GPU_UTIL
    assert all(
        "GPU_I_ID=" in line for line in lines["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] if 'Hostname="n2"' in line
    )
    assert sum('pod="ts-' in line for line in util) == 1  # one pod per time-sliced GPU series
    assert sum('Hostname="n3"' in line and "pod=" not in line for line in util) == 2  # device series kept
    assert sum('pod="tv-c"' in line and "vgpu=" in line for line in util) == 3  # one per replica


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backfilled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalPrometheus, int]]:
    workdir = tmp_path_factory.mktemp("shared-gpus-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield prom, t_end


def label_index() -> LabelIndex:
    index = LabelIndex([PODS, NODES])
    for pod, workload, *_ in PODS_ON:
        index.upsert(PODS, "ml", pod, {"app": workload})
    for node in ("n0", "n1", "n2", "n3"):
        index.upsert(NODES, "", node, {})
    index.mark_synced(PODS)
    index.mark_synced(NODES)
    return index


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="module",
    params=[
        ("cache", "DCGM_FI_DEV_GPU_UTIL"),
        ("per_request", "DCGM_FI_DEV_GPU_UTIL"),
        ("cache", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ],
    ids=["cache", "per-request", "gr-engine-source"],
)
async def client(
    request: pytest.FixtureRequest, backfilled: tuple[LocalPrometheus, int]
) -> AsyncIterator[TestClient[Any, Any]]:
    prom, t_end = backfilled
    mode, source = request.param
    config = Config.model_validate(
        {
            "prometheus": {"url": prom.url, "retries": 0},
            "adapter": {
                "authentication": {"enabled": False},
                "cache": {"mode": mode},
                "metrics_max_age_seconds": 900,
                "presets": {"gpu_utilization": {"source": source}},
            },
        }
    )
    adapter = Adapter(config, index=label_index(), clock=lambda: float(t_end))
    assert await adapter.discovery.relist()
    app = await adapter.start()
    async with TestClient(TestServer(app)) as c:
        c.source = source  # type: ignore[attr-defined]
        yield c
    await adapter.stop()


async def values(client: TestClient[Any, Any], path: str) -> dict[str, float]:
    response = await client.get(path)
    body: dict[str, Any] = await response.json()
    assert response.status == 200, body
    return {item["describedObject"]["name"]: quantity(item["value"]) for item in body["items"]}


def quantity(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


GR = 0.95  # the simulator's DCGM_FI_PROF_GR_ENGINE_ACTIVE is 0.95 x utilization / 100

# pod -> gpu_utilization (percent) per source, worked out from the loads in the module docstring
PER_POD = {
    "DCGM_FI_DEV_GPU_UTIL": {
        "whole-0": 40.0,
        "ts-b": 60.0,  # the whole GPU's utilization: dcgm-exporter named only ts-b on it
        "mig-a": 21 * GR,  # MIG: GR_ENGINE_ACTIVE x 100 of the pod's instance
        "mig-b": 21 * GR,
        "tv-a": 25.0,  # virtual GPUs: each pod's own processes (per-process GPU_UTIL)
        "tv-b": 25.0,
        "tv-c": 15.0,  # (10 on GPU 0 + 20 on GPU 1, listed twice) / 2 devices, not / 3 copies
    },
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": {
        "whole-0": 40 * GR,
        "ts-b": 60 * GR,
        "mig-a": 21 * GR,
        "mig-b": 21 * GR,
        "tv-a": 60 * GR,  # GR_ENGINE_ACTIVE is not split per process: each copy carries the device's
        "tv-b": 60 * GR,
        "tv-c": (60 + 20) * GR / 2,
    },
}


async def test_per_pod_utilization_on_every_kind_of_gpu(client: TestClient[Any, Any]) -> None:
    got = await values(client, f"{CUSTOM}/namespaces/ml/pods/*/gpu_utilization")
    want = PER_POD[client.source]  # type: ignore[attr-defined]
    assert got == pytest.approx(want, abs=1e-3)
    assert "ts-a" not in got  # shares GPU 0 of n1 with ts-b, but no series names it


async def test_single_pods_and_label_selectors(client: TestClient[Any, Any]) -> None:
    want = PER_POD[client.source]  # type: ignore[attr-defined]
    got = await values(client, f"{CUSTOM}/namespaces/ml/pods/mig-b/gpu_utilization")
    assert got == pytest.approx({"mig-b": want["mig-b"]}, abs=1e-3)
    got = await values(client, f"{CUSTOM}/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3Dtv2")
    assert got == pytest.approx({"tv-c": want["tv-c"]}, abs=1e-3)


async def test_per_node_utilization_counts_each_device_once(client: TestClient[Any, Any]) -> None:
    got = await values(client, f"{CUSTOM}/nodes/*/gpu_utilization")
    scale = 1.0 if client.source == "DCGM_FI_DEV_GPU_UTIL" else GR  # type: ignore[attr-defined]
    assert got == pytest.approx(
        {
            "n0": 40 * scale / 2,
            "n1": 60 * scale / 2,
            "n2": 21 * GR * 2 / 14,  # 14 instances, two of them busy
            "n3": (60 + 20) * scale / 2,  # the device series and the per-pod copies are one device each
        },
        abs=1e-3,
    )


USABLE, POD_MIB, MIG_MIB = 81004, 16384, 9984  # an H100's framebuffer (MiB), a pod's, a 1g.10gb instance's


async def test_per_pod_memory_ratio_on_every_kind_of_gpu(client: TestClient[Any, Any]) -> None:
    got = await values(client, f"{CUSTOM}/namespaces/ml/pods/*/gpu_memory_used_ratio")
    shared_free = USABLE - 3 * POD_MIB  # n3 GPU 0: tv-a, tv-b and one replica of tv-c
    assert got == pytest.approx(
        {
            "whole-0": POD_MIB / USABLE,
            "ts-b": 2 * POD_MIB / USABLE,  # the whole GPU's framebuffer: both pods' memory
            "mig-a": MIG_MIB / MIG_MIB,  # the instance is full
            "mig-b": MIG_MIB / MIG_MIB,
            # virtual GPUs: the pod's own processes' memory over that plus what the GPU has free
            "tv-a": POD_MIB / (POD_MIB + shared_free),
            "tv-b": POD_MIB / (POD_MIB + shared_free),
            "tv-c": 2 * POD_MIB / USABLE,  # its fullest device: GPU 1, both replicas its own
        },
        abs=1e-3,
    )
