"""A released node's drain: cancelled once, its eviction ledger kept until the last minute has passed.

Why it exists: the fleet's evictions-per-minute limit is counted from the ledgers in the nodes' drain states
(plan.py). A drain cancelled on release that removed its state would drop the evictions of the last minute
from that count, and the GPUPodEvicted Events a dying leader still owed. So a cancel keeps the ledger in a
cancelled state until `prune_ledger` empties it; then the state is removed.

The act sequence (act.py `DrainActuator.cancel`) and what the next pass does with each half-done state:
(1) GPUDrainCancelled, named after the drain's start - killed after it, the state is not yet cancelled: the
next pass announces again (409: written) and goes on; (2) the GPUPodEvicted Events still owed (named after
the pod's uid) - killed between them, they are still owed: written next pass, the ones written answer 409;
(3) the cancelled state (the ledger, the written Events marked), or no state when nothing is left to keep -
from then on each pass only prunes, and removes the state once the ledger is empty.

What it must not do: no I/O, no clock reads; it never evicts (a released node's pods stay where they are).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from controller.drain.plan import DrainPod, Eviction, events_owed, prune_ledger
from controller.drain.state import DrainState

EVENT_CANCELLED = "GPUDrainCancelled"


@dataclass(frozen=True, slots=True)
class CancelStep:
    """What this pass does for one released node carrying a drain state."""

    node: str
    state: DrainState
    """The state as read."""
    pods: tuple[DrainPod, ...]
    """The pods bound to the node (which of the ledger's evictions happened: pod gone or terminating)."""
    announce: str
    """The GPUDrainCancelled Event's name while it is owed (the state not yet cancelled), else empty."""
    owed: tuple[Eviction, ...]
    """Evictions whose GPUPodEvicted Event is still to be written."""


def cancelled_event_name(node: str, state: DrainState) -> str:
    """One name per drain: the node and when its drain started (whole seconds)."""
    return f"{node}.{EVENT_CANCELLED.lower()}.{int(state.started):x}"


def plan_cancel(node: str, state: DrainState, pods: Sequence[DrainPod]) -> CancelStep:
    """The cancel of `node`'s drain, or what is left of it."""
    announce = cancelled_event_name(node, state) if state.cancelled is None else ""
    return CancelStep(node, state, tuple(pods), announce, events_owed(state.evictions, pods))


def after_cancel(step: CancelStep, evented: Collection[str], now: float) -> DrainState | None:
    """The state once the step's Events are done (`evented`: the uids whose GPUPodEvicted Event now
    exists): the ledger, pruned; None when nothing is left to keep. Nothing else survives a cancel."""
    ledger = [replace(e, evented=True) if e.uid in evented else e for e in step.state.evictions]
    kept = prune_ledger(ledger, step.pods, now)
    if not kept:
        return None
    cancelled = step.state.cancelled if step.state.cancelled is not None else float(int(now))
    return DrainState(started=step.state.started, scope=step.state.scope, evictions=kept, cancelled=cancelled)
