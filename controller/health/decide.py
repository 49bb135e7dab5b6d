"""`plan_quarantine(snapshot, policy, now) -> HealthPlan`: the whole quarantine decision, as a pure function.

Why pure: the rules that keep a fleet safe — unknown data changes nothing, the circuit breaker, the healthy
period, operator overrides — are exactly the rules that must be table-tested row by row, and replayed by
`gpuwarden plan` without touching the cluster. Everything the decision needs is in the snapshot (including
the state we keep on Nodes and the breaker object), so a restarted or newly elected controller decides
the same.

What it must not do: no I/O, no logging, no events, no clock reads, no imports of Prometheus or Kubernetes
clients. It never plans a change to a taint other than ours, and never adds or removes a taint on the strength
of missing or stale data. Operator requests (`gpuwarden.io/release=now`, removing our taint by hand) are the
only changes made without fresh telemetry.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from controller.health import breaker, devicerules
from controller.health import plan as p
from controller.health.degrade import finish_degraded, plan_degraded
from controller.health.domains import DomainGrading, grade_domains, is_domain_key, publication_action
from controller.health.findings import Assessment, Finding, assess_node, fresh_gpus, recovery_holds
from controller.health.grading import FleetGrading, Graded, grade_fleet
from controller.health.policy import HealthPolicy, reason_class
from controller.health.snapshot import EFFECT_STRENGTH, FleetSnapshot, NodeState, Taint
from controller.health.validation import finish_validation, plan_validation
from gpuwarden.quarantine import QuarantineRecord, decode, iso
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY

EVENT_QUARANTINED = "GPUQuarantined"
EVENT_RELEASED = "GPUQuarantineReleased"


# (node, its quarantining findings, dismissed evidence still to remember)
_Candidate = tuple[NodeState, tuple[Finding, ...], tuple[str, ...]]


@dataclass
class _Work:
    actions: list[p.Action] = field(default_factory=list)
    skips: list[p.Skip] = field(default_factory=list)
    candidates: list[_Candidate] = field(default_factory=list)
    healthy: int = 0

    def skip(self, node: str, reason: str, message: str) -> None:
        self.skips.append(p.Skip(node, reason, message))


def plan_quarantine(snapshot: FleetSnapshot, policy: HealthPolicy, now: float) -> p.HealthPlan:
    """Decide every quarantine, release, bookkeeping update and skip for this loop."""
    work = _Work()
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    assessments = {n.name: assess_node(n, policy, now) if snapshot.prometheus_ok else None for n in nodes}
    known = {
        n.name: (n, fresh_gpus(n, policy, now))
        for n in nodes
        if not n.excluded and (a := assessments[n.name]) is not None and a.status != "unknown"
    }
    node_streaks = {k: s for k, s in snapshot.streaks.items() if not is_domain_key(k)}
    grading = grade_fleet(known, policy.signals, node_streaks, now)
    domain_streaks = {k: s for k, s in snapshot.streaks.items() if is_domain_key(k)}
    domains = grade_domains(nodes, grading, set(known), policy.domains, domain_streaks, now)
    work.actions.extend(publication_action(c) for c in domains.changes)
    for node in nodes:
        assessment = assessments[node.name]
        # A GPUDegraded change whose Event is owed is finished whatever the telemetry says now.
        finish = None if node.excluded else finish_degraded(node)
        if finish is not None:
            work.actions.append(finish)
        if node.name in known:
            extra = tuple(_signal_finding(g, policy) for g in _quarantining(node, grading))
            if extra:
                assessment = assess_node(node, policy, now, extra)
            _plan_signals(node, grading, work, now, degrade=finish is None)
        _plan_node(node, assessment, snapshot, policy, now, work)
    gpu_nodes = sum(1 for n in snapshot.nodes if n.gpu_node and not n.excluded)
    breaker, admitted = _breaker(snapshot, policy, now, gpu_nodes, work)
    for node, findings, keep in admitted:
        work.actions.append(_quarantine(node, findings, keep, snapshot, policy, now))
    actions = tuple(sorted(work.actions, key=lambda a: (a.node, a.kind)))
    stats = Counter(a.kind for a in work.actions) + Counter(f"skip:{s.reason}" for s in work.skips)
    return p.HealthPlan(
        now=now,
        dry_run=policy.dry_run,
        actions=actions,
        skips=tuple(sorted(work.skips, key=lambda s: (s.node, s.reason))),
        breaker=breaker,
        healthy=work.healthy,
        gpu_nodes=gpu_nodes,
        stats=dict(stats),
        signals=_signal_statuses(grading),
        streaks={**grading.streaks, **domains.streaks},
        domains=_domain_statuses(domains),
        stalled_gpus=sum(len(a.stalled) for a in assessments.values() if a is not None),
        rule_sync=devicerules.plan_rule_sync(
            nodes, actions, snapshot.owned_rules, effect=policy.device_taint_effect, dry_run=policy.dry_run
        )
        if snapshot.device_rules == "served"
        else p.RuleSync(),
    )


def _domain_statuses(domains: DomainGrading) -> tuple[p.DomainStatus, ...]:
    return tuple(
        p.DomainStatus(v.domain, v.state, v.target or "", len(v.members), v.count, v.needed, v.why)
        for v in domains.verdicts.values()
    )


def _quarantining(node: NodeState, grading: FleetGrading) -> tuple[Graded, ...]:
    """Confirmed `quarantine` signals, plus those still debouncing that are already our node's evidence:
    streaks restart with the controller, and a quarantine must not start its healthy period for that."""
    confirmed = grading.confirmed(node.name, "quarantine")
    if node.our_taint is None:
        return confirmed
    record, _ = decode(node.annotations.get(RECORD_ANNOTATION))
    held = record.fingerprints if record is not None else frozenset()
    again = tuple(
        g
        for g in grading.pending(node.name)
        if g.action == "quarantine" and f"{g.hit.reason}/{g.hit.gpu}" in held
    )
    return confirmed + again


def _signal_finding(g: Graded, policy: HealthPolicy) -> Finding:
    """A confirmed `quarantine` signal as a finding: the breaker, the record and the release treat it like
    any other evidence (released after the healthy period once the signal no longer holds)."""
    h = g.hit
    return Finding(
        h.reason,
        reason_class(h.reason, policy.catalog),
        True,
        f"{h.why} ({g.count} consecutive passes)",
        gpu=h.gpu,
        value=h.value,
        first_seen=g.since,
        recovery="none",
    )


def _plan_signals(node: NodeState, grading: FleetGrading, work: _Work, now: float, *, degrade: bool) -> None:
    """Skips that explain signals not (yet) acted on, and the GPUDegraded change (`degrade`: none is being
    finished this pass; the next change is planned one pass later, from the finished condition)."""
    name = node.name
    pending = grading.pending(name)
    if pending:
        work.skip(
            name,
            p.SKIP_DEBOUNCING,
            "; ".join(f"{g.hit.why}: {g.count}/{g.needed} consecutive passes" for g in pending),
        )
    silenced = grading.in_grace.get(name, ())
    if silenced:
        work.skip(
            name,
            p.SKIP_BOOT_GRACE,
            "inside the boot grace after the node's (re)boot: " + "; ".join(h.why for h in silenced),
        )
    observed = grading.confirmed(name, "observe")
    if observed:
        work.skip(name, p.SKIP_OBSERVED, "; ".join(g.hit.why for g in observed))
    holding = tuple(g for g in pending if g.action == "degrade")
    action = plan_degraded(node, grading.confirmed(name, "degrade"), holding, now=now) if degrade else None
    if action is not None:
        work.actions.append(action)


def _signal_statuses(grading: FleetGrading) -> tuple[p.SignalStatus, ...]:
    out: list[p.SignalStatus] = []
    for node, graded in sorted(grading.graded.items()):
        for g in graded:
            state: p.SignalState = "confirmed" if g.confirmed else "debouncing"
            out.append(p.SignalStatus(node, g.hit.signal, g.hit.gpu, g.action, state))
    for node, hits in sorted(grading.in_grace.items()):
        for h in hits:
            out.append(p.SignalStatus(node, h.signal, h.gpu, "", "boot-grace"))
    return tuple(out)


def _plan_node(
    node: NodeState,
    assessment: Assessment | None,
    snap: FleetSnapshot,
    policy: HealthPolicy,
    now: float,
    work: _Work,
) -> None:
    if node.excluded:
        work.skip(node.name, p.SKIP_EXCLUDED, "label gpuwarden.io/exclude=true: never touched")
        return
    record, error = decode(node.annotations.get(RECORD_ANNOTATION))
    if error:
        work.skip(node.name, p.SKIP_BAD_RECORD, f"annotation {RECORD_ANNOTATION} {error}; treated as absent")
    if record is not None and record.validation_event:
        # A validation step recorded whose Event was not written (the leader died in between): the Event
        # first, the node's next step one pass later (no write of this pass races the mark).
        work.actions.append(finish_validation(node.name, record, policy.validation))
        return
    taint = node.our_taint
    if taint is not None:
        if record is None or record.state != "quarantined":
            # Our taint without our record (crash between writes, or a hand-made taint): adopt it.
            record = QuarantineRecord("quarantined", taint.value, effect=taint.effect, boot_id=node.boot_id)
        _plan_quarantined(node, taint, record, assessment, snap, policy, now, work)
    else:
        _plan_free(node, record, assessment, snap, policy, now, work)


def _unknown(node: NodeState, assessment: Assessment | None, snap: FleetSnapshot, work: _Work) -> bool:
    if assessment is None:
        work.skip(
            node.name,
            p.SKIP_PROMETHEUS_DOWN,
            f"Prometheus unavailable ({snap.prometheus_error}): nothing added or removed",
        )
        return True
    if assessment.status == "unknown":
        reason = p.SKIP_STALLED if assessment.stalled else p.SKIP_UNKNOWN
        work.skip(node.name, reason, f"{assessment.why}: nothing added or removed")
        return True
    return False


def _plan_quarantined(
    node: NodeState,
    taint: Taint,
    record: QuarantineRecord,
    assessment: Assessment | None,
    snap: FleetSnapshot,
    policy: HealthPolicy,
    now: float,
    work: _Work,
) -> None:
    current = assessment.quarantining if assessment is not None and assessment.status != "unknown" else ()
    if node.release_requested:
        dismissed = tuple(sorted(record.fingerprints | {f.fingerprint for f in current}))
        if record.event_pending and record.quarantined_at is not None:
            work.actions.append(_finish_quarantine(node.name, record, drift=False, policy=policy))
        work.actions.append(_release(node, taint, record.with_(event_pending=False), "operator-annotation",
                                     now, dismissed))  # fmt: skip
        return
    if record.devices and snap.device_rules == "not-served":
        # The DeviceTaintRule API went away (downgrade, gate off): the rules cannot hold the devices any more,
        # so the node taint does; an owed Event is written by the next pass, without rules.
        gone = devicerules.scope_of({}, (), "not-served", snap.device_rules_why).note
        work.actions.append(_widen(node, taint, record, policy, gone, "device rules no longer served"))
        return
    drift = node.condition is None or node.condition.status != "False"
    if record.event_pending and record.quarantined_at is not None:
        # A quarantine whose Event was not written (the leader died after the taint): finish it, whatever
        # the telemetry says now - the taint is on the node and the Event only reports it.
        work.actions.append(_finish_quarantine(node.name, record, drift, policy=policy))
        drift = False
    if _unknown(node, assessment, snap, work):
        return
    if drift:
        work.actions.append(
            p.Action(
                "set-condition",
                node.name,
                "condition-drift",
                "quarantined but GPUHealthy is not False",
                condition=_condition_false(record.reason),
            )
        )
    if current:
        new = [f for f in current if f.fingerprint not in record.fingerprints]
        if new or record.healthy_since is not None:
            updated = record.with_(
                evidence=record.evidence + tuple(f.evidence() for f in new),
                healthy_since=None,
                validation_job="",  # a validation begun before the evidence returned proves nothing
                validation_started=None,
            )
            why = f"new evidence: {', '.join(f.fingerprint for f in new)}" if new else "evidence returned"
            work.actions.append(_rescope(node, taint, updated, snap, policy, why))
        else:
            work.skip(node.name, p.SKIP_STILL_FAULTY, "; ".join(f.why for f in current))
        return
    if record.healthy_since is None:
        work.actions.append(
            p.Action(
                "update-record",
                node.name,
                "healthy-period-started",
                f"no evidence now; the healthy period of {policy.healthy_period:.0f}s starts",
                record=record.with_(healthy_since=now),
            )
        )
        return
    left = record.healthy_since + policy.healthy_period - now
    if left > 0:
        work.skip(
            node.name,
            p.SKIP_HEALTHY_PERIOD,
            f"evidence gone since {iso(record.healthy_since)}; {left:.0f}s of the healthy period left",
        )
        return
    pending = [why for ev in record.evidence if (why := recovery_holds(ev, node, record.boot_id, policy))]
    if pending:
        work.skip(node.name, p.SKIP_RECOVERY_PENDING, "; ".join(pending))
        return
    note = ""
    if policy.validation.enabled:
        step = plan_validation(node, record, policy.validation, now)
        if not step.release:
            if step.action is not None:
                work.actions.append(step.action)
            if step.skip is not None:
                work.skip(node.name, *step.skip)
            return
        note = step.note
    work.actions.append(_release(node, taint, record, "healthy-period", now, (), note))


def _rescope(
    node: NodeState,
    taint: Taint,
    record: QuarantineRecord,
    snap: FleetSnapshot,
    policy: HealthPolicy,
    why: str,
) -> p.Action:
    """The update of a quarantine's evidence; a device-scoped one is scoped again over all its evidence: more
    devices get rules, and evidence no device rule can hold (node-level, an unmapped GPU, the rule API gone)
    turns it into the node-level quarantine (the marker taint replaced by the node taint, the rules
    dropped)."""
    if not record.devices:
        return p.Action("update-record", node.name, "evidence-changed", why, record=record)
    scope = devicerules.scope_of(
        node.dra_devices, (e.gpu for e in record.evidence), snap.device_rules, snap.device_rules_why
    )
    if scope.devices:
        updated = record.with_(devices=scope.devices)
        rules = devicerules.rules_for(node.name, updated, policy.device_taint_effect)
        return p.Action("update-record", node.name, "evidence-changed", why, record=updated, rules=rules)
    return _widen(node, taint, record, policy, scope.note, why)


def _widen(
    node: NodeState, taint: Taint, record: QuarantineRecord, policy: HealthPolicy, note: str, why: str
) -> p.Action:
    """A device-scoped quarantine turned into the node-level one: the node taint (the reason classes'
    strongest effect) replaces the marker, the rules are dropped, the record says why."""
    effect = max(
        (policy.effect_for(reason_class(e.reason, policy.catalog)) for e in record.evidence),
        key=lambda e: EFFECT_STRENGTH.get(e, 1),
    )
    widened = record.with_(devices=(), scope_note=note, effect=effect)
    return p.Action(
        "update-record",
        node.name,
        "scope-widened",
        f"{why}; {note}",
        add_taint=Taint(TAINT_KEY, record.reason, effect),
        remove_taint=taint,
        record=widened,
        drop_rules=_rule_names(node.name, record),
        condition=_condition_false(record.reason, note),
    )


def _plan_free(
    node: NodeState,
    record: QuarantineRecord | None,
    assessment: Assessment | None,
    snap: FleetSnapshot,
    policy: HealthPolicy,
    now: float,
    work: _Work,
) -> None:
    """A node without our taint: finish a release whose Event is owed, honour an operator's untaint or
    release request; otherwise, on known data, weigh its evidence (`_plan_evidence`)."""
    known = assessment is not None and assessment.status != "unknown"
    current = assessment.quarantining if assessment is not None and known else ()
    if record is not None and record.state == "released" and record.event_pending:
        # Released, but the leader died before the release's Event: write it, then go on as released.
        drift = node.condition is not None and node.condition.status == "False"
        work.actions.append(_finish_release(node.name, record, drift))
        record = record.with_(event_pending=False)
    if record is not None and record.state == "quarantined":
        # Our record says quarantined but our taint is gone: an operator removed it. Respect that and
        # remember the evidence so the same evidence does not re-taint the node.
        work.actions.append(_operator_untaint(node, record, current, now))
        return
    if node.release_requested:
        work.actions.append(_release_request(node, record, current, now))
        return
    if _unknown(node, assessment, snap, work):
        return
    assert assessment is not None
    _plan_evidence(node, record, assessment, current, work)


def _operator_untaint(
    node: NodeState, record: QuarantineRecord, current: tuple[Finding, ...], now: float
) -> p.Action:
    """Release a node whose taint an operator removed, dismissing the record's and the current evidence."""
    dismissed = tuple(sorted(record.fingerprints | {f.fingerprint for f in current}))
    released = record.with_(
        state="released",
        released_at=float(int(now)),
        released_by="operator-untaint",
        healthy_since=None,
        suppressed=dismissed,
    )
    return p.Action(
        "release",
        node.name,
        "operator-untaint",
        "our taint was removed by hand; not re-tainting for the same evidence",
        record=released.with_(event_pending=True),
        drop_rules=_rule_names(node.name, record),
        remove_release_request=node.release_requested,
        condition=p.ConditionUpdate("True", "ReleasedByOperator", "quarantine taint removed by hand"),
        event=p.EventSpec(
            EVENT_RELEASED,
            "Normal",
            f"taint {TAINT_KEY} removed by an operator; evidence {', '.join(dismissed) or 'none'} dismissed",
            "Untaint",
            name=release_event_name(node.name, released),
        ),
        after_event=released,
    )


