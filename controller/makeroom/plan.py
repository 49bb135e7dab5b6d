"""GPU preemption by the controller, the pure part: which pending pods need room, and whose eviction makes it.

Why it exists: on kube-scheduler v1.35 a node that has enough free GPUs by count, but no set the pod's policy
accepts, can never be freed by the scheduler's own preemption (its dry run finds no victim there and fails;
kubernetes PR #135486 fixes that in later releases). The extender reports such nodes `fragmented`; this
module decides, per pending pod the extender rejected so, on which node whose pods to preempt
(`victims.plan_victims`: lower priority only, fewest PodDisruptionBudget violations, fewest and lowest-
priority victims, fewest GPUs disturbed), only victims the cross-tenant rule allows (`tenancy`; GPUs taken
from a tenant by one preemptor of the pass count for the next). The loop (loop.py) applies the
preemption throttle, reserves the freed GPUs for the preemptor and evicts.

A pod is a candidate when it is unbound, pending, not being deleted, asks for GPUs, is not nominated by the
scheduler (its own preemption is under way), holds no fresh reservation, and its PodScheduled condition has
said Unschedulable for `min_pending` seconds with the extender's `fragmented:` verdict in the message - the
extender only sees nodes that passed every in-tree filter, so that verdict means "topology, nothing else" on
at least one node. Idle reclaim: a pod short of GPUs by count (`Insufficient <resource>`) is a candidate too,
but only for plans whose victims are all idle pods the idle loop marked reclaimable (prefer-as-victim), of
equal or lower priority - the scheduler's own preemption never takes a pod of equal priority and knows nothing
of idleness; lower-priority busy pods stay its business. Nodes are then limited to those the pod could use:
schedulable, taints tolerated, nodeSelector matched (other in-tree filters are the scheduler's; a node planned
here that fails them costs the reservation's time, never a second preemption, because the reservation is
checked first).

Pure: no I/O, no clock (`now` is a parameter), no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.gpus.fit import Settings
from controller.gpus.model import NodeView
from controller.gpus.objects import PodInfo, claim_fresh
from controller.gpus.tenants import Tenancy, taken_by
from controller.gpus.victims import (
    NO_BUDGETS,
    TENANT_MARKER,
    Budgets,
    NoPlan,
    VictimPlan,
    as_victim,
    plan_victims,
    tenant_refusal,
)
from controller.preemption.record import verb_pending
from controller.preemption.signals import parse_time

FRAGMENTED_MARKER = "fragmented:"
"""The start of the extender's verdict for a node fragmented for the pod (decide.py)."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the in-tree filters we mirror read from a Node."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()
    """(key, value, effect) of NoSchedule / NoExecute taints."""
    unschedulable: bool = False


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    taints = tuple(
        (str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")
    )
    return NodeFacts(dict(meta.get("labels") or {}), taints, bool(spec.get("unschedulable")))


def _tolerates(tolerations: Sequence[Mapping[str, Any]], key: str, value: str, effect: str) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        op = t.get("operator") or "Equal"
        if t.get("key") in (None, "") and op == "Exists":
            return True
        if t.get("key") != key:
            continue
        if op == "Exists" or str(t.get("value") or "") == value:
            return True
    return False


def usable(spec: Mapping[str, Any], facts: NodeFacts) -> bool:
    """Whether the pod passes the node's cordon, taints (NoSchedule/NoExecute) and nodeSelector."""
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    if facts.unschedulable and not _tolerates(
        tolerations, "node.kubernetes.io/unschedulable", "", "NoSchedule"
    ):
        return False
    if any(not _tolerates(tolerations, k, v, e) for k, v, e in facts.taints):
        return False
    selector = spec.get("nodeSelector") or {}
    return all(facts.labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending pod the extender found fragmented nodes for, with what the plan needs of its spec."""

    pod: PodInfo
    spec: Mapping[str, Any]
    since: float
    """When PodScheduled turned False (the creation time when unknown)."""
    idle_only: bool = False
    """Short of GPUs by count rather than fragmented: only reclaimable idle pods may make room for it."""


def candidate(
    obj: Mapping[str, Any],
    pod: PodInfo,
    now: float,
    min_pending: float,
    ttl: float,
    namespaces: Iterable[str],
    resource: str = "nvidia.com/gpu",
) -> Pending | str:
    """The pod as a preemptor, or why it is not one (a short reason for `gpuwarden plan`)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    allowed = list(namespaces)
    if pod.gpus <= 0 or pod.node_name or pod.terminated or meta.get("deletionTimestamp"):
        return "not a pending GPU pod"
    if allowed and meta.get("namespace") not in allowed:
        return "namespace not managed"
    if pod.nominated:
        return f"nominated to {pod.nominated} by the scheduler's preemption"
    if verb_pending(obj, now):
        return "the scheduler's preemption for it was allowed moments ago"
    if pod.claim_node and pod.gpu_ids and claim_fresh(pod.claimed_at, pod.reserved_until, now, ttl):
        if pod.reserved_until is not None:
            return f"room reserved on {pod.claim_node} until {pod.reserved_until:.0f}"
        return f"being bound to {pod.claim_node}"
    cond = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
        ),
        None,
    )
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return "not unschedulable"
    message = str(cond.get("message") or "")
    idle_only = FRAGMENTED_MARKER not in message
    if idle_only and f"Insufficient {resource}" not in message:
        return "no fragmented node in the scheduler's verdict"
    since = parse_time(cond.get("lastTransitionTime")) or parse_time(meta.get("creationTimestamp")) or now
    if now - since < min_pending:
        return "unschedulable for less than min_pending_seconds"
    return Pending(pod, obj.get("spec") or {}, since, idle_only)


