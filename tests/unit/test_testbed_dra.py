"""The DRA test-bed harness's pure parts: shipped DeviceClasses, claim templates, reading slices and claims,
the driver's command line, and the binary check that refuses a test bed without the driver."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.testbed.binaries import REQUIRED_BINARIES, Binaries, TestbedMissingError
from harness.testbed.dra import (
    DRIVER_BINARY,
    DRIVER_NAME,
    NUMA_ATTRIBUTE,
    DraDriver,
    DraDriverError,
    allocated_devices,
    claim_template,
    device_class,
    slice_attributes,
)
from harness.testbed.pki import make_ca
from harness.testbed.realnode import RealNode, RealNodeSpec


def test_device_classes_select_the_driver_and_only_the_variant_maps_nvidia_gpu() -> None:
    plain, extended = device_class(), device_class(extended_resource=True)
    assert plain["apiVersion"] == extended["apiVersion"] == "resource.k8s.io/v1"
    assert plain["metadata"]["name"] == extended["metadata"]["name"] == DRIVER_NAME
    for doc in (plain, extended):
        (selector,) = doc["spec"]["selectors"]
        assert selector["cel"]["expression"] == f'device.driver == "{DRIVER_NAME}"'
    assert "extendedResourceName" not in plain["spec"]
    assert extended["spec"]["extendedResourceName"] == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("match", "constraints"),
    [
        (NUMA_ATTRIBUTE, [{"requests": ["gpus"], "matchAttribute": NUMA_ATTRIBUTE}]),
        (None, None),
    ],
)
def test_claim_template(match: str | None, constraints: list[dict[str, object]] | None) -> None:
    doc = claim_template("t", device_class_name="c", count=4, match_attribute=match)
    devices = doc["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "gpus", "exactly": {"deviceClassName": "c", "count": 4}}]
    assert devices.get("constraints") == constraints


@pytest.mark.parametrize(
    ("claim", "want"),
    [
        ({}, []),
        ({"status": {"allocation": None}}, []),
        (
            {
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"driver": DRIVER_NAME, "pool": "n", "device": "gpu-3", "request": "gpus"},
                                {"driver": "other.example", "pool": "n", "device": "nic-0", "request": "x"},
                                {"driver": DRIVER_NAME, "pool": "n", "device": "gpu-1", "request": "gpus"},
                            ]
                        }
                    }
                }
            },
            ["gpu-1", "gpu-3"],
        ),
    ],
)
def test_allocated_devices(claim: dict[str, object], want: list[str]) -> None:
    assert allocated_devices(claim) == want


def test_slice_attributes_unwraps_values_of_the_driver_only() -> None:
    slices = {
        "items": [
            {
                "spec": {
                    "driver": DRIVER_NAME,
                    "devices": [
                        {
                            "name": "gpu-0",
                            "attributes": {NUMA_ATTRIBUTE: {"int": 0}, "uuid": {"string": "GPU-a"}},
                        },
                        {"name": "gpu-1"},
                    ],
                }
            },
            {"spec": {"driver": "other.example", "devices": [{"name": "nic-0", "attributes": {}}]}},
        ]
    }
    assert slice_attributes(slices) == {"gpu-0": {NUMA_ATTRIBUTE: 0, "uuid": "GPU-a"}, "gpu-1": {}}


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    real = RealNode(
        RealNodeSpec(name="real-node-0"),
        kubelet_binary=Path("/nonexistent/kubelet"),
        ctl_binary=Path("/nonexistent/kubectl"),
        server="https://127.0.0.1:6443",
        cluster_ca=make_ca("test-cluster-ca"),
        kubelet_client_ca=tmp_path / "ca.crt",
        cache_dir=tmp_path / "images",
    )
    yield real
    shutil.rmtree(real.run_dir, ignore_errors=True)


def test_driver_runs_with_the_nodes_credentials_and_its_kubelet_root(node: RealNode) -> None:
    driver = DraDriver(node, Path("/nonexistent/gpu-dra-driver"))
    cmd = driver.command()
    assert f"--kubeconfig={node.kubeconfig}" in cmd
    assert f"--node-name={node.name}" in cmd
    # The kubelet's plugin watcher follows --root-dir; /var/lib/kubelet/plugins_registry is not watched here.
    assert f"--registrar-dir={node.kubelet_root / 'plugins_registry'}" in cmd
    assert f"--plugin-dir={node.kubelet_root / 'plugins' / DRIVER_NAME}" in cmd
    assert "--devices=8" in cmd and "--numa-nodes=2" in cmd


def test_missing_driver_binary_fails_with_the_build_command(node: RealNode) -> None:
    with pytest.raises(DraDriverError, match="make testbed"):
        DraDriver(node, Path("/nonexistent/gpu-dra-driver")).start()


def test_test_bed_without_the_driver_is_incomplete(tmp_path: Path) -> None:
    assert DRIVER_BINARY in REQUIRED_BINARIES
    for name in REQUIRED_BINARIES:
        if name != DRIVER_BINARY:
            (tmp_path / name).write_text("#!/bin/sh\n")
            (tmp_path / name).chmod(0o755)
    with pytest.raises(TestbedMissingError, match=f"missing in .*: {DRIVER_BINARY}\\."):
        Binaries.locate(tmp_path)
