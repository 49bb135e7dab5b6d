"""Enforce mode: the agent as the node's device plugin (kubelet device-plugin API v1beta1) for the GPUs.

Why it exists: with NVIDIA's plugin the kubelet picks any free GPUs; serving the API ourselves lets the
recorded set be the set handed out. The kubelet asks `GetPreferredAllocation` before `Allocate`; we answer
with the recorded ids of the pod being admitted (`nodeagent.admission`), and `Allocate` returns
`NVIDIA_VISIBLE_DEVICES` with those ids (UUIDs under the default id strategy), optionally the device nodes.

Lifecycle, as the kubelet requires: serve first, then `Register` on `kubelet.sock` (the kubelet dials back at
once). The kubelet deletes every socket in its directory when it restarts: a watcher notices our socket is
gone (or `kubelet.sock` was re-created), serves a new one and registers again. Health: a GPU whose UUID the
health controller quarantined is reported Unhealthy, so the kubelet stops handing it out and the Node's
allocatable drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpuwarden.litemetrics import Counter, Gauge, Histogram, Registry
from nodeagent.admission import Preference
from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from nodeagent.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"

PreferFn = Callable[[Sequence[str], Sequence[str], int], Awaitable[Preference]]


class DevicePluginMetrics:
    def __init__(self, registry: Registry) -> None:
        self.calls = Histogram(
            "gpuwarden_node_device_plugin_call_seconds",
            "Device-plugin calls from the kubelet, by method.",
            ["method"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.registrations = Counter(
            "gpuwarden_node_device_plugin_registrations_total",
            "Register calls to the kubelet, by outcome (a kubelet restart makes a new one).",
            ["outcome"],
            registry=registry,
        )
        self.preferences = Counter(
            "gpuwarden_node_preferred_allocations_total",
            "GetPreferredAllocation answers: recorded (the pod's recorded set) or none (kubelet's choice).",
            ["answer"],
            registry=registry,
        )
        for answer in ("recorded", "none"):
            self.preferences.labels(answer)
        self.devices = Gauge(
            "gpuwarden_node_devices",
            "GPUs the device plugin offers the kubelet, by health (Unhealthy: quarantined by gpuwarden).",
            ["health"],
            registry=registry,
        )
        for health in (HEALTHY, UNHEALTHY):
            self.devices.labels(health)


def device_specs(ids: Sequence[str], index_of: Mapping[str, int]) -> list[dp.DeviceSpec]:
    """The device nodes NVIDIA's plugin passes with --pass-device-specs (per GPU + the control nodes)."""
    nodes = [f"/dev/nvidia{index_of[i]}" for i in ids if i in index_of]
    nodes += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    return [
        dp.DeviceSpec(container_path=n, host_path=n, permissions="rw") for n in nodes if os.path.exists(n)
    ]


class GpuDevicePlugin(dp_grpc.DevicePluginServicer):
    """Serves `devices` (id -> healthy) for `resource` from `<plugin_dir>/<socket_name>`."""

    def __init__(
        self,
        *,
        resource: str,
        plugin_dir: Path,
        socket_name: str,
        prefer: PreferFn,
        visible_env: str,
        registry: Registry,
        index_of: Mapping[str, int] | None = None,
        pass_device_specs: bool = False,
    ) -> None:
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self._prefer = prefer
        self._visible_env = visible_env
        self._index_of = dict(index_of or {})
        self._pass_specs = pass_device_specs
        self.metrics = DevicePluginMetrics(registry)
        self._devices: dict[str, bool] = {}
        self._version = 0
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self._stopping = False
        self.allocations: deque[tuple[str, ...]] = deque(maxlen=256)
        """The last Allocate answers (bounded), for debugging and tests."""

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    async def set_devices(self, devices: Mapping[str, bool]) -> None:
        """Replace the device list (id -> healthy); ListAndWatch streams send the new list."""
        new = dict(devices)
        if new == self._devices:
            return
        async with self._changed:
            self._devices = new
            self._version += 1
            self._changed.notify_all()
        unhealthy = sum(1 for ok in new.values() if not ok)
        self.metrics.devices.labels(UNHEALTHY).set(unhealthy)
        self.metrics.devices.labels(HEALTHY).set(len(new) - unhealthy)

    def _device_list(self) -> list[dp.Device]:
        return [
            dp.Device(ID=i, health=HEALTHY if ok else UNHEALTHY) for i, ok in sorted(self._devices.items())
        ]

    # ------------------------------------------------------------------ the DevicePlugin service
    async def GetDevicePluginOptions(self, request: dp.Empty, context: Any) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: dp.Empty, context: Any) -> AsyncIterator[dp.ListAndWatchResponse]:
        seen = -1
        while not self._stopping:
            async with self._changed:
                if seen == self._version:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), timeout=5.0)
                    if seen == self._version:
                        continue
                seen = self._version
                devices = self._device_list()
            yield dp.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        t0 = time.perf_counter()
        responses = []
        for creq in request.container_requests:
            pref = await self._prefer(
                list(creq.available_deviceIDs), list(creq.must_include_deviceIDs), int(creq.allocation_size)
            )
            self.metrics.preferences.labels("recorded" if pref.ids else "none").inc()
            log.info(
                "preferred allocation",
                extra={"ids": ",".join(pref.ids), "pod": "/".join(pref.pod or ()), "reason": pref.reason},
            )
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=list(pref.ids)))
        self.metrics.calls.labels("GetPreferredAllocation").observe(time.perf_counter() - t0)
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        t0 = time.perf_counter()
        responses = []
        for creq in request.container_requests:
            ids = tuple(creq.devices_ids)
            unknown = [i for i in ids if i not in self._devices]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device ids: {unknown}")
            self.allocations.append(ids)
            resp = dp.ContainerAllocateResponse(envs={self._visible_env: ",".join(ids)})
            if self._pass_specs:
                resp.devices.extend(device_specs(ids, self._index_of))
            responses.append(resp)
        self.metrics.calls.labels("Allocate").observe(time.perf_counter() - t0)
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    # ------------------------------------------------------------------ lifecycle
    async def _serve(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def _register(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub = dp_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_name,
                    resource_name=self.resource,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=15,
            )

    async def _stop_server(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=1)

    async def start(self) -> None:
        """Serve and register once (raises when the kubelet refuses)."""
        await self._serve()
        try:
            await self._register()
        except grpc.RpcError:
            self.metrics.registrations.labels("error").inc()
            raise
        self.metrics.registrations.labels("ok").inc()
        log.info("registered with the kubelet", extra={"resource": self.resource, "socket": str(self.socket)})

    async def run(self, poll_interval: float = 1.0) -> None:
        """Keep serving; re-serve and re-register whenever the kubelet wiped our socket or restarted."""
        kubelet_id: tuple[int, int] | None = None
        registered = False
        try:
            while True:
                try:
                    st = self.kubelet_socket.stat()
                    current: tuple[int, int] | None = (st.st_ino, int(st.st_ctime_ns))
                except OSError:
                    current = None
                need = not registered or not self.socket.exists() or current != kubelet_id
                if need and current is not None:
                    await self._stop_server()
                    try:
                        await self.start()
                        registered, kubelet_id = True, current
                    except (grpc.RpcError, OSError) as exc:
                        registered = False
                        log.warning("registration failed; retrying", extra={"error": str(exc)})
                await asyncio.sleep(poll_interval)
        finally:
            self._stopping = True
            await self._stop_server()
            self.socket.unlink(missing_ok=True)
