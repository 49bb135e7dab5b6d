"""The quarantine circuit breaker: how many of this loop's candidates may be tainted, and its next state.

Why it exists: a bad exporter rollout, a Prometheus relabelling mistake or a fleet-wide driver bug looks like
a mass hardware fault. Safety rule 3 (docs/architecture.md) caps quarantines at `max(absolute, percent of GPU
nodes)` at once and at N new per window; past that the breaker opens, nothing new is tainted, and it stays
open until the trip condition has been clear for a hold time or an operator resets it. Its state lives in the
API (see act.py), so a restart or a new leader does not silently close it. A transition's Event is kept in the
state as owed (`BreakerState.owed`) until it is written under a name made of its reason and the episode's
`opened_at`: a leader killed between the state and the Event writes it later, once.

What it must not do: no I/O, no clock reads, no knowledge of nodes — only counts in, a verdict out.
Releases are never limited: lifting a quarantine is the safe direction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.health.plan import EventSpec
from controller.health.snapshot import BreakerEvent, BreakerState

EVENT_BREAKER_OPEN = "QuarantineBreakerOpen"
EVENT_BREAKER_CLOSED = "QuarantineBreakerClosed"
_KIND = {EVENT_BREAKER_OPEN: ("Warning", "Trip"), EVENT_BREAKER_CLOSED: ("Normal", "Close")}


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
    clear it closes and admits. An operator reset (`before.reset_requested`) closes it first (evented when
    it was open). Without trustworthy data (`data_ok=False`) nothing moves. The window's starts and the
    Events still owed are carried; a transition's Event is added to the owed ones (`after.owed`).
    """
    state, event = before, None
    if before.reset_requested:
        state = BreakerState(starts=before.starts, owed=before.owed)
        if before.open:
            note = f"circuit breaker reset by an operator ({before.reason or 'open'}); quarantines resume"
            event = _owed(EVENT_BREAKER_CLOSED, before.opened_at, now, note)
    numbers = (
        f"{budget.quarantined}+{demand} vs limit {budget.limit}; "
        f"{budget.new_in_window}+{demand} new in window vs {budget.new_limit}"
    )
    if not data_ok:
        return _verdict(state, 0, event)
    fits = budget.fits(demand)
    if state.open and not fits:
        return _verdict(replace(state, clear_since=None), 0, event)
    if state.open:
        clear_since = state.clear_since if state.clear_since is not None else now
        if now - clear_since < hold:
            return _verdict(replace(state, clear_since=clear_since), 0, event)
        note = f"trip condition clear for {hold:.0f}s; quarantines resume ({numbers})"
        closed = BreakerState(starts=state.starts, owed=state.owed)
        return _verdict(closed, demand, _owed(EVENT_BREAKER_CLOSED, state.opened_at, now, note))
    if fits:
        return _verdict(state, demand, event)
    room = budget.room()
    reason = f"would exceed the quarantine budget ({numbers})"
    note = (
        f"circuit breaker open: {reason}; {demand - room} node(s) not quarantined; it closes after the "
        f"condition has been clear for {hold:.0f}s, or when an operator resets it"
    )
    if event is not None:  # reset and tripped again in one pass: both Events
        state = replace(state, owed=(*state.owed, event))
    opened = replace(state, open=True, opened_at=float(int(now)), clear_since=None, reason=reason)
    return _verdict(opened, room, _owed(EVENT_BREAKER_OPEN, now, now, note))


def _owed(reason: str, at: float | None, now: float, note: str) -> BreakerEvent:
    """The transition's Event, named after the episode's opened_at (now when that is unknown)."""
    return BreakerEvent(reason, float(int(at if at is not None else now)), note)


def _verdict(state: BreakerState, admit: int, event: BreakerEvent | None) -> BreakerVerdict:
    if event is None:
        return BreakerVerdict(state, admit)
    return BreakerVerdict(replace(state, owed=(*state.owed, event)), admit, event_spec(event))


def event_spec(event: BreakerEvent, configmap: str = "") -> EventSpec:
    """The Event of a transition; named (written once, across leaders) when the breaker object is given."""
    type_, action = _KIND.get(event.reason, ("Normal", "Close"))
    name = f"{configmap}.{event.reason.lower()}.{int(event.at):x}" if configmap else ""
    return EventSpec(event.reason, "Warning" if type_ == "Warning" else "Normal", event.note, action, name)
