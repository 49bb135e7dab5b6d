"""The one notion of the physical GPU: sharing mode and count per node shape, device IDs to physical GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.gpusharing import (
    DeviceRef,
    SharingMode,
    device_ref,
    is_gpu_resource,
    is_gpu_uuid,
    mig_profile,
    node_sharing,
)

H100 = "NVIDIA-H100-80GB-HBM3"
COUNT, REPLICAS, STRATEGY = (
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
)
PRODUCT, MIG = "nvidia.com/gpu.product", "nvidia.com/mig.strategy"

# (labels, capacity, expected mode, physical, replicas, slots, resource)
NODES: list[tuple[str, dict[str, str], dict[str, Any], SharingMode, int | None, int, int, str]] = [
    ("whole, no GFD", {}, {"nvidia.com/gpu": "8"}, SharingMode.WHOLE, 8, 1, 8, "nvidia.com/gpu"),
    (
        "whole with GFD",
        {COUNT: "8", REPLICAS: "1", PRODUCT: H100},
        {"nvidia.com/gpu": "8"},
        SharingMode.WHOLE,
        8,
        1,
        8,
        "nvidia.com/gpu",
    ),
    (
        "time-slicing 8x4",
        {
            COUNT: "8",
            REPLICAS: "4",
            STRATEGY: "time-slicing",
            PRODUCT: H100 + "-SHARED",
        },
        {"nvidia.com/gpu": "32"},
        SharingMode.TIME_SLICING,
        8,
        4,
        32,
        "nvidia.com/gpu",
    ),
    (
        "time-slicing, older GFD: replicas only",
        {COUNT: "2", REPLICAS: "10"},
        {"nvidia.com/gpu": "20"},
        SharingMode.TIME_SLICING,
        2,
        10,
        20,
        "nvidia.com/gpu",
    ),
    (
        "time-slicing renamed to .shared",
        {
            COUNT: "4",
            REPLICAS: "2",
            STRATEGY: "time-slicing",
        },
        {"nvidia.com/gpu.shared": "8"},
        SharingMode.TIME_SLICING,
        4,
        2,
        8,
        "nvidia.com/gpu.shared",
    ),
    (
        "time-slicing, no count label: replicas from capacity needs the count, unknown",
        {STRATEGY: "time-slicing"},
        {"nvidia.com/gpu": "32"},
        SharingMode.TIME_SLICING,
        None,
        0,
        32,
        "nvidia.com/gpu",
    ),
    (
        "mps",
        {
            COUNT: "8",
            REPLICAS: "2",
            STRATEGY: "mps",
        },
        {"nvidia.com/gpu": "16"},
        SharingMode.MPS,
        8,
        2,
        16,
        "nvidia.com/gpu",
    ),
    (
        "MIG single: gpu.count counts instances, physical unknown",
        {
            MIG: "single",
            COUNT: "56",
            PRODUCT: H100 + "-MIG-1g.10gb",
        },
        {"nvidia.com/gpu": "56"},
        SharingMode.MIG_SINGLE,
        None,
        1,
        56,
        "nvidia.com/gpu",
    ),
    (
        "MIG single with the operator's expected-GPUs label",
        {
            MIG: "single",
            COUNT: "56",
            PRODUCT: H100 + "-MIG-1g.10gb",
            "gpuwarden.io/expected-gpus": "8",
        },
        {"nvidia.com/gpu": "56"},
        SharingMode.MIG_SINGLE,
        8,
        1,
        56,
        "nvidia.com/gpu",
    ),
    (
        "MIG single strategy but MIG disabled (all-disabled): whole",
        {MIG: "single", COUNT: "8", PRODUCT: H100},
        {"nvidia.com/gpu": "8"},
        SharingMode.WHOLE,
        8,
        1,
        8,
        "nvidia.com/gpu",
    ),
    (
        "MIG mixed: gpu.count counts physical GPUs",
        {
            MIG: "mixed",
            COUNT: "8",
            REPLICAS: "0",
            "nvidia.com/mig-1g.10gb.count": "28",
            "nvidia.com/mig-3g.40gb.count": "8",
        },
        {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "28", "nvidia.com/mig-3g.40gb": "8"},
        SharingMode.MIG_MIXED,
        8,
        1,
        36,
        "nvidia.com/gpu",
    ),
    (
        "expected-GPUs label overrides a whole node's capacity",
        {"gpuwarden.io/expected-gpus": "8"},
        {"nvidia.com/gpu": "7"},
        SharingMode.WHOLE,
        8,
        1,
        7,
        "nvidia.com/gpu",
    ),
    ("no GPUs", {}, {"cpu": "8"}, SharingMode.WHOLE, 0, 1, 0, "nvidia.com/gpu"),
]


@pytest.mark.parametrize(
    ("labels", "capacity", "mode", "physical", "replicas", "slots", "resource"),
    [pytest.param(*row[1:], id=row[0]) for row in NODES],
)
def test_node_sharing(
    labels: dict[str, str],
    capacity: dict[str, Any],
    mode: SharingMode,
    physical: int | None,
    replicas: int,
    slots: int,
    resource: str,
) -> None:
    got = node_sharing(labels, capacity)
    assert (got.mode, got.physical, got.replicas, got.slots, got.resource) == (
        mode, physical, replicas, slots, resource,
    )  # fmt: skip
    assert got.shared == (mode is not SharingMode.WHOLE)
    assert got.describe()


def test_mig_single_physical_from_topology_only_when_published() -> None:
    labels = {MIG: "single", PRODUCT: H100 + "-MIG-1g.10gb"}
    assert node_sharing(labels, {"nvidia.com/gpu": "56"}, topology_gpus=8).physical == 8
    assert node_sharing(labels, {"nvidia.com/gpu": "56"}).physical is None


def test_unknown_physical_says_why() -> None:
    got = node_sharing({STRATEGY: "mps"}, {"nvidia.com/gpu": "16"})
    assert got.physical is None and "unknown" in got.source and "unknown" in got.describe()


@pytest.mark.parametrize(
    ("product", "profile"),
    [
        (H100, ""),
        (H100 + "-MIG-1g.10gb", "1g.10gb"),
        ("A100-SXM4-40GB-MIG-1g.5gb-SHARED", "1g.5gb"),
        (H100 + "-MIG-INVALID", ""),
    ],
)
def test_mig_profile(product: str, profile: str) -> None:
    assert mig_profile(product) == profile


@pytest.mark.parametrize(
    ("device_id", "ref"),
    [
        ("GPU-aaaa", DeviceRef("GPU-aaaa", "GPU-aaaa")),
        ("3", DeviceRef("3", "3")),
        ("GPU-aaaa::3", DeviceRef("GPU-aaaa::3", "GPU-aaaa", 3)),
        ("MIG-GPU-aaaa/7/0", DeviceRef("MIG-GPU-aaaa/7/0", "GPU-aaaa", None, "MIG-GPU-aaaa/7/0", 7, 0)),
        ("MIG-2ce7f0::7", DeviceRef("MIG-2ce7f0::7", "", 7, "MIG-2ce7f0")),
        ("MIG-2ce7f0", DeviceRef("MIG-2ce7f0", "", None, "MIG-2ce7f0")),
    ],
)
def test_device_ref(device_id: str, ref: DeviceRef) -> None:
    assert device_ref(device_id) == ref


@pytest.mark.parametrize(
    ("text", "exact"),
    [
        pytest.param("GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71", True, id="nvml-uuid"),
        pytest.param("GPU-3B8E0C2D-5F4A-4E7B-9C1D-2A6F8E0B4C71", True, id="upper-case"),
        pytest.param("GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71-2", False, id="hami-compound"),
        pytest.param("GPU-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71::2", False, id="replica-not-stripped"),
        pytest.param("3", False, id="index"),
        pytest.param("MIG-3b8e0c2d-5f4a-4e7b-9c1d-2a6f8e0b4c71", False, id="mig-uuid"),
        pytest.param("GPU-0", False, id="short"),
    ],
)
def test_is_gpu_uuid(text: str, exact: bool) -> None:
    assert is_gpu_uuid(text) is exact


@pytest.mark.parametrize(
    ("name", "resource", "gpu"),
    [
        pytest.param("nvidia.com/gpu", "nvidia.com/gpu", True, id="gpu"),
        pytest.param("nvidia.com/gpu.shared", "nvidia.com/gpu", True, id="renamed-shared"),
        pytest.param("nvidia.com/mig-1g.10gb", "nvidia.com/gpu", True, id="mig-mixed"),
        pytest.param("nvidia.com/mig-1g.10gb.shared", "nvidia.com/gpu", True, id="mig-mixed-shared"),
        pytest.param("example.com/gpu", "example.com/gpu", True, id="configured-resource"),
        pytest.param("nvidia.com/gpumem", "nvidia.com/gpu", False, id="hami-memory"),
        pytest.param("cpu", "nvidia.com/gpu", False, id="cpu"),
    ],
)
def test_is_gpu_resource(name: str, resource: str, gpu: bool) -> None:
    assert is_gpu_resource(name, resource) is gpu
