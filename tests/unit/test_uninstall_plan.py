"""controller/uninstall.py: exactly what gpuwarden wrote is lifted, nothing of anyone else's."""

from __future__ import annotations

from typing import Any

import pytest

from controller.uninstall import Lift, metadata_patch, plan_uninstall, removal_patch

OUR_TAINT = {"key": "gpuwarden.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
THEIR_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
READY = {"type": "Ready", "status": "True"}
HEALTHY = {"type": "GPUHealthy", "status": "False"}


def node(
    annotations: dict[str, str] | None = None, taints: Any = None, conditions: Any = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "annotations": annotations or {}},
        "spec": {"taints": taints} if taints is not None else {},
        "status": {"conditions": conditions or [READY]},
    }


def pod(annotations: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations, "labels": labels or {}}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(node(), None, id="untouched-node"),
        pytest.param(
            node({"gpuwarden.io/release": "now", "example.com/x": "1"}, [THEIR_TAINT]),
            None,
            id="operator-override-and-foreign-kept",
        ),
        pytest.param(
            node({"gpuwarden.io/quarantine": "{}", "gpuwarden.io/release": "now"}, [THEIR_TAINT, OUR_TAINT],
                 [READY, HEALTHY]),
            Lift("Node", "n1", annotations=("gpuwarden.io/quarantine",),
                 taints=((1, "gpuwarden.io/gpu-unhealthy"),), conditions=((1, "GPUHealthy"),)),
            id="quarantined-node",
        ),
        pytest.param(
            node({"gpuwarden.io/gpu-topology": "{}"}),
            Lift("Node", "n1", annotations=("gpuwarden.io/gpu-topology",)),
            id="node-agent-topology",
        ),
        pytest.param(
            node({"karpenter.sh/do-not-disrupt": "true", "gpuwarden.io/disruption-hold": "quarantine"}),
            Lift("Node", "n1", annotations=("gpuwarden.io/disruption-hold", "karpenter.sh/do-not-disrupt")),
            id="our-karpenter-hold-lifted-with-its-mark",
        ),
        pytest.param(node({"karpenter.sh/do-not-disrupt": "true"}), None, id="operators-karpenter-hold-kept"),
    ],
)  # fmt: skip
def test_node_lifts(obj: dict[str, Any], expected: Lift | None) -> None:
    plan = plan_uninstall([obj], [], [])
    assert plan.lifts == (() if expected is None else (expected,))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(pod({"gpuwarden.io/idle-ack-until": "x"}), None, id="users-ack-kept"),
        pytest.param(
            pod({"gpuwarden.io/gpu-ids": "0,1", "gpuwarden.io/topology-policy": "single-numa"},
                {"gpuwarden.io/gpu-node": "n1", "app": "a"}),
            Lift("Pod", "p", "ns", ("gpuwarden.io/gpu-ids",), ("gpuwarden.io/gpu-node",)),
            id="bound-gpu-pod",
        ),
    ],
)  # fmt: skip
def test_pod_lifts(obj: dict[str, Any], expected: Lift | None) -> None:
    assert plan_uninstall([], [obj], []).lifts == (() if expected is None else (expected,))


def test_only_our_device_taint_rules_are_deleted() -> None:
    ours = {"metadata": {"name": "gpuwarden-n1-abc", "labels": {"app.kubernetes.io/managed-by": "gpuwarden"}}}
    theirs = {"metadata": {"name": "driver-rule", "labels": {"app.kubernetes.io/managed-by": "dra-driver"}}}
    assert plan_uninstall([], [], [theirs, ours]).rules == ("gpuwarden-n1-abc",)


def test_patches_remove_keys_and_test_the_list_they_replace() -> None:
    lift = Lift("Pod", "p", "ns", ("gpuwarden.io/gpu-ids",), ("gpuwarden.io/gpu-node",))
    assert metadata_patch(lift) == {
        "metadata": {"annotations": {"gpuwarden.io/gpu-ids": None}, "labels": {"gpuwarden.io/gpu-node": None}}
    }
    assert metadata_patch(Lift("Node", "n")) is None
    ours = ((1, "GPUHealthy"), (3, "GPUDegraded"))
    assert removal_patch("/status/conditions", "type", ours) == [
        {"op": "test", "path": "/status/conditions/3/type", "value": "GPUDegraded"},
        {"op": "remove", "path": "/status/conditions/3"},
        {"op": "test", "path": "/status/conditions/1/type", "value": "GPUHealthy"},
        {"op": "remove", "path": "/status/conditions/1"},
    ]


def test_the_plan_reads_as_lines() -> None:
    plan = plan_uninstall([node({"gpuwarden.io/quarantine": "{}"}, [OUR_TAINT], [READY, HEALTHY])], [], [],
                          [("Lease", "gpuwarden-controller")])  # fmt: skip
    assert plan.lines() == [
        "Node n1: annotation gpuwarden.io/quarantine, taint gpuwarden.io/gpu-unhealthy, condition GPUHealthy",
        "Lease gpuwarden-controller: deleted",
    ]
