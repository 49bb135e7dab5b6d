"""The quarantine circuit breaker: how many of this loop's candidates may be tainted, and its next state.

Why it exists: a bad exporter rollout, a Prometheus relabelling mistake or a fleet-wide driver bug looks like
a mass hardware fault. Safety rule 3 (docs/architecture.md) caps quarantines at `max(absolute, percent of GPU
nodes)` at once and at N new per window; past that the breaker opens, nothing new is tainted, and it stays
open until the trip condition has been clear for a hold time or an operator resets it. Its state lives in the
API (see act.py), so a restart or a new leader does not silently close it.

What it must not do: no I/O, no clock reads, no knowledge of nodes — only counts in, a verdict out.
Releases are never limited: lifting a quarantine is the safe direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.health.plan import EventSpec
from controller.health.snapshot import BreakerState

EVENT_BREAKER_OPEN = "QuarantineBreakerOpen"
EVENT_BREAKER_CLOSED = "QuarantineBreakerClosed"


@dataclass(frozen=True, slots=True)
class Budget:
    """The counts the breaker compares: quarantined now and new in the window, against their limits."""

    quarantined: int
    limit: int
    new_in_window: int
    new_limit: int

    def fits(self, demand: int) -> bool:
        return self.quarantined + demand <= self.limit and self.new_in_window + demand <= self.new_limit

    def room(self) -> int:
        return max(0, min(self.limit - self.quarantined, self.new_limit - self.new_in_window))


@dataclass(frozen=True, slots=True)
class BreakerVerdict:
    """The breaker after this loop, how many candidates (in priority order) may be quarantined, an event."""

    after: BreakerState
    admit: int
    event: EventSpec | None = None


def evaluate(
    before: BreakerState, budget: Budget, demand: int, *, hold: float, now: float, data_ok: bool = True
) -> BreakerVerdict:
    """Decide the breaker for `demand` new quarantine candidates.

    Closed and the demand fits: admit all. Closed and it does not: admit what fits, open. Open: admit none;
    the clear timer runs while the demand would fit and restarts when it would not; after `hold` seconds of
    clear it closes and admits. An operator reset (`before.reset_requested`) closes it first. Without
    trustworthy data (`data_ok=False`) nothing moves.
    """
    state = BreakerState() if before.reset_requested else before
    numbers = (
        f"{budget.quarantined}+{demand} vs limit {budget.limit}; "
        f"{budget.new_in_window}+{demand} new in window vs {budget.new_limit}"
    )
    if not data_ok:
        return BreakerVerdict(state, 0)
    fits = budget.fits(demand)
    if state.open and not fits:
        return BreakerVerdict(BreakerState(True, state.opened_at, None, state.reason), 0)
    if state.open:
        clear_since = state.clear_since if state.clear_since is not None else now
        if now - clear_since < hold:
            return BreakerVerdict(BreakerState(True, state.opened_at, clear_since, state.reason), 0)
        note = f"trip condition clear for {hold:.0f}s; quarantines resume ({numbers})"
        return BreakerVerdict(
            BreakerState(), demand, EventSpec(EVENT_BREAKER_CLOSED, "Normal", note, "Close")
        )
    if fits:
        return BreakerVerdict(state, demand)
    room = budget.room()
    reason = f"would exceed the quarantine budget ({numbers})"
    note = (
        f"circuit breaker open: {reason}; {demand - room} node(s) not quarantined; it closes after the "
        f"condition has been clear for {hold:.0f}s, or when an operator resets it"
    )
    return BreakerVerdict(
        BreakerState(True, now, None, reason), room, EventSpec(EVENT_BREAKER_OPEN, "Warning", note, "Trip")
    )
