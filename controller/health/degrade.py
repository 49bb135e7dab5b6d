"""The `degrade` action: node condition `GPUDegraded` + an Event + a metric, never a taint.

Why: PCIe replays, HW slowdown, thermal and power-brake clock events and a shrinking thermal margin make a
node slower, not broken; peers warn on them rather than cordon (EKS: Warning events; NVSentinel: store-only
watches). Schedulers, dashboards and humans can read `GPUDegraded=True` (message: which signal on which
GPU) while work keeps landing there. The condition is ours alone (docs/architecture.md, safety rule 2) and
moves only on known data: an unknown node keeps whatever it had.

A change is written as: the `gpuwarden.io/degradation` mark (the change and its Event) → the condition →
the Event, named after the mark's time → the mark removed. A leader killed anywhere in between leaves the
mark, and the next pass finishes the change from it (`finish_degraded`), whatever the telemetry says by
then: the Event exists exactly once and always with its condition.

What it must not do: no I/O, no clock reads; it never plans a taint. The message lists signals and GPUs but
no live values, so an unchanged degradation is never re-patched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from controller.health import plan as p
from controller.health.grading import Graded
from controller.health.signals import EVENT_DEGRADATION_CLEARED, EVENT_DEGRADED
from controller.health.snapshot import NodeState
from gpuwarden.quarantine import iso, parse_iso
from gpuwarden.wellknown import DEGRADATION as DEGRADATION_ANNOTATION
from gpuwarden.wellknown import GPU_DEGRADED_CONDITION as DEGRADED_CONDITION

REASON_DEGRADED = "GPUDegradationSignals"
REASON_CLEAR = "NoGPUDegradation"


@dataclass(frozen=True, slots=True)
class DegradationMark:
    """A `GPUDegraded` change whose Event is still owed: everything its condition and its Event need."""

    status: Literal["True", "False"]
    message: str  # the condition's
    note: str  # the Event's
    at: float  # when it was decided, whole seconds: the Event's name

    def encode(self) -> str:
        body = {"status": self.status, "message": self.message, "note": self.note, "at": iso(self.at)}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @property
    def condition(self) -> p.ConditionUpdate:
        reason = REASON_DEGRADED if self.status == "True" else REASON_CLEAR
        return p.ConditionUpdate(self.status, reason, self.message, type=DEGRADED_CONDITION)

    def event(self, node: str) -> p.EventSpec:
        """The change's Event, named `<node>.gpudegraded.<at, hex>` (or `.gpudegradationcleared.`)."""
        at = f"{int(self.at):x}"
        if self.status == "True":
            return p.EventSpec(
                EVENT_DEGRADED, "Warning", self.note, "Degrade", name=f"{node}.gpudegraded.{at}"
            )
        name = f"{node}.gpudegradationcleared.{at}"
        return p.EventSpec(EVENT_DEGRADATION_CLEARED, "Normal", self.note, "ClearDegraded", name=name)


def decode_mark(text: str | None) -> DegradationMark | None:
    """The mark as read from the annotation; None when absent or unreadable (then it is overwritten by the
    next change, and never finished: its Event cannot be told)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        status = raw["status"]
        at = parse_iso(raw["at"])
        if status not in ("True", "False") or at is None:
            return None
        return DegradationMark(status, str(raw["message"]), str(raw["note"]), at)
    except (ValueError, KeyError, TypeError):
        return None


def degraded_message(confirmed: tuple[Graded, ...]) -> str:
    """Stable text: `signal on GPU, ...` sorted (values omitted so it changes only with the set)."""
    parts = sorted({f"{g.hit.reason} on {g.hit.gpu or 'node'}" for g in confirmed})
    return "degraded by gpuwarden: " + ", ".join(parts)


def plan_degraded(
    node: NodeState, confirmed: tuple[Graded, ...], pending: tuple[Graded, ...] = (), *, now: float
) -> p.Action | None:
    """The GPUDegraded change for a node whose telemetry is known this pass (None: nothing to change).

    `pending`: degrade signals that hold but are still debouncing. They never set the condition, and they keep
    a set one from being cleared (after a controller restart every streak starts again at one).
    """
    current = node.degraded
    at = float(int(now))
    if confirmed:
        message = degraded_message(confirmed)
        if current is not None and current.status == "True" and current.message == message:
            return None
        why = "; ".join(sorted({g.hit.why for g in confirmed}))
        mark = DegradationMark("True", message, f"{message} ({why}); no taint", at)
        return _change("degrade", node.name, confirmed[0].hit.reason, why, mark)
    if current is not None and current.status == "True" and not pending:
        mark = DegradationMark("False", "no degradation signal holds", f"cleared: {current.message}", at)
        return _change("clear-degraded", node.name, "signals-cleared", "no degradation signal holds any more",
                       mark)  # fmt: skip
    return None


def finish_degraded(node: NodeState) -> p.Action | None:
    """A GPUDegraded change whose Event is owed (the leader died after the mark): the condition as the mark
    says (if it is not so yet), the Event (or 409), the mark removed. None: no readable mark."""
    text = node.annotations.get(DEGRADATION_ANNOTATION)
    mark = decode_mark(text)
    if mark is None:
        return None
    event = mark.event(node.name)
    return p.Action(
        "finish-event",
        node.name,
        "degradation-event-pending",
        f"GPUDegraded={mark.status} decided, but its {event.reason} Event is not recorded as written",
        condition=mark.condition,
        event=event,
        degradation=text,
    )


def _change(kind: p.ActionKind, node: str, reason: str, why: str, mark: DegradationMark) -> p.Action:
    return p.Action(
        kind, node, reason, why, condition=mark.condition, event=mark.event(node), degradation=mark.encode()
    )
