"""`plan_nominations`: which pending pods' `status.nominatedNodeName` are stale, and what to do about them.

Why it exists: a nomination that outlives its reason keeps capacity reserved (the scheduler adds nominated
pods of equal or higher priority to the node in every filter) and makes autoscalers believe the pod has a
home (kubernetes#85677, #106780, #95752). Clearing one too early is worse: the scheduler refuses to preempt
again only while a victim on the *nominated* node is still terminating (`PodEligibleToPreemptOthers`), so
clearing then removes that guard and the next cycle preempts a second set of victims elsewhere
(reference/scheduler-extender.md section 4.5). Hence, per nominated pod, in this order:

1. **guard** — a pod on the nominated node with lower priority is being deleted with
   `DisruptionTarget=PreemptionByScheduler`: hold, whatever else is true (not configurable);
2. **escalation** (opt-in) — nominated to the same node for `evict_after_seconds` (so clearing did not
   help: the scheduler nominated it there again): evict, if a controller owns the pod (a bare pod would be
   lost; it is only cleared);
3. **stale** — the node is gone; NotReady for longer than the grace; cordoned; quarantined by us
   (NoSchedule/NoExecute taint); the pod can never fit it (the extender's *unresolvable* verdict: topology
   or quarantined GPUs); or nominated longer than `ttl_seconds` — clear;
4. otherwise hold (fresh).

Age is measured from our `gpuwarden.io/nomination` record; a pod without one (or with one for another node)
gets a `Stamp` and counts from `now`. A pending pod that is no longer nominated but still carries the record
gets a `Forget`, so a later nomination to the same node starts a new clock.

Messages carry no live numbers (ages), so a repeated dry-run Event is one Event series, not one per pass.
Messages carry no live numbers (ages), so a repeated dry-run Event is one Event series, not one per pass.
Pure: no I/O, no clock (`now` is a parameter), no logging.
"""

from __future__ import annotations

from controller.gpus.fit import never_fits as gpu_never_fits
from controller.nominations.plan import (
    Clear,
    Evict,
    Forget,
    Held,
    Hold,
    NominationPlan,
    NominationPolicy,
    Stale,
    Stamp,
)
from controller.nominations.snapshot import NominationRecord, NominationSnapshot, PendingPod


def never_fits(pod: PendingPod, snapshot: NominationSnapshot, now: float) -> str:
    """The extender's reason why `pod` can never fit its nominated node; "" when it could or when unknown
    (no model, node not in the model, no GPU request)."""
    if snapshot.views is None or snapshot.fit_settings is None or pod.gpu is None or pod.gpu.gpus <= 0:
        return ""
    view = snapshot.views.get(pod.node)
    if view is None:
        return ""
    return gpu_never_fits(pod.gpu, view, snapshot.fit_settings, now)


def staleness(
    pod: PendingPod, age: float, snapshot: NominationSnapshot, policy: NominationPolicy, now: float
) -> tuple[Stale | Held, str]:
    """Why the nomination is stale, or why it is not (`Held.FRESH` / `Held.NOT_READY_GRACE`)."""
    node = snapshot.nodes.get(pod.node)
    if node is None:
        return Stale.NODE_GONE, f"node {pod.node} no longer exists"
    held: tuple[Stale | Held, str] = (Held.FRESH, "")
    if node.ready is False:
        grace = policy.not_ready_grace_seconds
        if node.ready_since is None:
            held = (Held.NOT_READY_GRACE, f"node {pod.node} NotReady since an unknown time")
        elif now - node.ready_since >= grace:
            return Stale.NODE_NOT_READY, f"node {pod.node} NotReady for longer than the {grace:g}s grace"
        else:
            held = (Held.NOT_READY_GRACE, f"node {pod.node} NotReady within the {grace:g}s grace")
    if node.cordoned:
        return Stale.NODE_CORDONED, f"node {pod.node} is cordoned"
    if node.quarantine is not None:
        return Stale.NODE_QUARANTINED, f"node {pod.node} is quarantined by gpuwarden ({node.quarantine})"
    why = never_fits(pod, snapshot, now)
    if why:
        return Stale.NEVER_FITS, f"pod can never fit node {pod.node}: {why}"
    if age >= policy.ttl_seconds:
        ttl = policy.ttl_seconds
        return (
            Stale.EXPIRED,
            f"nominated to {pod.node} for longer than the {ttl:g}s ttl with no victim terminating",
        )
    return held


def plan_nominations(snapshot: NominationSnapshot, policy: NominationPolicy, now: float) -> NominationPlan:
    """Decide, for every pending pod in the snapshot, clear / evict / hold, and the record writes."""
    clears: list[Clear] = []
    evictions: list[Evict] = []
    holds: list[Hold] = []
    stamps: list[Stamp] = []
    forgets: list[Forget] = []
    for pod in snapshot.pods:
        if policy.namespaces and pod.namespace not in policy.namespaces:
            if pod.node:
                holds.append(Hold(pod, Held.OUT_OF_SCOPE, f"namespace {pod.namespace} is not managed"))
            continue
        if not pod.node:
            owed = pod.record if pod.record is not None and pod.record.clearing else None
            forgets.append(Forget(pod, owed))
            continue
        record = pod.record
        if record is None or record.node != pod.node:
            record = NominationRecord(pod.node, now)
            stamps.append(Stamp(pod, record))
        age = max(0.0, now - record.since)
        verdict, why = staleness(pod, age, snapshot, policy, now)
        guard = [v for v in snapshot.terminating.get(pod.node, ()) if v.priority < pod.priority]
        if guard:
            names = ", ".join(v.key for v in guard[:3]) + (", ..." if len(guard) > 3 else "")
            message = f"{len(guard)} preemption victim(s) still terminating on {pod.node} ({names})"
            if isinstance(verdict, Stale):
                message += f"; otherwise stale: {why}"
            holds.append(Hold(pod, Held.VICTIM_TERMINATING, message, age))
            continue
        if policy.escalate and pod.owned and age >= policy.evict_after_seconds:
            limit = policy.evict_after_seconds
            evictions.append(
                Evict(pod, f"nominated to {pod.node} for longer than {limit:g}s: clearing did not help", age)
            )
            continue
        if isinstance(verdict, Stale):
            clears.append(Clear(pod, verdict, why, age, record))
        else:
            holds.append(Hold(pod, verdict, why, age))
    return NominationPlan.of(now, policy.dry_run, clears, evictions, holds, stamps, forgets)