def _release_request(
    node: NodeState, record: QuarantineRecord | None, current: tuple[Finding, ...], now: float
) -> p.Action:
    """Acknowledge `gpuwarden.io/release=now` on a node not quarantined: the evidence dismissed before and
    the current evidence are dismissed (kept in a released record, none when there is nothing to dismiss)
    and the request is removed."""
    dismissed = tuple(sorted({*(record.suppressed if record else ()), *(f.fingerprint for f in current)}))
    rec = (
        QuarantineRecord(
            "released",
            "dismissed",
            released_at=now,
            released_by="operator-annotation",
            suppressed=dismissed,
        )
        if dismissed
        else None
    )
    return p.Action(
        "update-record",
        node.name,
        "release-request",
        "not quarantined; release request "
        f"acknowledged, evidence dismissed: {', '.join(dismissed) or 'none'}",
        record=rec,
        remove_release_request=True,
    )


def _plan_evidence(
    node: NodeState,
    record: QuarantineRecord | None,
    assessment: Assessment,
    current: tuple[Finding, ...],
    work: _Work,
) -> None:
    """Known data on a node without our taint: quarantining evidence an operator has not dismissed makes it
    a candidate (the breaker decides how many are quarantined). Otherwise the node is skipped with why, or
    counted healthy, and a `GPUHealthy=False` left behind is set back; dismissed evidence no longer seen is
    dropped from the record."""
    suppressed = set(record.suppressed) if record is not None else set()
    released_at = record.released_at if record is not None else None
    live: list[Finding] = []
    dismissed_now: list[Finding] = []
    for f in current:
        old = f.first_seen is None or released_at is None or f.first_seen <= released_at
        (dismissed_now if f.fingerprint in suppressed and old else live).append(f)
    keep = tuple(sorted(fp for fp in suppressed if fp in {f.fingerprint for f in current}))
    if record is not None and not live and keep != tuple(sorted(suppressed)):
        cleared = sorted(suppressed - set(keep))
        work.actions.append(
            p.Action(
                "update-record",
                node.name,
                "dismissed-evidence-cleared",
                f"dismissed evidence gone: {', '.join(cleared)}",
                record=record.with_(suppressed=keep) if keep else None,
                remove_record=not keep,
            )
        )
    if live:
        work.candidates.append((node, tuple(live), keep))
        return
    if dismissed_now:
        work.skip(
            node.name,
            p.SKIP_SUPPRESSED,
            "evidence dismissed by an operator: " + ", ".join(f.fingerprint for f in dismissed_now),
        )
    others = [f for f in assessment.findings if not f.quarantine]
    if others:
        work.skip(node.name, p.SKIP_NOT_QUARANTINING, "; ".join(f.why for f in others))
    elif not dismissed_now:
        work.healthy += 1
    cond = node.condition
    if cond is not None and cond.status == "False" and not dismissed_now:
        work.actions.append(
            p.Action(
                "set-condition",
                node.name,
                "condition-drift",
                "not quarantined but GPUHealthy is False",
                condition=p.ConditionUpdate("True", "NoGPUFaults", "no quarantine in place"),
            )
        )


