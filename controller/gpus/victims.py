"""Which lower-priority pods to preempt on a node so that a GPU set the pod's policy accepts becomes free.

Why it exists: kube-scheduler chooses preemption victims by *count*. On a node fragmented 2 + 2 across NUMA
nodes a 4-GPU `single-numa` pod already fits by count, so the scheduler's dry run finds no victim and fails
the attempt (kubernetes v1.35 preemption.go `DryRunPreemption`), and where it does pick victims they may free
the wrong GPUs. This is the victim choice that knows the topology, shared by the three places that need it:
the filter's explanation of a fragmented node, the preempt verb (add or replace victims, or omit the node)
and the controller's GPU preemption, which evicts the chosen pods itself.

The choice, per node, among holders of strictly lower priority that are not already leaving - and idle
holders the idle loop marked reclaimable (`gpuwarden.io/idle-reclaimable`, not acknowledged) of equal or
lower priority:
1. fewest PodDisruptionBudget violations (counted as kube-scheduler counts them: per budget, a victim
   beyond the budget's `disruptionsAllowed` violates it);
2. fewest busy victims (not reclaimable-idle): idle pods are taken before any priority tie is broken;
3. fewest victims; 4. lowest highest-victim priority, then lowest sum of priorities;
5. fewest GPUs disturbed; then the pods' keys (deterministic).
Only sets the cross-tenant rule allows are considered (`tenants.refuse`: within-tenant, over-share); when it
is what stands in the way, the reason says so (`TENANT_MARKER`).
Sets are enumerated by size, smallest first, so the answer is exact for the pods a GPU node holds (at most
`MAX_CANDIDATES` lowest-priority holders are considered; beyond that the rest are never chosen).

Pure: no I/O, no clock (`now` is a parameter), no logging.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from controller.gpus.fit import (
    Choice,
    FilterResult,
    Fit,
    Policy,
    Settings,
    choose_from,
    free_gpus,
    healthy_gpus,
    need_for,
    policy_of,
    unresolvable_reason,
    yielding_holders,
)
from controller.gpus.model import Holder, NodeView
from controller.gpus.objects import PodInfo
from controller.gpus.placement import Need, fits
from controller.gpus.tenants import Refusal, Rule, Tenancy, Victim, refuse, taken_by
from controller.gpus.topology import Gpu

EXPLAIN_BUDGET = 16
"""Victim searches one filter answer may run to explain fragmented nodes (answers are cached per node
view); beyond it a node's note comes from its holders' priorities only, so a fragmented fleet cannot slow
the verb."""
MAX_CANDIDATES = 12
"""Lower-priority holders considered per node (2^12 sets at most); GPU nodes rarely hold more GPU pods."""


@dataclass(frozen=True, slots=True)
class Budgets:
    """PodDisruptionBudgets as the victim choice needs them: which budgets cover a pod, and how many more
    disruptions each allows now (`status.disruptionsAllowed`)."""

    covering: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """pod key -> keys of the budgets whose selector matches it."""
    allowed: Mapping[str, int] = field(default_factory=dict)

    def violations(self, victims: Iterable[Holder]) -> int:
        """Victims whose eviction would exceed a covering budget (kube-scheduler's NumPDBViolations)."""
        left = dict(self.allowed)
        count = 0
        for victim in victims:
            violated = False
            for budget in self.covering.get(victim.pod, ()):
                left[budget] = left.get(budget, 0) - 1
                violated = violated or left[budget] < 0
            count += violated
        return count


NO_BUDGETS = Budgets()

TENANT_MARKER = "tenant rule:"
"""Starts the part of a `NoPlan.reason` that says the cross-tenant rule refused the victims it would need."""


def as_victim(holder: Holder) -> Victim:
    """A holder as the cross-tenant rule sees it (its GPUs: recorded ones and count-only ones)."""
    return Victim(holder.pod, len(holder.ids) + holder.unknown)


def tenant_refusal(
    namespace: str, victims: Sequence[Holder], tenancy: Tenancy | None, taken: Mapping[str, int]
) -> Refusal | None:
    """Why the rule refuses these holders as one preemption's victims (None: allowed or no rule)."""
    if tenancy is None or tenancy.rule is Rule.ANY:
        return None
    return refuse(namespace, [as_victim(v) for v in victims], tenancy, taken)


@dataclass(frozen=True, slots=True)
class VictimPlan:
    """Preempt `victims` (highest priority first, the scheduler's order) on `node`; the pod then gets
    `choice`. No victims: the pod fits there already."""

    node: str
    victims: tuple[Holder, ...]
    choice: Choice
    pdb_violations: int = 0
    busy: int = 0
    """Victims that are not reclaimable-idle pods."""

    @property
    def gpus_disturbed(self) -> int:
        return sum(len(v.ids) + v.unknown for v in self.victims)

    def cost(self) -> tuple[int, int, int, int, int, int]:
        """The order plans are compared in (smaller is better); see the module docstring."""
        prio = [v.priority for v in self.victims]
        return (
            self.pdb_violations, self.busy, len(prio), max(prio, default=-(2**31)), sum(prio),
            self.gpus_disturbed,
        )  # fmt: skip

    def describe(self) -> str:
        """`ns/a (priority 100, GPUs 0,1)` per victim, for Events and logs."""
        return ", ".join(
            f"{v.pod} (priority {v.priority}, GPUs {','.join(v.ids) or '?'}"
            + (f" +{v.unknown} unrecorded" if v.unknown else "")
            + ")"
            for v in self.victims
        )


@dataclass(frozen=True, slots=True)
class NoPlan:
    """Why no preemption on this node can make room (a sentence for Events and the filter's answer)."""

    node: str
    reason: str


def _candidates(
    pod: PodInfo, view: NodeView, leaving: Sequence[Holder], exclude: frozenset[str], now: float
) -> list[Holder]:
    """The holders a set may be drawn from, reclaimable-idle ones first, then by priority (at most
    `MAX_CANDIDATES`)."""
    out = [
        h
        for h in view.holders
        if (h.priority < pod.priority or (h.priority <= pod.priority and h.reclaimable(now)))
        and not h.terminating
        and h not in leaving
        and h.pod != pod.key
        and h.pod not in exclude
        and (h.ids or h.unknown)
    ]
    out.sort(key=lambda h: (not h.reclaimable(now), h.priority, len(h.ids) + h.unknown, h.pod))
    return out[:MAX_CANDIDATES]


def plan_victims(
    pod: PodInfo,
    view: NodeView | None,
    settings: Settings,
    now: float,
    *,
    budgets: Budgets = NO_BUDGETS,
    exclude: frozenset[str] = frozenset(),
    max_victims: int = 0,
    already: Sequence[Holder] = (),
    tenancy: Tenancy | None = None,
    taken: Mapping[str, int] | None = None,
) -> VictimPlan | NoPlan:
    """The cheapest victims on this node that free a GPU set `pod` accepts, or why there are none.

    `exclude`: pods that must not be chosen (e.g. already promised to another preemptor this pass);
    `max_victims`: most victims in one plan (0 = no limit); `already`: holders being preempted anyway (the
    scheduler's own victims), counted as free and never returned. Holders already terminating count as
    free. `tenancy`: only sets its rule allows (`taken`: GPUs per tenant other preemptions of the same
    decision take already)."""
    if view is None:
        return NoPlan("", "node not known to the gpuwarden extender's cache")
    name = view.name
    policy = policy_of(pod, settings)
    if not isinstance(policy, Policy):
        return NoPlan(name, policy)
    healthy = healthy_gpus(view)
    need = need_for(pod.gpus, policy, healthy, settings)
    why = unresolvable_reason(pod, view, need, policy, healthy, settings)
    if why:
        return NoPlan(name, why)
    yielded = yielding_holders(pod, view)
    leaving = [h for h in view.holders if (h.terminating or h in already) and h not in yielded]

    def attempt(victims: Sequence[Holder]) -> Choice | None:
        free, unknown, _ = free_gpus(pod, view, healthy, settings, now, freed=[*leaving, *victims])
        if not fits(free, unknown, need):
            return None
        return choose_from(pod, view, Fit(need, healthy, free, unknown), settings).choice

    ready = attempt(())
    if ready is not None:
        return VictimPlan(name, (), ready)
    everyone = _candidates(pod, view, leaving, exclude, now)
    if not everyone:
        return NoPlan(name, f"no lower-priority pods to preempt (priority < {pod.priority})")
    refusal_of = _tenant_rule(pod, tenancy, taken, already)
    # a holder refused alone is refused in every set: leave it out before the search (and the cut-off)
    refused = {h.pod: r for h in everyone if (r := refusal_of([h])) is not None}
    pool = everyone if not refused else _candidates(pod, view, leaving, exclude | set(refused), now)
    if attempt(pool) is None:
        if refused and attempt(everyone) is not None:
            first = next(iter(refused.values()))
            return NoPlan(
                name, f"{TENANT_MARKER} {len(refused)} lower-priority pod(s) refused: {first.reason}"
            )
        return NoPlan(
            name,
            f"preempting all {len(pool)} lower-priority pods would still leave no set for policy {policy}",
        )
    limit = len(pool) if max_victims <= 0 else min(len(pool), max_victims)
    fast = _group_check(pod, view, healthy, need, [*yielded, *leaving])
    if fast is not None:
        quick = fast
        combo = _search(pool, limit, budgets, now, lambda v: quick(v) and refusal_of(v) is None)
        choice = attempt(combo) if combo is not None else None
        if combo is not None and choice is not None:
            return _plan(name, combo, choice, budgets, now)
    combo = _search(pool, limit, budgets, now, lambda v: attempt(v) is not None and refusal_of(v) is None)
    choice = attempt(combo) if combo is not None else None
    if combo is None or choice is None:
        if tenancy is not None and tenancy.rule is Rule.OVER_SHARE:  # is the rule what stands in the way?
            unruled = _search(pool, limit, budgets, now, lambda v: attempt(v) is not None)
            refusal = refusal_of(unruled) if unruled is not None else None
            if refusal is not None:
                return NoPlan(name, f"{TENANT_MARKER} {refusal.reason}")
        return NoPlan(name, f"more than {limit} victims would be needed (limit {max_victims})")
    return _plan(name, combo, choice, budgets, now)


def _plan(name: str, victims: tuple[Holder, ...], choice: Choice, budgets: Budgets, now: float) -> VictimPlan:
    busy = sum(not v.reclaimable(now) for v in victims)
    return VictimPlan(name, victims, choice, budgets.violations(victims), busy)


def _tenant_rule(
    pod: PodInfo, tenancy: Tenancy | None, taken: Mapping[str, int] | None, already: Sequence[Holder]
) -> Callable[[Sequence[Holder]], Refusal | None]:
    """The cross-tenant rule for this preemptor: why a set of holders is refused (None: allowed). GPUs
    already taken (`taken`, and the scheduler's own victims `already`) count against tenants' excess."""
    namespace = pod.key.split("/", 1)[0]
    took = dict(taken or {})
    if tenancy is not None and tenancy.rule is not Rule.ANY:
        for tenant, gpus in taken_by(map(as_victim, already), tenancy).items():
            took[tenant] = took.get(tenant, 0) + gpus
    return lambda victims: tenant_refusal(namespace, victims, tenancy, took)


Cost = tuple[int, int, int, int, int, int, list[str]]


def _cost(victims: Sequence[Holder], budgets: Budgets, now: float) -> Cost:
    prio = [v.priority for v in victims]
    gpus = sum(len(v.ids) + v.unknown for v in victims)
    names = [v.pod for v in victims]
    busy = sum(not v.reclaimable(now) for v in victims)
    return (
        budgets.violations(victims), busy, len(prio), max(prio, default=-(2**31)), sum(prio), gpus, names
    )  # fmt: skip


def _search(
    pool: Sequence[Holder],
    limit: int,
    budgets: Budgets,
    now: float,
    feasible: Callable[[Sequence[Holder]], bool],
) -> tuple[Holder, ...] | None:
    """The cheapest feasible set of at most `limit` holders (module docstring order), highest priority
    first; sets are tried smallest first and the search stops at the first size with a set that violates
    no budget once no larger set could take fewer busy (not reclaimable-idle) pods - at once when the pool
    has no idle pod (a larger set cannot beat it)."""
    best: tuple[Holder, ...] | None = None
    best_cost: Cost | None = None
    idle = sum(h.reclaimable(now) for h in pool)
    for size in range(1, limit + 1):
        for combo in combinations(pool, size):
            if not feasible(combo):
                continue
            ordered = tuple(sorted(combo, key=lambda h: (-h.priority, h.pod)))
            cost = _cost(ordered, budgets, now)
            if best_cost is None or cost < best_cost:
                best, best_cost = ordered, cost
        if best_cost is not None and best_cost[0] == 0 and max(0, size + 1 - idle) >= best_cost[1]:
            break  # no budget violated, and a larger set cannot take fewer busy pods: it cannot beat it
    return best


def _group_check(
    pod: PodInfo, view: NodeView, healthy: Sequence[Gpu], need: Need, gone: Sequence[Holder]
) -> Callable[[Sequence[Holder]], bool] | None:
    """A fast feasibility test by free GPUs per group, for the common case: one group must hold the set
    (`single-numa` / `single-pcie`, span 1) and nothing else on the node shifts the answer (no claims,
    nominations or count-only pods, topology within allocatable). None: use the full check."""
    level = need.level
    if (
        level is None
        or need.span != 1
        or view.claims
        or view.nominated
        or view.used_unknown
        or len(view.topology.gpus) > view.allocatable
    ):
        return None
    group: dict[str, object] = {}
    for g in healthy:
        value = getattr(g, level)
        group[g.id] = value if value is not None else ("alone", g.id)
    leaving = {i for h in gone for i in h.ids}
    taken = view.used - leaving
    base: Counter[object] = Counter(group[i] for i in group if i not in taken)
    freed: dict[str, list[tuple[object, int]]] = {}
    for h in view.holders:
        freed[h.pod] = list(Counter(group[i] for i in h.ids if i in group and i in taken).items())
    k = need.k

    def feasible(victims: Sequence[Holder]) -> bool:
        # no group holds k free now (the caller checked), so only the groups the victims free can
        extra: dict[object, int] = {}
        for v in victims:
            for g, n in freed[v.pod]:
                extra[g] = extra.get(g, 0) + n
        return any(base.get(g, 0) + n >= k for g, n in extra.items())

    return feasible


def better(a: VictimPlan, b: VictimPlan) -> bool:
    """Whether plan `a` beats plan `b` across nodes: cheaper victims, then the better-scoring GPU set,
    then the node name."""
    return (a.cost(), -a.choice.score, a.node) < (b.cost(), -b.choice.score, b.node)


def explain_room(
    pod: PodInfo,
    result: FilterResult,
    views: Mapping[str, NodeView | None],
    settings: Settings,
    now: float,
) -> FilterResult:
    """The filter answer with each fragmented node's reason completed by what GPU preemption could do
    there (`gpuwarden can make room by preempting ...` or why it cannot)."""
    if not result.fragmented:
        return result
    unresolvable = dict(result.unresolvable)
    budget = EXPLAIN_BUDGET
    for name in result.fragmented:
        view = views.get(name)
        if view is None:
            continue
        key = ("room", pod.gpus, pod.policy, pod.priority)
        memo = None if view.nominated or view.claims or view.preempting else view.memo.get(key)
        if (memo is None or memo[0] is not settings) and budget <= 0:
            # past the budget: what the holders' priorities alone tell (no victim search on the verb's path)
            if view.may_yield_to(pod.priority):
                note = "lower-priority pods hold GPUs here: gpuwarden's GPU preemption may make room"
            else:
                lowest = f"priority < {pod.priority}"
                note = f"gpuwarden cannot make room: no lower-priority pods to preempt ({lowest})"
            unresolvable[name] = f"{unresolvable[name]}; {note}"
            continue
        if memo is None or memo[0] is not settings:
            budget -= 1
            plan = plan_victims(pod, view, settings, now)
            if isinstance(plan, VictimPlan) and plan.victims:
                n = len(plan.victims)
                note = f"gpuwarden can make room by preempting {n} lower-priority pod{'s' if n > 1 else ''}"
            elif isinstance(plan, NoPlan):
                note = f"gpuwarden cannot make room: {plan.reason}"
            else:
                note = "waiting for terminating pods to release their GPUs"
            memo = (settings, note)
            if not (view.nominated or view.claims or view.preempting):
                view.memo[key] = memo
        if memo[1]:
            unresolvable[name] = f"{unresolvable[name]}; {memo[1]}"
    return FilterResult(result.passed, result.failed, unresolvable, result.fragmented)


@dataclass(frozen=True, slots=True)
class Revision:
    """The preempt verb's victims per node, and the nodes dropped because the cross-tenant rule refused
    the victims they would need (node -> the rule's reason)."""

    victims: Mapping[str, tuple[str, ...]]
    refused: Mapping[str, str] = field(default_factory=dict)


def revise_candidates(
    pod: PodInfo,
    candidates: Mapping[str, Sequence[str]],
    views: Mapping[str, NodeView | None],
    settings: Settings,
    now: float,
    *,
    tenancy: Tenancy | None = None,
) -> Revision:
    """The preempt verb's victim choice: per candidate node (victim UIDs as the scheduler chose them, by
    count), the victims that free a GPU set the policy accepts, or the node omitted when none can.
    DRA-backed nodes (dra.py) are passed as the scheduler chose: no GPU set can be promised there.

    The scheduler's victims are kept (they may free CPU or memory we do not model) - except where they are all
    GPU holders, one of them busy, and reclaimable idle pods alone free a policy set: then the idle pods are
    the victims instead (`_idle_instead`). GPU holders are added when they do not free a policy set, only ones
    the cross-tenant rule allows (whether the scheduler's own victims are allowed is the throttle's question).
    A node sent with no victims (schedulers with kubernetes PR #135486) gets our victims or is omitted: never
    returned empty. Nodes we know nothing about pass unchanged when they have victims."""
    out: dict[str, tuple[str, ...]] = {}
    refused: dict[str, str] = {}
    for node, uids in candidates.items():
        view = views.get(node)
        # DRA allocates or the GPUs are shared there: no GPU set to free
        if view is None or pod.gpus <= 0 or view.passthrough:
            if uids:
                out[node] = tuple(uids)
            continue
        by_uid = {h.uid: h for h in view.holders if h.uid}
        sent = [by_uid[u] for u in uids if u in by_uid]
        idle = _idle_instead(pod, view, settings, now, uids, sent, tenancy)
        if idle is not None:
            out[node] = idle
            continue
        plan = plan_victims(pod, view, settings, now, already=sent, tenancy=tenancy)
        if isinstance(plan, NoPlan):
            if plan.reason.startswith(TENANT_MARKER):
                refused[node] = plan.reason.removeprefix(TENANT_MARKER).strip()
            continue
        added = tuple(v.uid for v in plan.victims if v.uid and v.uid not in uids)
        victims = (*uids, *added)
        if victims:
            out[node] = victims
    return Revision(out, refused)


def _idle_instead(
    pod: PodInfo,
    view: NodeView,
    settings: Settings,
    now: float,
    uids: Sequence[str],
    sent: Sequence[Holder],
    tenancy: Tenancy | None,
) -> tuple[str, ...] | None:
    """Victim UIDs of reclaimable idle pods that make room on this node in place of the scheduler's
    choice, or None to keep the scheduler's. Only when every victim it sent is a GPU holder we know (so the
    pods it would preempt are GPU pods of this node, not a CPU- or memory-bound choice) and one of them is
    busy: the scheduler picks by priority and start time and knows nothing of idleness."""
    if not sent or len(sent) != len(uids) or all(h.reclaimable(now) for h in sent):
        return None
    if not any(h.reclaimable(now) for h in view.holders):
        return None
    plan = plan_victims(pod, view, settings, now, tenancy=tenancy)
    if not isinstance(plan, VictimPlan) or not plan.victims or plan.busy:
        return None
    victims = tuple(v.uid for v in plan.victims if v.uid)
    return victims if len(victims) == len(plan.victims) else None
