"""What the API says about preemption: which workload a pod belongs to, the victim's DisruptionTarget, and
kube-scheduler's `Preempted` Event.

Why it exists: budgets, chains and ping-pong are about *workloads*, not pods — a Deployment's replacement
replica is a new pod with a new UID, and the cascade we bound is "B's replacement preempts C". So every pod
is mapped to a `Workload`: its controller owner, with a ReplicaSet created by a Deployment folded into that
Deployment (cheaply, from the `pod-template-hash` label, without reading the ReplicaSet). A victim we never
saw as a live pod (deleted before our watch caught it, or preempted before a restart) is mapped from its
name alone (`workload_from_name`), which yields the same key for the common controllers. The key is
`namespace/name` of the owner without its kind, so both mappings agree; a Job and a Deployment of the same
name in one namespace share a budget (conservative, and rare).

The scheduler leaves two traces of every preemption (reference/scheduler-extender.md section 5.2):

* an Event `reason: Preempted, action: Preempting`, regarding = the victim, related = the preemptor, note
  `Preempted by pod <preemptor-uid> on node <node>` — written through events.k8s.io/v1 by current
  schedulers, through core/v1 (involvedObject, message) by older ones; both shapes are read here (the API
  server serves every Event through both groups, so one watch sees all of them);
* the victim's condition `DisruptionTarget=True, reason PreemptionByScheduler`, written just before the
  delete, naming no preemptor (read here the way kube-scheduler's `podTerminatingByPreemption` does).

Events can be missing (best-effort, 1 h TTL), so a victim may be known only from its condition; the graph
merges the two by victim UID. Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
TEMPLATE_HASH_LABEL = "pod-template-hash"

_SAFE = "bcdfghjklmnpqrstvwxz2456789"
"""apimachinery's rand.SafeEncodeString alphabet: generateName suffixes and pod-template-hash use it."""
_GENERATED = re.compile(rf"^(?P<base>.+)-[{_SAFE}]{{5}}\Z")
_TEMPLATE_HASH = re.compile(rf"^(?P<base>.+)-[{_SAFE}]{{6,10}}\Z")
_ORDINAL = re.compile(r"^(?P<base>.+)-\d+\Z")


@dataclass(frozen=True, slots=True)
class Workload:
    """A preemption actor: `key` is `namespace/owner-name`; `kind` is for humans and never compared."""

    namespace: str
    name: str
    kind: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind or 'workload'} {self.key}"


def parse_time(value: Any) -> float | None:
    """An RFC 3339 timestamp (`Time` or `MicroTime`) as Unix seconds; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def workload_of(pod: Mapping[str, Any]) -> Workload:
    """The workload of a pod object: its controller owner (ReplicaSet of a Deployment -> the Deployment),
    else the pod itself."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping)]
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner is None:
        return Workload(namespace, name, "Pod")
    kind, owner_name = str(owner.get("kind", "")), str(owner.get("name", ""))
    template_hash = str((meta.get("labels") or {}).get(TEMPLATE_HASH_LABEL, ""))
    if kind == "ReplicaSet" and template_hash and owner_name.endswith(f"-{template_hash}"):
        return Workload(namespace, owner_name[: -len(template_hash) - 1], "Deployment")
    return Workload(namespace, owner_name, kind)


def workload_from_name(namespace: str, pod_name: str) -> Workload:
    """Best guess for a pod known only by name (the victim of a `Preempted` event we saw after it was gone).

    `web-5d4f8b9c7-x2x7k` -> Deployment `web`, `train-q8zrw` -> Job (or other generateName owner) `train`,
    `db-0` -> StatefulSet `db`, anything else -> the pod itself.
    """
    generated = _GENERATED.match(pod_name)
    if generated:
        base = generated["base"]
        hashed = _TEMPLATE_HASH.match(base)
        if hashed:
            return Workload(namespace, hashed["base"], "Deployment?")
        return Workload(namespace, base, "owner?")
    ordinal = _ORDINAL.match(pod_name)
    if ordinal:
        return Workload(namespace, ordinal["base"], "StatefulSet?")
    return Workload(namespace, pod_name, "Pod")