def _severity(f: Finding, policy: HealthPolicy) -> tuple[int, int, str]:
    return (
        -EFFECT_STRENGTH.get(policy.effect_for(f.reason_class), 1),
        -int(f.xid is not None),
        f.fingerprint,
    )


def _condition_false(reason: str, detail: str = "") -> p.ConditionUpdate:
    return p.ConditionUpdate("False", "GPUQuarantined", f"quarantined by gpuwarden: {detail or reason}")


def _quarantine(
    node: NodeState,
    findings: tuple[Finding, ...],
    keep: tuple[str, ...],
    snap: FleetSnapshot,
    policy: HealthPolicy,
    now: float,
) -> p.Action:
    ordered = sorted(findings, key=lambda f: _severity(f, policy))
    primary = ordered[0]
    scope = devicerules.scope_of(
        node.dra_devices, (f.gpu for f in ordered), snap.device_rules, snap.device_rules_why
    )
    effect = (
        devicerules.MARKER_EFFECT
        if scope.devices
        else max(
            (policy.effect_for(f.reason_class) for f in ordered), key=lambda e: EFFECT_STRENGTH.get(e, 1)
        )
    )
    taint = Taint(TAINT_KEY, primary.reason, effect)
    record = QuarantineRecord(
        "quarantined",
        primary.reason,
        primary.reason_class,
        effect,
        tuple(f.evidence() for f in ordered),
        quarantined_at=float(int(now)),
        boot_id=node.boot_id,
        suppressed=keep,
        devices=scope.devices,
        scope_note=scope.note,
        sharing=node.sharing.describe() if node.sharing is not None and node.sharing.shared else "",
        event_pending=True,
    )
    gpus = sorted({f.gpu for f in ordered if f.gpu})
    seen = [f.first_seen for f in ordered if f.first_seen is not None]
    note = (
        f"{primary.why}; GPUs {', '.join(gpus) or '-'}; taint {TAINT_KEY}={primary.reason}:{effect}"
        f"{_scope_note(node.name, record, policy.device_taint_effect)}"
    )
    return p.Action(
        "quarantine",
        node.name,
        primary.reason,
        primary.why,
        add_taint=taint,
        record=record,
        rules=devicerules.rules_for(node.name, record, policy.device_taint_effect),
        condition=_condition_false(primary.reason, primary.why),
        event=p.EventSpec(
            EVENT_QUARANTINED, "Warning", note, "Taint", name=quarantine_event_name(node.name, record)
        ),
        first_seen=min(seen) if seen else None,
        after_event=record.with_(event_pending=False),
    )


