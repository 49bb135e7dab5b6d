"""What the nomination loop decides: the policy it decides with, and the plan it hands to `act.py`.

Why a module of its own: `decide.py` produces these, `act.py` applies them, `metrics.py` counts them and
`gpuwarden plan` prints them; none of those should import another's dependencies. Every entry names its
pod and carries a reason a user can read (`kubectl describe pod` shows the same text in the Event).

Vocabulary:

* `Clear` — the nomination is stale: patch `status.nominatedNodeName` away and emit `NominationCleared`;
* `Evict` — the opt-in escalation: the pod stayed nominated to the same node past the second TTL;
* `Hold` — nothing to do, with why (fresh, a victim still terminating, not ready only briefly, ...);
* `Stamp` / `Forget` — write or remove our `gpuwarden.io/nomination` record (first-seen time).

No I/O, no clock, no decisions here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller.nominations.snapshot import NominationRecord, PendingPod, rfc3339
from gpuwarden.config.nominations import NominationsConfig


class Stale(StrEnum):
    """Why a nomination is cleared; the `reason` label of `gpuwarden_nominations_cleared_total`."""

    NODE_GONE = "node-gone"
    NODE_NOT_READY = "node-not-ready"
    NODE_CORDONED = "node-cordoned"
    NODE_QUARANTINED = "node-quarantined"
    NEVER_FITS = "never-fits"
    EXPIRED = "ttl-expired"


class Held(StrEnum):
    """Why a nomination is left alone."""

    FRESH = "fresh"
    VICTIM_TERMINATING = "victim-terminating"
    NOT_READY_GRACE = "not-ready-grace"
    OUT_OF_SCOPE = "namespace-not-managed"


@dataclass(frozen=True, slots=True)
class NominationPolicy:
    """The `nominations` config section, as the decision reads it."""

    ttl_seconds: float = 300.0
    not_ready_grace_seconds: float = 60.0
    namespaces: frozenset[str] = frozenset()
    escalate: bool = False
    evict_after_seconds: float = 3600.0
    dry_run: bool = False


def policy_from_config(cfg: NominationsConfig, *, dry_run: bool | None = None) -> NominationPolicy:
    """The policy for a validated `nominations:` section (`dry_run` overrides the section's flag)."""
    return NominationPolicy(
        ttl_seconds=cfg.ttl_seconds,
        not_ready_grace_seconds=cfg.not_ready_grace_seconds,
        namespaces=frozenset(cfg.namespaces),
        escalate=cfg.escalation.enabled,
        evict_after_seconds=cfg.escalation.evict_after_seconds,
        dry_run=cfg.dry_run if dry_run is None else dry_run,
    )


def cleared_event_name(pod: PendingPod, record: NominationRecord) -> str:
    """The one name of a clear's NominationCleared Event: the pod (name, uid) and the nomination's start."""
    return f"{pod.name[:150]}.{pod.uid[:8]}.nominationcleared.{int(record.since):x}"


@dataclass(frozen=True, slots=True)
class Clear:
    pod: PendingPod
    reason: Stale
    message: str
    age: float
    record: NominationRecord | None = None
    """The nomination's record: act marks it (Event pending) before the clear, removes it after the Event."""


@dataclass(frozen=True, slots=True)
class Evict:
    pod: PendingPod
    message: str
    age: float


@dataclass(frozen=True, slots=True)
class Hold:
    pod: PendingPod
    reason: Held
    message: str = ""
    age: float = 0.0


@dataclass(frozen=True, slots=True)
class Stamp:
    pod: PendingPod
    record: NominationRecord


@dataclass(frozen=True, slots=True)
class Forget:
    pod: PendingPod
    owed: NominationRecord | None = None
    """A record marked for a clear whose NominationCleared Event may be missing (the leader died between
    the clear and its Event): the Event is written once (named after the record) before the record goes."""


@dataclass(frozen=True)
class NominationPlan:
    """Everything one pass decided at `now`; `dry_run` means act.py only logs and events."""

    now: float
    dry_run: bool = False
    clears: tuple[Clear, ...] = ()
    evictions: tuple[Evict, ...] = ()
    holds: tuple[Hold, ...] = ()
    stamps: tuple[Stamp, ...] = ()
    forgets: tuple[Forget, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    """Nominations by state: each `Stale` value (cleared or to be evicted) and each `Held` value."""

    @classmethod
    def of(
        cls,
        now: float,
        dry_run: bool,
        clears: list[Clear],
        evictions: list[Evict],
        holds: list[Hold],
        stamps: list[Stamp],
        forgets: list[Forget],
    ) -> NominationPlan:
        counts = Counter[str](c.reason.value for c in clears)
        counts.update("evict" for _ in evictions)
        counts.update(h.reason.value for h in holds)
        return cls(now, dry_run, tuple(clears), tuple(evictions), tuple(holds), tuple(stamps), tuple(forgets),
                   dict(sorted(counts.items())))  # fmt: skip

    def oldest_age(self) -> float:
        """Age of the oldest nomination in this pass (0 when there is none)."""
        ages = [c.age for c in self.clears] + [e.age for e in self.evictions] + [h.age for h in self.holds]
        return max(ages, default=0.0)

    def to_json(self) -> dict[str, Any]:
        """A plain summary (what `gpuwarden plan` prints)."""
        return {
            "now": rfc3339(self.now),
            "dry_run": self.dry_run,
            "counts": self.counts,
            "clear": [
                {"pod": c.pod.key, "node": c.pod.node, "reason": c.reason.value, "message": c.message}
                for c in self.clears
            ],
            "evict": [{"pod": e.pod.key, "node": e.pod.node, "message": e.message} for e in self.evictions],
            "hold": [
                {"pod": h.pod.key, "node": h.pod.node, "reason": h.reason.value, "message": h.message}
                for h in self.holds
                if h.reason is not Held.FRESH
            ],
        }
