"""DRA on the real kubelet node: our DRA kubelet plugin (gpu-dra-driver) under the real kubelet, scheduler and
resource-claim controller.

The driver registers through the kubelet's plugin watcher, publishes a ResourceSlice of 8 GPU-like devices
(2 NUMA nodes x 4, two PCIe roots per NUMA node) with the node's own credentials, and prepares claims
without CDI devices. A pod whose ResourceClaimTemplate asks for 4 devices with
``matchAttribute: resource.kubernetes.io/numaNode`` is allocated 4 devices of one NUMA node by kube-scheduler,
prepared by the kubelet through the driver, and runs; deleting it unprepares them. This is the DRA node the
mixed-cluster work (issue 30) builds on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from controller.gpus.claimtemplate import claim_template as gpuwarden_claim_template
from controller.gpus.claimtemplate import pod_usage as gpuwarden_pod_usage
from harness.testbed import Cluster, poll
from harness.testbed.dra import (
    DRIVER_BINARY,
    DRIVER_NAME,
    NUMA_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    DraDriver,
    allocated_devices,
    claim_template,
    device_class,
    slice_attributes,
)
from harness.testbed.images import TOOL_IMAGE
from harness.testbed.realnode import REAL_NODE_LABEL, REAL_NODE_TAINT, RealNode
from nodeagent.draowner import dra_owner
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.e2e.conftest import REAL_NODE

CLASS = str(device_class()["metadata"]["name"])


@pytest.fixture(scope="module")
def dra_driver(node_cluster: Cluster) -> Iterator[DraDriver]:
    node: RealNode = node_cluster.real_node()
    driver = DraDriver(node, node_cluster.binaries.path(DRIVER_BINARY))
    node_cluster.apply(device_class())
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
        node_cluster.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)
        node_cluster.kubectl(
            "delete", "resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}", check=False
        )


def create(cluster: Cluster, ns: str, *objects: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))


def claim_pod(name: str, template: str) -> dict[str, Any]:
    """A long-sleeping gwtool pod for the real node, its devices from a claim made from ``template``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [{"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": TOOL_IMAGE.name,
                    "imagePullPolicy": "Never",
                    "args": ["--env", "GWTEST_", "--sleep", "0"],
                    "resources": {
                        "limits": {"cpu": "100m", "memory": "32Mi"},
                        "claims": [{"name": "gpus"}],
                    },
                }
            ],
        },
    }


def test_driver_registers_and_publishes_its_devices_with_topology(
    node_cluster: Cluster, dra_driver: DraDriver
) -> None:
    def full_slice() -> dict[str, Any] | None:
        got = node_cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}")
        return got if len(slice_attributes(got)) == 8 else None

    slices = poll(full_slice, timeout=60, what=f"a ResourceSlice of {DRIVER_NAME} with 8 devices")
    (item,) = slices["items"]
    spec = item["spec"]
    assert spec["nodeName"] == REAL_NODE and spec["pool"]["name"] == REAL_NODE
    # Published with the node's credentials, owned by the Node (removed with it).
    owner = item["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", REAL_NODE)
    attrs = slice_attributes(slices)
    assert sorted(a["index"] for a in attrs.values()) == list(range(8))
    assert len({a["uuid"] for a in attrs.values()}) == 8
    assert all(str(a["uuid"]).startswith("GPU-") for a in attrs.values())
    by_numa: dict[int, set[str]] = {}
    for name, a in attrs.items():
        by_numa.setdefault(int(a[NUMA_ATTRIBUTE]), set()).add(name)
    assert {k: len(v) for k, v in by_numa.items()} == {0: 4, 1: 4}
    roots = {a[PCIE_ROOT_ATTRIBUTE] for a in attrs.values()}
    assert len(roots) == 4  # two PCIe roots per NUMA node, none shared between NUMA nodes
    for root in roots:
        assert len({a[NUMA_ATTRIBUTE] for a in attrs.values() if a[PCIE_ROOT_ATTRIBUTE] == root}) == 1
    # The kubelet confirmed the registration (NotifyRegistrationStatus, logged by the driver).
    assert "registered with the kubelet" in dra_driver.log_path.read_text()


