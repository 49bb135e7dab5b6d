"""The sliding-window preemption graph: who preempted whom, where and when, keyed by workload.

Why it exists: every question the throttle asks is about recent history — how many victims in the last five
minutes (per cluster, preemptor namespace, preemptor workload), whether the preemptor's workload was itself
a victim (a chain, and how deep), whether a candidate victim's workload just preempted the preemptor's
(ping-pong), and how often this workload preempted on this node (back-off). The graph answers them from
records built purely from the API (`Preempted` Events and DisruptionTarget conditions), so a restarted or
second replica that has read the same objects answers the same (docs/architecture.md,
safety rule 5).

A record is one victim (one Event each, as the budgets count). Its chain depth is 1 plus the deepest recent
record that made its preemptor's workload a victim (within `chain_window` before it): A preempts B is depth
1; B's replacement preempting C is depth 2. Between a decision and the signals it causes, `reserve()`
bridges the scheduler's lag (reservations.py): reserved victims count toward budgets and chains at once.

It is a data structure: no I/O, no clock (callers pass `now`), no decisions, no logging.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.preemption.record import PreemptionRecord
from controller.preemption.reservations import Reservations, VictimRef
from controller.preemption.signals import Workload

RECORD_TIME_SLACK = 0.002
"""Seconds within which a record's `at` (written with millisecond precision) is this replica's own."""

BACKOFF_HISTORY = 64
"""Preemption times kept per (workload, node): enough to saturate any back-off (2**6 x base >= max)."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """One victim; the preemptor is unknown ("" / None) until its `Preempted` Event is seen."""

    victim_uid: str
    victim: Workload
    node: str
    at: float
    victim_name: str = ""
    preemptor_uid: str = ""
    preemptor: Workload | None = None
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Observation:
    """What adding a record changed: a victim seen for the first time, a preemptor learned, ping-pong."""

    record: Preemption
    new_victim: bool
    preemptor_learned: bool
    ping_pong: bool


@dataclass(frozen=True, slots=True)
class BackoffSpec:
    """Kueue-style back-off (KEP-14468): `base * 2**(round-1)` capped at `max`, forgotten after `reset` s
    without a preemption past the cool-down; preemptions within `burst` s of a round's start share it."""

    base: float = 60.0
    max: float = 3600.0
    reset: float = 600.0
    burst: float = 30.0


@dataclass(frozen=True, slots=True)
class BackoffState:
    """The current streak of one (workload, node): `rounds` so far, the last round's `start`, the last
    preemption `last`, and the cool-down end `until`."""

    rounds: int
    start: float
    last: float
    until: float


def backoff_state(times: Sequence[float], spec: BackoffSpec) -> BackoffState | None:
    """Fold sorted preemption times of one (workload, node) into its back-off state; None = no streak."""
    rounds, start, last, until = 0, 0.0, 0.0, 0.0
    for t in times:
        if rounds and t - max(last, until) > spec.reset:
            rounds = 0
        if rounds == 0 or t - start > spec.burst:
            rounds += 1
            start = t
            until = t + min(spec.max, spec.base * 2 ** min(rounds - 1, 30))
        last = t
    return BackoffState(rounds, start, last, until) if rounds else None


def _count_since(times: Sequence[float], since: float) -> int:
    return len(times) - bisect.bisect_left(times, since)