def _scope_note(node: str, record: QuarantineRecord, effect: str) -> str:
    """What the quarantine's Event adds about its scope: the device rules, or why a DRA-backed node got the
    node taint; nothing on a device-plugin node."""
    if record.devices:
        rules = ", ".join(
            f"{r.name} ({r.device.driver}/{r.device.pool}/{r.device.device}, {r.device.uuid})"
            for r in devicerules.rules_for(node, record, effect)
        )
        return f" (node marker only); DeviceTaintRule {TAINT_KEY}={record.reason}:{effect}: {rules}"
    return f"; {record.scope_note}" if record.scope_note else ""


def _rule_names(node: str, record: QuarantineRecord) -> tuple[str, ...]:
    return tuple(sorted(devicerules.rule_name(node, d) for d in record.devices))


def quarantine_event_name(node: str, record: QuarantineRecord) -> str:
    """The one name of a quarantine's Event: the node and when the quarantine began (whole seconds)."""
    return f"{node}.gpuquarantined.{int(record.quarantined_at or 0):x}"


def release_event_name(node: str, record: QuarantineRecord) -> str:
    """The one name of a release's Event: the node and when the quarantine was lifted (whole seconds)."""
    return f"{node}.gpuquarantinereleased.{int(record.released_at or 0):x}"


