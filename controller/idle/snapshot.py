"""From the live-pod informer's JSON and the pass's usage answer to the idle decision's inputs.

Why a module: which GPUs a pod holds, and which series measure them, is the join that makes per-pod
attribution right. A pod's recorded GPU set (`gpuwarden.io/gpu-ids`, the node agent's actual set once it
reconciled the pod) names (node, gpu) pairs, and the series of those GPUs are the pod's whatever their pod
labels say (dcgm-exporter's `pod`/`namespace` are sometimes missing, NVIDIA/dcgm-exporter#342) — unless a
series names another pod, which is a conflict and unknown. Without a recorded set the exporter's pod labels
are the join. Unreadable times are unknown.

Shared GPUs (docs/idle.md "Shared GPUs"): a set's device IDs are resolved to what the series measure - an
index to the `gpu` label, a GPU UUID or a replica `<uuid>::<n>` to the `UUID` label, a MIG device to its
parent's `UUID` and its `GPU_I_ID` (legacy MIG UUIDs say both, opaque ones through the node's published MIG
devices, `controller.gpus.physical`). A GPU held through a replica (time-slicing, MPS) is read whole: every
series of it, whichever pod dcgm-exporter names (it names one, the last it iterates), so a sharer is idle
only when the whole GPU is. On a shared node only the kubelet's set counts (no device plugin of ours
honours a recorded one there); a set that cannot be resolved falls back to the pod labels, which on MIG name
the instance's holder and on a time-sliced GPU give one sharer the whole GPU's series (the others: unknown).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.gpus.objects import gpu_share_request
from controller.gpus.physical import MigPlace, mig_places
from controller.gpus.topology import TopologyError, parse_annotation
from controller.idle.query import GpuUsage
from gpuwarden.gpusharing import GpuSharing, SharingMode, device_ref, node_sharing
from gpuwarden.wellknown import (
    GPU_IDS,
    GPU_IDS_SOURCE,
    GPU_IDS_SOURCE_KUBELET,
    GPU_TOPOLOGY,
    IDLE_ACK_UNTIL,
    IDLE_RECLAIMABLE,
    IDLE_SINCE,
    parse_gpu_ids,
    parse_time_value,
)

Obj = Mapping[str, Any]


def parse_time(text: object) -> float | None:
    """An RFC 3339 time (`2026-12-02T07:00:00Z`) as Unix seconds; None when absent or unreadable."""
    return parse_time_value(text)


@dataclass(frozen=True, slots=True)
class Owner:
    """The pod's controlling owner (ownerReference with controller=true): where the second Event goes."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Holding:
    """One physical GPU or MIG instance a pod holds, named the way dcgm-exporter's series name it."""

    gpu: str
    """The GPU's UUID (`by_uuid`, matched on the `UUID` label) or index (matched on the `gpu` label)."""
    by_uuid: bool = False
    instance: str = ""
    """The MIG GPU instance id (`GPU_I_ID`); "" for a whole GPU."""
    shared: bool = False
    """Held through a replica (time-slicing, MPS): other pods hold it too, its series are the whole GPU's."""

    @property
    def name(self) -> str:
        return f"{self.gpu} instance {self.instance}" if self.instance else self.gpu


@dataclass(frozen=True, slots=True)
class IdlePod:
    """A running pod that holds GPUs, as the idle decision needs it."""

    namespace: str
    name: str
    uid: str
    node: str
    gpus: int
    gpu_ids: tuple[str, ...] | None
    started: float | None
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Owner | None = None
    idle_since_text: str | None = None
    """Our annotation as found (None: absent); kept as text so an unreadable one is still ours to clear."""
    ack_until_text: str | None = None
    reclaimable: bool = False
    """Our `idle-reclaimable` annotation is on the pod (what GPU preemption reads)."""
    actual: bool = False
    """`gpu_ids` is the kubelet's word (the node agent reconciled it from PodResources), not a record."""
    held: tuple[Holding, ...] | None = None
    """Its set resolved to physical GPUs and MIG instances (`resolve_set`); None: joined by pod labels."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def expected(self) -> int:
        """How many readings make its picture whole: one per GPU or instance held, else one per GPU
        requested."""
        return len(self.held) if self.held is not None else self.gpus


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU of a pod over the window: peak utilization (percent) and sample count; `conflict` names
    another pod the exporter attributes this GPU to."""

    gpu: str
    max_percent: float | None
    samples: int
    conflict: str = ""
    max_watts: float | None = None
    shared: bool = False
    """The GPU is held through a replica: the reading is the whole GPU's (every sharer's work)."""


@dataclass(frozen=True, slots=True)
class IdleSnapshot:
    pods: tuple[IdlePod, ...]
    readings: Mapping[str, tuple[GpuReading, ...]]
    """Pod key -> one reading per GPU with data (a held GPU without data has no reading)."""
    telemetry: bool
    """False when the query failed: everything is unknown."""
    recent_evictions: int = 0
    """Idle evictions in the last hour (the loop's memory): what the hourly budget has left."""