def preempted_at(pod: Mapping[str, Any]) -> float | None:
    """When the scheduler marked this pod as its victim (`DisruptionTarget=True`, reason
    `PreemptionByScheduler`); None when it did not. Like upstream, the first DisruptionTarget decides.
    A condition without a readable lastTransitionTime yields 0.0 (marked, time unknown)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_TARGET:
            if cond.get("status") == "True" and cond.get("reason") == PREEMPTION_BY_SCHEDULER:
                return parse_time(cond.get("lastTransitionTime")) or 0.0
            return None
    return None


def terminating_by_preemption(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler's `podTerminatingByPreemption`: deleted, and its DisruptionTarget says preemption."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and preempted_at(pod) is not None


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the throttle needs to know about a pod it may be asked to preempt (or that preempts)."""

    uid: str
    namespace: str
    name: str
    workload: Workload
    priority: int = 0
    created: float | None = None
    node: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """Read a v1.Pod (JSON) into a `PodMeta`."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return PodMeta(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        workload=workload_of(pod),
        priority=_int(spec.get("priority")),
        created=parse_time(meta.get("creationTimestamp")),
        node=str(spec.get("nodeName") or ""),
    )


PREEMPTED_REASON = "Preempted"
NOTE = re.compile(r"^Preempted by pod (?P<uid>[^\s]+) on node (?P<node>[^\s]+)")
"""kube-scheduler's note: `Eventf(victim, preemptor, Normal, "Preempted", "Preempting",
"Preempted by pod %v on node %v", preemptor.UID, node)`."""


@dataclass(frozen=True, slots=True)
class PreemptedEvent:
    """One `Preempted` Event, parsed. `at` is when the preemption happened (first occurrence)."""

    event_uid: str
    victim_uid: str
    victim_namespace: str
    victim_name: str
    preemptor_uid: str
    preemptor_namespace: str
    preemptor_name: str
    node: str
    at: float | None


def _ref(obj: Mapping[str, Any], *names: str) -> Mapping[str, Any]:
    for name in names:
        value = obj.get(name)
        if isinstance(value, Mapping):
            return value
    return {}


def _first_time(obj: Mapping[str, Any]) -> float | None:
    for key in ("eventTime", "deprecatedFirstTimestamp", "firstTimestamp", "deprecatedLastTimestamp"):
        found = parse_time(obj.get(key))
        if found is not None:
            return found
    series = _ref(obj, "series")
    return parse_time(series.get("lastObservedTime")) or parse_time(
        (obj.get("metadata") or {}).get("creationTimestamp")
    )


def parse_preempted(event: Mapping[str, Any]) -> PreemptedEvent | None:
    """A `Preempted` Event (events.k8s.io/v1 or core/v1 shape) as a `PreemptedEvent`; None for any other
    Event, or one whose victim is not a Pod or whose note names no preemptor."""
    if event.get("reason") != PREEMPTED_REASON:
        return None
    victim = _ref(event, "regarding", "involvedObject")
    if victim.get("kind") != "Pod":
        return None
    note = event.get("note") if "note" in event else event.get("message")
    parsed = NOTE.match(str(note or ""))
    if parsed is None:
        return None
    related = _ref(event, "related")
    victim_namespace = str(victim.get("namespace", ""))
    return PreemptedEvent(
        event_uid=str((event.get("metadata") or {}).get("uid", "")),
        victim_uid=str(victim.get("uid", "")),
        victim_namespace=victim_namespace,
        victim_name=str(victim.get("name", "")),
        preemptor_uid=parsed["uid"],
        preemptor_namespace=str(related.get("namespace") or victim_namespace),
        preemptor_name=str(related.get("name", "")),
        node=parsed["node"],
        at=_first_time(event),
    )
