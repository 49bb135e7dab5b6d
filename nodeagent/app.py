"""The node agent process (`gpuwarden node-agent`): observe the node, decide with the pure cores, act.

Why one module for the wiring: the topology publisher, the reconcile loop and (opt-in) the device plugin
share the pod watch of this node, the PodResources reader, the Kubernetes client and the self-metrics. The
listener serves `/healthz`, `/readyz` (pod watch synced and PodResources answering) and `/metrics`.

What it touches (docs/architecture.md: only its own Node and the pods bound to it): the
`gpuwarden.io/gpu-topology` annotation of its Node, our GPU annotations on pods with `spec.nodeName` = this
node, Events about those. Dry-run decides, logs and counts, and writes nothing. This module decides nothing
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from gpuwarden.config.lean import LeanConfig
from gpuwarden.errors import KubeError
from gpuwarden.kube import NODES, PODS, EventRecorder, EventType, Informer, KubeClient, ObjectRef
from gpuwarden.litemetrics import (
    CONTENT_TYPE_LATEST,
    Counter,
    Gauge,
    Histogram,
    Registry,
    generate_latest,
    new_registry,
)
from gpuwarden.quarantine import node_quarantine, quarantined_ids
from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from gpuwarden.wellknown import parse_gpu_ids as parse_ids
from nodeagent.admission import Preference, candidate, prefer
from nodeagent.draowner import dra_owner, withheld_note
from nodeagent.listener import Listener, Reply, Route
from nodeagent.podresources import KubeletUnavailable, PodResourcesReader
from nodeagent.reconcile import Assignment, Outcome, decide, pod_record
from nodeagent.sharedgpus import node_shares_gpus, shared_note
from nodeagent.topology.annotation import render
from nodeagent.topology.discover import discover
from nodeagent.topology.model import TopologyReadError

if TYPE_CHECKING:
    from gpuwarden.config.root import Config
    from nodeagent.deviceplugin import GpuDevicePlugin

AgentConfig = Union["Config", LeanConfig]
"""The models' `Config`, or the lean loader's view of a plainly valid node-agent file (same attributes)."""

log = logging.getLogger(__name__)

DRA_RECHECK_SECONDS = 10.0
"""How often enforce mode looks at the kubelet's plugin registry for a DRA driver owning the GPUs."""


COMPONENT = "node-agent"


def quarantined_devices(
    node: Mapping[str, Any], ids: Sequence[str], uuid_by_id: Mapping[str, str]
) -> set[str]:
    """Device ids the health controller's quarantine covers, by the one rule (`gpuwarden.quarantine`): none
    without our taint, the faulty GPUs when the record names them (by UUID, or by device id when the device
    plugin's ids are UUIDs) and the topology maps them, every device when that cannot be told."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    quarantine = node_quarantine(spec.get("taints") or [], meta.get("annotations") or {})
    id_by_uuid = {i: i for i in ids} | {uuid: i for i, uuid in uuid_by_id.items() if uuid}
    return set(quarantined_ids(quarantine, ids, id_by_uuid))


@dataclass
class AgentMetrics:
    """The agent's self-metrics (one registry per process)."""

    registry: Registry
    assignments: Counter = field(init=False)
    reads: Counter = field(init=False)
    reconcile_seconds: Histogram = field(init=False)
    topology_publishes: Counter = field(init=False)
    topology_errors: Counter = field(init=False)
    allocatable: Gauge = field(init=False)
    patch_errors: Counter = field(init=False)
    plugin_withheld: Gauge = field(init=False)
    http_rejected: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.assignments = Counter(
            "gpuwarden_node_assignments_total",
            "Pods whose actual GPU allocation (kubelet PodResources) was compared with the recorded set, by "
            "outcome: honoured (same GPUs), overridden (the kubelet chose others), unrecorded (no set).",
            ["outcome"],
            registry=r,
        )
        for verdict in Outcome:
            self.assignments.labels(verdict.value)
        self.reads = Counter(
            "gpuwarden_node_podresources_reads_total", "PodResources List calls.", ["outcome"], registry=r
        )
        for result in ("ok", "error"):
            self.reads.labels(result)
        self.reconcile_seconds = Histogram(
            "gpuwarden_node_reconcile_seconds",
            "One reconcile pass: PodResources read, decision, patches.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.topology_publishes = Counter(
            "gpuwarden_node_topology_publishes_total",
            "Writes of the gpuwarden.io/gpu-topology annotation (only when it changed).",
            registry=r,
        )
        self.topology_errors = Counter(
            "gpuwarden_node_topology_errors_total",
            "Topology reads that failed (unreadable or inconsistent hardware); the annotation was kept.",
            registry=r,
        )
        self.allocatable = Gauge(
            "gpuwarden_node_allocatable_devices",
            "Healthy devices of the resource the kubelet can hand out (PodResources GetAllocatable).",
            registry=r,
        )
        self.patch_errors = Counter(
            "gpuwarden_node_patch_errors_total", "Failed writes to the API server.", ["kind"], registry=r
        )
        self.plugin_withheld = Gauge(
            "gpuwarden_node_device_plugin_withheld",
            "1 while enforce mode does not serve the device plugin because a DRA driver of "
            "device_plugin.dra_drivers owns this node's GPUs (nodeagent/draowner.py) or the node shares its "
            "GPUs: time-slicing, MPS or MIG (nodeagent/sharedgpus.py).",
            registry=r,
        )
        self.http_rejected = Counter(
            "gpuwarden_http_requests_rejected_total",
            "HTTP requests refused before any route saw them (400 malformed, 413 body over the limit, "
            "431 head or line too long, 408 too slow), by reason.",
            ["reason"],
            registry=r,
        )


