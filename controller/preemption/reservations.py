"""Preemptions this replica allowed but has not yet seen happen: the bridge over the scheduler's lag.

Why it exists: after the preempt verb answers, kube-scheduler picks one of the returned nodes, patches each
victim's DisruptionTarget, deletes it, and only then queues its `Preempted` Event — which the event
broadcaster writes asynchronously, often after the victim's controller has created a replacement and that
replacement has already asked us whether *it* may preempt. Measured on the testbed: the whole four-link
cascade of tests/e2e/test_preemption_throttle.py takes under a second. Without this bridge the throttle
would judge the replacement before knowing that its workload was just a victim, and a chain would slip
through. So every allowed preemption leaves a `Reservation` for `ttl` seconds that:

* counts toward the budgets (the fewest victims the scheduler may take) until the real signals arrive;
* names the candidate victims, so a victim's DisruptionTarget (written before the delete) is linked to its
  preemptor at once (`claimed_by`), and the preemptor's own retries may name them again for free;
* makes the candidate victims' workloads "possible recent victims" at the allowed chain depth
  (`depth_of`) — narrowed to the chosen node once a victim's signal names it.

A reservation is made in memory by the replica that allowed the preemption, at once, and written on the
preemptor pod as its preemption record (record.py) before the verb answers or the first victim is evicted;
every other replica, and the next leader after a restart, rebuilds it from that record (`until` and the
victims already recorded come with it), so a leader change or a second replica never grants a fresh budget.
Pure: no I/O, no clock (callers pass `now`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.preemption.signals import Workload

VictimRef = tuple[str, str]
"""(victim pod UID, victim workload key; "" when the pod is unknown)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    at: float
    preemptor: Workload
    depth: int
    candidates: Mapping[str, tuple[VictimRef, ...]]
    node: str = ""
    """The node the scheduler chose, once a victim's signal named it ("" until then)."""
    linked: int = 0
    until: float = float("inf")
    """It counts until then (its signals should have arrived long before)."""

    def victims(self) -> tuple[VictimRef, ...]:
        """The victims it may still take: those of the chosen node, or of every kept candidate."""
        if self.node in self.candidates:
            return self.candidates[self.node]
        return tuple(v for refs in self.candidates.values() for v in refs)

    @property
    def outstanding(self) -> int:
        """Victims reserved but not yet recorded (the least the scheduler may take, until it is known)."""
        if self.node in self.candidates:
            count = len(self.candidates[self.node])
        else:
            count = min((len(v) for v in self.candidates.values()), default=0)
        return max(0, count - self.linked)


class Reservations:
    """The live reservations, one per preemptor pod UID (a newer decision replaces an older one)."""

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._by_preemptor: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._by_preemptor)

    def add(
        self,
        preemptor_uid: str,
        preemptor: Workload,
        candidates: Mapping[str, Sequence[VictimRef]],
        now: float,
        depth: int = 1,
        *,
        until: float | None = None,
        linked: int = 0,
        node: str = "",
    ) -> None:
        """Reserve (replacing this preemptor's earlier reservation) until `until` (default: `now` + ttl);
        `linked`: victims of it already recorded."""
        kept = {node: tuple(refs) for node, refs in candidates.items() if refs}
        if preemptor_uid and kept:
            end = now + self.ttl if until is None else until
            self._by_preemptor[preemptor_uid] = Reservation(now, preemptor, depth, kept, node, linked, end)

    def discard(self, preemptor_uid: str, at: float) -> None:
        """Drop this preemptor's reservation if it is the one made at `at`."""
        found = self._by_preemptor.get(preemptor_uid)
        if found is not None and found.at == at:
            del self._by_preemptor[preemptor_uid]

    def get(self, preemptor_uid: str) -> Reservation | None:
        return self._by_preemptor.get(preemptor_uid)

    def linked(self, preemptor_uid: str, node: str) -> None:
        """One of this preemptor's victims was recorded, on `node`."""
        found = self._by_preemptor.get(preemptor_uid)
        if found is not None:
            chosen = node if node in found.candidates else found.node
            self._by_preemptor[preemptor_uid] = replace(found, node=chosen, linked=found.linked + 1)

    def prune(self, now: float) -> None:
        self._by_preemptor = {k: r for k, r in self._by_preemptor.items() if now < r.until}

    def _live(self, now: float | None) -> Iterator[tuple[str, Reservation]]:
        for uid, r in self._by_preemptor.items():
            if now is None or now < r.until:
                yield uid, r

    def outstanding(
        self, now: float, *, namespace: str | None = None, workload: Workload | None = None
    ) -> int:
        """Victims reserved and not yet recorded, for all preemptors or one namespace or workload."""
        return sum(
            r.outstanding
            for _, r in self._live(now)
            if (workload is None or r.preemptor == workload)
            and (namespace is None or r.preemptor.namespace == namespace)
        )

    def claimed_by(self, victim_uid: str, now: float | None = None) -> tuple[str, Workload] | None:
        """The preemptor (UID, workload) most recently allowed to take this pod, if any."""
        found = [
            (r.at, uid, r.preemptor)
            for uid, r in self._live(now)
            if any(v == victim_uid for v, _ in r.victims())
        ]
        if not found:
            return None
        _, uid, workload = max(found, key=lambda f: f[0])
        return uid, workload

    def holds(self, preemptor_uid: str, victim_uid: str) -> bool:
        """Whether this preemptor was allowed to take this pod (its retry names it again)."""
        found = self._by_preemptor.get(preemptor_uid)
        return found is not None and any(v == victim_uid for v, _ in found.victims())

    def depth_of(self, workload_key: str, now: float | None = None, *, exclude: str = "") -> int:
        """The deepest allowed preemption that may be taking a pod of this workload right now (0: none)."""
        deepest = 0
        for uid, r in self._live(now):
            if uid != exclude and any(w == workload_key for _, w in r.victims()):
                deepest = max(deepest, r.depth)
        return deepest