@dataclass(frozen=True, slots=True)
class RoomDecision:
    """For one preemptor: the victims to preempt (`plan`), or why nothing is done (`reason`)."""

    pod: PodInfo
    plan: VictimPlan | None = None
    reason: str = ""


def _shape(p: Pending, tenancy: Tenancy | None) -> tuple[Any, ...]:
    spec = p.spec
    tol = tuple(
        sorted(repr(sorted(t.items())) for t in spec.get("tolerations") or [] if isinstance(t, Mapping))
    )
    sel = tuple(sorted((spec.get("nodeSelector") or {}).items()))
    # under a cross-tenant rule whom a pod may preempt depends on its namespace
    ns = p.pod.key.split("/", 1)[0] if tenancy is not None else ""
    return (p.pod.gpus, p.pod.policy, p.pod.priority, tol, sel, ns, p.idle_only)


def plan_room(
    pending: Sequence[Pending],
    views: Mapping[str, NodeView | None],
    facts: Mapping[str, NodeFacts],
    settings: Settings,
    now: float,
    *,
    budgets: Budgets = NO_BUDGETS,
    max_victims: int = 4,
    limit: int = 10,
    tenancy: Tenancy | None = None,
) -> list[RoomDecision]:
    """One decision per pending pod, highest priority first (then longest waiting): the cheapest victims on
    the best node. A node gets at most one preemptor per pass and a pod is a victim at most once, so two
    preemptors never count the same freed GPUs; under `over-share` the GPUs one preemptor takes from a
    tenant count against that tenant's excess for the next. Pods of one shape (GPUs, policy, priority,
    tolerations, node selector, and the namespace under a cross-tenant rule) share one evaluation of the
    fleet. A pod short by count (`idle_only`) gets a decision only where idle pods could make room for it
    (or the cross-tenant rule refused them): pending pods without idle GPUs in reach stay the scheduler's,
    with no Event and no plan row."""
    order = sorted(pending, key=lambda p: (-p.pod.priority, p.since, p.pod.key))
    taken_nodes: set[str] = set()
    used: set[str] = set()
    taken: dict[str, int] = {}
    ranked: dict[tuple[Any, ...], list[VictimPlan]] = {}
    why_none: dict[tuple[Any, ...], str] = {}
    out: list[RoomDecision] = []
    planned = 0
    for p in order:
        if planned >= limit:
            out.append(RoomDecision(p.pod, reason=f"limit of {limit} preemptors per pass reached"))
            continue
        shape = _shape(p, tenancy)
        if shape not in ranked:
            ranked[shape], why_none[shape] = _rank(
                p, views, facts, settings, now, budgets, max_victims, tenancy
            )
        ns = p.pod.key.split("/", 1)[0]
        choice: VictimPlan | None = None
        refused = ""
        for plan in ranked[shape]:
            if plan.node in taken_nodes or any(v.pod in used for v in plan.victims):
                continue
            refusal = tenant_refusal(ns, plan.victims, tenancy, taken)
            if refusal is not None:  # what earlier preemptors of this pass took from that tenant
                refused = refused or f"{TENANT_MARKER} {refusal.reason}"
                continue
            choice = plan
            break
        if choice is None and p.idle_only and not refused:
            continue  # short by count with no idle pod to reclaim: the scheduler's business, not a decision
        if choice is None:
            reason = (
                why_none[shape]
                if not ranked[shape]
                else refused or "every node that could host it is taken this pass"
            )
            out.append(RoomDecision(p.pod, reason=reason))
            continue
        if not choice.victims:
            out.append(RoomDecision(p.pod, reason=f"fits on {choice.node} now: left to the scheduler"))
            continue
        taken_nodes.add(choice.node)
        used.update(v.pod for v in choice.victims)
        if tenancy is not None:
            for tenant, gpus in taken_by(map(as_victim, choice.victims), tenancy).items():
                taken[tenant] = taken.get(tenant, 0) + gpus
        out.append(RoomDecision(p.pod, plan=choice))
        planned += 1
    return out