def test_claim_for_four_gpus_on_one_numa_node_runs_and_is_unprepared_on_delete(
    node_cluster: Cluster, dra_driver: DraDriver, node_ns: str
) -> None:
    ns = node_ns
    create(
        node_cluster,
        ns,
        claim_template("four-one-numa", device_class_name=CLASS, count=4, match_attribute=NUMA_ATTRIBUTE),
        claim_pod("dra4", "four-one-numa"),
    )
    poll(
        lambda: (
            node_cluster.kubectl("get", "pod", "dra4", "-n", ns, "-o", "jsonpath={.status.phase}")
            == "Running"
        ),
        timeout=90,
        what=f"pod {ns}/dra4 Running",
    )
    pod = node_cluster.get_json("pod", "dra4", "-n", ns)
    assert pod["spec"]["nodeName"] == REAL_NODE  # placed by kube-scheduler's DRA plugin
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim_name = status["resourceClaimName"]
    claim = node_cluster.get_json("resourceclaim", claim_name, "-n", ns)
    devices = allocated_devices(claim)
    assert len(devices) == 4, claim["status"]
    attrs = slice_attributes(
        node_cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}")
    )
    assert len({attrs[d][NUMA_ATTRIBUTE] for d in devices}) == 1, {d: attrs[d] for d in devices}
    assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == [REAL_NODE] * 4
    assert claim["status"]["reservedFor"][0]["name"] == "dra4"
    # The kubelet prepared exactly this claim through the driver before starting the container.
    prepared = dra_driver.prepared()
    assert prepared == {
        claim["metadata"]["uid"]: {"namespace": ns, "name": claim_name, "devices": devices}
    }, prepared

    # The kubelet's PodResources API names the claim and its devices per container (what a node agent maps a
    # faulty device to a pod with; KubeletPodResourcesDynamicResources, beta and on since 1.34).
    with grpc.insecure_channel(f"unix://{dra_driver.node.pod_resources_socket}") as channel:
        got = pr_grpc.PodResourcesListerStub(channel).Get(  # type: ignore[no-untyped-call]
            pr.GetPodResourcesRequest(pod_name="dra4", pod_namespace=ns), timeout=10
        )
    (container,) = got.pod_resources.containers
    (dynamic,) = container.dynamic_resources
    assert (dynamic.claim_namespace, dynamic.claim_name) == (ns, claim_name)
    assert sorted(r.device_name for r in dynamic.claim_resources) == devices
    assert {(r.driver_name, r.pool_name) for r in dynamic.claim_resources} == {(DRIVER_NAME, REAL_NODE)}
    assert all(not r.cdi_devices for r in dynamic.claim_resources)

    node_cluster.kubectl("delete", "pod", "dra4", "-n", ns, "--wait=true", timeout=90)
    poll(lambda: dra_driver.prepared() == {}, timeout=60, what="the driver unprepared the claim")
    uid = claim["metadata"]["uid"]
    log = dra_driver.log_path.read_text().splitlines()
    assert any('"unprepared"' in line and uid in line for line in log), dra_driver.log_tail()
    # The generated claim goes with its pod (resource-claim controller).
    poll(
        lambda: (
            node_cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "name", check=False).strip() == ""
        ),
        timeout=60,
        what=f"ResourceClaim {ns}/{claim_name} deleted with its pod",
    )


@pytest.mark.parametrize(
    ("policy", "gpus", "attribute"),
    [("single-numa", 4, NUMA_ATTRIBUTE), ("single-pcie", 2, PCIE_ROOT_ATTRIBUTE), ("prefer-numa", 4, None)],
)
def test_gpuwarden_claim_template_gets_aligned_gpus_from_the_dra_allocator(
    node_cluster: Cluster, dra_driver: DraDriver, node_ns: str, policy: str, gpus: int, attribute: str | None
) -> None:
    """`gpuwarden dra claim-template`'s templates, as printed, allocated by the real DRA plugin of
    kube-scheduler: the devices share the policy's attribute (prefer-numa: its aligned alternative, as the
    node has room on one NUMA node)."""
    ns = node_ns
    template = gpuwarden_claim_template(gpus=gpus, policy=policy, device_class=CLASS, namespace=ns)
    name = str(template["metadata"]["name"])
    pod = claim_pod("aligned", name)
    pod["spec"].update(gpuwarden_pod_usage(name)["spec"] | {"containers": pod["spec"]["containers"]})
    create(node_cluster, ns, template, pod)
    poll(
        lambda: (
            node_cluster.kubectl("get", "pod", "aligned", "-n", ns, "-o", "jsonpath={.status.phase}")
            == "Running"
        ),
        timeout=90,
        what=f"pod {ns}/aligned Running",
    )
    (status,) = node_cluster.get_json("pod", "aligned", "-n", ns)["status"]["resourceClaimStatuses"]
    claim = node_cluster.get_json("resourceclaim", status["resourceClaimName"], "-n", ns)
    devices = allocated_devices(claim)
    attrs = slice_attributes(
        node_cluster.get_json("resourceslices", f"--field-selector=spec.driver={DRIVER_NAME}")
    )
    assert len(devices) == gpus, claim["status"]
    assert len({attrs[d][attribute or NUMA_ATTRIBUTE] for d in devices}) == 1, {d: attrs[d] for d in devices}
    if policy == "prefer-numa":
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["request"] for r in results} == {"gpus/aligned"}, results
    node_cluster.kubectl("delete", "pod", "aligned", "-n", ns, "--wait=true", timeout=90)
    poll(lambda: dra_driver.prepared() == {}, timeout=60, what="the driver unprepared the claim")


def test_the_node_agent_sees_the_registered_dra_driver(dra_driver: DraDriver) -> None:
    """What enforce mode reads before serving a device plugin: the driver's registration socket, as the
    kubelet plugin library names it, in the real kubelet's plugin registry."""
    entries = os.listdir(dra_driver.registry_dir)
    assert dra_owner(entries, ["gpu.nvidia.com", DRIVER_NAME]) == DRIVER_NAME, entries
    assert dra_owner(entries, ["gpu.nvidia.com"]) == "", entries
