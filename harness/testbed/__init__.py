"""A real Kubernetes control plane on this machine, for gpuwarden's e2e tests and demo.

There is no container runtime, so the test bed runs upstream kube-apiserver, kube-controller-manager,
kube-scheduler and etcd as host processes through kwokctl's binary runtime, with kwok playing kubelet for fake
GPU nodes. The binaries come from ``make testbed`` (tests/testbed/build.sh). This package is standalone (it
imports nothing else from gpuwarden but the dependency-free `gpuwarden.ports`) so the demo and the tests
share exactly one way of building a cluster.
"""

from harness.testbed.apiservice import (
    LocalAPIService,
    apiservice_condition,
    delete_local_apiservice,
    register_local_apiservice,
    wait_apiservice_available,
)
from harness.testbed.binaries import Binaries, TestbedMissingError
from harness.testbed.cluster import Cluster, ClusterConfig, ClusterError, ensure_namespace, running_cluster
from harness.testbed.nodes import (
    GPU_RESOURCE,
    GpuNodeSpec,
    NodeSharing,
    add_gpu_nodes,
    delete_nodes,
    gpu_node_specs,
    mig_mixed_node,
    mig_single_node,
    time_sliced_node,
)
from harness.testbed.scheduler import ExtenderSpec, SchedulerSettings, scheduler_configuration
from harness.testbed.waiting import PollTimeoutError, Progress, poll

__all__ = [
    "GPU_RESOURCE",
    "Binaries",
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ExtenderSpec",
    "GpuNodeSpec",
    "LocalAPIService",
    "NodeSharing",
    "PollTimeoutError",
    "Progress",
    "SchedulerSettings",
    "TestbedMissingError",
    "add_gpu_nodes",
    "apiservice_condition",
    "delete_local_apiservice",
    "delete_nodes",
    "ensure_namespace",
    "gpu_node_specs",
    "mig_mixed_node",
    "mig_single_node",
    "poll",
    "register_local_apiservice",
    "running_cluster",
    "scheduler_configuration",
    "time_sliced_node",
    "wait_apiservice_available",
]
