"""Finishing a GPU preemption a killed leader left half done: what the next pass does with each state.

Why it exists: GPU preemption writes, in order, (1) the claim and its preemption record (`state: evicting`,
the victims named) on the preemptor, then per victim (2) the Eviction and (3) its `Preempted` Event (named
after preemptor and victim), (4) `GPUPreempting` on the preemptor (named after the record), and (5) the
record marked `done` with the victims actually evicted. A leader killed between any two of them leaves a
record in `evicting`. Every replica counts its victims from the record (the throttle's reservations), so no
budget is granted afresh; this plan says how the next leader finishes it, from the record and what the pod
cache shows of each victim:

* a victim still live (same UID, not being deleted) is evicted when the preemptor still waits for its room
  (unbound, not being deleted, the record's deadline not passed); otherwise it is left alone;
* a victim gone or being deleted counts as evicted: its `Preempted` Event is owed (written with its fixed
  name, so an Event already written answers 409 and is not doubled). A victim someone else deleted in the
  meantime is counted too: over-counting is the safe direction;
* when nothing was or will be evicted, the claim is withdrawn (the preemptor is planned afresh later);
* otherwise `GPUPreempting` is owed and the record is marked `done`.

A victim is never evicted twice: one being deleted, or gone, is not evicted again. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controller.preemption.record import PreemptionRecord, VictimEntry


class VictimState(StrEnum):
    LIVE = "live"
    """The same pod (UID), not being deleted."""
    GOING = "going"
    """Being deleted (an eviction went through)."""
    GONE = "gone"
    """Not in the cache of live pods, or a new pod under its name."""


def victim_state(obj: Mapping[str, Any] | None, uid: str) -> VictimState:
    """A victim's state from the pod cache (`obj`: the pod under its name, None when absent)."""
    meta = (obj or {}).get("metadata") or {}
    if obj is None or meta.get("uid") != uid:
        return VictimState.GONE
    phase = (obj.get("status") or {}).get("phase")
    if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
        return VictimState.GOING
    return VictimState.LIVE


def waiting(preemptor: Mapping[str, Any]) -> bool:
    """Whether the preemptor still waits for room: unbound, not being deleted, not finished."""
    meta, spec = preemptor.get("metadata") or {}, preemptor.get("spec") or {}
    phase = (preemptor.get("status") or {}).get("phase")
    return (
        not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and phase not in ("Succeeded", "Failed")
    )


@dataclass(frozen=True, slots=True)
class Completion:
    """What the next pass does with a record left in `evicting`."""

    record: PreemptionRecord
    node: str
    evict: tuple[VictimEntry, ...]
    """Victims to evict now (each followed by its `Preempted` Event)."""
    evicted: tuple[VictimEntry, ...]
    """Victims already gone or going: their `Preempted` Events are owed (409 = already written)."""
    release: bool
    """The preemptor is unbound: withdrawing means giving its claim back too."""
    reason: str

    @property
    def withdraw(self) -> bool:
        """Nothing was evicted and nothing will be: withdraw the claim (if unbound) and the record."""
        return not self.evict and not self.evicted


def plan_completion(
    preemptor: Mapping[str, Any], record: PreemptionRecord, victims: Mapping[str, VictimState], now: float
) -> Completion:
    """The rest of the preemption `record` describes, given each victim's state (by UID; absent = gone)."""
    node, entries = next(iter(sorted(record.victims.items())), ("", ()))
    states = {v.uid: victims.get(v.uid, VictimState.GONE) for v in entries}
    evicted = tuple(v for v in entries if states[v.uid] is not VictimState.LIVE)
    live = tuple(v for v in entries if states[v.uid] is VictimState.LIVE)
    pending = waiting(preemptor)
    if live and pending and now < record.until:
        evict, reason = live, f"{len(live)} victim(s) still to evict"
    elif live:
        why = "past its deadline" if pending else "no longer waiting"
        evict, reason = (), f"preemptor {why}: {len(live)} victim(s) left alone"
    else:
        evict, reason = (), "every victim evicted"
    return Completion(record, node, evict, evicted, pending, reason)