def _rank(
    p: Pending,
    views: Mapping[str, NodeView | None],
    facts: Mapping[str, NodeFacts],
    settings: Settings,
    now: float,
    budgets: Budgets,
    max_victims: int,
    tenancy: Tenancy | None = None,
) -> tuple[list[VictimPlan], str]:
    """Every node's plan for this pod's shape, best first (a node where it fits already ranks first: then
    nothing is to be done), and the most telling reason when no node has one."""
    pod = p.pod
    plans: list[VictimPlan] = []
    reasons: dict[str, int] = {}
    for name, view in views.items():
        if view is None or view.allocatable < pod.gpus:
            continue
        idle = any(h.reclaimable(now) and h.priority <= pod.priority for h in view.holders)
        if not idle and (p.idle_only or not view.may_yield_to(pod.priority)):
            continue
        node = facts.get(name)
        if node is None or not usable(p.spec, node):
            continue
        plan = plan_victims(
            pod, view, settings, now, budgets=budgets, max_victims=max_victims, tenancy=tenancy
        )
        if isinstance(plan, NoPlan):
            tenants = plan.reason.startswith(TENANT_MARKER)
            key = plan.reason if tenants else plan.reason.split(" (")[0]
            reasons[key] = reasons.get(key, 0) + 1
            continue
        if p.idle_only and plan.busy:
            continue  # a busy victim for a pod short by count: the scheduler's own preemption decides
        plans.append(plan)
    best_first = sorted(
        plans, key=lambda pl: (0 if not pl.victims else 1, *pl.cost(), -pl.choice.score, pl.node)
    )
    if not reasons:
        return best_first, "no node with lower-priority GPU pods it could use"
    top = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))
    return best_first, f"no node can make room ({top[1]} node(s): {top[0]})"


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels (policy/v1 PDB: an empty selector matches every pod)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def budgets_from(pdbs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Budgets:
    """The PodDisruptionBudgets covering each pod and the disruptions each still allows, as kube-scheduler
    reads them (`status.disruptionsAllowed`; a budget without status allows none)."""
    by_ns: dict[str, list[tuple[str, Mapping[str, Any] | None]]] = {}
    allowed: dict[str, int] = {}
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        selector = (pdb.get("spec") or {}).get("selector")
        by_ns.setdefault(str(meta.get("namespace", "")), []).append((key, selector))
        value = (pdb.get("status") or {}).get("disruptionsAllowed")
        allowed[key] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    covering: dict[str, tuple[str, ...]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace", ""))
        budgets = by_ns.get(ns)
        if not budgets:
            continue
        labels = meta.get("labels") or {}
        hit = tuple(k for k, sel in budgets if _matches(sel, labels))
        if hit:
            covering[f"{ns}/{meta.get('name', '')}"] = hit
    return Budgets(covering, allowed)
