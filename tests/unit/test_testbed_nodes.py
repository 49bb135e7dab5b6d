"""The test bed's fake GPU nodes: what they advertise and GFD's labels, per sharing mode.

Each node kind is read back through the kernel's one notion of the physical GPU
(`gpuwarden.gpusharing.node_sharing`), so the test bed and the product agree on what a time-sliced or MIG
node looks like (reference/gpu-sharing.md sections 1-3).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.gpusharing import SharingMode, node_sharing
from harness.simulator.fleet import Fleet
from harness.simulator.scenario import parse_scenario
from harness.testbed import GpuNodeSpec, NodeSharing, mig_mixed_node, mig_single_node, time_sliced_node


def read(spec: GpuNodeSpec) -> tuple[dict[str, str], dict[str, Any]]:
    manifest = spec.manifest()
    assert manifest["status"]["capacity"] == manifest["status"]["allocatable"]
    return manifest["metadata"]["labels"], manifest["status"]["capacity"]


@pytest.mark.parametrize(
    ("spec", "mode", "physical", "replicas", "slots", "resource"),
    [
        pytest.param(GpuNodeSpec(name="n", gpus=8), SharingMode.WHOLE, 8, 1, 8, "nvidia.com/gpu", id="whole"),
        pytest.param(
            time_sliced_node("n", gpus=8, replicas=4),
            SharingMode.TIME_SLICING,
            8,
            4,
            32,
            "nvidia.com/gpu",
            id="time-slicing",
        ),
        pytest.param(
            time_sliced_node("n", gpus=2, replicas=3, mps=True),
            SharingMode.MPS,
            2,
            3,
            6,
            "nvidia.com/gpu",
            id="mps",
        ),
        pytest.param(
            mig_single_node("n", gpus=8, profile="1g.10gb", instances_per_gpu=7),
            SharingMode.MIG_SINGLE,
            None,  # nothing a MIG-single node publishes counts its GPUs
            1,
            56,
            "nvidia.com/gpu",
            id="mig-single",
        ),
        pytest.param(
            mig_single_node("n", gpus=8, labels={"gpuwarden.io/expected-gpus": "8"}),
            SharingMode.MIG_SINGLE,
            8,
            1,
            56,
            "nvidia.com/gpu",
            id="mig-single-with-expected-gpus",
        ),
        pytest.param(
            mig_mixed_node("n", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, gpus=4),
            SharingMode.MIG_MIXED,
            4,
            1,
            16,
            "nvidia.com/gpu",
            id="mig-mixed",
        ),
    ],
)
def test_nodes_read_back_as_the_kernel_reads_them(
    spec: GpuNodeSpec, mode: SharingMode, physical: int | None, replicas: int, slots: int, resource: str
) -> None:
    labels, capacity = read(spec)
    got = node_sharing(labels, capacity)
    assert (got.mode, got.physical, got.replicas, got.slots, got.resource) == (
        mode,
        physical,
        replicas,
        slots,
        resource,
    )


def test_whole_gpu_node_keeps_its_labels_and_resources() -> None:
    labels, capacity = read(GpuNodeSpec(name="n", gpus=4))
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "81559",
    }
    assert capacity["nvidia.com/gpu"] == "4"


def test_time_sliced_node_has_gfd_labels_of_the_device_plugin() -> None:
    labels, capacity = read(time_sliced_node("n", gpus=8, replicas=4))
    assert labels["nvidia.com/gpu.count"] == "8"  # physical GPUs, not multiplied by replicas
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert capacity["nvidia.com/gpu"] == "32"


def test_mig_nodes_have_gfd_labels_of_their_strategy() -> None:
    labels, capacity = read(mig_single_node("n", gpus=8, profile="1g.10gb"))
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == capacity["nvidia.com/gpu"] == "56"
    assert labels["nvidia.com/gpu.memory"] == "9984"
    labels, capacity = read(mig_mixed_node("m", {"3g.40gb": 2}, gpus=2))
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.count"] == "2" and labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/mig-3g.40gb.count"] == capacity["nvidia.com/mig-3g.40gb"] == "4"
    assert "nvidia.com/gpu" not in capacity


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"mode": "shared"}, "not one of", id="unknown-mode"),
        pytest.param({"mode": "time-slicing", "replicas": 1}, "replicas >= 2", id="one-replica"),
    ],
)
def test_bad_sharing_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodeSharing(**kwargs)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(GpuNodeSpec(name="gpu-node-0", gpus=2), id="whole"),
        pytest.param(time_sliced_node("gpu-node-0", gpus=2, replicas=3), id="time-slicing"),
        pytest.param(
            mig_single_node("gpu-node-0", gpus=2, profile="2g.20gb", instances_per_gpu=3), id="mig-single"
        ),
        pytest.param(mig_mixed_node("gpu-node-0", {"3g.40gb": 1, "1g.10gb": 2}, gpus=2), id="mig-mixed"),
    ],
)
def test_the_simulator_offers_what_the_kwok_node_advertises(spec: GpuNodeSpec) -> None:
    sharing = spec.sharing.scenario() if spec.sharing else {"mode": "whole"}
    doc = {"fleet": {"nodes": 1, "gpus_per_node": spec.gpus, "node_name_pattern": "gpu-node-{index}"}}
    doc["fleet"]["node_sharing"] = {spec.name: sharing}
    node = Fleet(parse_scenario(doc), start=0.0).nodes[spec.name]
    devices = sum(len(g.instances) or g.replicas for g in node.gpus)
    resources = spec.gpu_resources()
    advertised = sum(int(v) for k, v in resources.items() if k.startswith("nvidia.com/"))
    assert devices == advertised
