"""Keeping the GPU model current: watches on nodes, pods and NodeResourceTopology, and error trends.

Why it exists: every replica's extender answers filter/prioritize/bind from memory, and the controller's
other capabilities ask the same model, so the model must follow the API
with the reflector contract (list, watch from its resourceVersion, relist on 410) that `gpuwarden.kube`
implements. Pods are watched without terminated ones (field selector), so a pod that finishes arrives as a
DELETED event and frees its GPUs. The NRT CRD is optional: when it is not installed the feed checks again
every few minutes, so a CRD installed after start is picked up (scheduler-plugins#967 is the known bug of
not doing so). Correctable-error trends come from Prometheus on a timer; a failed read keeps the last values
for a while and then forgets them (unknown = no penalty, never a guess).

In the controller the node and live-pod informers are the process's shared ones (`nodes=`, `pods=`: one
list+watch stream per kind for every capability; with `kubernetes.protobuf` the controller's pod informer is
protobuf too); standalone, the feed runs its own, and with `protobuf` its pods are listed and watched as
protobuf (`gpuwarden.kube.protosource`; kube-scheduler watches them so too, so the API server encodes each
pod event once) and decoded straight into the model's `PodInfo` (`podproto.decoded_pod`, no dict of the pod),
so an event that changes nothing the model reads costs its decode and one comparison.

It must not decide anything and never writes to the API.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from controller.gpus.domains import DomainPlacement
from controller.gpus.fit import FleetSettings, settings_from_config
from controller.gpus.model import ClusterModel
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError, KubeNotFound, PrometheusError
from gpuwarden.kube import (
    DELETED,
    LIVE_PODS,
    NODES,
    PODS,
    SYNCED,
    Informer,
    KubeClient,
    ProtobufSource,
    Resource,
    WatchEvent,
    object_key,
)
from gpuwarden.kube.watch import WatchSource
from gpuwarden.promclient import PrometheusClient
from gpuwarden.promtypes import Vector

log = logging.getLogger(__name__)

NRT = Resource("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "NodeResourceTopology", False)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
"""DRA's DeviceClasses (GA API from 1.34): which extended resources DRA serves on nodes without a device
plugin (dra.py). Optional like the NRT CRD: an API server without it is checked again every few minutes."""
SBE_METRIC = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"


class ModelFeed:
    """Runs the informers feeding one `ClusterModel` until cancelled."""

    def __init__(
        self,
        client: KubeClient,
        model: ClusterModel,
        *,
        page_size: int = 500,
        watch_timeout: int = 300,
        nrt_recheck_seconds: float = 300.0,
        freeze_gc_after_sync: bool = True,
        sleep: Callable[[float], Any] = asyncio.sleep,
        on_pod: Callable[[str], None] = lambda key: None,
        nodes: Informer | None = None,
        pods: Informer | None = None,
        protobuf: bool = False,
    ) -> None:
        self._client = client
        self._protobuf = protobuf
        """Our own pod informer lists and watches as protobuf (a shared `pods` informer is its owner's)."""
        self.model = model
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._nrt_recheck = nrt_recheck_seconds
        self._freeze_gc = freeze_gc_after_sync
        self._sleep = sleep
        self._on_pod = on_pod
        """Told the key of every pod event once the model has applied it (the binder waits on its claims)."""
        self.nrt_installed = False
        self._own: list[Informer] = []
        """Informers this feed runs itself (those not handed in)."""
        for informer, resource, selector, handler in (
            (nodes, NODES, None, self.on_node),
            (pods, PODS, LIVE_PODS, self.on_pod),
        ):
            if informer is None:
                informer = self._informer(resource, selector)
                self._own.append(informer)
            informer.subscribe(handler)

    def add_pod_listener(self, listener: Callable[[str], None]) -> None:
        """Also tell `listener` the key of every pod event once the model has applied it."""
        previous = self._on_pod

        def both(key: str) -> None:
            previous(key)
            listener(key)

        self._on_pod = both

    async def run(self) -> None:
        tasks = [informer.run() for informer in self._own]
        if self.model.topology_source != "annotation":
            tasks.append(self._nrts())
        tasks.append(self._device_classes())
        if tasks:
            await asyncio.gather(*tasks)
        else:  # every informer is the process's shared one: nothing of our own to run
            await asyncio.Event().wait()

    def _informer(self, resource: Resource, field_selector: str | None = None) -> Informer:
        source: WatchSource = self._client
        if resource is PODS and self._protobuf:
            # Imported here: a controller whose pods come from the shared (JSON) informer never loads the
            # protobuf runtime.
            from controller.gpus.podproto import decoded_pod

            # Each pod straight into the PodInfo the model reads (no dict of its JSON): the informer holds
            # only the pods' keys and resourceVersions, and no one but the model reads them.
            source = ProtobufSource(self._client, decode=partial(decoded_pod, resource=self.model.resource))
        return Informer(
            source,
            resource,
            field_selector=field_selector,
            page_size=self._page_size,
            watch_timeout=self._watch_timeout,
        )

    def _synced(self) -> None:
        if self.model.synced:
            log.info("extender model synced", extra={"nodes": self.model.node_count()})
            if self._freeze_gc:
                # The cache is long-lived: keep gen-2 collections from rescanning it (latency spikes of
                # 50-150 ms at 5,000 nodes otherwise). Objects are still freed by reference counting.
                gc.freeze()

    def on_node(self, event: WatchEvent) -> None:
        if event.type == SYNCED:
            first = not self.model.nodes_synced
            self.model.nodes_synced = True
            if first:
                self._synced()
        elif event.type == DELETED:
            self.model.delete_node(object_key(event.object))
        else:
            self.model.upsert_node(event.object)

    def on_pod(self, event: WatchEvent) -> None:
        if event.type == SYNCED:
            first = not self.model.pods_synced
            self.model.pods_synced = True
            if first:
                self._synced()
        elif event.type == DELETED:
            key = object_key(event.object)
            self.model.delete_pod(key)
            self._on_pod(key)
        else:
            self.model.upsert_pod(event.object)
            self._on_pod(object_key(event.object))

    async def _nrts(self) -> None:
        while not await self._nrt_available():
            await self._sleep(self._nrt_recheck)
        self.nrt_installed = True
        async for event in self._informer(NRT).events():
            if event.type == DELETED:
                self.model.delete_nrt(object_key(event.object))
            elif event.type != SYNCED:
                self.model.upsert_nrt(event.object)

    async def _device_classes(self) -> None:
        while not await self._available(DEVICE_CLASSES, "DRA DeviceClasses (resource.k8s.io/v1)"):
            await self._sleep(self._nrt_recheck)
        classes: dict[str, Mapping[str, Any]] = {}
        async for event in self._informer(DEVICE_CLASSES).events():
            if event.type == SYNCED:
                continue
            if event.type == DELETED:
                classes.pop(object_key(event.object), None)
            else:
                classes[object_key(event.object)] = event.object
            self.model.set_device_classes(classes.values())

    async def _available(self, resource: Resource, what: str) -> bool:
        try:
            await self._client.list_page(resource, limit=1)
        except KubeNotFound:
            log.info(f"{what} not served; checking again later")
            return False
        except KubeError as exc:
            log.warning(f"cannot list {what}", extra={"error": str(exc)})
            return False
        return True

    async def _nrt_available(self) -> bool:
        try:
            await self._client.list_page(NRT, limit=1)
        except KubeNotFound:
            log.info("NodeResourceTopology CRD not installed; using the gpuwarden.io/gpu-topology annotation")
            return False
        except KubeError as exc:
            log.warning("cannot list NodeResourceTopology", extra={"error": str(exc)})
            return False
        return True


def trend_query(node_labels: Sequence[str], label_matchers: str = "") -> str:
    """PromQL for correctable (single-bit ECC) errors per node over the last hour."""
    return f"sum by ({', '.join(node_labels)}) (increase({SBE_METRIC}{{{label_matchers}}}[1h]))"


def trends_from_vector(vector: Vector, node_labels: Sequence[str]) -> dict[str, float]:
    """Node name (first present of `node_labels`) -> SBE errors in the last hour, summed."""
    out: dict[str, float] = {}
    for sample in vector.samples:
        node = next((sample.labels[label] for label in node_labels if sample.labels.get(label)), None)
        if node is not None and sample.value == sample.value:  # skip NaN
            out[node] = out.get(node, 0.0) + max(0.0, sample.value)
    return out


class ErrorTrends:
    """Refreshes the model's per-node correctable-error trends from Prometheus every `interval` seconds."""

    def __init__(
        self,
        prometheus: PrometheusClient,
        model: ClusterModel,
        *,
        node_labels: Sequence[str],
        label_matchers: str = "",
        interval: float = 60.0,
        forget_after_failures: int = 5,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._prom = prometheus
        self._model = model
        self._labels = list(node_labels)
        self.query = trend_query(self._labels, label_matchers)
        self._interval = interval
        self._forget_after = forget_after_failures
        self._sleep = sleep
        self.failures = 0

    async def refresh(self) -> Mapping[str, float] | None:
        """One read; the trends applied, or None when Prometheus could not answer."""
        try:
            result = await self._prom.query(self.query)
        except PrometheusError as exc:
            self.failures += 1
            log.warning("error-trend query failed", extra={"error": str(exc), "failures": self.failures})
            if self.failures == self._forget_after:
                self._model.set_error_trends({})
            return None
        self.failures = 0
        trends = trends_from_vector(result, self._labels) if isinstance(result, Vector) else {}
        self._model.set_error_trends(trends)
        return trends

    async def run(self) -> None:
        while True:
            await self.refresh()
            await self._sleep(self._interval)


@dataclass
class GpuModel:
    """The controller's one GPU model: the model, the settings every capability asks it with, and the feed
    (plus the error trends) that keep it current. `await run()` runs the feed and trends until cancelled;
    the shared node and pod informers it subscribes to are run by their owner."""

    model: ClusterModel
    settings: FleetSettings
    feed: ModelFeed | None
    """None for a model built from objects listed once (`model_from_lists`)."""
    trends: ErrorTrends | None = None

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                if self.feed is not None:
                    group.create_task(self.feed.run(), name="gpu-model-feed")
                if self.trends is not None:
                    group.create_task(self.trends.run(), name="gpu-model-error-trends")
        except BaseExceptionGroup as failed:  # the first failure; the rest are usually its consequences
            raise failed.exceptions[0] from failed


def domain_placement(config: Config) -> DomainPlacement | None:
    """The extender's NVLink-domain placement settings (config `domains`); None when off."""
    d = config.domains
    if not d.enabled or (d.placement_weight == 0 and d.health.action == "off"):
        return None
    return DomainPlacement(d.clique_label, tuple(d.job_labels), d.placement_weight)


def build_gpu_model(
    config: Config,
    kube: KubeClient,
    *,
    prometheus: PrometheusClient | None = None,
    nodes: Informer | None = None,
    pods: Informer | None = None,
) -> GpuModel:
    """The model from the `extender` (topology source, decision knobs, scoring), `kubernetes` and `health`
    (node labels of DCGM series) sections; `prometheus` None disables the error trends. `nodes`/`pods`:
    the process's shared informers (live pods), else the feed runs its own."""
    cfg = config.extender
    resource = config.kubernetes.gpu_resource_name
    model = ClusterModel(resource, topology_source=cfg.topology_source, placement=domain_placement(config))
    feed = ModelFeed(
        kube,
        model,
        page_size=config.kubernetes.list_page_size,
        watch_timeout=int(config.kubernetes.watch_timeout_seconds),
        nodes=nodes,
        pods=pods,
        protobuf=config.kubernetes.protobuf,
    )
    trends = None
    if prometheus is not None:
        trends = ErrorTrends(
            prometheus,
            model,
            node_labels=config.health.node_labels,
            label_matchers=config.health.label_matchers,
            interval=cfg.scoring.error_trend_refresh_seconds,
        )
    settings = FleetSettings(settings_from_config(cfg, resource), model.max_numa_gpus)
    return GpuModel(model, settings, feed, trends)


def model_from_lists(
    config: Config, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> GpuModel:
    """A synced model from objects listed once (`gpuwarden plan`): no feed runs, no error trends.
    Topology from the node annotation (NodeResourceTopology objects are not listed)."""
    cfg, resource = config.extender, config.kubernetes.gpu_resource_name
    model = ClusterModel(resource)
    for node in nodes:
        model.upsert_node(node)
    for pod in pods:
        model.upsert_pod(pod)
    model.nodes_synced = model.pods_synced = True
    settings = FleetSettings(settings_from_config(cfg, resource), model.max_numa_gpus)
    return GpuModel(model, settings, None)
