"""Kubernetes objects of the demo, built from the scenario: GPU nodes with topology, workloads, HPAs.

Why it exists: the scenario says "a Deployment of 1-GPU pods with an HPA on GPU utilization and QPS" or "a
2-pod, 4-GPU training Job in the batch pool"; this module turns that into the exact objects a platform team
would apply (autoscaling/v2 Pods and External metrics served by the gpuwarden adapter, tolerations for pool
taints, node affinity, priority classes), and describes the kwok GPU nodes the way the device plugin and
gpuwarden's topology annotation would. Pure: dicts in, dicts out, no I/O.
"""

from __future__ import annotations

import uuid
from typing import Any

from gpuwarden.wellknown import TOPOLOGY_POLICY
from harness.demo.scenario import ENGINE_METRICS, Deploy, Fleet, Hpa, Job, Workload
from harness.simulator.hardware import gpu_uuid
from harness.testbed import GpuNodeSpec

POOL_KEY = "gpuwarden.io/pool"
HOLD_FINALIZER = "gpuwarden.io/demo-hold"
APP_LABEL = "app"
DEMO_LABEL = "gpuwarden.io/demo"
IMAGE = "registry.invalid/harness/demo-workload:0"  # kwok never pulls it
GATEWAY_SERIES = "gateway_requests_total"
GATEWAY_METRIC = "gateway_requests_per_second"
"""The External metric the adapter serves from the simulator's `gateway_requests_total{namespace, service}`
(the stack's adapter config has the rule), selected per workload by `service=<workload>`."""
ROUTER_METRIC, ENGINE_QUEUE_METRIC, ENGINE_KV_METRIC = ENGINE_METRICS
"""The External metrics of a Deployment with an engine (named in the scenario model, the `Hpa` fields):
the router's queue, the adapter's `router_queue` preset under its default name, selected per workload by
`service=<workload>`; the engine's queue and KV cache, which the stack's adapter config makes of the pods'
vLLM series summed per namespace (stack.engine_rules)."""


def topology(fleet: Fleet, node: str) -> dict[str, dict[str, Any]]:
    """`gpuwarden.io/gpu-topology`: NUMA as in the simulator, a PCIe switch per GPU pair, one NVSwitch domain,
    and the simulator's GPU UUIDs (so the extender can tell which GPU the health controller flagged)."""
    return {
        str(i): {
            "numa": fleet.numa_of(i),
            "pcie": f"pcie{i // 2}",
            "nvlink": "nvswitch0",
            "uuid": gpu_uuid(node, i),
        }
        for i in range(fleet.gpus_per_node)
    }


def node_specs(fleet: Fleet) -> list[GpuNodeSpec]:
    """One kwok node per fleet node, labelled and tainted for its pool."""
    pool_of = {n: pool for pool, spec in fleet.pools.items() for n in spec.nodes}
    specs = []
    for name in fleet.node_names():
        pool = pool_of.get(name)
        labels = {POOL_KEY: pool} if pool else {}
        taints = (
            [{"key": POOL_KEY, "value": pool, "effect": "NoSchedule"}]
            if pool and fleet.pools[pool].taint
            else []
        )
        specs.append(
            GpuNodeSpec(
                name=name,
                gpus=fleet.gpus_per_node,
                labels=labels,
                taints=taints,
                topology=topology(fleet, name),
            )
        )
    return specs


def boot_id_patch() -> dict[str, Any]:
    """A status patch giving the node a new bootID: what a reboot looks like to the API."""
    return {"status": {"nodeInfo": {"bootID": str(uuid.uuid4())}}}


def namespace(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
        "value": value,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "gpuwarden demo",
    }


