"""The kubelet's PodResources API v1, read over its unix socket: who holds which device, and what is healthy.

Why it exists: it is the kubelet's own record of device allocations (written before a container starts), the
only exact source for "which GPUs does this container have". The kubelet emits one `ContainerDevices` entry
per device per NUMA node, so entries are merged here; init containers that are not sidecars are not listed.
The kubelet rate-limits the socket (100 qps, burst 10): callers read at most every few hundred milliseconds.
Errors become `KubeletUnavailable`; no grpc exception leaves this module.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import grpc

from gpuwarden.wellknown import canonical_gpu_ids as canonical
from nodeagent.kubeletapi.podresources.v1 import api_pb2 as pr
from nodeagent.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from nodeagent.reconcile import Allocation


class KubeletUnavailable(RuntimeError):
    """The PodResources socket did not answer (kubelet restarting, wrong path, not mounted)."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """One container's device ids for one resource."""

    namespace: str
    pod: str
    container: str
    ids: tuple[str, ...]


class PodResourcesReader:
    """An async client of `v1.PodResourcesLister` on `socket_path`."""

    def __init__(self, socket_path: str, *, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> pr_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket_path}")
        return pr_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    async def containers(self, resource: str) -> list[ContainerDevices]:
        """Every container holding devices of `resource` (ids merged across NUMA entries)."""
        try:
            answer = await self._stub().List(pr.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as exc:
            await self._reset()
            raise KubeletUnavailable(f"PodResources List on {self.socket_path}: {_describe(exc)}") from None
        out: list[ContainerDevices] = []
        for pod in answer.pod_resources:
            for container in pod.containers:
                ids = [i for d in container.devices if d.resource_name == resource for i in d.device_ids]
                if ids:
                    out.append(ContainerDevices(pod.namespace, pod.name, container.name, canonical(ids)))
        return out

    async def allocations(self, resource: str) -> list[Allocation]:
        """Per pod, the union of its containers' devices of `resource`."""
        per_pod: dict[tuple[str, str], set[str]] = defaultdict(set)
        for c in await self.containers(resource):
            per_pod[(c.namespace, c.pod)].update(c.ids)
        return [Allocation(ns, name, canonical(ids)) for (ns, name), ids in sorted(per_pod.items())]

    async def allocatable(self, resource: str) -> tuple[str, ...]:
        """The healthy devices of `resource` the kubelet can hand out (allocated ones included)."""
        try:
            answer = await self._stub().GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=self._timeout
            )
        except grpc.RpcError as exc:
            await self._reset()
            raise KubeletUnavailable(
                f"PodResources GetAllocatableResources on {self.socket_path}: {_describe(exc)}"
            ) from None
        return canonical(i for d in answer.devices if d.resource_name == resource for i in d.device_ids)

    async def _reset(self) -> None:
        # A restarted kubelet makes a new socket; a fresh channel dials it.
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()

    async def aclose(self) -> None:
        await self._reset()


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{getattr(code, 'name', code)}: {details}"