def _finish_quarantine(node: str, record: QuarantineRecord, drift: bool, *, policy: HealthPolicy) -> p.Action:
    gpus = sorted({e.gpu for e in record.evidence if e.gpu})
    note = (
        f"{record.reason}: {', '.join(sorted(record.fingerprints)) or 'adopted taint'}; GPUs "
        f"{', '.join(gpus) or '-'}; taint {TAINT_KEY}={record.reason}:{record.effect} since "
        f"{iso(record.quarantined_at)}{_scope_note(node, record, policy.device_taint_effect)}"
    )
    return p.Action(
        "finish-event",
        node,
        "quarantine-event-pending",
        "tainted, but its GPUQuarantined Event is not recorded as written",
        condition=_condition_false(record.reason) if drift else None,
        rules=devicerules.rules_for(node, record, policy.device_taint_effect),
        event=p.EventSpec(
            EVENT_QUARANTINED, "Warning", note, "Taint", name=quarantine_event_name(node, record)
        ),
        after_event=record.with_(event_pending=False),
    )


def _finish_release(node: str, record: QuarantineRecord, drift: bool) -> p.Action:
    done = record.with_(event_pending=False)
    why = f"quarantine lifted ({record.released_by})"
    return p.Action(
        "finish-event",
        node,
        "release-event-pending",
        "released, but its GPUQuarantineReleased Event is not recorded as written",
        condition=p.ConditionUpdate("True", "QuarantineReleased", why) if drift else None,
        event=p.EventSpec(
            EVENT_RELEASED,
            "Normal",
            f"{record.reason} quarantine lifted at {iso(record.released_at)} ({record.released_by})",
            "Untaint",
            name=release_event_name(node, record),
        ),
        after_event=done,
        remove_record_after_event=not done.suppressed,
        drop_rules=_rule_names(node, record),
    )


