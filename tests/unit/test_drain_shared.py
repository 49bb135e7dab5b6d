"""Drain on shared GPUs, per sharing mode: a quarantined physical GPU moves exactly the pods holding one of
its replicas or MIG devices; what cannot be resolved widens to the node, saying why. Tables on the pure scope,
then the same from raw Node and Pod objects (GFD labels, the topology annotation's MIG devices, the node
agent's kubelet-reported sets)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.drain.observe import build_snapshot
from controller.drain.plan import DrainNode, DrainPod, plan_drains, scope_of
from controller.gpus.physical import MigPlace
from gpuwarden.config.drain import DrainConfig
from gpuwarden.gpusharing import GpuSharing, SharingMode, node_sharing
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import GPU_IDS, GPU_IDS_SOURCE, GPU_TOPOLOGY, QUARANTINE_RECORD, QUARANTINE_TAINT

A = "GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71"
B = "GPU-7c1f5e9a-0d2b-4c3e-8f6a-1b9d0e2c5a84"
C = "GPU-0a0b0c0d-1e1f-4a2b-8c3d-4e5f6a7b8c9d"  # a whole (non-MIG) GPU on the MIG-mixed node
H100 = "NVIDIA-H100-80GB-HBM3"

WHOLE = GpuSharing(SharingMode.WHOLE, 3)
TIME_SLICED = node_sharing(
    {"nvidia.com/gpu.count": "3", "nvidia.com/gpu.replicas": "4",
     "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.product": "Tesla-T4-SHARED"},
    {"nvidia.com/gpu": "12"},
)  # fmt: skip
MPS = node_sharing(
    {"nvidia.com/gpu.count": "3", "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps"},
    {"nvidia.com/gpu": "6"},
)
MIG_SINGLE = node_sharing(
    {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": H100 + "-MIG-1g.10gb"},
    {"nvidia.com/gpu": "14"},
    topology_gpus=2,
)
MIG_MIXED = node_sharing(
    {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "3", "nvidia.com/mig-1g.10gb.count": "7"},
    {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
)
MIGS = {"MIG-a1": MigPlace(A, 1), "MIG-a2": MigPlace(A, 2), "MIG-b1": MigPlace(B, 1)}
UUID_TOPOLOGY = {A: A, B: B, C: C}


def test_the_modes_are_what_gfd_says() -> None:
    modes = [s.mode for s in (WHOLE, TIME_SLICED, MPS, MIG_SINGLE, MIG_MIXED)]
    assert modes == list(SharingMode)


def pod(name: str, ids: str | None, *, actual: bool = True, gpus: int = 1) -> DrainPod:
    return DrainPod("ml", name, f"uid-{name}", tuple(ids.split(",")) if ids else None, gpus, actual=actual)


def node(
    sharing: GpuSharing,
    fault: str,
    topology: dict[str, str] | None = None,
    migs: dict[str, MigPlace] | None = None,
) -> DrainNode:
    return DrainNode(
        "n1",
        frozenset({fault}),
        UUID_TOPOLOGY if topology is None else topology,
        migs=MIGS if migs is None else migs,
        sharing=sharing,
    )


INDEX_TOPOLOGY = {A: "0", B: "1"}
SLICED_PODS = [
    pod("x", f"{A}::0"), pod("y", f"{A}::3"), pod("z", f"{B}::1"), pod("w", f"{B}::0,{A}::2", gpus=2),
]  # fmt: skip
MIG_PODS = [pod("m1", "MIG-a1"), pod("m2", "MIG-a2"), pod("m3", "MIG-b1")]

SCOPES: list[Any] = [
    ("whole-uuid-ids", node(WHOLE, A), [pod("a", A), pod("b", B)], "gpu", ["a"], ""),
    ("whole-index-ids", node(WHOLE, A, INDEX_TOPOLOGY), [pod("a", "0"), pod("b", "1")], "gpu", ["a"], ""),
    ("whole-recorded-set-trusted", node(WHOLE, A, INDEX_TOPOLOGY), [pod("a", "0", actual=False)], "gpu",
     ["a"], ""),
    ("time-slicing-holders-of-the-faulty-gpu", node(TIME_SLICED, A), SLICED_PODS, "gpu", ["x", "y", "w"], ""),
    ("time-slicing-other-gpu-stays", node(TIME_SLICED, B), SLICED_PODS, "gpu", ["z", "w"], ""),
    ("time-slicing-index-replicas", node(TIME_SLICED, B, INDEX_TOPOLOGY),
     [pod("x", "0::1"), pod("z", "1::0")], "gpu", ["z"], ""),
    ("time-slicing-recorded-set-is-a-wish", node(TIME_SLICED, B),
     [pod("x", f"{A}::0"), pod("r", A, actual=False)], "node", ["x", "r"],
     "ml/r: no kubelet-reported set on a time-slicing node"),
    ("mps-holders-of-the-faulty-gpu", node(MPS, B), [pod("x", f"{A}::0"), pod("z", f"{B}::1")], "gpu", ["z"],
     ""),
    ("mig-single-opaque-uuids-via-topology", node(MIG_SINGLE, B), MIG_PODS, "gpu", ["m3"], ""),
    ("mig-single-every-instance-of-the-gpu", node(MIG_SINGLE, A), MIG_PODS, "gpu", ["m1", "m2"], ""),
    ("mig-single-legacy-uuids", node(MIG_SINGLE, A, migs={}),
     [pod("l1", f"MIG-{A}/7/0"), pod("l2", f"MIG-{B}/7/0")], "gpu", ["l1"], ""),
    ("mig-shared-replica", node(MIG_SINGLE, B), [pod("s", "MIG-b1::3"), *MIG_PODS[:1]], "gpu", ["s"], ""),
    ("mig-mixed-whole-gpu-beside-instances", node(MIG_MIXED, C), [*MIG_PODS, pod("whole", C)], "gpu",
     ["whole"], ""),
    ("mig-mixed-faulty-mig-gpu", node(MIG_MIXED, A), [*MIG_PODS, pod("whole", C)], "gpu", ["m1", "m2"], ""),
    ("opaque-mig-unresolvable-widens", node(MIG_SINGLE, B), [*MIG_PODS, pod("u", "MIG-zz")], "node",
     ["m1", "m2", "m3", "u"], "ml/u holds MIG-zz: an opaque MIG UUID"),
    ("mig-devices-not-published-widen", node(MIG_SINGLE, B, migs={}), MIG_PODS, "node",
     ["m1", "m2", "m3"], "ml/m1 holds MIG-a1: an opaque MIG UUID"),
    ("unknown-set-widens", node(TIME_SLICED, A), [pod("x", f"{B}::0"), pod("n", None)], "node", ["x", "n"],
     "ml/n holds GPUs no set names"),
    ("index-not-in-topology-widens", node(WHOLE, A, INDEX_TOPOLOGY), [pod("a", "0"), pod("b", "5")], "node",
     ["a", "b"], "ml/b holds 5: names no GPU"),
    ("faulty-gpu-outside-topology-index-ids-widen", node(WHOLE, C, INDEX_TOPOLOGY), [pod("a", "0")], "node",
     ["a"], f"faulty GPU {C} is not in the node's topology"),
    ("faulty-gpu-outside-topology-uuid-ids-exact", node(WHOLE, C, {}), [pod("a", A), pod("c", C)], "gpu",
     ["c"], ""),
]  # fmt: skip


@pytest.mark.parametrize(("n", "pods", "scope", "moved", "note"), [s[1:] for s in SCOPES],
                         ids=[s[0] for s in SCOPES])  # fmt: skip
def test_scope_per_sharing_mode(
    n: DrainNode, pods: list[DrainPod], scope: str, moved: list[str], note: str
) -> None:
    got = scope_of(n, pods)
    assert (got.scope, [p.name for p in got.pods]) == (scope, moved)
    assert got.note.startswith(note) and (bool(note) or not got.note), got.note


# --- from raw objects --------------------------------------------------------------------------------
TAINT = {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
POLICY = DrainConfig.model_validate({"enabled": True})


def node_obj(labels: dict[str, str], capacity: dict[str, str], topology: dict[str, Any], fault: str) -> Any:
    ev = Evidence("xid-79", gpu=fault, xid=79)
    record = QuarantineRecord("quarantined", ev.reason, evidence=(ev,))
    annotations = {GPU_TOPOLOGY: json.dumps(topology), QUARANTINE_RECORD: record.encode()}
    return {"metadata": {"name": "n1", "labels": labels, "annotations": annotations},
            "spec": {"taints": [TAINT]},
            "status": {"capacity": capacity, "allocatable": capacity}}  # fmt: skip


def pod_obj(name: str, resource: str, ids: str | None, *, kubelet: bool = True) -> Any:
    ann = {GPU_IDS: ids, GPU_IDS_SOURCE: "kubelet"} if ids and kubelet else {GPU_IDS: ids} if ids else {}
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}", "annotations": ann},
            "spec": {"nodeName": "n1",
                     "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def evicted(nodes: list[Any], pods: list[Any]) -> list[str]:
    snap = build_snapshot(nodes, pods, resource="nvidia.com/gpu")
    plan = plan_drains(snap.nodes, snap.pods_by_node, POLICY, 1000.0, evictions_last_minute=0, gpu_nodes=10,
                       schedulable_gpu_nodes=10)  # fmt: skip
    return [a.pod.name for n in plan.nodes for a in n.actions]


def test_time_sliced_node_moves_only_the_replicas_of_the_faulty_gpu() -> None:
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/gpu.sharing-strategy": "time-slicing"}  # fmt: skip
    n = node_obj(labels, {"nvidia.com/gpu": "8"}, {A: {"uuid": A}, B: {"uuid": B}}, B)
    pods = [pod_obj("on-a", "nvidia.com/gpu", f"{A}::1"), pod_obj("on-b", "nvidia.com/gpu", f"{B}::3")]
    snap = build_snapshot([n], pods, resource="nvidia.com/gpu")
    assert snap.nodes[0].sharing.mode is SharingMode.TIME_SLICING and snap.nodes[0].sharing.physical == 2
    assert all(p.actual for p in snap.pods_by_node["n1"])
    assert evicted([n], pods) == ["on-b"]
    # the same set recorded by someone else than the kubelet is a wish on a shared node: the whole node
    wish = [pod_obj("on-a", "nvidia.com/gpu", f"{A}::1", kubelet=False), pods[1]]
    assert evicted([n], wish) == ["on-a", "on-b"]


def test_renamed_shared_resource_counts_as_a_gpu_pod() -> None:
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "2",
              "nvidia.com/gpu.sharing-strategy": "time-slicing"}  # fmt: skip
    n = node_obj(labels, {"nvidia.com/gpu.shared": "4"}, {A: {"uuid": A}, B: {"uuid": B}}, A)
    pods = [
        pod_obj("on-a", "nvidia.com/gpu.shared", f"{A}::0"),
        pod_obj("on-b", "nvidia.com/gpu.shared", f"{B}::0"),
    ]
    assert evicted([n], pods) == ["on-a"]


def test_mig_mixed_node_moves_the_instances_of_the_faulty_gpu_through_the_published_mig_devices() -> None:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "3",
        "nvidia.com/mig-1g.10gb.count": "4",
    }
    topology = {
        A: {
            "uuid": A,
            "mig": [{"uuid": "MIG-a1", "gi": 1, "profile": "1g.10gb"}, {"uuid": "MIG-a2", "gi": 2}],
        },
        B: {"uuid": B, "mig": [{"uuid": "MIG-b1", "gi": 1}]},
        C: {"uuid": C},
    }
    n = node_obj(labels, {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "4"}, topology, A)
    mig = "nvidia.com/mig-1g.10gb"
    pods = [pod_obj("a1", mig, "MIG-a1"), pod_obj("a2", mig, "MIG-a2"), pod_obj("b1", mig, "MIG-b1"),
            pod_obj("whole", "nvidia.com/gpu", C)]  # fmt: skip
    snap = build_snapshot([n], pods, resource="nvidia.com/gpu")
    assert snap.nodes[0].sharing.mode is SharingMode.MIG_MIXED
    assert snap.nodes[0].migs["MIG-b1"] == MigPlace(B, 1)
    assert snap.gpu_nodes == 1  # offered only MIG devices and one GPU: a GPU node for the gate's floor
    assert evicted([n], pods) == ["a1", "a2"]
    # a MIG pod the node agent has not reconciled yet (no set): unknown, so every GPU pod of the node
    assert evicted([n], [*pods, pod_obj("new", "nvidia.com/mig-1g.10gb", None)]) == [
        "a1",
        "a2",
        "b1",
        "new",
        "whole",
    ]