def pod_template(w: Workload) -> dict[str, Any]:
    """Metadata and spec of the workload's pods."""
    annotations = {TOPOLOGY_POLICY: w.topology_policy} if w.topology_policy else {}
    metadata: dict[str, Any] = {"labels": {APP_LABEL: w.name, DEMO_LABEL: "true"}}
    if annotations:
        metadata["annotations"] = annotations
    if w.hold:
        metadata["finalizers"] = [HOLD_FINALIZER]
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": w.name,
                "image": IMAGE,
                "resources": {"limits": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(w.gpus)}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"nvidia.com/gpu.present": "true", **({POOL_KEY: w.pool} if w.pool else {})},
    }
    if w.pool:
        spec["tolerations"] = [
            {"key": POOL_KEY, "operator": "Equal", "value": w.pool, "effect": "NoSchedule"}
        ]
    if w.priority_class:
        spec["priorityClassName"] = w.priority_class
    affinity: dict[str, Any] = {}
    if w.nodes:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": w.nodes}]}
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}
    if w.prefer_nodes:
        pref = {"key": "kubernetes.io/hostname", "operator": "In", "values": w.prefer_nodes}
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "preference": {"matchExpressions": [pref]}}
        ]
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    return {"metadata": metadata, "spec": spec}


def deployment(d: Deploy) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": d.name, "namespace": d.namespace, "labels": {DEMO_LABEL: "true"}},
        "spec": {
            "replicas": d.replicas,
            "selector": {"matchLabels": {APP_LABEL: d.name}},
            "template": pod_template(d),
        },
    }


def external_selector(d: Deploy, metric: str) -> dict[str, Any] | None:
    """The gateway's and the router's metrics are per service (`service=<workload>`); the engine's workload
    sums are per namespace (the simulator's engine series carry no workload label), so they take none."""
    if metric in (GATEWAY_METRIC, ROUTER_METRIC):
        return {"matchLabels": {"service": d.name}}
    return None


def hpa(d: Deploy, spec: Hpa) -> dict[str, Any]:
    """autoscaling/v2 on the adapter's Pods metrics (gpu_utilization, requests_per_second) and its External
    ones (the gateway's request rate; the router's queue and the engine's queue and KV cache); `minReplicas:
    0` is allowed by the API server only when every metric is External (or Object), which the scenario model
    already checked. Every External target is an AverageValue: the workload's value per replica."""
    targets = (("gpu_utilization", spec.gpu_utilization), ("requests_per_second", spec.requests_per_second))
    metrics = [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": name},
                "target": {"type": "AverageValue", "averageValue": f"{value:g}"},
            },
        }
        for name, value in targets
        if value is not None
    ]
    for name, value in spec.external_targets.items():
        metric: dict[str, Any] = {"name": name}
        if (selector := external_selector(d, name)) is not None:
            metric["selector"] = selector
        metrics.append(
            {
                "type": "External",
                "external": {
                    "metric": metric,
                    "target": {"type": "AverageValue", "averageValue": f"{value:g}"},
                },
            }
        )
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": d.name, "namespace": d.namespace, "labels": {DEMO_LABEL: "true"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name},
            "minReplicas": spec.min,
            "maxReplicas": spec.max,
            "metrics": metrics,
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {"stabilizationWindowSeconds": spec.scale_down_stabilization_seconds},
            },
        },
    }


def job_pods(j: Job) -> list[dict[str, Any]]:
    """A training job as its operator runs it (PyTorchJob, JobSet, MPIJob): one pod per worker, not
    restarted. Bare pods rather than a batch/v1 Job because kwok's default stages complete Job-owned pods at
    once, and a training job that finishes in a second shows nothing."""
    pods = []
    for i in range(j.parallelism):
        template = pod_template(j)
        template["metadata"].update({"name": f"{j.name}-worker-{i}", "namespace": j.namespace})
        template["spec"]["restartPolicy"] = "Never"
        pods.append({"apiVersion": "v1", "kind": "Pod", **template})
    return pods


def workload_objects(w: Deploy | Job) -> list[dict[str, Any]]:
    """The objects to apply for a `deploy` or `job` action."""
    if isinstance(w, Job):
        return job_pods(w)
    objects = [deployment(w)]
    if w.hpa is not None:
        objects.append(hpa(w, w.hpa))
    return objects
