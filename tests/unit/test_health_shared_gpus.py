"""Health on shared GPUs: the baseline is physical GPUs, never the replicas or MIG instances advertised.

One row per sharing mode (gpuwarden.gpusharing) through the real decision (`plan_quarantine`), with the node
parsed from Node JSON as the observer parses it (`observe.node_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller.health.decide import plan_quarantine
from controller.health.observe import node_state
from controller.health.policy import HealthPolicy
from controller.health.snapshot import FleetSnapshot, NodeState
from gpuwarden.quarantine import decode
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from tests.unit.test_health_fixtures import NOW, node

H100 = "NVIDIA-H100-80GB-HBM3"
TIME_SLICED = {
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.product": H100 + "-SHARED",
}
MPS = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps"}
MIG_SINGLE = {
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.count": "56",
    "nvidia.com/gpu.product": H100 + "-MIG-1g.10gb",
}
MIG_MIXED = {
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/mig-1g.10gb.count": "56",
}
TOPOLOGY = '{"gpus": [' + ", ".join(f'{{"id": "{i}", "numa": {i // 4}}}' for i in range(8)) + "]}"


def shaped(
    labels: dict[str, str],
    capacity: dict[str, str],
    *,
    reporting: int = 8,
    annotations: dict[str, str] | None = None,
    **kw: Any,
) -> NodeState:
    """A node as observe builds it from its Node object, with `reporting` GPUs in DCGM."""
    obj = {
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations or {}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }
    parsed = node_state(obj)
    telemetry = node(gpus=reporting, **kw)
    return replace(telemetry, labels=parsed.labels, gpu_capacity=parsed.gpu_capacity, sharing=parsed.sharing)


@dataclass
class Row:
    id: str
    node: NodeState
    expect: set[str] = field(default_factory=set)


ROWS = [
    Row("whole-8-of-8-healthy", shaped({}, {"nvidia.com/gpu": "8"})),
    Row("whole-7-of-8-missing", shaped({}, {"nvidia.com/gpu": "8"}, reporting=7), {"quarantine:gpu-missing"}),
    Row("time-sliced-8x4-all-reporting-healthy", shaped(TIME_SLICED, {"nvidia.com/gpu": "32"})),
    Row(
        "time-sliced-7-of-8-missing",
        shaped(TIME_SLICED, {"nvidia.com/gpu": "32"}, reporting=7),
        {"quarantine:gpu-missing"},
    ),
    Row(
        "time-sliced-renamed-shared-healthy",
        shaped(TIME_SLICED, {"nvidia.com/gpu.shared": "32", "nvidia.com/gpu": "0"}),
    ),
    Row("mps-8x2-healthy", shaped(MPS, {"nvidia.com/gpu": "16"})),
    Row("mig-single-56-instances-healthy", shaped(MIG_SINGLE, {"nvidia.com/gpu": "56"})),
    Row(
        "mig-single-physical-unknown-judges-no-gpu-missing",
        shaped(MIG_SINGLE, {"nvidia.com/gpu": "56"}, reporting=7),
    ),
    Row(
        "mig-single-with-topology-7-of-8-missing",
        shaped(
            MIG_SINGLE,
            {"nvidia.com/gpu": "56"},
            reporting=7,
            annotations={"gpuwarden.io/gpu-topology": TOPOLOGY},
        ),
        {"quarantine:gpu-missing"},
    ),
    Row(
        "mig-single-expected-label-7-of-8-missing",
        shaped({**MIG_SINGLE, "gpuwarden.io/expected-gpus": "8"}, {"nvidia.com/gpu": "56"}, reporting=7),
        {"quarantine:gpu-missing"},
    ),
    Row("mig-mixed-healthy", shaped(MIG_MIXED, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"})),
    Row(
        "time-sliced-xid-79-on-one-physical-gpu",
        shaped(TIME_SLICED, {"nvidia.com/gpu": "32"}, per_gpu={2: {"xids": (79,)}}),
        {"quarantine:xid-79"},
    ),
    Row(
        "mig-single-xid-79-on-one-physical-gpu",
        shaped(MIG_SINGLE, {"nvidia.com/gpu": "56"}, per_gpu={5: {"xids": (79,)}}),
        {"quarantine:xid-79"},
    ),
]


def outcome(n: NodeState) -> tuple[set[str], Any]:
    plan = plan_quarantine(FleetSnapshot(NOW, (n,)), HealthPolicy(), NOW)
    got = {f"{a.kind}:{a.reason}" for a in plan.actions if a.node == n.name and a.kind == "quarantine"}
    return got, plan


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_shared_node_baseline(row: Row) -> None:
    got, _ = outcome(row.node)
    assert got == row.expect


def test_missing_reason_names_the_physical_baseline() -> None:
    _, plan = outcome(shaped(TIME_SLICED, {"nvidia.com/gpu": "32"}, reporting=7))
    action = next(a for a in plan.actions if a.kind == "quarantine")
    assert "8 GPUs, DCGM reports 7 (1 missing" in action.message
    assert "32" not in action.message.split(";")[0]


@pytest.mark.parametrize(
    ("labels", "capacity", "carries"),
    [
        (TIME_SLICED, {"nvidia.com/gpu": "32"}, "time-slicing: 8 physical GPUs, 4 replicas each"),
        (MIG_SINGLE, {"nvidia.com/gpu": "56"}, "MIG single"),
        ({}, {"nvidia.com/gpu": "8"}, ""),
    ],
    ids=["time-sliced", "mig-single", "whole"],
)
def test_record_names_the_physical_gpu_and_what_it_carries(
    labels: dict[str, str], capacity: dict[str, str], carries: str
) -> None:
    _, plan = outcome(shaped(labels, capacity, per_gpu={2: {"xids": (79,)}}))
    action = next(a for a in plan.actions if a.kind == "quarantine")
    record, why = decode(action.record.encode() if action.record else None)
    assert record is not None, why
    assert {e.gpu for e in record.evidence} == {"GPU-n1-2"}  # the physical GPU, once
    assert record.sharing.startswith(carries) if carries else record.sharing == ""
    assert (RECORD_ANNOTATION, carries != "") == (RECORD_ANNOTATION, '"sharing"' in record.encode())


def test_shared_nodes_count_as_gpu_nodes_for_the_breaker() -> None:
    renamed = shaped(TIME_SLICED, {"nvidia.com/gpu.shared": "32"})
    mixed = shaped(MIG_MIXED, {"nvidia.com/mig-1g.10gb": "56"})
    assert renamed.gpu_capacity == 0 and renamed.gpu_node
    assert mixed.gpu_capacity == 0 and mixed.gpu_node
