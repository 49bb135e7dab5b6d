"""A mixed cluster behind gpuwarden's extender: a device-plugin GPU node (kwok) and a DRA-backed one (the real
kubelet node running our DRA kubelet plugin, with a DeviceClass mapping `nvidia.com/gpu`).

kube-scheduler (v1.37: `DRAExtendedResource` GA) serves `nvidia.com/gpu` through DRA on the real node, whose
allocatable has none, and through the device plugin on the kwok node; it calls our extender for both. The
extender must place the device-plugin pod as before (a recorded GPU set) and pass the DRA pod through: no
rejection, no recorded set, a `GPUsAllocatedByDRA` Event - while DRA allocates its devices and the real
kubelet prepares them through our driver. Needs a scheduler with DRA extended resources (1.36 beta, 1.37 GA);
on an older test bed the module says so and fails (it is not in `make test-oldest`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.testbed import Cluster, poll
from harness.testbed.dra import (
    DRIVER_BINARY,
    DRIVER_NAME,
    DraDriver,
    allocated_devices,
    device_class,
    slice_attributes,
)
from harness.testbed.images import TOOL_IMAGE
from harness.testbed.realnode import REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode
from tests.e2e.conftest import KWOK_NODE, REAL_NODE, free_port, gpuwarden_extender, scheduler_calling
from tests.e2e.test_extender_scheduler import PREFIX, RunningExtender

pytestmark = pytest.mark.e2e

EXTENDED = device_class(extended_resource=True)
CLASS = str(EXTENDED["metadata"]["name"])


@pytest.fixture(scope="module")
def mixed(node_cluster: Cluster) -> Iterator[tuple[DraDriver, RunningExtender]]:
    version = node_cluster.binaries.versions.get("kubernetes", "")
    minor = int(version.split(".")[1]) if version.count(".") >= 2 else 0
    if minor and minor < 37:
        pytest.fail(f"DRA-backed nvidia.com/gpu needs Kubernetes >= 1.37 here; the test bed is {version}")
    node: RealNode = node_cluster.real_node()
    driver = DraDriver(node, node_cluster.binaries.path(DRIVER_BINARY))
    node_cluster.apply(EXTENDED)
    driver.start()
    port = free_port()
    try:
        with scheduler_calling(node_cluster, gpuwarden_extender(port, PREFIX)):
            running = RunningExtender(node_cluster, port).start()
            try:
                poll(
                    lambda: (
                        running.extender is not None
                        and (view := running.extender.model.view(REAL_NODE)) is not None
                        and view.dra_class == CLASS
                    ),
                    timeout=60,
                    what=f"the extender's model sees {REAL_NODE} as DRA-backed ({CLASS})",
                )
                yield driver, running
            finally:
                running.stop()
    finally:
        driver.stop()
        node_cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        node_cluster.kubectl(
            "delete", "resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}", check=False
        )


def gpu_pod(name: str, gpus: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": TOOL_IMAGE.name,
                    "imagePullPolicy": "Never",
                    "args": ["--env", "GWTEST_", "--sleep", "0"],
                    "resources": {"limits": {"cpu": "100m", "memory": "32Mi", "nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def events(cluster: Cluster, ns: str, reason: str) -> dict[str, dict[str, Any]]:
    items = cluster.get_json("events.events.k8s.io", "-n", ns)["items"]
    return {e["regarding"]["name"]: e for e in items if e.get("reason") == reason}


def test_extender_places_device_plugin_pods_and_passes_dra_pods_through(
    node_cluster: Cluster, mixed: tuple[DraDriver, RunningExtender], node_ns: str
) -> None:
    driver, _ = mixed
    ns = node_ns
    real = node_cluster.get_json("node", REAL_NODE)
    assert not int(real["status"].get("allocatable", {}).get("nvidia.com/gpu", "0") or 0)
    assert REAL_NODE_LABEL in real["metadata"]["labels"]
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [gpu_pod("on-dra", 2, REAL_NODE), gpu_pod("on-dp", 2, KWOK_NODE)],
    }
    node_cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))

    def running(name: str) -> bool:
        phase = node_cluster.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}")
        return phase == "Running"

    poll(lambda: running("on-dra"), timeout=120, what=f"{ns}/on-dra Running on the DRA node")
    poll(lambda: running("on-dp"), timeout=60, what=f"{ns}/on-dp Running on the device-plugin node")

    dra_pod = node_cluster.get_json("pod", "on-dra", "-n", ns)
    assert dra_pod["spec"]["nodeName"] == REAL_NODE
    assert "gpuwarden.io/gpu-ids" not in (dra_pod["metadata"].get("annotations") or {})  # no fiction recorded
    claim_name = dra_pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = node_cluster.get_json("resourceclaim", claim_name, "-n", ns)
    devices = allocated_devices(claim)
    assert len(devices) == 2, claim["status"]
    attrs = slice_attributes(
        node_cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}")
    )
    assert set(devices) <= set(attrs)
    assert claim["metadata"]["uid"] in driver.prepared()  # prepared by the real kubelet through our driver

    dp_pod = node_cluster.get_json("pod", "on-dp", "-n", ns)
    assert dp_pod["spec"]["nodeName"] == KWOK_NODE
    ids = dp_pod["metadata"]["annotations"]["gpuwarden.io/gpu-ids"].split(",")
    assert len(ids) == 2  # the device-plugin path as before: a recorded set

    passed = poll(
        lambda: events(node_cluster, ns, "GPUsAllocatedByDRA").get("on-dra"),
        timeout=60,
        what="the GPUsAllocatedByDRA Event of on-dra",
    )
    assert f"node {REAL_NODE} serves its GPUs through DRA (DeviceClass {CLASS})" in passed["note"]
    assert "on-dp" in poll(
        lambda: events(node_cluster, ns, "GPUsAssigned") or None, timeout=60, what="GPUsAssigned of on-dp"
    )
    assert "on-dra" not in events(node_cluster, ns, "GPUsAssigned")
    for name in ("on-dra", "on-dp"):
        node_cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=true", timeout=90)
    poll(
        lambda: claim["metadata"]["uid"] not in driver.prepared(), timeout=60, what="the DRA claim unprepared"
    )
