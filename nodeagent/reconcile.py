"""Reconcile: the GPUs a container actually holds (kubelet PodResources) against the set recorded on its pod.

Why it exists: with NVIDIA's device plugin the kubelet hands a container whichever free GPUs it picks, so the
extender's `gpuwarden.io/gpu-ids` is a wish until the kubelet has allocated. The kubelet's PodResources API is
the one exact record of who holds which device. This module compares the two and says, per pod, what to
write so the pod carries the *actual* set where the extender reads it (`gpuwarden.io/gpu-ids`): the extender's
accounting then follows the allocation, and pods bound by other schedulers become exact instead of
count-only. The extender's original choice is kept beside it (`gpuwarden.io/gpu-ids-requested`) and the pod is
marked `gpuwarden.io/gpu-ids-source: kubelet`, which also makes each pod counted and evented once.

Pure: no I/O, no clock, no logging. Missing data is unknown: a pod the watch does not know is skipped, never
guessed at (PodResources names pods by namespace and name only; the shell keys its own writes by uid).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_REQUESTED as REQUESTED_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE as SOURCE_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE_KUBELET as SOURCE_KUBELET
from gpuwarden.wellknown import NUMA_NODE as NUMA_ANNOTATION
from gpuwarden.wellknown import canonical_gpu_ids as canonical
from gpuwarden.wellknown import format_gpu_ids
from gpuwarden.wellknown import parse_gpu_ids as parse_ids


class Outcome(StrEnum):
    """How the kubelet's allocation relates to the recorded set (the metric's `outcome` label)."""

    HONOURED = "honoured"
    OVERRIDDEN = "overridden"
    UNRECORDED = "unrecorded"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the API says about a pod bound to this node (from the pod watch)."""

    namespace: str
    name: str
    uid: str
    recorded: tuple[str, ...] | None
    source: str = ""
    requested: tuple[str, ...] | None = None
    numa: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def pod_record(obj: Mapping[str, Any]) -> PodRecord:
    """Parse a pod object (only the fields reconcile reads)."""
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    return PodRecord(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        recorded=parse_ids(ann.get(GPU_IDS_ANNOTATION)),
        source=str(ann.get(SOURCE_ANNOTATION) or ""),
        requested=parse_ids(ann.get(REQUESTED_ANNOTATION)),
        numa=ann.get(NUMA_ANNOTATION),
    )


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the kubelet says a pod holds: the union of its containers' device ids for our resource."""

    namespace: str
    name: str
    ids: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One pod's verdict: the outcome, the merge patch of its annotations, and an Event note if overridden."""

    namespace: str
    name: str
    outcome: Outcome
    actual: tuple[str, ...]
    recorded: tuple[str, ...] | None
    annotations: Mapping[str, str | None]
    event_note: str = ""

    def patch(self) -> dict[str, Any]:
        """JSON merge patch touching only our annotations."""
        return {"metadata": {"annotations": dict(self.annotations)}}


@dataclass(frozen=True, slots=True)
class Plan:
    """Every pod that needs a write, and the pods skipped for missing data (with the reason)."""

    assignments: tuple[Assignment, ...] = ()
    skipped: tuple[tuple[str, str], ...] = field(default=())


def numa_of(ids: Sequence[str], numa_by_id: Mapping[str, int]) -> str | None:
    """The `gpuwarden.io/numa-node` value for a set ("0" or "0,1"); None when any GPU's NUMA is unknown."""
    nodes = set()
    for gpu in ids:
        if gpu not in numa_by_id:
            return None
        nodes.add(numa_by_id[gpu])
    return ",".join(str(n) for n in sorted(nodes)) or None


def decide(
    pods: Iterable[PodRecord], allocations: Iterable[Allocation], numa_by_id: Mapping[str, int]
) -> Plan:
    """Compare each allocated pod's actual GPUs with what is recorded on it; return the writes needed.

    `pods`: pods bound to this node (watch cache). `allocations`: the kubelet's PodResources `List`, already
    reduced to our resource. `numa_by_id`: the published topology's NUMA node per GPU id (may be empty).
    """
    by_key = {p.key: p for p in pods}
    out: list[Assignment] = []
    skipped: list[tuple[str, str]] = []
    for alloc in sorted(allocations, key=lambda a: a.key):
        if not alloc.ids:
            continue
        pod = by_key.get(alloc.key)
        if pod is None:
            skipped.append((f"{alloc.namespace}/{alloc.name}", "not in the pod watch yet"))
            continue
        actual = canonical(alloc.ids)
        if pod.source == SOURCE_KUBELET and pod.recorded == actual:
            continue  # reconciled before; counted and evented then
        numa = numa_of(actual, numa_by_id)
        # After our own earlier write the extender's choice is in `requested`; the write no longer matching
        # (edited by hand, or the allocation changed) is corrected like any other.
        requested = pod.requested if pod.source == SOURCE_KUBELET else pod.recorded
        if requested is None:
            outcome = Outcome.UNRECORDED
        elif set(requested) == set(actual):
            outcome = Outcome.HONOURED
        else:
            outcome = Outcome.OVERRIDDEN
        annotations: dict[str, str | None] = {SOURCE_ANNOTATION: SOURCE_KUBELET}
        if pod.recorded != actual:
            annotations[GPU_IDS_ANNOTATION] = format_gpu_ids(actual)
            if numa is not None or pod.numa is not None:
                annotations[NUMA_ANNOTATION] = numa
        if outcome is Outcome.OVERRIDDEN and requested is not None:
            annotations[REQUESTED_ANNOTATION] = ",".join(requested)
        note = ""
        if outcome is Outcome.OVERRIDDEN and requested is not None:
            note = (
                f"kubelet allocated GPUs {','.join(actual)}, not the recorded {','.join(requested)}; "
                f"{GPU_IDS_ANNOTATION} now names the GPUs the container holds"
            )
        out.append(
            Assignment(
                namespace=pod.namespace,
                name=pod.name,
                outcome=outcome,
                actual=actual,
                recorded=requested,
                annotations=annotations,
                event_note=note,
            )
        )
    return Plan(assignments=tuple(out), skipped=tuple(skipped))
