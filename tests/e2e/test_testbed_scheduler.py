"""Proofs (c) and (d): the real kube-scheduler calls our extender, and preempts.

(c) The session's KubeSchedulerConfiguration has an extender at a port reserved by conftest, interested only
in pods requesting ``gpuwarden.io/extender-probe``. The test serves it (extender/v1 wire format), rejects one
GPU node, records the filter request and checks the scheduler bound the pod where the extender allowed.

(d) On a dedicated 2-GPU node, a low-priority pod holds both GPUs; a high-priority pod asking for them makes
the default preemption plugin evict the victim (kwok's pod-delete stage finishes the graceful delete) and
set the preemptor's ``status.nominatedNodeName``, observed through a watch.

Plus: the harness can restart kube-scheduler with a different KubeSchedulerConfiguration.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from harness.testbed import (
    Cluster,
    ExtenderSpec,
    GpuNodeSpec,
    SchedulerSettings,
    add_gpu_nodes,
    delete_nodes,
    poll,
    scheduler_configuration,
)
from tests.e2e.conftest import EXTENDER_PROBE_RESOURCE, GPU_NODES, ExtenderServer, free_port, pod_manifest

pytestmark = pytest.mark.e2e


def _pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("pod", name, "-n", namespace)


def _running_on(cluster: Cluster, namespace: str, name: str) -> str | None:
    pod = _pod(cluster, namespace, name)
    if pod.get("status", {}).get("phase") == "Running" and pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    return None


def test_scheduler_calls_extender_and_binds_where_it_allows(
    cluster: Cluster, namespace: str, extender: ExtenderServer
) -> None:
    allowed = GPU_NODES[1]
    extender.allow = lambda node: node == allowed
    pod = pod_manifest(
        "extender-probe",
        gpus=1,
        extra_limits={EXTENDER_PROBE_RESOURCE: "1"},
        nodeSelector={"nvidia.com/gpu.present": "true"},
    )
    pod["metadata"]["namespace"] = namespace
    cluster.apply(pod)

    node = poll(
        lambda: _running_on(cluster, namespace, "extender-probe"), timeout=60, what="probe pod Running"
    )
    assert node == allowed

    mine = [
        r
        for r in extender.filter_requests
        if r["Pod"]["metadata"]["name"] == "extender-probe" and r["Pod"]["metadata"]["namespace"] == namespace
    ]
    assert mine, f"extender saw no filter request for the pod ({len(extender.filter_requests)} total)"
    offered = {n["metadata"]["name"] for n in mine[0]["Nodes"]["items"]}
    assert set(GPU_NODES) <= offered, offered
    limits = mine[0]["Pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[EXTENDER_PROBE_RESOURCE] == "1"


def test_preemption_sets_nominated_node_name(cluster: Cluster, namespace: str) -> None:
    suffix = uuid.uuid4().hex[:5]
    node, pool = f"preempt-node-{suffix}", f"preempt-{suffix}"
    low, high = f"gw-e2e-low-{suffix}", f"gw-e2e-high-{suffix}"
    add_gpu_nodes(
        cluster,
        [
            GpuNodeSpec(
                name=node,
                gpus=2,
                labels={"gpuwarden.io/e2e-pool": pool},
                taints=[{"key": "gpuwarden.io/e2e-pool", "value": pool, "effect": "NoSchedule"}],
            )
        ],
    )
    api_client = cluster.api_client()
    stop = threading.Event()
    watcher: threading.Thread | None = None
    try:
        cluster.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": low},
                "value": 100,
            },
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": high},
                "value": 1000,
            },
        )
        placement: dict[str, Any] = {
            "nodeSelector": {"gpuwarden.io/e2e-pool": pool},
            "tolerations": [{"key": "gpuwarden.io/e2e-pool", "operator": "Equal", "value": pool}],
        }
        victim = pod_manifest(
            "victim", gpus=2, priorityClassName=low, terminationGracePeriodSeconds=30, **placement
        )
        victim["metadata"]["namespace"] = namespace
        cluster.apply(victim)
        assert (
            poll(lambda: _running_on(cluster, namespace, "victim"), timeout=60, what="victim Running") == node
        )

        core = client.CoreV1Api(api_client)
        listed = core.list_namespaced_pod(namespace).metadata
        assert listed is not None
        start_rv = listed.resource_version
        nominated: list[str] = []
        w = watch.Watch()  # type: ignore[no-untyped-call]

        watch_errors: list[Exception] = []

        def observe() -> None:
            try:
                for event in w.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod,
                    namespace,
                    field_selector="metadata.name=preemptor",
                    resource_version=start_rv,
                    timeout_seconds=90,
                ):
                    nn = event["object"].status.nominated_node_name
                    if nn:
                        nominated.append(nn)
                    if stop.is_set():
                        break
            except Exception as exc:  # the connection is cut when the test closes the client
                if not stop.is_set():
                    watch_errors.append(exc)

        watcher = threading.Thread(target=observe, daemon=True)
        watcher.start()

        preemptor = pod_manifest("preemptor", gpus=2, priorityClassName=high, **placement)
        preemptor["metadata"]["namespace"] = namespace
        cluster.apply(preemptor)

        assert (
            poll(lambda: _running_on(cluster, namespace, "preemptor"), timeout=90, what="preemptor Running")
            == node
        )
        poll(
            lambda: nominated or watch_errors, timeout=10, what="a watch event with status.nominatedNodeName"
        )
        stop.set()
        w.stop()  # type: ignore[no-untyped-call]
        assert not watch_errors, watch_errors
        assert set(nominated) == {node}, nominated
        assert not cluster.kubectl(
            "get", "pod", "victim", "-n", namespace, "--ignore-not-found", "-o", "name"
        )
        events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=victim")
        reasons = {e.get("reason") for e in events["items"]}
        assert "Preempted" in reasons, reasons
    finally:
        stop.set()
        # Deleting the pods produces watch events, which lets the watcher see ``stop`` and return.
        cluster.kubectl("delete", "pod", "--all", "-n", namespace, "--wait=false", check=False)
        if watcher is not None:
            watcher.join(timeout=10)
        api_client.close()
        cluster.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)
        delete_nodes(cluster, [node])


def test_restart_scheduler_with_a_new_extender_config(cluster: Cluster, namespace: str) -> None:
    """``Cluster.restart_scheduler`` swaps the KubeSchedulerConfiguration of a running cluster."""
    original = yaml.safe_load(cluster.scheduler_config_path().read_text())
    resource = "gpuwarden.io/extender-probe-restart"
    second = ExtenderServer(port=free_port(), allow=lambda node: node == GPU_NODES[0]).start()
    try:
        cluster.restart_scheduler(
            scheduler_configuration(
                SchedulerSettings(
                    extenders=[
                        ExtenderSpec(
                            url_prefix=f"http://127.0.0.1:{second.port}/scheduler",
                            managed_resources=[resource],
                            ignored_by_scheduler=True,
                        )
                    ]
                )
            )
        )
        pod = pod_manifest("after-restart", gpus=1, extra_limits={resource: "1"})
        pod["metadata"]["namespace"] = namespace
        cluster.apply(pod)
        node = poll(lambda: _running_on(cluster, namespace, "after-restart"), timeout=60, what="pod Running")
        assert node == GPU_NODES[0]
        assert any(r["Pod"]["metadata"]["name"] == "after-restart" for r in second.filter_requests)
    finally:
        cluster.restart_scheduler(original)
        second.stop()
