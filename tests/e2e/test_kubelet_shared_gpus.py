"""Time-sliced GPUs on the real kubelet node: replica IDs as kubelet's PodResources reports them.

A device plugin stand-in (tests/e2e/minimal_device_plugin.py with `replicas`) offers 2 GPUs x 3 replicas as
`nvidia.com/gpu`, device IDs `<uuid>::<n>`, as NVIDIA's plugin does under time-slicing. Two pods take all six
replicas, so at least one physical GPU is held by both. The proof: the kubelet advertises 6, PodResources
lists each pod's replica IDs exactly as the plugin was asked to allocate them, the container sees the
physical UUIDs (suffix stripped, deduplicated), and `gpuwarden.gpusharing.device_ref` — what drain and the
node agent use — resolves every reported ID to its physical GPU and replica.
"""

from __future__ import annotations

import grpc

from gpuwarden.gpusharing import device_ref
from harness.testbed import Cluster, poll
from harness.testbed.realnode import KUBELET_SOCKET, RealNode
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.e2e.conftest import REAL_NODE
from tests.e2e.minimal_device_plugin import MinimalDevicePlugin
from tests.e2e.test_kubelet_node import create, events, tool_pod, wait_phase

GPU = "nvidia.com/gpu"
PHYSICAL = ["GPU-6f0c2a51-3c1e-4b7a-9d0e-1a2b3c4d5e6f", "GPU-0b9d8e7f-6a5b-4c3d-8e2f-1f0e9d8c7b6a"]
REPLICAS = 3


def pod_device_ids(socket: str, ns: str) -> dict[str, list[str]]:
    """pod name -> the `nvidia.com/gpu` device IDs PodResources lists for its `main` container."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        listed = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=10)
    return {
        p.name: [i for c in p.containers if c.name == "main" for d in c.devices if d.resource_name == GPU
                 for i in d.device_ids]
        for p in listed.pod_resources
        if p.namespace == ns
    }  # fmt: skip


def test_kubelet_reports_replica_ids_and_device_ref_resolves_them_to_the_physical_gpu(
    node_cluster: Cluster, real_node: RealNode, node_ns: str
) -> None:
    ns = node_ns
    plugin = MinimalDevicePlugin(
        resource=GPU,
        devices=PHYSICAL,
        plugin_dir=real_node.device_plugin_dir,
        socket_name="gwtest-shared.sock",
        replicas=REPLICAS,
    )
    plugin.start(KUBELET_SOCKET)
    try:
        want = str(len(PHYSICAL) * REPLICAS)
        poll(
            lambda: (
                node_cluster.get_json("node", REAL_NODE)["status"].get("allocatable", {}).get(GPU) == want
            ),
            timeout=60,
            what=f"{GPU}={want} allocatable on {REAL_NODE} (2 GPUs x {REPLICAS} replicas)",
        )
        args = ["--env", "NVIDIA_VISIBLE_DEVICES", "--env", "GWTEST_", "--sleep", "0"]
        create(node_cluster, ns, tool_pod("share-a", args, gpus=2), tool_pod("share-b", args, gpus=4))
        for name in ("share-a", "share-b"):
            wait_phase(node_cluster, ns, name, "Running")
        ids = poll(
            lambda: (
                (got := pod_device_ids(str(real_node.pod_resources_socket), ns)).keys()
                >= {"share-a", "share-b"}
                and got
            ),
            timeout=30,
            what="both pods in PodResources",
        )
        # PodResources reports exactly the replica IDs the plugin was asked to allocate, all six taken once.
        assert sorted(map(sorted, plugin.allocations)) == sorted(map(sorted, ids.values()))
        assert sorted(ids["share-a"] + ids["share-b"]) == sorted(plugin.advertised)
        held: dict[str, set[str]] = {}
        for pod, device_ids in ids.items():
            for device_id in device_ids:
                ref = device_ref(device_id)
                assert device_id == f"{ref.gpu}::{ref.replica}", device_id
                assert ref.gpu in PHYSICAL and ref.replica is not None and 0 <= ref.replica < REPLICAS
                held.setdefault(ref.gpu, set()).add(pod)
        # 2 + 4 replicas of 2 x 3: at least one physical GPU is shared by both pods.
        assert any(pods == {"share-a", "share-b"} for pods in held.values()), held
        for name in ("share-a", "share-b"):
            logs = poll(
                lambda n=name: (
                    (out := node_cluster.kubectl("logs", n, "-n", ns, check=False))
                    and "event=sleeping" in out
                    and out
                ),
                timeout=30,
                what=f"{name}'s output",
            )
            texts = [t for _, t in events(logs)]
            # the plugin's answer (in the kubelet's Allocate order) is what the container saw
            asked = next(a for a in plugin.allocations if sorted(a) == sorted(ids[name]))
            physical = list(dict.fromkeys(device_ref(i).gpu for i in asked))
            assert f"env GWTEST_DEVICES={','.join(asked)}" in texts, texts
            assert f"env NVIDIA_VISIBLE_DEVICES={','.join(physical)}" in texts, texts
        for name in ("share-a", "share-b"):
            node_cluster.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force", check=False)
    finally:
        plugin.stop()
