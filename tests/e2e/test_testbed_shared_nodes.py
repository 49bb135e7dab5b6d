"""The test bed's shared-GPU kwok nodes on the real control plane: created, Ready, and read back right.

A time-sliced node, a MIG-single node and a MIG-mixed node made by harness/testbed/nodes.py become Ready with
exactly the resources NVIDIA's device plugin would advertise (kwok keeps the status as created), and the Node
objects the API serves read back through `gpuwarden.gpusharing.node_sharing` as the sharing mode and physical
GPU count they stand for. These are the nodes the shared-GPU e2e tests of every capability start from.
"""

from __future__ import annotations

import uuid

import pytest

from gpuwarden.gpusharing import SharingMode, node_sharing
from harness.testbed import (
    Cluster,
    add_gpu_nodes,
    delete_nodes,
    mig_mixed_node,
    mig_single_node,
    time_sliced_node,
)


def test_shared_gpu_nodes_become_ready_and_read_back_as_the_kernel_reads_them(cluster: Cluster) -> None:
    tag = uuid.uuid4().hex[:5]
    specs = [
        time_sliced_node(f"ts-{tag}", gpus=8, replicas=4),
        mig_single_node(f"mig-{tag}", gpus=8, profile="1g.10gb", instances_per_gpu=7),
        mig_mixed_node(f"mixed-{tag}", {"3g.40gb": 1, "2g.20gb": 2}, gpus=4),
    ]
    names = add_gpu_nodes(cluster, specs)
    try:
        got = {}
        for name in names:
            node = cluster.get_json("node", name)
            labels, allocatable = node["metadata"]["labels"], node["status"]["allocatable"]
            sharing = node_sharing(labels, allocatable)
            got[name.split("-")[0]] = (sharing.mode, sharing.physical, sharing.replicas, sharing.slots)
        assert got == {
            "ts": (SharingMode.TIME_SLICING, 8, 4, 32),
            "mig": (SharingMode.MIG_SINGLE, None, 1, 56),  # nothing published counts a MIG-single node's GPUs
            "mixed": (SharingMode.MIG_MIXED, 4, 1, 12),
        }
        mixed = cluster.get_json("node", f"mixed-{tag}")["status"]["allocatable"]
        assert (mixed["nvidia.com/mig-3g.40gb"], mixed["nvidia.com/mig-2g.20gb"]) == ("4", "8")
        assert "nvidia.com/gpu" not in mixed
    finally:
        delete_nodes(cluster, names)


@pytest.mark.parametrize("replicas", [1, 0])
def test_time_slicing_needs_two_replicas(replicas: int) -> None:
    with pytest.raises(ValueError, match="replicas >= 2"):
        time_sliced_node("n", replicas=replicas)
