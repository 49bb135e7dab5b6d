"""The throttle decision: which of the scheduler's preemption candidates may go ahead.

Why it exists: kube-scheduler consults an extender's `preempt` verb after its own dry run and honours the
answer (reference/scheduler-extender.md section 5.7): a subset of the candidate nodes narrows the choice,
an empty answer vetoes the preemption (the pod's nominatedNodeName is kept and it is retried later). So this
is where cascades and storms are bounded:

* **chain depth** — the preemptor's workload was itself a recent victim, at depth d: this preemption would
  be depth d+1; past `max_chain_depth` it is vetoed;
* **budgets** — victims per sliding window, cluster-wide, per preemptor namespace, per preemptor workload;
  a node whose victims would overspend the tightest budget is dropped, so a smaller candidate may remain;
* **ping-pong** — a node is dropped when a victim's workload recently preempted the preemptor's workload
  (A<->B), or when a victim pod itself recently preempted (undoing work that just displaced others);
* **back-off** — per (preemptor workload, node), after Kueue's reclaim back-off: a new round of preemption
  on a node waits `base * 2**(round-1)`; within one burst (preemptions seconds apart, of pods that were
  already there) the round continues, so one job taking a node is a single round;
* **tenants** — whom: a node whose victims the cross-tenant rule refuses (`controller.gpus.tenants`:
  within-tenant, over-share) is dropped, and so is one the GPU victim choice found no allowed victims on
  (`Candidate.refused`).

Victims already being preempted (the scheduler retrying while they terminate, or the ones this preemptor
was just allowed to take) cost nothing and pass every check. Kept candidates are returned exactly as given
(victims stay in decreasing-priority order); a node is never returned with an empty victim list.
Preemptors at or above `exempt_min_priority` are never throttled.

Pure: reads a `Ledger` (the graph) and the pod index, never the clock, never logs, never emits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from controller.gpus.tenants import Rule, Tenancy, Victim, refuse
from controller.preemption.graph import BackoffSpec, BackoffState
from controller.preemption.signals import PodMeta, Workload
from gpuwarden.config.preemption import Budget, PreemptionConfig


class Reason(StrEnum):
    """Why a candidate node (or the whole preemption) was throttled; the `reason` label of the metric."""

    CHAIN_DEPTH = "chain-depth"
    TENANT = "tenant"
    BUDGET_GLOBAL = "budget-global"
    BUDGET_NAMESPACE = "budget-namespace"
    BUDGET_WORKLOAD = "budget-workload"
    PING_PONG = "ping-pong"
    VICTIM_PREEMPTOR = "victim-recent-preemptor"
    BACKOFF = "backoff"
    NO_VICTIMS = "no-victims"


SEVERITY = list(Reason)
"""Order in which reasons are reported when several apply (the veto reason is the first present)."""


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    max_victims: int
    window: float


@dataclass(frozen=True, slots=True)
class ThrottlePolicy:
    """The `preemption` config section, as the decision reads it."""

    enabled: bool = True
    dry_run: bool = False
    global_budget: BudgetSpec | None = BudgetSpec(50, 300.0)
    namespace_budget: BudgetSpec | None = BudgetSpec(20, 300.0)
    workload_budget: BudgetSpec | None = BudgetSpec(16, 600.0)
    max_chain_depth: int = 2
    chain_window: float = 900.0
    prevent_ping_pong: bool = True
    backoff: BackoffSpec = field(default_factory=BackoffSpec)
    exempt_min_priority: int | None = 2_000_000_000

    @property
    def horizon(self) -> float:
        """How far back the graph must remember."""
        windows = [b.window for b in (self.global_budget, self.namespace_budget, self.workload_budget) if b]
        return max([self.chain_window, *windows])


def _budget(b: Budget | None) -> BudgetSpec | None:
    return BudgetSpec(b.max_victims, b.window_seconds) if b is not None else None


def policy_from_config(cfg: PreemptionConfig, *, dry_run: bool | None = None) -> ThrottlePolicy:
    """The policy for a validated `preemption:` section (`dry_run` overrides the section's own flag)."""
    return ThrottlePolicy(
        enabled=cfg.enabled,
        dry_run=cfg.dry_run if dry_run is None else dry_run,
        global_budget=_budget(cfg.global_budget),
        namespace_budget=_budget(cfg.namespace_budget),
        workload_budget=_budget(cfg.workload_budget),
        max_chain_depth=cfg.max_chain_depth,
        chain_window=cfg.chain_window_seconds,
        prevent_ping_pong=cfg.prevent_ping_pong,
        backoff=BackoffSpec(
            cfg.backoff.base_seconds,
            cfg.backoff.max_seconds,
            cfg.backoff.reset_seconds,
            cfg.backoff.burst_seconds,
        ),
        exempt_min_priority=cfg.exempt_min_priority,
    )


class Ledger(Protocol):
    """The questions the decision asks of recent history (`PreemptionGraph` answers them)."""

    def victims(
        self, now: float, window: float, *, namespace: str | None = None, workload: Workload | None = None
    ) -> int: ...
    def depth_as_victim(self, workload: Workload, now: float) -> int: ...
    def preempted(self, preemptor: Workload, victim: Workload, now: float) -> bool: ...
    def recent_preemptor(self, pod_uid: str, now: float) -> bool: ...
    def is_victim(self, pod_uid: str, preemptor_uid: str = "") -> bool: ...
    def backoff(self, workload: Workload, node: str) -> BackoffState | None: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node of the scheduler's dry run with its victims' UIDs, in the order given."""

    node: str
    victims: tuple[str, ...]
    refused: str = ""
    """Set when the GPU victim choice found only victims the cross-tenant rule refuses (its reason)."""


@dataclass(frozen=True, slots=True)
class TenantGate:
    """The cross-tenant rule as the decision applies it: who is in which tenant with which share and
    holdings, and the GPUs each victim UID holds (absent: none known)."""

    tenancy: Tenancy
    gpus: Mapping[str, int] = field(default_factory=dict)
    taken: Mapping[str, int] = field(default_factory=dict)
    """GPUs per tenant already taken by preemptions decided with this gate (one make-room pass)."""


@dataclass(frozen=True, slots=True)
class ThrottleDecision:
    """`kept` nodes in input order; every other candidate in `dropped` with its reason. `veto` is set when
    nothing is kept. `depth` is the chain depth this preemption would have."""

    kept: tuple[str, ...]
    dropped: Mapping[str, Reason]
    veto: Reason | None
    depth: int
    exempt: bool = False
    detail: str = ""

    @property
    def throttled(self) -> bool:
        return bool(self.reasons())

    @property
    def outcome(self) -> str:
        if self.exempt:
            return "exempt"
        if self.veto is not None:
            return "vetoed"
        return "narrowed" if self.throttled else "passed"

    def reasons(self) -> list[Reason]:
        """Distinct reasons, most severe first (NO_VICTIMS is bookkeeping, not throttling)."""
        present = set(self.dropped.values()) | ({self.veto} if self.veto else set())
        return [r for r in SEVERITY if r in present and r is not Reason.NO_VICTIMS]


def _backoff_blocks(
    state: BackoffState | None, victims: Sequence[PodMeta | None], spec: BackoffSpec, now: float
) -> bool:
    if state is None or now >= state.until:
        return False
    in_burst = now - state.start <= spec.burst
    # a victim created after the round began refilled the node: that is a new round, not the same burst
    return not (in_burst and all(v is not None and (v.created or 0.0) <= state.start for v in victims))


def _remaining(
    preemptor: PodMeta, ledger: Ledger, policy: ThrottlePolicy, now: float
) -> list[tuple[Reason, int, str]]:
    """(reason, victims still allowed, description) per configured budget, tightest scope last."""
    out: list[tuple[Reason, int, str]] = []
    if (b := policy.global_budget) is not None:
        used = ledger.victims(now, b.window)
        out.append((Reason.BUDGET_GLOBAL, b.max_victims - used, f"{b.max_victims} victims per {b.window:g}s"))
    if (b := policy.namespace_budget) is not None:
        used = ledger.victims(now, b.window, namespace=preemptor.namespace)
        note = f"{b.max_victims} per {b.window:g}s in namespace {preemptor.namespace}"
        out.append((Reason.BUDGET_NAMESPACE, b.max_victims - used, note))
    if (b := policy.workload_budget) is not None:
        used = ledger.victims(now, b.window, workload=preemptor.workload)
        note = f"{b.max_victims} per {b.window:g}s for {preemptor.workload}"
        out.append((Reason.BUDGET_WORKLOAD, b.max_victims - used, note))
    return out


def _judge(
    preemptor: PodMeta,
    node: str,
    fresh: tuple[str, ...],
    lookup: Callable[[str], PodMeta | None],
    ledger: Ledger,
    policy: ThrottlePolicy,
    now: float,
    depth: int,
    budgets: list[tuple[Reason, int, str]],
    notes: dict[Reason, str],
    tenants: TenantGate | None = None,
) -> Reason | None:
    """Why preempting `fresh` (not yet preempted) victims on `node` is throttled; None when it is not."""
    if depth > policy.max_chain_depth:
        notes[Reason.CHAIN_DEPTH] = (
            f"{preemptor.workload} was itself preempted recently: this preemption would be depth {depth} "
            f"of a chain (limit {policy.max_chain_depth})"
        )
        return Reason.CHAIN_DEPTH
    victims = [lookup(uid) for uid in fresh]
    if tenants is not None and tenants.tenancy.rule is not Rule.ANY:
        why = _tenant_note(preemptor, fresh, victims, tenants)
        if why:
            notes.setdefault(Reason.TENANT, f"tenant rule: {why} on {node}")
            return Reason.TENANT
    if policy.prevent_ping_pong:
        for uid, victim in zip(fresh, victims, strict=True):
            if victim is not None and ledger.preempted(victim.workload, preemptor.workload, now):
                notes[Reason.PING_PONG] = f"{victim.workload} recently preempted {preemptor.workload}"
                return Reason.PING_PONG
            if ledger.recent_preemptor(uid, now):
                who = victim.key if victim is not None else uid
                notes[Reason.VICTIM_PREEMPTOR] = f"victim {who} itself preempted pods recently"
                return Reason.VICTIM_PREEMPTOR
    if _backoff_blocks(ledger.backoff(preemptor.workload, node), victims, policy.backoff, now):
        notes[Reason.BACKOFF] = f"{preemptor.workload} is backing off preemption on {node}"
        return Reason.BACKOFF
    for reason, left, note in budgets:
        if len(fresh) > left:
            notes[reason] = f"budget spent: {note}"
            return reason
    return None


def _tenant_note(
    preemptor: PodMeta, fresh: Sequence[str], victims: Sequence[PodMeta | None], gate: TenantGate
) -> str:
    """Why the cross-tenant rule refuses these victims ("" when it allows them all)."""
    known: list[Victim] = []
    for uid, victim in zip(fresh, victims, strict=True):
        if victim is None:  # unknown pod: its tenant cannot be told, and unknown is never preemptable
            return f"victim {uid} unknown, so is its tenant"
        known.append(Victim(victim.key, gate.gpus.get(uid, 0)))
    refusal = refuse(preemptor.namespace, known, gate.tenancy, gate.taken)
    return refusal.reason if refusal is not None else ""


def decide_preemption(
    preemptor: PodMeta,
    candidates: Sequence[Candidate],
    lookup: Callable[[str], PodMeta | None],
    ledger: Ledger,
    policy: ThrottlePolicy,
    now: float,
    *,
    tenants: TenantGate | None = None,
) -> ThrottleDecision:
    """Which candidates may be preempted now; `lookup` resolves victim UIDs (None = unknown pod);
    `tenants`: the cross-tenant rule (None: no rule, as `any`)."""
    empty = {c.node: Reason.NO_VICTIMS for c in candidates if not c.victims and not c.refused}
    usable = [c for c in candidates if c.victims and not c.refused]
    refused = [c for c in candidates if c.refused]
    depth = ledger.depth_as_victim(preemptor.workload, now) + 1
    exempt = policy.exempt_min_priority is not None and preemptor.priority >= policy.exempt_min_priority
    if exempt or not policy.enabled:
        usable = [c for c in candidates if c.victims]
        kept = tuple(c.node for c in usable)
        empty = {c.node: Reason.NO_VICTIMS for c in candidates if not c.victims}
        return ThrottleDecision(kept, empty, None if kept else Reason.NO_VICTIMS, depth, exempt=exempt)
    dropped: dict[str, Reason] = dict(empty)
    notes: dict[Reason, str] = {}
    for cand in refused:
        dropped[cand.node] = Reason.TENANT
        notes.setdefault(Reason.TENANT, f"tenant rule: {cand.refused} on {cand.node}")
    budgets = _remaining(preemptor, ledger, policy, now)
    for cand in usable:
        # victims the scheduler is already preempting (a retry while they terminate) cost nothing new
        fresh = tuple(uid for uid in cand.victims if not ledger.is_victim(uid, preemptor.uid))
        if not fresh:
            continue
        reason = _judge(
            preemptor, cand.node, fresh, lookup, ledger, policy, now, depth, budgets, notes, tenants
        )
        if reason is not None:
            dropped[cand.node] = reason
    kept = tuple(c.node for c in usable if c.node not in dropped)
    veto = None
    if not kept:
        veto = next((r for r in SEVERITY if r in dropped.values()), Reason.NO_VICTIMS)
    present = [r for r in SEVERITY if r in notes]
    if veto is not None and veto in notes:
        detail = f"preemption vetoed: {notes[veto]}"
    elif present:
        total = len(usable) + len(refused)
        detail = f"narrowed to {len(kept)} of {total} candidate nodes: " + "; ".join(
            notes[r] for r in present
        )
    else:
        detail = ""
    return ThrottleDecision(kept, dropped, veto, depth, detail=detail)
