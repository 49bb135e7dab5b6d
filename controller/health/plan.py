"""The quarantine plan: what `decide.py` concluded, as data `act.py` applies and `gpuwarden plan` prints.

Why a value and not callbacks: the same plan is logged, evented, printed as JSON or a table, asserted on in
tests, and (outside dry-run) applied. Every action and every skip carries a machine reason and a sentence.

What it must not do: no I/O. Rendering returns strings/dicts; printing is the caller's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from controller.health.snapshot import BreakerState, Streak, Taint
from gpuwarden.quarantine import DeviceRef, QuarantineRecord, iso
from gpuwarden.wellknown import GPU_HEALTHY_CONDITION as CONDITION_TYPE

ActionKind = Literal[
    "quarantine",
    "release",
    "update-record",
    "set-condition",
    "finish-event",
    "degrade",
    "clear-degraded",
    "start-validation",
    "domain-degrade",
    "domain-release",
]
EventType = Literal["Normal", "Warning"]
SignalState = Literal["confirmed", "debouncing", "boot-grace"]

# Skip reasons (stable strings: tests, metrics and the table use them).
SKIP_EXCLUDED = "excluded"
SKIP_PROMETHEUS_DOWN = "prometheus-unavailable"
SKIP_UNKNOWN = "telemetry-unknown"
SKIP_BREAKER = "breaker-open"
SKIP_NOT_QUARANTINING = "not-quarantining"
SKIP_SUPPRESSED = "dismissed-by-operator"
SKIP_STILL_FAULTY = "still-faulty"
SKIP_HEALTHY_PERIOD = "healthy-period-not-elapsed"
SKIP_RECOVERY_PENDING = "recovery-pending"
SKIP_BAD_RECORD = "unreadable-record"
SKIP_STALLED = "telemetry-stalled"  # fresh samples, frozen values: unknown
SKIP_DEBOUNCING = "signal-debouncing"  # a signal holds, but not yet for `consecutive` passes
SKIP_BOOT_GRACE = "boot-grace"  # a signal holds inside the node's boot grace
SKIP_OBSERVED = "signal-observed"  # a confirmed signal whose action is `observe` (metric only)


@dataclass(frozen=True, slots=True)
class ConditionUpdate:
    """Desired node condition: `GPUHealthy` unless `type` says otherwise (`GPUDegraded`)."""

    status: Literal["True", "False"]
    reason: str
    message: str
    type: str = CONDITION_TYPE


@dataclass(frozen=True, slots=True)
class EventSpec:
    """An events.k8s.io/v1 Event regarding the node (or the breaker object when `node` is empty)."""

    reason: str
    type: EventType
    note: str
    action: str  # events.k8s.io `action`, e.g. Taint, Untaint, Trip
    name: str = ""
    """When set, the Event is written under this name at most once (409 AlreadyExists = already written)."""


@dataclass(frozen=True, slots=True, order=True)
class RuleSpec:
    """A DeviceTaintRule of ours as it should be (devicerules.py builds the manifest)."""

    name: str
    node: str
    device: DeviceRef
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class DomainPublication:
    """What a member of an NVLink domain should carry (domains.py): the `gpuwarden.io/nvlink-domain-health`
    label's value (None: removed) and whether our domain taint is on (only with action `quarantine`)."""

    label: str | None
    taint: bool


@dataclass(frozen=True, slots=True)
class DomainStatus:
    """One NVLink domain at this pass, for metrics, JSON and the table."""

    domain: str
    state: str  # healthy | degraded | failed | unknown (this pass's verdict)
    published: str  # what its members carry after this pass: degraded | failed | "" (nothing)
    trays: int
    count: int
    needed: int
    why: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "state": self.state,
            "published": self.published,
            "trays": self.trays,
            "passes": f"{self.count}/{self.needed}",
            "why": list(self.why),
        }


@dataclass(frozen=True, slots=True)
class RuleSync:
    """This pass's DeviceTaintRule changes outside the actions' own: a rule recreated that someone deleted,
    one whose node is no longer quarantined (or gone) removed, the dry-run's `None` rules kept in step."""

    create: tuple[RuleSpec, ...] = ()
    update: tuple[RuleSpec, ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.create or self.update or self.delete)

    def to_dict(self) -> dict[str, Any]:
        return {
            "create": [f"{r.name}={r.value}:{r.effect}" for r in self.create],
            "update": [f"{r.name}={r.value}:{r.effect}" for r in self.update],
            "delete": list(self.delete),
        }