def node_name_from(config: AgentConfig, env: dict[str, str] | None = None) -> str:
    """`node_agent.node_name`, else $NODE_NAME; raise if neither is set."""
    env = dict(os.environ) if env is None else env
    name = config.node_agent.node_name or env.get("NODE_NAME", "")
    if not name:
        raise ValueError(
            "node_agent.node_name is empty and $NODE_NAME is not set (Downward API spec.nodeName)"
        )
    return name


class NodeAgent:
    """The running agent for one node."""

    def __init__(
        self, config: AgentConfig, kube: KubeClient, node: str, *, registry: Registry | None = None
    ) -> None:
        self.config = config
        self.cfg = config.node_agent
        self.kube = kube
        self.node = node
        self.registry = registry or new_registry(COMPONENT)
        self.metrics = AgentMetrics(self.registry)
        self.reader = PodResourcesReader(self.cfg.pod_resources_path)
        self.pods = Informer(kube, PODS, field_selector=f"spec.nodeName={node}")
        self.nodes = Informer(kube, NODES, field_selector=f"metadata.name={node}")
        self.uuid_by_id: dict[str, str] = {}
        self.index_by_id: dict[str, int] = {}
        self.plugin: GpuDevicePlugin | None = None
        if self.cfg.device_plugin.enabled:
            # Enforce mode only: its code and the device-plugin API stubs are not loaded otherwise.
            from nodeagent.deviceplugin import GpuDevicePlugin

            dpc = self.cfg.device_plugin
            self.plugin = GpuDevicePlugin(
                resource=self.cfg.resource_name,
                plugin_dir=Path(self.cfg.device_plugin_dir),
                socket_name=dpc.socket_name,
                prefer=self.prefer,
                visible_env=dpc.visible_devices_env,
                registry=self.registry,
                index_of=self.index_by_id,
                pass_device_specs=dpc.device_nodes,
            )
        self.events = EventRecorder(kube, component=COMPONENT, instance=f"{node}/{socket.gethostname()}")
        self.numa_by_id: dict[str, int] = {}
        self.topology_json: str | None = None
        self.last_read_ok = False
        self._wake = asyncio.Event()
        self._written: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
        self._topology_known = asyncio.Event()
        self._stop = asyncio.Event()
        self._withheld = ""
        self._registry_warned = False

    # ---------------------------------------------------------------- topology
    def read_topology(self) -> str:
        """Discover and render; raise TopologyReadError."""
        c = self.cfg
        topo = discover(
            c.topology_source,
            topology_file=Path(c.topology_file) if c.topology_file else None,
        )
        return render(topo, c.device_id_strategy)

    async def publish_topology(self) -> None:
        """Read the hardware; write the Node annotation when it changed; on failure keep the old one."""
        try:
            text = await asyncio.to_thread(self.read_topology)
        except TopologyReadError as exc:
            self.metrics.topology_errors.inc()
            log.warning("topology unreadable; keeping the published annotation", extra={"error": str(exc)})
            with contextlib.suppress(KubeError):
                node = self.nodes.get(self.node)
                await self.events.emit(
                    ObjectRef.of(node) if node else ObjectRef(api_version="v1", kind="Node", name=self.node),
                    reason="GPUTopologyUnreadable",
                    note=str(exc)[:900],
                    action="ReadTopology",
                    type=EventType.WARNING,
                )
            return
        self.topology_json = text
        doc = json.loads(text)
        self.numa_by_id = {gpu: int(a["numa"]) for gpu, a in doc.items() if a.get("numa") is not None}
        self.uuid_by_id = {gpu: str(a["uuid"]) for gpu, a in doc.items() if a.get("uuid")}
        self._topology_known.set()
        await self.refresh_devices()
        if not self.cfg.publish_topology:
            return
        node = self.nodes.get(self.node) if self.nodes.synced.is_set() else None
        if node is None:  # before the node watch has listed (the first publish at start-up)
            try:
                node = await self.kube.get(NODES, self.node)
            except KubeError as exc:
                log.warning("cannot read own Node", extra={"error": str(exc)})
                return
        current = ((node.get("metadata") or {}).get("annotations") or {}).get(TOPOLOGY_ANNOTATION)
        if current == text:
            return
        if self.cfg.dry_run:
            log.info("dry-run: would publish topology", extra={"node": self.node, "topology": text})
            return
        try:
            await self.kube.patch(
                NODES, self.node, {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: text}}}
            )
        except KubeError as exc:
            self.metrics.patch_errors.labels("node").inc()
            log.warning("cannot publish topology", extra={"error": str(exc)})
            return
        self.metrics.topology_publishes.inc()
        log.info("published GPU topology", extra={"node": self.node, "gpus": len(self.numa_by_id)})

    # ---------------------------------------------------------------- reconcile
    async def reconcile_once(self) -> list[Assignment]:
        """One pass: PodResources -> decide -> patch the pods that need it. Returns the assignments."""
        with self.metrics.reconcile_seconds.time():
            try:
                allocations = await self.reader.allocations(self.cfg.resource_name)
                allocatable = await self.reader.allocatable(self.cfg.resource_name)
            except KubeletUnavailable as exc:
                self.metrics.reads.labels("error").inc()
                self.last_read_ok = False
                log.warning("PodResources unavailable", extra={"error": str(exc)})
                return []
            self.metrics.reads.labels("ok").inc()
            self.last_read_ok = True
            self.metrics.allocatable.set(len(allocatable))
            pods = [pod_record(o) for o in self.pods.objects()]
            plan = decide(pods, allocations, self.numa_by_id)
            # The watch may not have delivered our own last write yet: a pod we already recorded with the
            # same actual set (same uid) is not patched, counted or evented again.
            live = {(p.namespace, p.name): p.uid for p in pods}
            self._written = {k: v for k, v in self._written.items() if live.get(k) == v[0]}
            todo = [
                a
                for a in plan.assignments
                if self._written.get((a.namespace, a.name), ("", ()))[1] != a.actual
            ]
            for assignment in todo:
                if await self._apply(assignment):
                    self._written[(assignment.namespace, assignment.name)] = (
                        live.get((assignment.namespace, assignment.name), ""),
                        assignment.actual,
                    )
            return todo

    async def _apply(self, a: Assignment) -> bool:
        extra = {"pod": f"{a.namespace}/{a.name}", "outcome": a.outcome.value, "actual": ",".join(a.actual)}
        if self.cfg.dry_run:
            log.info("dry-run: would record the actual GPU set", extra=extra)
            return False
        try:
            pod = await self.kube.patch(PODS, a.name, a.patch(), namespace=a.namespace)
        except KubeError as exc:
            self.metrics.patch_errors.labels("pod").inc()
            log.warning("cannot record the actual GPU set", extra={**extra, "error": str(exc)})
            return False
        self.metrics.assignments.labels(a.outcome.value).inc()
        log.info("recorded the actual GPU set", extra=extra)
        if a.event_note:
            with contextlib.suppress(KubeError):
                await self.events.emit(
                    ObjectRef.of(pod),
                    reason="GPUAssignmentOverridden",
                    note=a.event_note,
                    action="ReconcileGPUs",
                    type=EventType.WARNING,
                )
        return True

    def on_pod_event(self, _event: Any) -> None:
        self._wake.set()

    # ---------------------------------------------------------------- device plugin (enforce)
    async def refresh_devices(self) -> None:
        """The plugin's devices: Unhealthy once the health controller quarantined it."""
        if self.plugin is None or self.topology_json is None:
            return
        node = self.nodes.get(self.node) or {}
        ids = list(json.loads(self.topology_json))
        bad = quarantined_devices(node, ids, self.uuid_by_id)
        await self.plugin.set_devices({i: i not in bad for i in ids})

    async def on_node_event(self, _event: Any) -> None:
        await self.refresh_devices()

    async def prefer(self, available: Sequence[str], must_include: Sequence[str], size: int) -> Preference:
        """GetPreferredAllocation: the recorded set of the pod being admitted (see nodeagent.admission)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.device_plugin.admission_wait_seconds
        while True:
            try:
                allocs = await self.reader.allocations(self.cfg.resource_name)
            except KubeletUnavailable:
                allocs = []
            allocated = {a.key: a.ids for a in allocs}
            cands = []
            for obj in self.pods.objects():
                ann = (obj.get("metadata") or {}).get("annotations") or {}
                c = candidate(obj, parse_ids(ann.get(GPU_IDS_ANNOTATION)))
                if c is not None:
                    cands.append(c)
            pref = prefer(cands, allocated, available, must_include, size)
            if pref.ids or loop.time() >= deadline:
                return pref
            await asyncio.sleep(0.05)  # the bound pod may not have reached our watch yet

    async def reconcile_loop(self) -> None:
        await self.pods.synced.wait()
        while not self._stop.is_set():
            self._wake.clear()
            await self.reconcile_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.cfg.reconcile_interval_seconds)
            # Bursts of pod events become one read per min_read_interval (the kubelet rate-limits).
            await asyncio.sleep(self.cfg.min_read_interval_seconds)

    async def topology_loop(self) -> None:
        while not self._stop.is_set():
            await self.publish_topology()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.cfg.topology_interval_seconds)

    def dra_owner(self) -> str:
        """The DRA driver of `device_plugin.dra_drivers` registered with this node's kubelet, or ""; an
        unreadable registry counts as none (warned once): before DRA, nodes have none to read."""
        registry = Path(self.cfg.kubelet_root_dir) / "plugins_registry"
        try:
            entries = os.listdir(registry)
        except OSError as exc:
            if not self._registry_warned:
                self._registry_warned = True
                log.warning(
                    "kubelet plugin registry unreadable; serving the device plugin without knowing "
                    "whether a DRA driver owns the GPUs (mount it read-only)",
                    extra={"path": str(registry), "error": str(exc)},
                )
            return ""
        return dra_owner(entries, self.cfg.device_plugin.dra_drivers)

    def withhold_reason(self) -> tuple[str, str]:
        """(who or what, the note) when the plugin must not be served: a DRA driver owns the GPUs, or the
        node shares them (GFD's labels on our Node); ("", "") when it may be served."""
        owner = self.dra_owner()
        if owner:
            return owner, withheld_note(owner, self.cfg.resource_name)
        sharing = node_shares_gpus(self.nodes.get(self.node), self.cfg.resource_name)
        if sharing is not None:
            return f"shared:{sharing.mode.value}", shared_note(sharing, self.cfg.resource_name)
        return "", ""

    async def _withhold(self, owner: str, note: str) -> None:
        """Say once per episode that the plugin is not served, and why (log, metric, Event on the Node)."""
        self.metrics.plugin_withheld.set(1)
        if self._withheld == owner:
            return
        self._withheld = owner
        log.warning("device plugin withheld", extra={"node": self.node, "owner": owner, "why": note})
        with contextlib.suppress(KubeError):
            node = self.nodes.get(self.node)
            await self.events.emit(
                ObjectRef.of(node) if node else ObjectRef(api_version="v1", kind="Node", name=self.node),
                reason="GPUDevicePluginWithheld",
                note=note,
                action="Withhold",
                type=EventType.WARNING,
            )

    async def _run_plugin(self, recheck_seconds: float = DRA_RECHECK_SECONDS) -> None:
        """Serve the device plugin while no DRA driver owns the GPUs and the node does not share them; stop
        it when that changes (the plugin unregisters by removing its socket, the kubelet then drops the
        resource), resume when it is gone."""
        assert self.plugin is not None
        await self.pods.synced.wait()
        await self.nodes.synced.wait()  # GFD's labels say whether the node shares its GPUs
        await self._topology_known.wait()  # no devices to offer before the topology is known
        while not self._stop.is_set():
            owner, note = self.withhold_reason()
            if owner:
                await self._withhold(owner, note)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=recheck_seconds)
                continue
            self._withheld = ""
            self.metrics.plugin_withheld.set(0)
            serving = asyncio.create_task(self.plugin.run(), name="device-plugin-serve")
            try:
                while not serving.done() and not self.withhold_reason()[0]:
                    await asyncio.wait({serving}, timeout=recheck_seconds)
            finally:
                if not serving.done():
                    serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
            failed = None if serving.cancelled() else serving.exception()
            if failed is not None:
                raise failed

    def ready(self) -> bool:
        return self.pods.synced.is_set() and self.last_read_ok

    def reject_http(self, reason: str) -> None:
        self.metrics.http_rejected.labels(reason).inc()

    def routes(self) -> dict[str, Route]:
        """The listener's paths: liveness, readiness (pod watch synced, PodResources answering), metrics."""

        def ok() -> Reply:
            return Reply.text("ok")

        def ready() -> Reply:
            if not self.pods.synced.is_set():
                return Reply.text("pod watch not synced yet", 503)
            if not self.last_read_ok:
                return Reply.text(f"PodResources not answering at {self.reader.socket_path}", 503)
            return Reply.text("ok")

        def metrics() -> Reply:
            return Reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

        return {"/healthz": ok, "/livez": ok, "/readyz": ready, "/metrics": metrics}

    async def run(self) -> None:
        host, _, port = self.cfg.listen.rpartition(":")
        listener = Listener(self.routes(), rejected=self.reject_http)
        await listener.start(host, int(port))
        log.info(
            "node agent running",
            extra={"node": self.node, "listen": self.cfg.listen, "dry_run": self.cfg.dry_run},
        )
        tasks = [
            asyncio.create_task(self.pods.run(self.on_pod_event), name="pod-watch"),
            asyncio.create_task(self.nodes.run(self.on_node_event), name="node-watch"),
            asyncio.create_task(self.topology_loop(), name="topology"),
            asyncio.create_task(self.reconcile_loop(), name="reconcile"),
        ]
        if self.plugin is not None:
            tasks.append(asyncio.create_task(self._run_plugin(), name="device-plugin"))
        try:
            await asyncio.gather(*tasks)
        finally:
            self._stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.reader.aclose()
            await listener.close()


def kube_client(config: AgentConfig) -> KubeClient:
    """The agent's API client: a few requests a minute and two watches, so plain asyncio streams, not
    aiohttp's pool (gpuwarden/kube/minihttp.py says why)."""
    k = config.kubernetes
    return KubeClient.from_config(
        kubeconfig=k.kubeconfig,
        context=k.context,
        request_timeout=k.request_timeout_seconds,
        field_manager=k.field_manager,
        http="streams",
    )


async def run_node_agent(config: AgentConfig) -> None:
    """Entry point of `gpuwarden node-agent`."""
    node = node_name_from(config)
    kube = kube_client(config)
    try:
        await NodeAgent(config, kube, node).run()
    finally:
        await kube.aclose()
