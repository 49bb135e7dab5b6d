"""Proof (a): the test bed runs workloads. A Deployment requesting ``nvidia.com/gpu`` is scheduled by the real
kube-scheduler onto kwok GPU nodes, and kwok reports its pods Running and Ready."""

from __future__ import annotations

from typing import Any

import pytest

from harness.testbed import GPU_RESOURCE, Cluster, poll
from tests.e2e.conftest import GPU_NODES, pod_manifest

pytestmark = pytest.mark.e2e


def _deployment(name: str, namespace: str, replicas: int, gpus: int) -> dict[str, Any]:
    pod = pod_manifest(name, gpus=gpus, nodeSelector={"nvidia.com/gpu.present": "true"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def _pod_ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def test_gpu_deployment_becomes_running_and_ready(cluster: Cluster, namespace: str) -> None:
    cluster.apply(_deployment("gpu-worker", namespace, replicas=3, gpus=2))

    def rolled_out() -> dict[str, Any] | None:
        d = cluster.get_json("deployment", "gpu-worker", "-n", namespace)
        st = d.get("status", {})
        return d if st.get("readyReplicas") == 3 and st.get("availableReplicas") == 3 else None

    poll(rolled_out, timeout=90, what="Deployment gpu-worker 3/3 ready")
    pods = cluster.get_json("pods", "-n", namespace, "-l", "app=gpu-worker")["items"]
    assert len(pods) == 3
    for pod in pods:
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert _pod_ready(pod), pod["status"]
        assert pod["spec"]["nodeName"] in GPU_NODES
        assert pod["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "2"
    # No node is over-committed on GPUs.
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + 2
    assert all(v <= 8 for v in per_node.values()), per_node


def test_gpu_requests_beyond_capacity_stay_pending(cluster: Cluster, namespace: str) -> None:
    """The real scheduler enforces nvidia.com/gpu allocatable: a pod asking for 9 GPUs fits no 8-GPU node."""
    pod = pod_manifest("too-big", gpus=9, nodeSelector={"nvidia.com/gpu.present": "true"})
    pod["metadata"]["namespace"] = namespace
    cluster.apply(pod)

    def unschedulable() -> dict[str, Any] | None:
        p = cluster.get_json("pod", "too-big", "-n", namespace)
        for c in p.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return dict(c)
        return None

    cond = poll(unschedulable, timeout=60, what="PodScheduled=False/Unschedulable")
    assert GPU_RESOURCE in cond.get("message", ""), cond
