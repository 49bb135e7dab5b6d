"""A minimal device plugin for the real-kubelet proofs: fixed devices, Allocate answers a test can read back.

It speaks the kubelet's device-plugin API v1beta1 (stubs generated from the kubelet's own .proto): serves
``DevicePlugin`` on a socket in the kubelet's device-plugin directory, then registers with the kubelet's
``Registration`` service (the kubelet dials back at once, so the server must be up first). Every Allocate is
recorded, and its answer sets ``NVIDIA_VISIBLE_DEVICES`` (what NVIDIA's plugin sets) and ``GWTEST_DEVICES`` to
the IDs the kubelet chose, so a test can compare what the kubelet asked, what the plugin answered and what the
container saw. It is test code: the product's plugin comes with the node agent.

With ``replicas`` > 1 it stands in for NVIDIA's plugin under time-slicing (or MPS): every device is offered
as ``<id>::<n>``, n = 0..replicas-1, and Allocate strips the suffix and deduplicates before setting
``NVIDIA_VISIBLE_DEVICES`` (k8s-device-plugin ``internal/rm/devices.go`` ``NewAnnotatedID``,
``internal/plugin/server.go``); ``GWTEST_DEVICES`` keeps the replica IDs the kubelet chose.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

API_VERSION = "v1beta1"


@dataclass
class MinimalDevicePlugin(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Serve ``devices`` of ``resource`` from ``<plugin_dir>/<socket_name>`` and register with the kubelet."""

    resource: str
    devices: Sequence[str]
    plugin_dir: Path
    socket_name: str = "gwtest-gpu.sock"
    replicas: int = 1
    """Time-slicing: offer each device this many times as `<id>::<n>` (1: the devices as they are)."""
    allocations: list[list[str]] = field(default_factory=list)
    _server: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def advertised(self) -> list[str]:
        """The device IDs registered with the kubelet: the devices, or their replica IDs."""
        if self.replicas <= 1:
            return list(self.devices)
        return [f"{d}::{n}" for d in self.devices for n in range(self.replicas)]

    # ------------------------------------------------------------------ DevicePlugin service
    def GetDevicePluginOptions(self, request: dp.Empty, context: Any) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: dp.Empty, context: Any) -> Iterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=d, health="Healthy") for d in self.advertised])
        while not self._stop.is_set() and context.is_active():
            self._stop.wait(0.5)

    def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        responses = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            self.allocations.append(ids)
            visible = ",".join(dict.fromkeys(i.rsplit("::", 1)[0] if "::" in i else i for i in ids))
            responses.append(
                dp.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": visible, "GWTEST_DEVICES": ",".join(ids)}
                )
            )
        return dp.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse()

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    # ------------------------------------------------------------------ lifecycle
    def start(self, kubelet_socket: Path) -> MinimalDevicePlugin:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_name,
                    resource_name=self.resource,
                    options=dp.DevicePluginOptions(),
                ),
                timeout=20,
            )
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
        self.socket.unlink(missing_ok=True)
