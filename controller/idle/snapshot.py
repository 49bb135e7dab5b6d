"""From the live-pod informer's JSON and the pass's usage answer to the idle decision's inputs.

Why a module: which GPUs a pod holds, and which series measure them, is the join that makes per-pod
attribution right. A pod's recorded GPU set (`gpuwarden.io/gpu-ids`, the node agent's actual set once it
reconciled the pod) names (node, gpu) pairs, and the series of those GPUs are the pod's whatever their pod
labels say (dcgm-exporter's `pod`/`namespace` are sometimes missing, NVIDIA/dcgm-exporter#342) — unless a
series names another pod, which is a conflict and unknown. Without a recorded set the exporter's pod labels
are the join. Unreadable times are unknown. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.gpus.objects import gpu_request
from controller.idle.query import GpuUsage
from gpuwarden.wellknown import (
    GPU_IDS,
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU of a pod over the window: peak utilization (percent) and sample count; `conflict` names
    another pod the exporter attributes this GPU to."""

    gpu: str
    max_percent: float | None
    samples: int
    conflict: str = ""
    max_watts: float | None = None


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


def idle_pod(obj: Obj, resource: str) -> IdlePod | None:
    """A running, bound pod holding GPUs; None for anything else (pending, finished, terminating, no GPU)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ann = meta.get("annotations") or {}
    gpus = gpu_request(spec, resource)
    ids = parse_gpu_ids(ann.get(GPU_IDS))
    node = str(spec.get("nodeName") or "")
    if status.get("phase") != "Running" or not node or meta.get("deletionTimestamp"):
        return None
    if gpus <= 0 and ids is None:
        return None
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
    )


def _merge(gpu: str, usages: Iterable[GpuUsage], conflict: str = "") -> GpuReading:
    peaks = [u.max_percent for u in usages]
    known = [p for p in peaks if p is not None]
    watts = [u.max_watts for u in usages if u.max_watts is not None]
    return GpuReading(
        gpu=gpu,
        max_percent=max(known) if known and len(known) == len(peaks) else None,
        samples=max((u.samples for u in usages), default=0),
        conflict=conflict,
        max_watts=max(watts) if watts else None,
    )


def join(pods: Iterable[IdlePod], usage: Iterable[GpuUsage]) -> dict[str, tuple[GpuReading, ...]]:
    """Each pod's GPU readings: by its recorded GPU set on its node when it has one, else by the exporter's
    pod labels. Several series of one GPU (the pod label came and went) merge to the highest peak."""
    by_gpu: dict[tuple[str, str], list[GpuUsage]] = defaultdict(list)
    by_pod: dict[tuple[str, str], list[GpuUsage]] = defaultdict(list)
    for u in usage:
        by_gpu[(u.node, u.gpu)].append(u)
        if u.pod:
            by_pod[(u.namespace, u.pod)].append(u)
    out: dict[str, tuple[GpuReading, ...]] = {}
    for pod in pods:
        readings: list[GpuReading] = []
        if pod.gpu_ids is not None:
            for gpu in pod.gpu_ids:
                series = by_gpu.get((pod.node, gpu), [])
                others = sorted({f"{u.namespace}/{u.pod}" for u in series if u.pod} - {pod.key})
                if series:
                    readings.append(_merge(gpu, series, others[0] if others else ""))
        else:
            per_gpu: dict[str, list[GpuUsage]] = defaultdict(list)
            for u in by_pod.get((pod.namespace, pod.name), []):
                if u.node == pod.node:
                    per_gpu[u.gpu].append(u)
            readings = [_merge(gpu, series) for gpu, series in sorted(per_gpu.items())]
        out[pod.key] = tuple(readings)
    return out


def build_snapshot(
    pod_objects: Iterable[Obj], usage: Iterable[GpuUsage] | None, *, resource: str
) -> IdleSnapshot:
    """The pass's snapshot; `usage` None means the query failed (telemetry unknown)."""
    pods = tuple(p for p in (idle_pod(o, resource) for o in pod_objects) if p is not None)
    readings = join(pods, usage) if usage is not None else {}
    return IdleSnapshot(pods, readings, telemetry=usage is not None)


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
