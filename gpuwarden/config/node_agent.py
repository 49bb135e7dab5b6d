"""The `node_agent:` section — the per-node process that carries GPU placement onto the kubelet.

Why: the extender's GPU choice ends at the API server; the agent publishes the node's real topology, reads
which GPUs each container actually got (kubelet PodResources) and, opt-in, serves the device-plugin API so
the recorded set is the set handed out. Paths default to the kubelet's own defaults, so a DaemonSet with the
usual hostPath mounts needs no configuration. The node name comes from the environment (Downward API).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, Seconds

DRIVER_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A DRA driver name: a DNS subdomain (ResourceSlice `spec.driver`)."""


class DevicePluginConfig(Section):
    """Enforce mode: the agent is the node's device plugin for the GPU resource."""

    enabled: bool = Field(
        default=False,
        description="Serve the kubelet device-plugin API v1beta1 (`--device-plugin`). Off: run beside "
        "NVIDIA's device plugin and only observe and reconcile; two plugins for one resource would fight.",
    )
    socket_name: str = Field(
        default="gpuwarden-gpu.sock",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\.sock$",
        description="File name of the plugin's socket inside device_plugin_dir (the kubelet dials it there).",
    )
    visible_devices_env: str = Field(
        default="NVIDIA_VISIBLE_DEVICES",
        description="Environment variable the Allocate answer sets to the allocated GPU ids (what NVIDIA's "
        "container toolkit reads; containerd 1.6 ignores CDI answers).",
    )
    device_nodes: bool = Field(
        default=False,
        description="Also hand the container /dev/nvidia<N>, /dev/nvidiactl, /dev/nvidia-uvm(-tools) as "
        "NVIDIA's plugin does with `--pass-device-specs`. Off: the NVIDIA runtime hook adds them.",
    )
    admission_wait_seconds: Seconds = Field(
        default=2.0,
        description="How long GetPreferredAllocation waits for the pod being admitted to appear in the pod "
        "watch before answering from the free GPUs alone. 2 s: the kubelet admits right after the bind.",
    )
    dra_drivers: list[Annotated[str, StringConstraints(pattern=DRIVER_NAME)]] = Field(
        default_factory=lambda: ["gpu.nvidia.com"],
        description="DRA drivers that own GPUs. While one of them is registered with this node's kubelet "
        "(its `<driver>-…reg.sock` in <kubelet_root_dir>/plugins_registry) the device plugin is not served, "
        "and a running one is stopped: the same GPUs under a device plugin and a DRA driver would be handed "
        "out twice, and a node listing the resource in its allocatable is taken off DRA's path. "
        "`gpu.nvidia.com` is NVIDIA's DRA driver.",
    )


class NodeAgentConfig(Section):
    """The node agent (`gpuwarden node-agent`, one per GPU node)."""

    node_name: str = Field(
        default="",
        description="This node's name. Empty: read from $NODE_NAME (set it with the Downward API "
        "`spec.nodeName`); the agent refuses to start without one.",
    )
    dry_run: bool = Field(
        default=False,
        description="Read and decide, log and count, but patch nothing (no annotation on the Node or pods).",
    )
    resource_name: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$",
        description="The extended resource whose devices are reconciled (and served, in enforce mode).",
    )
    device_id_strategy: Literal["uuid", "index"] = Field(
        default="uuid",
        description="Which GPU ids the node's device plugin uses, so the published topology names the same "
        "ids: `uuid` is NVIDIA's default (`--device-id-strategy=uuid`), `index` its alternative.",
    )
    topology_source: Literal["auto", "nvml", "sysfs", "file"] = Field(
        default="auto",
        description="Where the GPU topology comes from: `auto` = NVML when libnvidia-ml loads, else sysfs; "
        "`file` = topology_file (simulated nodes, tests).",
    )
    topology_file: str = Field(default="", description="YAML/JSON topology for topology_source `file`.")
    publish_topology: bool = Field(
        default=True,
        description="Write the `gpuwarden.io/gpu-topology` annotation on this Node (only when it changed). "
        "Off: another component (NFD topology updater) publishes it.",
    )
    kubelet_root_dir: str = Field(
        default="/var/lib/kubelet",
        description="The kubelet's --root-dir; the PodResources socket is <root>/pod-resources/kubelet.sock.",
    )
    pod_resources_socket: str = Field(
        default="",
        description="PodResources API socket. Empty: <kubelet_root_dir>/pod-resources/kubelet.sock.",
    )
    device_plugin_dir: str = Field(
        default="/var/lib/kubelet/device-plugins",
        description="The kubelet's device-plugin directory (fixed by the kubelet; mount it at that path).",
    )
    reconcile_interval_seconds: Seconds = Field(
        default=5.0,
        ge=0.5,
        description="Seconds between PodResources reads besides the ones pod events trigger. 5 s: the "
        "kubelet rate-limits the API at 100 qps (burst 10); a read per pod event plus this stays far below.",
    )
    min_read_interval_seconds: Seconds = Field(
        default=0.2,
        description="At most one PodResources read per this many seconds, however many pod events arrive.",
    )
    topology_interval_seconds: Seconds = Field(
        default=60.0,
        description="Seconds between topology re-reads (a GPU that fell off the bus changes it).",
    )
    listen: str = Field(
        default="0.0.0.0:9402",
        pattern=r"^[^:]*:[0-9]{1,5}$",
        description="HOST:PORT of /healthz, /readyz and /metrics.",
    )
    device_plugin: DevicePluginConfig = Field(
        default_factory=DevicePluginConfig, description="Enforce mode (the agent as device plugin)."
    )

    @model_validator(mode="after")
    def _file_needs_path(self) -> NodeAgentConfig:
        if self.topology_source == "file" and not self.topology_file:
            raise FieldError("topology_file", "is required when topology_source is `file`")
        return self

    @property
    def pod_resources_path(self) -> str:
        """The PodResources socket path actually used."""
        return self.pod_resources_socket or f"{self.kubelet_root_dir.rstrip('/')}/pod-resources/kubelet.sock"
