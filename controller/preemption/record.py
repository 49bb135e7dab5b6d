"""The preemption record on a preemptor pod: the fleet's memory of preemptions allowed but not yet seen.

Why it exists: a preemption is allowed in one process (the preempt verb's answer on whichever replica the
scheduler called, or the leader's GPU preemption pass) and its signals - victims' DisruptionTarget
conditions and `Preempted` Events - arrive later, or never when the writer is killed in between. Budgets
that must hold for the fleet cannot live in that process's memory alone (reservations.py). So before the
verb answers, and before GPU preemption's first eviction, the allowed preemption is written on the
preemptor pod as the annotation `gpuwarden.io/preemption`: the victims per candidate node (UID, pod,
workload), when it was allowed (`at`), until when it counts without its signals (`until`), its chain depth,
and for GPU preemption its progress (`state`: `evicting` until every Event is written, then `done` with the
victims actually evicted). Every replica's pod watch reads it into its graph's reservations, and the next
leader's GPU preemption pass finishes an `evicting` one (controller/makeroom/complete.py).

Pure: encode, decode, derive Event names. An unreadable record is ignored (None): it then counts nothing,
as before this record existed; it never blocks a pod.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.wellknown import PREEMPTION

BY_VERB = "verb"
BY_MAKE_ROOM = "make-room"
EVICTING = "evicting"
"""GPU preemption wrote the record and may have evicted some victims; Events may be owed."""
DONE = "done"
"""GPU preemption finished: every victim listed was evicted and its `Preempted` Event written."""


@dataclass(frozen=True, slots=True)
class VictimEntry:
    uid: str
    pod: str
    """namespace/name"""
    workload: str = ""
    """The victim's workload key ("" when unknown)."""


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    by: str
    at: float
    until: float
    depth: int
    victims: Mapping[str, tuple[VictimEntry, ...]] = field(default_factory=dict)
    """node -> victims (the verb: every kept candidate node; GPU preemption: the one node it chose)."""
    state: str = ""

    def refs(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """node -> (victim UID, workload key), what the graph's reservations take."""
        return {node: tuple((v.uid, v.workload) for v in vs) for node, vs in self.victims.items()}

    def with_(self, **changes: Any) -> PreemptionRecord:
        return replace(self, **changes)

    def encode(self) -> str:
        body: dict[str, Any] = {
            "by": self.by,
            "at": round(self.at, 3),
            "until": round(self.until, 3),
            "depth": self.depth,
            "victims": {
                node: [{"uid": v.uid, "pod": v.pod, "workload": v.workload} for v in vs]
                for node, vs in sorted(self.victims.items())
            },
        }
        if self.state:
            body["state"] = self.state
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


def decode(raw: str | None) -> PreemptionRecord | None:
    """The record from the annotation's value; None when absent or unreadable."""
    if not raw:
        return None
    try:
        body = json.loads(raw)
        victims = {
            str(node): tuple(
                VictimEntry(str(v["uid"]), str(v["pod"]), str(v.get("workload", ""))) for v in entries
            )
            for node, entries in dict(body.get("victims") or {}).items()
        }
        return PreemptionRecord(
            by=str(body["by"]),
            at=float(body["at"]),
            until=float(body["until"]),
            depth=int(body.get("depth", 1)),
            victims=victims,
            state=str(body.get("state", "")),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:16]


def _event_name(regarding: str, digest: str) -> str:
    return f"{regarding[:200]}.{digest}"


def preempted_event_name(victim_name: str, victim_uid: str, preemptor_uid: str) -> str:
    """The `Preempted` Event GPU preemption writes on one victim: one name per (preemptor, victim), so
    whoever finishes the preemption gets 409 AlreadyExists instead of a second Event."""
    return _event_name(victim_name, _digest("preempted", preemptor_uid, victim_uid))


def preempting_event_name(preemptor_name: str, preemptor_uid: str, at: float) -> str:
    """The `GPUPreempting` Event on the preemptor, one per record (named after its `at`)."""
    return _event_name(preemptor_name, _digest("gpu-preempting", preemptor_uid, f"{at:.3f}"))


def record_of(pod: Mapping[str, Any]) -> PreemptionRecord | None:
    """The record on a pod (v1.Pod JSON), if any."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(PREEMPTION)
    return decode(value if isinstance(value, str) else None)


def record_patch(record: PreemptionRecord | None) -> dict[str, Any]:
    """JSON merge patch writing the record (None: removing it)."""
    return {"metadata": {"annotations": {PREEMPTION: record.encode() if record is not None else None}}}


def making_room(pod: Mapping[str, Any] | None, now: float) -> bool:
    """Whether GPU preemption is making room for this pod: its record is still `evicting` and within its
    deadline (the preempt verb then leaves the pod alone rather than overwrite what the next leader needs)."""
    record = record_of(pod) if pod is not None else None
    return (
        record is not None and record.by == BY_MAKE_ROOM and record.state == EVICTING and now < record.until
    )


def verb_pending(pod: Mapping[str, Any], now: float) -> bool:
    """Whether the preempt verb let the scheduler preempt for this pod moments ago (its record within its
    `until`): the scheduler's preemption is under way, GPU preemption does not plan the pod."""
    record = record_of(pod)
    return record is not None and record.by == BY_VERB and now < record.until
