"""Which DRA driver owns the node's GPUs, from the kubelet's plugin registry entries."""

from __future__ import annotations

import pytest

from nodeagent.draowner import dra_owner

GPU = ["gpu.nvidia.com"]


@pytest.mark.parametrize(
    ("entries", "drivers", "want"),
    [
        ([], GPU, ""),
        (["gpu.nvidia.com-reg.sock"], GPU, "gpu.nvidia.com"),
        (["gpu.nvidia.com-3f2a9c1e-77aa-4b1e-9d3b-0c6a1f2e3d4c-reg.sock"], GPU, "gpu.nvidia.com"),  # rolling
        (["compute-domain.nvidia.com-reg.sock"], GPU, ""),  # NVIDIA's other driver does not own GPUs
        (["gpu.nvidia.com.sock", "gpu.nvidia.com"], GPU, ""),  # not registration sockets
        (["nvidia-gpu.sock", "kubelet.sock"], GPU, ""),  # device-plugin style names
        (
            ["b.example-reg.sock", "a.example-reg.sock"],
            ["a.example", "b.example"],
            "a.example",
        ),  # first listed
        (["gpu.nvidia.com-reg.sock"], [], ""),  # the check switched off
    ],
)
def test_dra_owner(entries: list[str], drivers: list[str], want: str) -> None:
    assert dra_owner(entries, drivers) == want