def _owner(meta: Obj) -> Owner | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return Owner(
                str(ref.get("apiVersion", "")), str(ref.get("kind", "")), str(ref.get("name", "")),
                str(ref.get("uid", "")),
            )  # fmt: skip
    return None


def idle_pod(
    obj: Obj, resource: str, node_of: Callable[[str, bool], NodeGpus] | None = None
) -> IdlePod | None:
    """A running, bound pod holding GPUs; None for anything else (pending, finished, terminating, no GPU).
    `node_of(name, migs)`: its node's GPUs (`migs`: its MIG devices are needed), to resolve its set
    (`resolve_set`); None: every node is taken as whole GPUs."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ann = meta.get("annotations") or {}
    gpus = gpu_share_request(spec, resource)
    ids = parse_gpu_ids(ann.get(GPU_IDS))
    node = str(spec.get("nodeName") or "")
    if status.get("phase") != "Running" or not node or meta.get("deletionTimestamp"):
        return None
    if gpus <= 0 and ids is None:
        return None
    actual = ann.get(GPU_IDS_SOURCE) == GPU_IDS_SOURCE_KUBELET
    held = None
    if ids is not None:
        gpus_of = WHOLE_GPUS if node_of is None else node_of(node, any(i.startswith("MIG-") for i in ids))
        held = resolve_set(ids, actual, gpus_of)
    return IdlePod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=node,
        gpus=gpus if gpus > 0 else len(ids or ()),
        gpu_ids=ids,
        started=parse_time(status.get("startTime")),
        labels=dict(meta.get("labels") or {}),
        owner=_owner(meta),
        idle_since_text=ann.get(IDLE_SINCE),
        ack_until_text=ann.get(IDLE_ACK_UNTIL),
        reclaimable=IDLE_RECLAIMABLE in ann,
        actual=actual,
        held=held,
    )


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What the join needs of a pod's node: how it shares its GPUs and where its MIG devices live."""

    sharing: GpuSharing = field(default_factory=GpuSharing)
    migs: Mapping[str, MigPlace] = field(default_factory=dict)

    @property
    def replicated(self) -> bool:
        """Time-slicing or MPS: every GPU is held through replicas."""
        return self.sharing.mode in (SharingMode.TIME_SLICING, SharingMode.MPS)


WHOLE_GPUS = NodeGpus()
"""A node of whole GPUs (also what a node not read is taken for)."""


def node_gpus(obj: Obj, resource: str, *, migs: bool = True) -> NodeGpus:
    """A Node's sharing (GFD labels, capacity) and, with `migs`, its published MIG devices (none if its
    topology is unreadable). The topology is parsed only for `migs`: the sharing mode needs no GPU count."""
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(GPU_TOPOLOGY) if migs else None
    try:
        topo = parse_annotation(text) if text else None
    except TopologyError:
        topo = None
    sharing = node_sharing(
        meta.get("labels") or {}, (obj.get("status") or {}).get("capacity") or {}, resource
    )
    if not sharing.shared and topo is None:
        return WHOLE_GPUS  # the common node: recorded indices need no resolving
    return NodeGpus(sharing, mig_places(topo))


@functools.lru_cache(maxsize=1024)
def _index_holding(gpu: str) -> Holding:
    """One shared (immutable) `Holding` per GPU index: tens of thousands of pods hold indices 0..7."""
    return Holding(gpu)


def holdings(pod: IdlePod, node: NodeGpus) -> tuple[Holding, ...] | None:
    """`resolve_set` of a pod's set on `node`."""
    return None if pod.gpu_ids is None else resolve_set(pod.gpu_ids, pod.actual, node)


def resolve_set(ids: tuple[str, ...], actual: bool, node: NodeGpus) -> tuple[Holding, ...] | None:
    """The physical GPUs and MIG instances a set names; None when the pod labels must join instead (a
    recorded set on a shared node, or a device that cannot be resolved). `actual`: the kubelet's set."""
    if node is WHOLE_GPUS and all(i.isdigit() for i in ids):
        return tuple(_index_holding(i) for i in ids)  # the common case, recorded indices: nothing to resolve
    if node.sharing.shared and not actual:
        return None
    replicated = node.replicated
    out: dict[tuple[str, str], Holding] = {}
    for device_id in ids:
        ref = device_ref(device_id)
        gpu, instance = ref.gpu, "" if ref.gi is None else str(ref.gi)
        if ref.mig:
            place = node.migs.get(ref.mig)
            if not gpu and place is not None:
                gpu = place.gpu
            if not instance and place is not None and place.gi is not None:
                instance = str(place.gi)
            if not gpu or not instance:
                return None  # an opaque MIG device, or its instance, not published: unknown here
        if not gpu:
            return None
        shared = ref.replica is not None or (replicated and not ref.mig)
        key = (gpu, instance)
        was = out.get(key)
        out[key] = Holding(gpu, not gpu.isdigit(), instance, shared or (was is not None and was.shared))
    return tuple(out.values())