def _release(
    node: NodeState,
    taint: Taint,
    record: QuarantineRecord,
    by: str,
    now: float,
    dismissed: tuple[str, ...],
    note: str = "",
) -> p.Action:
    why = (
        "operator annotation gpuwarden.io/release=now"
        if by == "operator-annotation"
        else "evidence gone for the healthy period and recovery condition holds"
        + (f"; {note}" if note else "")
    )
    keep = dismissed or record.suppressed
    released = record.with_(
        state="released",
        released_at=float(int(now)),
        released_by=by,
        healthy_since=None,
        suppressed=keep,
        validation_job="",
        validation_started=None,
        validation_attempts=0,
        validation_failures=(),
        event_pending=True,
    )
    return p.Action(
        "release",
        node.name,
        by,
        why,
        remove_taint=taint,
        record=released,
        drop_rules=_rule_names(node.name, record),
        remove_release_request=node.release_requested,
        condition=p.ConditionUpdate("True", "QuarantineReleased", why),
        event=p.EventSpec(
            EVENT_RELEASED,
            "Normal",
            f"{record.reason} quarantine lifted: {why}",
            "Untaint",
            name=release_event_name(node.name, released),
        ),
        after_event=released.with_(event_pending=False),
        remove_record_after_event=not keep,
    )


