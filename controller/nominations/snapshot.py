"""The typed picture the nomination decision is made from, read from pod and node objects.

Why a module of its own: `loop.py` (informer caches) builds it and `decide.py` (pure) reads it, and tests and
`gpuwarden plan` build snapshots by hand. It holds, for every pending pod that is nominated (or carries our
nomination record), what the staleness rules need: the nominated node's state, the victims still
terminating there by preemption (the guard), the pod's own record of when the nomination was first seen,
and — when the extender's model is available — that node's `NodeView`, so "can never fit" is the
extender's own verdict and not a second opinion.

Nomination age must survive restarts and agree across replicas, and the API keeps no timestamp for
`status.nominatedNodeName`. So the loop writes the annotation `gpuwarden.io/nomination` (JSON `{"node",
"since"}`) the first time it sees a nomination to a node, and reads it back here. That is honest (age is
never over-stated: a nomination made while no controller ran counts from when one first saw it) and cheap
(one patch per new nomination; nothing per pass). In dry-run, or when the write failed, the loop remembers
the record in memory instead (`remembered`).

What it must not do: I/O, reading the clock, or deciding; values are what the API said.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from controller.gpus.fit import Settings
from controller.gpus.model import NodeView
from controller.gpus.objects import PodInfo, pod_info
from controller.preemption.signals import parse_time, terminating_by_preemption
from gpuwarden.wellknown import NOMINATION as NOMINATION_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY

QUARANTINE_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Our taint with these effects keeps every new pod off the node; PreferNoSchedule is left to the model."""
JsonObject = dict[str, Any]


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class NominationRecord:
    """When we first saw the pod nominated to `node` (Unix seconds, whole seconds on the wire)."""

    node: str
    since: float
    clearing: bool = False
    """Written just before we clear the nomination: until the NominationCleared Event exists (then the
    record goes), a leader killed in between leaves it, and the next pass writes the Event once."""

    def encode(self) -> str:
        doc = {"node": self.node, "since": rfc3339(self.since)}
        if self.clearing:
            doc["event"] = "pending"
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def decode(cls, text: Any) -> NominationRecord | None:
        """The record in an annotation value; None when absent or unreadable (then it is rewritten)."""
        if not isinstance(text, str) or not text:
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("node"), str) or not doc["node"]:
            return None
        since = parse_time(doc.get("since"))
        return cls(doc["node"], since, doc.get("event") == "pending") if since is not None else None


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pending pod that is nominated (`node` set) or still carries our record (`node` empty)."""

    namespace: str
    name: str
    uid: str
    node: str
    priority: int = 0
    record: NominationRecord | None = None
    owned: bool = False
    """Has a controller owner, so eviction re-creates it instead of losing the work."""
    gpu: PodInfo | None = None
    """The extender's reading of the pod (GPU request, topology policy), for the never-fits verdict."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeState:
    """The nominated node as the API has it; `ready` None = no Ready condition (unknown)."""

    name: str
    ready: bool | None = True
    ready_since: float | None = None
    """lastTransitionTime of the Ready condition (when it last flipped)."""
    cordoned: bool = False
    quarantine: str | None = None
    """Value of our `gpuwarden.io/gpu-unhealthy` taint when its effect is NoSchedule or NoExecute."""


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod on a node, being deleted, whose DisruptionTarget says the scheduler preempted it."""

    key: str
    priority: int


@dataclass(frozen=True, slots=True)
class NominationSnapshot:
    pods: tuple[PendingPod, ...]
    nodes: Mapping[str, NodeState]
    terminating: Mapping[str, tuple[Victim, ...]] = field(default_factory=dict)
    views: Mapping[str, NodeView] | None = None
    """The extender model's view of each nominated node it knows, emptied of pods (its GPUs, topology and
    quarantine only); None = model not available."""
    fit_settings: Settings | None = None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def node_state(obj: Mapping[str, Any]) -> NodeState:
    """Read a v1.Node (JSON)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ready: bool | None = None
    since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
            since = parse_time(cond.get("lastTransitionTime"))
    quarantine = next(
        (
            str(t.get("value") or "quarantined")
            for t in spec.get("taints") or []
            if t.get("key") == TAINT_KEY and t.get("effect") in QUARANTINE_EFFECTS
        ),
        None,
    )
    return NodeState(str(meta.get("name", "")), ready, since, bool(spec.get("unschedulable")), quarantine)


def pending_pod(obj: Mapping[str, Any], resource: str) -> PendingPod | None:
    """A `PendingPod` for an unbound, not-deleting pod that is nominated or carries our record."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") not in (None, "Pending"):
        return None
    node = str(status.get("nominatedNodeName") or "")
    record = NominationRecord.decode((meta.get("annotations") or {}).get(NOMINATION_ANNOTATION))
    if not node and record is None:
        return None
    owners = meta.get("ownerReferences") or []
    return PendingPod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=node,
        priority=_int(spec.get("priority")),
        record=record,
        owned=any(o.get("controller") for o in owners if isinstance(o, Mapping)),
        gpu=pod_info(obj, resource) if node else None,
    )


def build_snapshot(
    pods: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    *,
    resource: str = "nvidia.com/gpu",
    view_of: Callable[[str], NodeView | None] | None = None,
    fit_settings: Settings | None = None,
    remembered: Mapping[str, NominationRecord] | None = None,
) -> NominationSnapshot:
    """One pass over the pod and node caches. `remembered` (pod UID -> record) stands in for records we
    could not write (dry-run, failed patch); an annotation on the pod always wins."""
    pending: list[PendingPod] = []
    terminating: dict[str, list[Victim]] = {}
    remembered = remembered or {}
    for obj in pods:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node = spec.get("nodeName")
        if node:
            if meta.get("deletionTimestamp") and terminating_by_preemption(obj):
                victim = Victim(
                    f"{meta.get('namespace', '')}/{meta.get('name', '')}", _int(spec.get("priority"))
                )
                terminating.setdefault(str(node), []).append(victim)
            continue
        pod = pending_pod(obj, resource)
        if pod is not None:
            if pod.record is None and pod.uid in remembered:
                pod = replace(pod, record=remembered[pod.uid])
            pending.append(pod)
    node_states = {s.name: s for s in map(node_state, nodes)}
    views: dict[str, NodeView] | None = None
    if view_of is not None:
        views = {}
        for name in {p.node for p in pending if p.node}:
            view = view_of(name)
            if view is not None:
                views[name] = view
    return NominationSnapshot(
        pods=tuple(sorted(pending, key=lambda p: p.key)),
        nodes=node_states,
        terminating={n: tuple(v) for n, v in terminating.items()},
        views=views,
        fit_settings=fit_settings,
    )
