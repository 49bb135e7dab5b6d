"""Idle detection on shared GPUs against a REAL Prometheus: dcgm-exporter-shaped history backfilled with
promtool - a time-sliced GPU whose series names one sharer (the exporter's last-wins attribution), per-pod
`vgpu` copies (`KUBERNETES_VIRTUAL_GPUS`) whose utilization sums read 0, per-instance MIG series
(`GPU_I_ID`, `GPU_I_PROFILE`, `UUID` = the parent's) with and without the profiling field - read by the pass's
one query and joined to pods whose kubelet-reported sets are replicas and MIG devices."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.loop import plan_from
from controller.idle.observe import observe_usage
from controller.idle.query import PROF_METRIC, UTIL_METRIC
from gpuwarden.config.root import Config
from gpuwarden.wellknown import GPU_IDS, GPU_IDS_SOURCE, GPU_TOPOLOGY
from harness.localprom import LocalPrometheus, backfill_openmetrics

STEP = 30
MINUTES = 40
A = "GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71"  # time-sliced, busy through sharer y
B = "GPU-7c1f5e9a-0d2b-4c3e-8f6a-1b9d0e2c5a84"  # time-sliced, idle
C = "GPU-0a0b0c0d-1e1f-4a2b-8c3d-4e5f6a7b8c9d"  # time-sliced with KUBERNETES_VIRTUAL_GPUS, no profiling
D = "GPU-5d6e7f80-9a0b-4c1d-8e2f-3a4b5c6d7e8f"  # MIG, three 1g.10gb instances

# (metric, node, gpu index, UUID, extra labels, value)
SERIES: list[tuple[str, str, str, str, dict[str, str], float]] = [
    (PROF_METRIC, "ts", "0", A, {"pod": "y"}, 0.45),  # the exporter names y on GPU A; x shares it
    (PROF_METRIC, "ts", "1", B, {"pod": "z"}, 0.0),
    (UTIL_METRIC, "vg", "0", C, {"pod": "v1"}, 50.0),  # the device series
    (UTIL_METRIC, "vg", "0", C, {"pod": "v1", "vgpu": "0"}, 0.0),  # per-pod sums: 0, PIDs not mapped
    (UTIL_METRIC, "vg", "0", C, {"pod": "v2", "vgpu": "1"}, 0.0),
    (PROF_METRIC, "mig", "0", D, {"pod": "m1", "GPU_I_ID": "1", "GPU_I_PROFILE": "1g.10gb"}, 0.0),
    (PROF_METRIC, "mig", "0", D, {"pod": "m2", "GPU_I_ID": "2", "GPU_I_PROFILE": "1g.10gb"}, 0.7),
    (UTIL_METRIC, "mig", "0", D, {"pod": "m3", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.10gb"}, 0.0),  # not m3's
]


def history(t_end: int) -> str:
    lines: list[str] = []
    for metric in (PROF_METRIC, UTIL_METRIC):
        lines.append(f"# TYPE {metric} gauge")
        for m, node, gpu, uuid, extra, value in SERIES:
            if m != metric:
                continue
            labels = {
                "UUID": uuid,
                "Hostname": node,
                "gpu": gpu,
                "modelName": "NVIDIA H100 80GB HBM3",
                **extra,
            }
            if "pod" in extra:
                labels["namespace"] = "ml"
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            for t in range(t_end - MINUTES * 60, t_end + 1, STEP):
                lines.append(f"{metric}{{{text}}} {value} {t}")
    return "\n".join(lines) + "\n# EOF\n"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, labels: dict[str, str], capacity: dict[str, str], topology: Any = None) -> dict[str, Any]:
    ann = {GPU_TOPOLOGY: json.dumps(topology)} if topology else {}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": ann},
        "status": {"capacity": capacity},
    }


SLICED = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
          "nvidia.com/gpu.sharing-strategy": "time-slicing"}  # fmt: skip
NODES = [
    node("ts", SLICED, {"nvidia.com/gpu": "8"}, {A: {"uuid": A}, B: {"uuid": B}}),
    node("vg", SLICED, {"nvidia.com/gpu": "8"}),
    node(
        "mig",
        {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
        {"nvidia.com/gpu": "3"},
        {D: {"uuid": D, "mig": [{"uuid": f"MIG-d{i}", "gi": i, "profile": "1g.10gb"} for i in (1, 2, 3)]}},
    ),
]


def pod(name: str, node_name: str, ids: str | None, started: float) -> dict[str, Any]:
    ann = {GPU_IDS: ids, GPU_IDS_SOURCE: "kubelet"} if ids else {}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": ann},
        "spec": {"nodeName": node_name,
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        "status": {"phase": "Running", "startTime": rfc3339(started)},
    }  # fmt: skip


def pods(t_end: float) -> list[dict[str, Any]]:
    old = t_end - 3 * 3600
    return [
        pod("x", "ts", f"{A}::0", old),
        pod("y", "ts", f"{A}::1", old),
        pod("z", "ts", f"{B}::0", old),
        pod("v1", "vg", f"{C}::0", old),
        pod("v2", "vg", None, old),  # not reconciled yet: only its vgpu copy names it
        pod("m1", "mig", "MIG-d1", old),
        pod("m2", "mig", "MIG-d2", old),
        pod("m3", "mig", "MIG-d3", old),
    ]


WANT = {
    "ml/x": Verdict.BUSY,  # its GPU is busy through y
    "ml/y": Verdict.BUSY,
    "ml/z": Verdict.IDLE,
    "ml/v1": Verdict.BUSY,  # the device value, not its per-pod 0
    "ml/v2": Verdict.UNKNOWN,  # a per-pod 0 is never read as idle
    "ml/m1": Verdict.IDLE,
    "ml/m2": Verdict.BUSY,
    "ml/m3": Verdict.UNKNOWN,  # DCGM_FI_DEV_GPU_UTIL on a MIG instance is not its utilization
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prom_end(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[LocalPrometheus, int]]:
    workdir = tmp_path_factory.mktemp("prometheus-idle-shared")
    t_end = (int(time.time()) // 3600 - 3) * 3600
    backfill_openmetrics(workdir, history(t_end))
    async with LocalPrometheus(workdir) as prom:
        yield prom, t_end


@pytest.mark.asyncio(loop_scope="module")
async def test_shared_gpus_judged_whole_and_mig_instances_on_their_own(
    prom_end: tuple[LocalPrometheus, int],
) -> None:
    local, t_end = prom_end
    config = Config.model_validate({"idle": {"enabled": True}})
    async with local.client() as prom:
        usage = await observe_usage(prom, config.idle, t_end)
    assert usage is not None
    plan = plan_from(config, pods(t_end), usage, now=t_end, nodes=NODES)
    got = {j.pod.key: j.verdict for j in plan.judgements}
    assert got == WANT, {j.pod.key: j.reason for j in plan.judgements}
    x = next(j for j in plan.judgements if j.pod.key == "ml/x")
    assert x.reason == f"shared GPU {A} (all sharers) peaked at 45%"
    m1 = next(j for j in plan.judgements if j.pod.key == "ml/m1")
    assert m1.reason.startswith("all 1 GPUs under 1%")
    assert sorted(m.pod.key for m in plan.marks) == ["ml/m1", "ml/z"]