class PreemptionGraph:
    """Records within `horizon` seconds, indexed for the throttle's questions."""

    def __init__(
        self,
        *,
        horizon: float,
        chain_window: float,
        backoff: BackoffSpec | None = None,
        reservation_ttl: float = 30.0,
    ) -> None:
        self.horizon = max(horizon, chain_window)
        self.chain_window = chain_window
        self.backoff_spec = backoff or BackoffSpec()
        self.reservation_ttl = reservation_ttl
        self._records: dict[str, Preemption] = {}
        self._order: list[tuple[float, str]] = []
        self._global: list[float] = []
        self._by_namespace: dict[str, list[float]] = {}
        self._by_workload: dict[str, list[float]] = {}
        self._as_victim: dict[str, set[str]] = {}
        self._pairs: dict[tuple[str, str], float] = {}
        self._preemptor_pods: dict[str, float] = {}
        self._backoff: dict[tuple[str, str], list[float]] = {}
        self.reservations = Reservations(reservation_ttl)
        self._newest_linked = float("-inf")
        self._depths_stale = False

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[Preemption]:
        """Every record in the window, oldest first."""
        return [self._records[uid] for _, uid in self._order if uid in self._records]

    def get(self, victim_uid: str) -> Preemption | None:
        return self._records.get(victim_uid)

    # --- building -----------------------------------------------------------------------------------------

    def observe(self, record: Preemption) -> Observation | None:
        """Add or complete a record (merged by victim UID); None when it adds nothing new."""
        old = self._records.get(record.victim_uid)
        if old is not None and (old.preemptor is not None or record.preemptor is None):
            return None
        if old is None:
            current = replace(record, depth=1)
            self._records[record.victim_uid] = current
            bisect.insort(self._order, (record.at, record.victim_uid))
            bisect.insort(self._global, record.at)
            self._as_victim.setdefault(record.victim.key, set()).add(record.victim_uid)
        else:  # a victim first seen by its condition; its Event names the preemptor
            node = old.node or record.node
            current = replace(old, preemptor_uid=record.preemptor_uid, preemptor=record.preemptor, node=node)
            self._records[record.victim_uid] = current
        if current.preemptor is None:
            return Observation(current, old is None, False, False)
        current, ping_pong = self._link(current)
        return Observation(current, old is None, True, ping_pong)

    def _link(self, record: Preemption) -> tuple[Preemption, bool]:
        preemptor = record.preemptor
        assert preemptor is not None
        if record.at < self._newest_linked:
            self._depths_stale = True  # an older preemption arrived late (relist): recompute on next query
        self._newest_linked = max(self._newest_linked, record.at)
        seen = self._depth_before(preemptor.key, record.at, record.victim_uid)
        possible = self.reservations.depth_of(preemptor.key, exclude=record.preemptor_uid)
        record = replace(record, depth=1 + max(seen, possible))
        self._records[record.victim_uid] = record
        reverse = self._pairs.get((record.victim.key, preemptor.key))
        ping_pong = reverse is not None and 0 <= record.at - reverse <= self.chain_window
        bisect.insort(self._by_namespace.setdefault(preemptor.namespace, []), record.at)
        bisect.insort(self._by_workload.setdefault(preemptor.key, []), record.at)
        times = self._backoff.setdefault((preemptor.key, record.node), [])
        bisect.insort(times, record.at)
        del times[:-BACKOFF_HISTORY]
        pair = (preemptor.key, record.victim.key)
        self._pairs[pair] = max(self._pairs.get(pair, record.at), record.at)
        uid = record.preemptor_uid
        self._preemptor_pods[uid] = max(self._preemptor_pods.get(uid, record.at), record.at)
        self.reservations.linked(uid, record.node)
        return record, ping_pong

    def _depth_before(self, workload: str, at: float, exclude: str = "") -> int:
        deepest = 0
        for uid in self._as_victim.get(workload, ()):
            rec = self._records.get(uid)
            if rec is not None and uid != exclude and at - self.chain_window <= rec.at <= at:
                deepest = max(deepest, rec.depth)
        return deepest

    def _refresh_depths(self) -> None:
        if not self._depths_stale:
            return
        self._depths_stale = False
        for at, uid in self._order:
            rec = self._records[uid]
            if rec.preemptor is not None:
                depth = 1 + self._depth_before(rec.preemptor.key, at, uid)
                self._records[uid] = replace(rec, depth=depth)

    def prune(self, now: float) -> None:
        """Forget records older than the horizon, expired reservations and stale indexes."""
        cutoff = now - self.horizon
        drop = bisect.bisect_left(self._order, (cutoff, ""))
        for _, uid in self._order[:drop]:
            rec = self._records.pop(uid, None)
            if rec is not None:
                victims = self._as_victim.get(rec.victim.key)
                if victims is not None:
                    victims.discard(uid)
                    if not victims:
                        del self._as_victim[rec.victim.key]
        del self._order[:drop]
        del self._global[: bisect.bisect_left(self._global, cutoff)]
        for index in (self._by_namespace, self._by_workload):
            for key in list(index):
                times = index[key]
                del times[: bisect.bisect_left(times, cutoff)]
                if not times:
                    del index[key]
        recent = now - self.chain_window
        self._pairs = {k: t for k, t in self._pairs.items() if t >= recent}
        self._preemptor_pods = {k: t for k, t in self._preemptor_pods.items() if t >= recent}
        keep_backoff = now - (self.backoff_spec.max + self.backoff_spec.reset)
        self._backoff = {k: t for k, t in self._backoff.items() if t and t[-1] >= keep_backoff}
        self.reservations.prune(now)

    def reserve(
        self,
        preemptor_uid: str,
        preemptor: Workload,
        candidates: Mapping[str, Sequence[VictimRef]],
        now: float,
        depth: int = 1,
        *,
        until: float | None = None,
    ) -> None:
        """Remember an allowed preemption until its signals arrive (see reservations.py); victims of it
        already recorded are not counted twice."""
        victims = {uid for refs in candidates.values() for uid, _ in refs}
        seen = [
            rec
            for uid in victims
            if (rec := self._records.get(uid)) is not None and rec.preemptor_uid == preemptor_uid
        ]
        node = next((rec.node for rec in seen if rec.node in candidates), "")
        self.reservations.add(
            preemptor_uid, preemptor, candidates, now, depth, until=until, linked=len(seen), node=node
        )

    def unreserve(self, preemptor_uid: str, at: float) -> None:
        """Forget the reservation made at `at` (a preemption that did not go ahead after all)."""
        self.reservations.discard(preemptor_uid, at)

    def adopt(self, preemptor_uid: str, preemptor: Workload, record: PreemptionRecord, now: float) -> bool:
        """Reserve what a preemption record on the API says (another replica's answer, an earlier leader's
        GPU preemption); True when it changed the reservations. A record this replica already holds (same
        time and victims) or one past its `until` changes nothing."""
        if now >= record.until:
            return False
        refs = record.refs()
        known = self.reservations.get(preemptor_uid)
        if known is not None and (
            known.at > record.at + RECORD_TIME_SLACK
            or (abs(known.at - record.at) <= RECORD_TIME_SLACK and dict(known.candidates) == refs)
        ):
            return False
        self.reserve(preemptor_uid, preemptor, refs, record.at, record.depth, until=record.until)
        return True

    # --- questions ----------------------------------------------------------------------------------------

    def victims(
        self, now: float, window: float, *, namespace: str | None = None, workload: Workload | None = None
    ) -> int:
        """Victims (plus live reservations) in (now - window, now], cluster-wide or for one preemptor
        namespace or workload."""
        since = now - window
        if workload is not None:
            times: Sequence[float] = self._by_workload.get(workload.key, ())
        elif namespace is not None:
            times = self._by_namespace.get(namespace, ())
        else:
            times = self._global
        reserved = self.reservations.outstanding(now, namespace=namespace, workload=workload)
        return _count_since(times, since) + reserved

    def depth_as_victim(self, workload: Workload, now: float) -> int:
        """The deepest recent chain that ended on this workload (0: not a recent victim)."""
        self._refresh_depths()
        return max(self._depth_before(workload.key, now), self.reservations.depth_of(workload.key, now))

    def preempted(self, preemptor: Workload, victim: Workload, now: float) -> bool:
        """Whether `preemptor`'s pods preempted `victim`'s within the chain window."""
        at = self._pairs.get((preemptor.key, victim.key))
        return at is not None and now - at <= self.chain_window

    def recent_preemptor(self, pod_uid: str, now: float) -> bool:
        """Whether this pod itself preempted someone within the chain window."""
        at = self._preemptor_pods.get(pod_uid)
        return at is not None and now - at <= self.chain_window

    def claimed_by(self, victim_uid: str) -> tuple[str, Workload] | None:
        """The preemptor this replica most recently allowed to take this pod (see reservations.py)."""
        return self.reservations.claimed_by(victim_uid)

    def is_victim(self, pod_uid: str, preemptor_uid: str = "") -> bool:
        """Whether this pod is already being preempted: a recorded victim, or one this preemptor was just
        allowed to take (its retry can come before the victim's signals reach us)."""
        return pod_uid in self._records or self.reservations.holds(preemptor_uid, pod_uid)

    def backoff(self, workload: Workload, node: str) -> BackoffState | None:
        """The back-off streak of `workload` on `node`, or None."""
        return backoff_state(self._backoff.get((workload.key, node), ()), self.backoff_spec)

    def depth_histogram(self) -> dict[int, int]:
        """Records by chain depth (for `gpuwarden plan`-style summaries)."""
        self._refresh_depths()
        out: dict[int, int] = {}
        for rec in self._records.values():
            if rec.preemptor is not None:
                out[rec.depth] = out.get(rec.depth, 0) + 1
        return out


def load(graph: PreemptionGraph, records: Iterable[Preemption]) -> None:
    """Add records oldest first (what a relist does), so chain depths are computed in order."""
    for record in sorted(records, key=lambda r: r.at):
        graph.observe(record)