def _merge(gpu: str, usages: Iterable[GpuUsage], conflict: str = "", shared: bool = False) -> GpuReading:
    peaks = [u.max_percent for u in usages]
    known = [p for p in peaks if p is not None]
    watts = [u.max_watts for u in usages if u.max_watts is not None]
    return GpuReading(
        gpu=gpu,
        max_percent=max(known) if known and len(known) == len(peaks) else None,
        samples=max((u.samples for u in usages), default=0),
        conflict=conflict,
        max_watts=max(watts) if watts else None,
        shared=shared,
    )


def join(pods: Iterable[IdlePod], usage: Iterable[GpuUsage]) -> dict[str, tuple[GpuReading, ...]]:
    """Each pod's GPU readings: by its resolved set (`IdlePod.held`) on its node, else by the exporter's pod
    labels. Several series of one GPU (the pod label came and went, or the GPU is shared) merge to the
    highest peak."""
    pods = list(pods)
    usage = list(usage)
    by_index: dict[tuple[str, str, str], list[GpuUsage]] = defaultdict(list)
    by_pod: dict[tuple[str, str], list[GpuUsage]] = defaultdict(list)
    for u in usage:
        by_index[(u.node, u.gpu, u.instance)].append(u)
        if u.pod:
            by_pod[(u.namespace, u.pod)].append(u)
    by_uuid: dict[tuple[str, str, str], list[GpuUsage]] = defaultdict(list)
    if any(h.by_uuid for p in pods for h in p.held or ()):
        for u in usage:
            if u.uuid:
                by_uuid[(u.node, u.uuid, u.instance)].append(u)
    out: dict[str, tuple[GpuReading, ...]] = {}
    for pod in pods:
        readings: list[GpuReading] = []
        if pod.held is not None:
            for h in pod.held:
                series = (by_uuid if h.by_uuid else by_index).get((pod.node, h.gpu, h.instance))
                if not series:
                    continue
                # a replica's GPU is every sharer's: other pods named on its series are expected, no conflict
                others = (
                    ()
                    if h.shared
                    else sorted({f"{u.namespace}/{u.pod}" for u in series if u.pod} - {pod.key})
                )
                readings.append(_merge(h.name, series, others[0] if others else "", h.shared))
        else:
            per_gpu: dict[tuple[str, str], list[GpuUsage]] = defaultdict(list)
            for u in by_pod.get((pod.namespace, pod.name), []):
                if u.node == pod.node:
                    per_gpu[(u.gpu, u.instance)].append(u)
            readings = [
                _merge(f"{gpu} instance {instance}" if instance else gpu, series)
                for (gpu, instance), series in sorted(per_gpu.items())
            ]
        out[pod.key] = tuple(readings)
    return out


def build_snapshot(
    pod_objects: Iterable[Obj],
    usage: Iterable[GpuUsage] | None,
    *,
    resource: str,
    nodes: Iterable[Obj] | None = None,
) -> IdleSnapshot:
    """The pass's snapshot; `usage` None means the query failed (telemetry unknown). `nodes`: the Node
    objects (sharing, published MIG devices); None: not read, every node taken as whole GPUs."""
    node_of = _NodeReader(nodes, resource) if nodes is not None else None
    pods = tuple(p for p in (idle_pod(o, resource, node_of) for o in pod_objects) if p is not None)
    readings = join(pods, usage) if usage is not None else {}
    return IdleSnapshot(pods, readings, telemetry=usage is not None)


class _NodeReader:
    """`node_of` for `idle_pod`: each node read once, and its topology only once a pod holds a MIG device."""

    def __init__(self, nodes: Iterable[Obj], resource: str) -> None:
        self.objects = {str((n.get("metadata") or {}).get("name", "")): n for n in nodes}
        self.resource = resource
        self.read: dict[str, tuple[NodeGpus, bool]] = {}

    def __call__(self, name: str, migs: bool) -> NodeGpus:
        got = self.read.get(name)
        if got is not None and (got[1] or not migs):
            return got[0]
        obj = self.objects.get(name)
        gpus = node_gpus(obj, self.resource, migs=migs) if obj is not None else WHOLE_GPUS
        self.read[name] = (gpus, migs)
        return gpus


def recent_actions(events: Iterable[Obj], now: float, window: float, *, on_pods: bool) -> int:
    """How many distinct objects (pods when `on_pods`, else owners) our listed core/v1 Events say were acted
    on within `window` seconds before `now` - the fleet's count of an hourly budget, which every leader reads
    alike. Dry-run Events and Events without a readable time do not count."""
    seen: set[str] = set()
    for event in events:
        involved = event.get("involvedObject") or {}
        if (involved.get("kind") == "Pod") != on_pods or str(event.get("message", "")).startswith(
            "[dry-run]"
        ):
            continue
        series = event.get("series") or {}
        stamps = [parse_time(t) for t in (series.get("lastObservedTime"), event.get("eventTime"),
                                           event.get("lastTimestamp"))]  # fmt: skip
        when = max((t for t in stamps if t is not None), default=None)
        if when is not None and now - when < window:
            seen.add(str(involved.get("uid") or f"{involved.get('namespace')}/{involved.get('kind')}/"
                                                f"{involved.get('name')}"))  # fmt: skip
    return len(seen)