def _breaker(
    snap: FleetSnapshot, policy: HealthPolicy, now: float, gpu_nodes: int, work: _Work
) -> tuple[p.BreakerDecision, list[_Candidate]]:
    since = now - policy.breaker_window
    kept = {s for s in snap.breaker.starts if s[1] >= since}
    budget = breaker.Budget(
        quarantined=sum(1 for node in snap.nodes if node.our_taint is not None),
        limit=policy.max_quarantined(gpu_nodes),
        new_in_window=len(kept | record_starts(snap, since)),
        new_limit=policy.breaker_max_new_per_window,
    )
    # Oldest fault first, then by name: deterministic, and the longest-waiting evidence wins the budget.
    cands = sorted(
        work.candidates, key=lambda c: (min((f.first_seen or now for f in c[1]), default=now), c[0].name)
    )
    verdict = breaker.evaluate(
        snap.breaker, budget, len(cands), hold=policy.breaker_hold, now=now, data_ok=snap.prometheus_ok
    )
    admitted, denied = cands[: verdict.admit], cands[verdict.admit :]
    # The admitted quarantines' starts go into the stored state, which act.py writes before their taints.
    begun = {(node.name, float(int(now))) for node, _, _ in admitted}
    after = replace(verdict.after, starts=tuple(sorted(kept | begun)))
    for node, findings, _ in denied:
        fingerprints = ", ".join(f.fingerprint for f in findings)
        work.skip(node.name, p.SKIP_BREAKER, f"circuit breaker open; would quarantine for {fingerprints}")
    decision = p.BreakerDecision(
        snap.breaker,
        after,
        budget.quarantined,
        budget.limit,
        budget.new_in_window,
        budget.new_limit,
        len(denied),
        verdict.event,
    )
    return decision, admitted


def record_starts(snap: FleetSnapshot, since: float) -> set[tuple[str, float]]:
    """The quarantines begun since `since` that the nodes' records show, as (node, start). The window counts
    them together with the breaker state's starts (the same quarantine once): the state remembers a released
    quarantine whose record is gone; the records cover starts the state lacks (written by an older version,
    or a breaker object deleted by an operator)."""
    starts = set()
    for node in snap.nodes:
        rec, _ = decode(node.annotations.get(RECORD_ANNOTATION))
        if rec is not None and rec.quarantined_at is not None and rec.quarantined_at >= since:
            starts.add((node.name, rec.quarantined_at))
    return starts