@dataclass(frozen=True, slots=True)
class Action:
    """One change to one node. Fields that are None are left alone by `act.py`."""

    kind: ActionKind
    node: str
    reason: str
    message: str
    add_taint: Taint | None = None
    remove_taint: Taint | None = None
    record: QuarantineRecord | None = None
    remove_record: bool = False
    remove_release_request: bool = False
    condition: ConditionUpdate | None = None
    event: EventSpec | None = None
    first_seen: float | None = None  # of the fault, for the detection-latency metric
    create_job: dict[str, Any] | None = None  # a validation Job to create (namespace set by act.py)
    after_event: QuarantineRecord | None = None
    """The record whose mark `event` settles, as it is once the Event exists (the mark cleared); the mark is
    cleared only over the same record (same quarantine and release; for `validation`, the same attempt)."""
    settles: Literal["event", "validation"] = "event"
    """Which mark of the record: `event_pending` (quarantine, release) or `validation_event`."""
    remove_record_after_event: bool = False
    """Remove the record (matched by `after_event`) once `event` exists (nothing left to remember)."""
    rules: tuple[RuleSpec, ...] = ()
    """DeviceTaintRules that must exist before `event` is written (created after the node write; 409 = there
    already, a changed taint patched): a device-scoped quarantine on a DRA-backed node."""
    drop_rules: tuple[str, ...] = ()
    """DeviceTaintRules of ours deleted after the node write and before `event` (404 = gone already)."""
    domain: DomainPublication | None = None
    """An NVLink domain's publication on this member (label, taint by option); None: left alone."""
    degradation: str | None = None
    """The `gpuwarden.io/degradation` mark (encoded, `degrade.DegradationMark`): written before the
    GPUDegraded condition, removed once `event` exists (only while it still holds this value)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "node": self.node,
            "reason": self.reason,
            "message": self.message,
        }
        if self.add_taint:
            out["add_taint"] = f"{self.add_taint.key}={self.add_taint.value}:{self.add_taint.effect}"
        if self.remove_taint:
            out["remove_taint"] = (
                f"{self.remove_taint.key}={self.remove_taint.value}:{self.remove_taint.effect}"
            )
        if self.record is not None:
            out["record"] = self.record.encode()
        if self.remove_record:
            out["remove_record"] = True
        if self.remove_release_request:
            out["remove_release_request"] = True
        if self.condition is not None:
            out["condition"] = {"status": self.condition.status, "reason": self.condition.reason}
            if self.condition.type != CONDITION_TYPE:
                out["condition"]["type"] = self.condition.type
        if self.event is not None:
            out["event"] = {"reason": self.event.reason, "type": self.event.type, "note": self.event.note}
        if self.after_event is not None:
            out["after_event"] = (
                "remove-record"
                if self.remove_record_after_event
                else "clear-validation-mark"
                if self.settles == "validation"
                else "clear-event-mark"
            )
        if self.degradation is not None:
            out["after_event"] = "remove-degradation-mark"
        if self.domain is not None:
            out["domain_label"] = self.domain.label
            out["domain_taint"] = self.domain.taint
        if self.rules:
            out["device_rules"] = [f"{r.name}={r.value}:{r.effect}" for r in self.rules]
        if self.drop_rules:
            out["drop_device_rules"] = list(self.drop_rules)
        if self.first_seen is not None:
            out["first_seen"] = iso(self.first_seen)
        if self.create_job is not None:
            out["create_job"] = self.create_job.get("metadata", {}).get("name", "")
        return out


@dataclass(frozen=True, slots=True)
class Skip:
    """A node we considered and deliberately left alone, and why."""

    node: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "message": self.message}


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    """The breaker before and after this loop, the numbers behind it, and an event on a transition."""

    before: BreakerState
    after: BreakerState
    quarantined: int
    limit: int
    new_in_window: int
    new_limit: int
    denied: int = 0
    event: EventSpec | None = None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def to_dict(self) -> dict[str, Any]:
        return {
            "open": self.after.open,
            "reason": self.after.reason,
            "opened_at": iso(self.after.opened_at),
            "clear_since": iso(self.after.clear_since),
            "quarantined": self.quarantined,
            "limit": self.limit,
            "new_in_window": self.new_in_window,
            "new_limit": self.new_limit,
            "denied": self.denied,
        }


@dataclass(frozen=True, slots=True)
class SignalStatus:
    """One fabric/degradation signal holding on one GPU (or node) this pass, for metrics and the table."""

    node: str
    signal: str
    gpu: str
    action: str  # quarantine | degrade | observe
    state: SignalState


@dataclass(frozen=True, slots=True)
class HealthPlan:
    """Everything one loop decided. `healthy` counts nodes that needed nothing."""

    now: float
    dry_run: bool
    actions: tuple[Action, ...]
    skips: tuple[Skip, ...]
    breaker: BreakerDecision
    healthy: int = 0
    gpu_nodes: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    signals: tuple[SignalStatus, ...] = ()
    streaks: dict[str, Streak] = field(default_factory=dict)  # debounce state for the next pass
    stalled_gpus: int = 0
    absent_series: tuple[str, ...] = ()  # `gpuwarden plan`: required series Prometheus lacks (series.py)
    rule_sync: RuleSync = field(default_factory=RuleSync)  # DeviceTaintRules kept in step (devicerules.py)
    domains: tuple[DomainStatus, ...] = ()  # NVLink domains judged this pass (domains.py)

    def actions_of(self, kind: ActionKind) -> list[Action]:
        return [a for a in self.actions if a.kind == kind]

    def skips_of(self, reason: str) -> list[Skip]:
        return [s for s in self.skips if s.reason == reason]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "now": iso(self.now),
            "dry_run": self.dry_run,
            "gpu_nodes": self.gpu_nodes,
            "healthy": self.healthy,
            "breaker": self.breaker.to_dict(),
            "actions": [a.to_dict() for a in self.actions],
            "skips": [s.to_dict() for s in self.skips],
        }
        if self.signals:
            out["signals"] = [
                {"node": s.node, "signal": s.signal, "gpu": s.gpu, "action": s.action, "state": s.state}
                for s in self.signals
            ]
        if self.absent_series:
            out["absent_series"] = list(self.absent_series)
        if self.rule_sync:
            out["device_rules"] = self.rule_sync.to_dict()
        if self.domains:
            out["nvlink_domains"] = [d.to_dict() for d in self.domains]
        return out

    def render_table(self) -> str:
        """A fixed-width table for `gpuwarden plan -o table`: actions first, then skips."""
        rows = [("NODE", "DO", "REASON", "WHY")]
        rows += [(a.node, a.kind, a.reason, a.message) for a in self.actions]
        rows += [(s.node, "skip", s.reason, s.message) for s in self.skips]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [
            f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows
        ]
        b = self.breaker
        state = "OPEN" if b.after.open else "closed"
        lines.append(
            f"\nbreaker {state}: {b.quarantined}/{b.limit} quarantined, "
            f"{b.new_in_window}/{b.new_limit} new in window; {len(self.actions)} actions, "
            f"{len(self.skips)} skips, {self.healthy} healthy GPU nodes"
            + (" (dry-run)" if self.dry_run else "")
        )
        if self.rule_sync:
            r = self.rule_sync
            lines.append(
                f"device taint rules kept in step: {len(r.create)} to create, {len(r.update)} to update, "
                f"{len(r.delete)} to delete"
            )
        for d in self.domains:
            if d.state != "healthy" or d.published:
                shown = f", published {d.published}" if d.published else ""
                lines.append(f"NVLink domain {d.domain}: {d.state} ({d.count}/{d.needed} passes{shown})"
                             + (": " + "; ".join(d.why) if d.why else ""))  # fmt: skip
        if self.absent_series:
            lines.append("absent from Prometheus (those checks see nothing: unknown, not healthy):")
            lines += [f"  {line}" for line in self.absent_series]
        return "\n".join(lines) + "\n"
