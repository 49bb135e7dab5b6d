"""Idle detection on shared GPUs, per sharing mode: a GPU held through a replica is idle only when all of it
is (whichever pod dcgm-exporter names on its series), a MIG device is judged on its own instance; what cannot
be resolved joins by pod labels or stays unknown. Tables on the resolution, the join, and the verdict from
raw Node and Pod objects with dcgm-exporter-shaped usage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.gpus.physical import MigPlace
from controller.idle.decide import IdleVerdict as Verdict
from controller.idle.decide import plan_idle, policy_from_config
from controller.idle.query import GpuUsage
from controller.idle.snapshot import GpuReading, Holding, IdlePod, NodeGpus, build_snapshot, holdings, join
from gpuwarden.config.idle import IdleConfig
from gpuwarden.gpusharing import GpuSharing, SharingMode, node_sharing
from gpuwarden.wellknown import GPU_IDS, GPU_IDS_SOURCE, GPU_TOPOLOGY
from gpuwarden.wellknown import parse_time_value as parse_time

A = "GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71"
B = "GPU-7c1f5e9a-0d2b-4c3e-8f6a-1b9d0e2c5a84"
C = "GPU-0a0b0c0d-1e1f-4a2b-8c3d-4e5f6a7b8c9d"
OLD = "2026-12-02T10:00:00Z"
NOW = parse_time("2026-12-02T12:00:00Z") or 0.0
FULL = 60
CFG = IdleConfig(enabled=True)

TIME_SLICED = node_sharing(
    {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    },
    {"nvidia.com/gpu": "8"},
)
MPS = node_sharing(
    {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps"},
    {"nvidia.com/gpu": "4"},
)
MIG_SINGLE = node_sharing(
    {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
    {"nvidia.com/gpu": "14"},
)
MIGS = {"MIG-a1": MigPlace(A, 1), "MIG-a2": MigPlace(A, 2), "MIG-b1": MigPlace(B, 1), "MIG-x": MigPlace("0")}


def pod(name: str, ids: str | None, *, actual: bool = True, gpus: int = 1) -> IdlePod:
    gpu_ids = tuple(ids.split(",")) if ids else None
    return IdlePod("ml", name, f"uid-{name}", "n1", gpus, gpu_ids, parse_time(OLD), actual=actual)


HOLDINGS: list[Any] = [
    ("whole-index", GpuSharing(), pod("p", "0,1", gpus=2), (Holding("0"), Holding("1"))),
    ("whole-uuid", GpuSharing(), pod("p", A), (Holding(A, True),)),
    ("time-slicing-replica", TIME_SLICED, pod("p", f"{A}::2"), (Holding(A, True, "", True),)),
    ("time-slicing-two-replicas-one-gpu", TIME_SLICED, pod("p", f"{A}::0,{A}::3", gpus=2),
     (Holding(A, True, "", True),)),
    ("time-slicing-recorded-set-not-trusted", TIME_SLICED, pod("p", "0", actual=False), None),
    ("mps-replica", MPS, pod("p", f"{B}::1"), (Holding(B, True, "", True),)),
    ("mig-opaque-via-topology", MIG_SINGLE, pod("p", "MIG-a2"), (Holding(A, True, "2"),)),
    ("mig-legacy-names-parent-and-instance", MIG_SINGLE, pod("p", f"MIG-{B}/5/0"), (Holding(B, True, "5"),)),
    ("mig-shared-replica", MIG_SINGLE, pod("p", "MIG-b1::1"), (Holding(B, True, "1", True),)),
    ("mig-opaque-unlisted", MIG_SINGLE, pod("p", "MIG-zz"), None),
    ("mig-instance-not-published", MIG_SINGLE, pod("p", "MIG-x"), None),
    ("no-set", TIME_SLICED, pod("p", None), None),
]  # fmt: skip


@pytest.mark.parametrize(("sharing", "p", "want"), [h[1:] for h in HOLDINGS], ids=[h[0] for h in HOLDINGS])
def test_holdings(sharing: GpuSharing, p: IdlePod, want: tuple[Holding, ...] | None) -> None:
    assert holdings(p, NodeGpus(sharing, MIGS)) == want


def u(gpu: str, peak: float | None, uuid: str = "", inst: str = "", p: str = "", n: int = FULL) -> GpuUsage:
    return GpuUsage("n1", gpu, "ml" if p else "", p, peak, n, None, uuid, inst)


def held(p: IdlePod, sharing: GpuSharing) -> IdlePod:
    from dataclasses import replace

    return replace(p, held=holdings(p, NodeGpus(sharing, MIGS)))


JOINS: list[Any] = [
    ("shared-gpu-read-whole-other-pod-named", held(pod("x", f"{A}::0"), TIME_SLICED),
     [u("0", 40, A, p="y"), u("1", 0, B, p="x")], [GpuReading(A, 40, FULL, shared=True)]),
    ("shared-gpu-series-of-every-sharer-merge", held(pod("x", f"{A}::0"), TIME_SLICED),
     [u("0", 0, A, p="x", n=30), u("0", 55, A, p="y", n=30), u("0", 0, A, n=30)],
     [GpuReading(A, 55, 30, shared=True)]),
    ("whole-uuid-other-pod-is-a-conflict", held(pod("x", A), GpuSharing()), [u("0", 0, A, p="y")],
     [GpuReading(A, 0, FULL, conflict="ml/y")]),
    ("mig-instance-its-own-series", held(pod("m", "MIG-a2"), MIG_SINGLE),
     [u("0", 90, A, "1", p="o"), u("0", 0, A, "2", p="m")], [GpuReading(f"{A} instance 2", 0, FULL)]),
    ("mig-instance-named-for-another-pod", held(pod("m", "MIG-a2"), MIG_SINGLE), [u("0", 0, A, "2", p="o")],
     [GpuReading(f"{A} instance 2", 0, FULL, conflict="ml/o")]),
    ("mig-unresolved-joins-by-pod-labels", held(pod("m", "MIG-zz"), MIG_SINGLE),
     [u("3", 0, C, "7", p="m"), u("3", 80, C, "8", p="o")], [GpuReading("3 instance 7", 0, FULL)]),
    ("recorded-set-on-shared-node-joins-by-pod-labels", held(pod("x", "0", actual=False), TIME_SLICED),
     [u("0", 40, A, p="y")], []),
]  # fmt: skip


@pytest.mark.parametrize(("p", "usage", "want"), [j[1:] for j in JOINS], ids=[j[0] for j in JOINS])
def test_join(p: IdlePod, usage: list[GpuUsage], want: list[GpuReading]) -> None:
    assert list(join([p], usage)[p.key]) == want


# --- the verdict from raw objects ------------------------------------------------------------------
def node_obj(labels: dict[str, str], capacity: dict[str, str], topology: dict[str, Any] | None = None) -> Any:
    ann = {GPU_TOPOLOGY: json.dumps(topology)} if topology else {}
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": ann},
        "status": {"capacity": capacity},
    }


def pod_obj(name: str, ids: str | None, resource: str = "nvidia.com/gpu", kubelet: bool = True) -> Any:
    ann = {GPU_IDS: ids, GPU_IDS_SOURCE: "kubelet" if kubelet else ""} if ids else {}
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}", "annotations": ann},
            "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Running", "startTime": OLD}}  # fmt: skip


SLICED_NODE = node_obj(
    {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    },
    {"nvidia.com/gpu": "8"},
)
MPS_NODE = node_obj(
    {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps"},
    {"nvidia.com/gpu": "4"},
)
MIG_TOPOLOGY = {A: {"uuid": A, "mig": [{"uuid": "MIG-a1", "gi": 1}, {"uuid": "MIG-a2", "gi": 2}]},
                C: {"uuid": C}}  # fmt: skip
MIG_SINGLE_NODE = node_obj(
    {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
    {"nvidia.com/gpu": "7"},
    MIG_TOPOLOGY,
)
MIG_MIXED_NODE = node_obj(
    {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "2", "nvidia.com/mig-1g.10gb.count": "2"},
    {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"},
    MIG_TOPOLOGY,
)
SLICED_PODS = [pod_obj("x", f"{A}::0"), pod_obj("y", f"{A}::1"), pod_obj("z", f"{B}::0")]
MIG = "nvidia.com/mig-1g.10gb"

VERDICTS: list[Any] = [
    ("time-slicing-busy-through-another-sharer", SLICED_NODE, SLICED_PODS,
     [u("0", 40, A, p="y"), u("1", 0, B, p="z")], {"x": Verdict.BUSY, "y": Verdict.BUSY, "z": Verdict.IDLE}),
    ("time-slicing-all-sharers-idle", SLICED_NODE, SLICED_PODS, [u("0", 0, A, p="x"), u("1", 0, B, p="z")],
     {"x": Verdict.IDLE, "y": Verdict.IDLE, "z": Verdict.IDLE}),
    ("time-slicing-per-pod-vgpu-copies-carry-the-device-value", SLICED_NODE, SLICED_PODS,
     [u("0", 35, A, p="x"), u("0", 35, A, p="y"), u("1", 0, B, p="z")],
     {"x": Verdict.BUSY, "y": Verdict.BUSY, "z": Verdict.IDLE}),
    ("time-slicing-no-series-for-the-gpu", SLICED_NODE, SLICED_PODS, [u("1", 0, B, p="z")],
     {"x": Verdict.UNKNOWN, "y": Verdict.UNKNOWN, "z": Verdict.IDLE}),
    ("time-slicing-gappy-window", SLICED_NODE, SLICED_PODS, [u("0", 0, A, p="x", n=20), u("1", 0, B, p="z")],
     {"x": Verdict.UNKNOWN, "y": Verdict.UNKNOWN, "z": Verdict.IDLE}),
    ("time-slicing-without-kubelet-sets-only-the-named-pod-is-judged", SLICED_NODE,
     [pod_obj("x", None), pod_obj("y", None)], [u("0", 0, A, p="y")],
     {"x": Verdict.UNKNOWN, "y": Verdict.IDLE}),
    ("time-slicing-recorded-index-never-read-as-that-gpu", SLICED_NODE, [pod_obj("x", "1", kubelet=False)],
     [u("1", 0, B)], {"x": Verdict.UNKNOWN}),
    ("mps-busy-through-another-sharer", MPS_NODE, [pod_obj("x", f"{A}::0"), pod_obj("y", f"{A}::1")],
     [u("0", 12, A, p="x")], {"x": Verdict.BUSY, "y": Verdict.BUSY}),
    ("mig-single-each-instance-on-its-own", MIG_SINGLE_NODE,
     [pod_obj("m1", "MIG-a1"), pod_obj("m2", "MIG-a2")],
     [u("0", 0, A, "1", p="m1"), u("0", 70, A, "2", p="m2")], {"m1": Verdict.IDLE, "m2": Verdict.BUSY}),
    ("mig-instance-without-its-profiling-field", MIG_SINGLE_NODE, [pod_obj("m1", "MIG-a1")],
     [u("0", 0, A, "2", p="m2")], {"m1": Verdict.UNKNOWN}),
    ("mig-unresolvable-device-joins-by-the-instance-pod-label", MIG_SINGLE_NODE, [pod_obj("m9", "MIG-zz")],
     [u("5", 0, "GPU-other", "3", p="m9")], {"m9": Verdict.IDLE}),
    ("mig-mixed-instances-and-a-whole-gpu", MIG_MIXED_NODE,
     [pod_obj("m1", "MIG-a1", MIG), pod_obj("m2", "MIG-a2", MIG), pod_obj("w", C)],
     [u("0", 0, A, "1", p="m1"), u("0", 50, A, "2", p="m2"), u("1", 0, C, p="w")],
     {"m1": Verdict.IDLE, "m2": Verdict.BUSY, "w": Verdict.IDLE}),
]  # fmt: skip


@pytest.mark.parametrize(("node", "pods", "usage", "want"), [v[1:] for v in VERDICTS],
                         ids=[v[0] for v in VERDICTS])  # fmt: skip
def test_verdict_per_sharing_mode(
    node: Any, pods: list[Any], usage: list[GpuUsage], want: dict[str, Any]
) -> None:
    snap = build_snapshot(pods, usage, resource="nvidia.com/gpu", nodes=[node])
    plan = plan_idle(snap, policy_from_config(CFG), NOW)
    got = {j.pod.name: j.verdict for j in plan.judgements}
    assert got == want, {j.pod.name: j.reason for j in plan.judgements}


def test_a_sharer_busy_through_another_says_so() -> None:
    snap = build_snapshot(
        SLICED_PODS[:1], [u("0", 40, A, p="y")], resource="nvidia.com/gpu", nodes=[SLICED_NODE]
    )
    judgement = plan_idle(snap, policy_from_config(CFG), NOW).judgements[0]
    assert judgement.reason == f"shared GPU {A} (all sharers) peaked at 40%"
    idle = build_snapshot(SLICED_PODS[:1], [u("0", 0, A)], resource="nvidia.com/gpu", nodes=[SLICED_NODE])
    assert "(shared GPUs: every sharer)" in plan_idle(idle, policy_from_config(CFG), NOW).judgements[0].reason


def test_without_nodes_every_node_is_whole_gpus() -> None:
    """`gpuwarden plan` and older wiring give no nodes: a kubelet replica set still names its GPU by UUID."""
    snap = build_snapshot([pod_obj("x", f"{A}::0")], [u("0", 40, A, p="y")], resource="nvidia.com/gpu")
    assert snap.pods[0].held == (Holding(A, True, "", True),)
    assert snap.pods[0].expected == 1
    assert SharingMode.WHOLE is NodeGpus().sharing.mode
