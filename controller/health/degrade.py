"""The `degrade` action: node condition `GPUDegraded` + an Event + a metric, never a taint.

Why: PCIe replays, HW slowdown, thermal and power-brake clock events and a shrinking thermal margin make a
node slower, not broken; peers warn on them rather than cordon (EKS: Warning events; NVSentinel: store-only
watches). Schedulers, dashboards and humans can read `GPUDegraded=True` (message: which signal on which
GPU) while work keeps landing there. The condition is ours alone (docs/architecture.md, safety rule 2) and
moves only on known data: an unknown node keeps whatever it had.

What it must not do: no I/O, no clock reads; it never plans a taint. The message lists signals and GPUs but
no live values, so an unchanged degradation is never re-patched.
"""

from __future__ import annotations

from controller.health import plan as p
from controller.health.grading import Graded
from controller.health.signals import EVENT_DEGRADATION_CLEARED, EVENT_DEGRADED
from controller.health.snapshot import NodeState
from gpuwarden.wellknown import GPU_DEGRADED_CONDITION as DEGRADED_CONDITION

REASON_DEGRADED = "GPUDegradationSignals"
REASON_CLEAR = "NoGPUDegradation"


def degraded_message(confirmed: tuple[Graded, ...]) -> str:
    """Stable text: `signal on GPU, ...` sorted (values omitted so it changes only with the set)."""
    parts = sorted({f"{g.hit.reason} on {g.hit.gpu or 'node'}" for g in confirmed})
    return "degraded by gpuwarden: " + ", ".join(parts)


def plan_degraded(
    node: NodeState, confirmed: tuple[Graded, ...], pending: tuple[Graded, ...] = ()
) -> p.Action | None:
    """The GPUDegraded change for a node whose telemetry is known this pass (None: nothing to change).

    `pending`: degrade signals that hold but are still debouncing. They never set the condition, and they keep
    a set one from being cleared (after a controller restart every streak starts again at one).
    """
    current = node.degraded
    if confirmed:
        message = degraded_message(confirmed)
        if current is not None and current.status == "True" and current.message == message:
            return None
        why = "; ".join(sorted({g.hit.why for g in confirmed}))
        return p.Action(
            "degrade",
            node.name,
            confirmed[0].hit.reason,
            why,
            condition=p.ConditionUpdate("True", REASON_DEGRADED, message, type=DEGRADED_CONDITION),
            event=p.EventSpec(EVENT_DEGRADED, "Warning", f"{message} ({why}); no taint", "Degrade"),
        )
    if current is not None and current.status == "True" and not pending:
        return p.Action(
            "clear-degraded",
            node.name,
            "signals-cleared",
            "no degradation signal holds any more",
            condition=p.ConditionUpdate(
                "False", REASON_CLEAR, "no degradation signal holds", type=DEGRADED_CONDITION
            ),
            event=p.EventSpec(
                EVENT_DEGRADATION_CLEARED, "Normal", f"cleared: {current.message}", "ClearDegraded"
            ),
        )
    return None
