"""The drain plan: for each quarantined node, which pods must move, how, and whether the gate lets them.

Why it exists: moving work off a failed GPU is the step that ends running jobs, so every choice is made here,
purely and table-tested, from what the API says (docs/architecture.md, safety rule 5):
the node's quarantine record (which GPUs, by UUID), the topology (UUID -> the id pods record), the pods bound
to the node with their recorded or actual GPU set, the per-workload modes, the drain state already on the
Node, the clock and the fleet's eviction history. The shell only evicts what this returns.

Scope: a GPU-level fault moves only the pods holding one of the faulty GPUs - on a shared node, the pods
holding a replica (`<uuid>::<n>`) or a MIG device of it, each device ID resolved to its physical GPU by the
GPU model (`controller.gpus.physical`); a node-level fault (no GPU named), a GPU that cannot be mapped, or a
pod whose devices cannot be resolved moves every GPU pod of the node (unknown never narrows). On a shared
node only the kubelet's set counts (the node agent's reconciled `gpu-ids`): no device plugin of ours
honours a recorded set there, so a set the extender recorded is a wish. Never moved: DaemonSet pods,
mirror (static) pods, finished pods, pods already terminating, excluded namespaces and labels (reported).
The gate: at most N nodes draining, at most M evictions per minute fleet-wide (counted from the eviction
ledgers on the Nodes, so a new leader inherits the count), no new drain while too few GPU nodes accept pods.
No I/O, no clock reads, no logging.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from controller.gpus.devices import holds_any
from controller.gpus.physical import MigPlace, physical_gpus
from gpuwarden.config.drain import DrainConfig, DrainGate, DrainMode
from gpuwarden.gpusharing import GpuSharing
from gpuwarden.quarantine import DeviceRef


class DrainVerdict(StrEnum):
    EVICT = "evict"
    WAIT = "wait-completion"
    DELETE = "delete"  # a rule's delete_after_seconds passed for a pod Evictions could not move
    REPORT = "report"  # mode never, or excluded
    BACKOFF = "backoff"  # evicted before and refused (429); retried after the back-off


@dataclass(frozen=True, slots=True)
class DrainPod:
    """A pod bound to a quarantined node, as the plan needs it."""

    namespace: str
    name: str
    uid: str
    gpu_ids: tuple[str, ...] | None
    """The actual set when the node agent reconciled it, else the recorded one; None when unknown. Device
    IDs as the kubelet gives them: ids, GPU UUIDs, replicas `<uuid>::<n>`, MIG UUIDs."""
    gpus: int
    """GPUs or shares of one it requests (the GPU resource, its `.shared` rename, MIG-mixed resources)."""
    owner_kinds: tuple[str, ...] = ()
    mirror: bool = False
    phase: str = "Running"
    terminating: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    claims: bool = False
    """It uses DRA ResourceClaims (its own, or the one the scheduler made for a DRA-backed extended
    resource): on a DRA-backed node it may hold a GPU without a `gpus` request."""
    devices: frozenset[DeviceRef] | None = None
    """The DRA devices its claims are allocated (`controller.gpus.devices.pod_devices`); None when unknown
    or not read (only read on nodes whose quarantine is device-scoped)."""
    actual: bool = False
    """`gpu_ids` is the kubelet's word (the node agent reconciled it from PodResources), not a record."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodHistory:
    """What the Node's drain state remembers about one pod."""

    first_refused: float | None = None
    last_attempt: float | None = None
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class Eviction:
    """One eviction in the node's ledger (its drain state): written *before* the Eviction is sent, so the
    fleet's evictions of the last minute and the Events still owed survive a leader change."""

    pod: str
    """namespace/name"""
    uid: str
    at: float
    evented: bool = False
    """Its GPUPodEvicted Event exists (it is written once, named after the pod's uid)."""


RATE_WINDOW_SECONDS = 60.0
"""The rate limit's default window (`drain.gate.rate_window_seconds`): max_evictions_per_minute's minute."""


def evictions_in_window(
    ledgers: Iterable[Iterable[Eviction]], now: float, window: float = RATE_WINDOW_SECONDS
) -> int:
    """Evictions (sent or about to be) in the last `window` seconds, fleet-wide: the rate limit's count."""
    return sum(1 for ledger in ledgers for e in ledger if now - e.at < window)


def _gone_or_going(e: Eviction, pods: Iterable[DrainPod]) -> bool:
    return not any(p.uid == e.uid and not p.terminating for p in pods)


def events_owed(ledger: Iterable[Eviction], pods: Sequence[DrainPod]) -> tuple[Eviction, ...]:
    """Evictions whose Event is not written though the pod is gone or terminating: a leader died between
    the Eviction and its Event (or the Event failed). A pod still running was never evicted: no Event."""
    return tuple(e for e in ledger if not e.evented and _gone_or_going(e, pods))


def prune_ledger(
    ledger: Iterable[Eviction], pods: Sequence[DrainPod], now: float, window: float = RATE_WINDOW_SECONDS
) -> tuple[Eviction, ...]:
    """The ledger kept: evictions of the rate's window (the last minute by default), and older ones whose
    Event is still owed."""
    return tuple(e for e in ledger if now - e.at < window or (not e.evented and _gone_or_going(e, pods)))


@dataclass(frozen=True, slots=True)
class DrainNode:
    """A quarantined node."""

    name: str
    fault_gpus: frozenset[str]
    """UUIDs named by the quarantine record; empty = node-level fault."""
    uuid_to_id: Mapping[str, str]
    """Topology: GPU UUID -> the id pods record (`gpuwarden.io/gpu-ids`)."""
    fault_devices: tuple[DeviceRef, ...] = ()
    """A device-scoped quarantine on a DRA-backed node (the record's `devices`): the holders are found
    through their claims' allocations, not `gpuwarden.io/gpu-ids` (which DRA nodes do not have)."""
    dra: bool = False
    """A DRA-backed node (its record names devices, or says why its quarantine is node-level there): a pod
    may hold a GPU through a ResourceClaim alone, without a `gpus` request."""
    started: float | None = None
    """When this node's drain began (from its drain state), None if not yet."""
    history: Mapping[str, PodHistory] = field(default_factory=dict)
    paused: bool = False
    finished: bool = False
    """Its drain state says done: it no longer counts against max_draining_nodes."""
    evictions: tuple[Eviction, ...] = ()
    """The node's eviction ledger (from its drain state)."""
    quarantined_at: float | None = None
    """When the quarantine being drained began (its record): names the drain's Events, so they are once."""
    migs: Mapping[str, MigPlace] = field(default_factory=dict)
    """Topology: MIG UUID -> the physical GPU it lives on (the node agent's published MIG devices)."""
    sharing: GpuSharing = field(default_factory=GpuSharing)
    """How the node shares its GPUs (`gpuwarden.gpusharing.node_sharing`)."""


@dataclass(frozen=True, slots=True)
class PodAction:
    pod: DrainPod
    verdict: DrainVerdict
    mode: DrainMode
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    scope: str  # "gpu" | "node"
    actions: tuple[PodAction, ...]
    scope_note: str = ""
    """Why a GPU-level fault widened to the node (for Events and `gpuwarden plan`), empty otherwise."""
    start: bool = False
    """The drain begins in this pass (the gate let it)."""
    done: bool = False
    """Nothing left to move: every pod in scope is gone (or only reported)."""
    held: str = ""
    """Why the gate held this node's new drain, empty when not held."""
    events_owed: tuple[Eviction, ...] = ()
    """Evictions done (pod gone or terminating) whose GPUPodEvicted Event is still to be written."""
    quarantined_at: float | None = None
    """The drained quarantine's start (see DrainNode)."""


@dataclass(frozen=True, slots=True)
class DrainPlan:
    nodes: tuple[NodePlan, ...]
    gate_closed: tuple[str, ...] = ()
    """Why the gate held something this pass (for Events, the metric and the alert)."""


def mode_of(pod: DrainPod, policy: DrainConfig) -> tuple[DrainMode, str]:
    """The first matching rule's mode (and name), else the default."""
    for rule in policy.rules:
        if rule.namespaces and not any(fnmatch.fnmatchcase(pod.namespace, ns) for ns in rule.namespaces):
            continue
        if any(pod.labels.get(k) != v for k, v in rule.match_labels.items()):
            continue
        return rule.mode, rule.name
    return policy.default_mode, "default"


def _rule(policy: DrainConfig, name: str) -> tuple[float | None, float]:
    for rule in policy.rules:
        if rule.name == name:
            return rule.delete_after_seconds, rule.completion_deadline_seconds
    return None, 3600.0


@dataclass(frozen=True, slots=True)
class Scope:
    """What a fault concerns: `gpu` (the holders of the faulty GPUs) or `node` (every GPU pod), the pods,
    and why the scope is the node's when the fault named GPUs."""

    scope: str
    pods: list[DrainPod]
    note: str = ""


def _gpu_scope(node: DrainNode, gpu_pods: list[DrainPod]) -> Scope:
    """A device-plugin node whose quarantine names GPUs: each pod's devices resolved to physical GPUs."""
    faulty = node.fault_gpus
    unmapped = sorted(faulty - node.uuid_to_id.keys())
    moved: list[DrainPod] = []
    for p in gpu_pods:
        if p.gpu_ids is None:
            return Scope("node", gpu_pods, f"{p.key} holds GPUs no set names")
        if node.sharing.shared and not p.actual:
            # no device plugin of ours honours a recorded set on a shared node: only the kubelet's word counts
            return Scope("node", gpu_pods, f"{p.key}: no kubelet-reported set on a {node.sharing.mode} node")
        held = physical_gpus(p.gpu_ids, node.uuid_to_id, node.migs)
        if held.unknown:
            return Scope("node", gpu_pods, f"{p.key} holds {held.unknown[0]}")
        if unmapped and held.via_id:
            return Scope("node", gpu_pods, f"faulty GPU {unmapped[0]} is not in the node's topology")
        if held.gpus & faulty:
            moved.append(p)
    if unmapped and not gpu_pods:
        return Scope("node", [], f"faulty GPU {unmapped[0]} is not in the node's topology")
    return Scope("gpu", moved)


def scope_of(node: DrainNode, pods: Iterable[DrainPod]) -> Scope:
    """The pods the fault concerns: holders of the faulty GPUs, or every GPU pod when that cannot be told."""
    if node.dra:
        holders = [p for p in pods if p.gpus > 0 or p.claims]
        if not node.fault_devices:
            return Scope("node", holders)  # the node-level quarantine of a DRA-backed node
        if any(p.devices is None for p in holders):
            # a claim we could not read could hold the faulty device
            return Scope("node", holders, "a pod's claims could not be read")
        return Scope("gpu", [p for p in holders if holds_any(p.devices or (), node.fault_devices)])
    gpu_pods = [p for p in pods if p.gpus > 0]
    if not node.fault_gpus:
        return Scope("node", gpu_pods)
    return _gpu_scope(node, gpu_pods)


def in_scope(node: DrainNode, pods: Iterable[DrainPod]) -> tuple[str, list[DrainPod]]:
    """`scope_of` as (scope, pods)."""
    got = scope_of(node, pods)
    return got.scope, got.pods


def _movable(pod: DrainPod) -> bool:
    return not (pod.mirror or "DaemonSet" in pod.owner_kinds or pod.phase in ("Succeeded", "Failed"))


def pod_actions(
    node: DrainNode, pods: Iterable[DrainPod], policy: DrainConfig, now: float
) -> tuple[str, list[PodAction]]:
    scope = scope_of(node, pods)
    return scope.scope, _actions(node, scope, policy, now)


def _actions(node: DrainNode, chosen: Scope, policy: DrainConfig, now: float) -> list[PodAction]:
    scope = chosen.scope
    out: list[PodAction] = []
    started = node.started if node.started is not None else now
    for pod in sorted(chosen.pods, key=lambda p: p.key):
        if not _movable(pod):
            continue
        if pod.terminating:
            # Within its grace period: nothing to do, but the drain is not done until it is gone.
            out.append(PodAction(pod, DrainVerdict.WAIT, "immediate", "", "terminating"))
            continue
        mode, rule = mode_of(pod, policy)
        if pod.namespace in policy.exclude_namespaces or pod.labels.get(policy.exclude_label) == "true":
            out.append(PodAction(pod, DrainVerdict.REPORT, mode, rule, "excluded"))
            continue
        if mode == "never":
            out.append(PodAction(pod, DrainVerdict.REPORT, mode, rule, f"rule {rule}: mode never"))
            continue
        delete_after, deadline = _rule(policy, rule)
        if mode == "allow-completion" and now - started < deadline:
            out.append(
                PodAction(pod, DrainVerdict.WAIT, mode, rule, f"waits to finish (deadline {deadline:g}s)")
            )
            continue
        hist = node.history.get(pod.key, PodHistory())
        if hist.last_attempt is not None and hist.attempts > 0:
            # Capped exponent: a pod refused for days must not overflow the float (and stop every pass).
            backoff = min(120.0, policy.retry_backoff_seconds * 2 ** min(hist.attempts - 1, 16))
            if now - hist.last_attempt < backoff:
                out.append(
                    PodAction(pod, DrainVerdict.BACKOFF, mode, rule, f"refused; retry in {backoff:g}s")
                )
                continue
        if (
            hist.first_refused is not None
            and delete_after is not None
            and now - hist.first_refused >= delete_after
        ):
            out.append(
                PodAction(pod, DrainVerdict.DELETE, mode, rule, f"eviction refused for {delete_after:g}s")
            )
            continue
        out.append(
            PodAction(
                pod, DrainVerdict.EVICT, mode, rule, "holds a faulty GPU" if scope == "gpu" else "node fault"
            )
        )
    return out


def rate_limit_note(gate: DrainGate) -> str:
    """Why a pass evicts no more: "eviction rate limit (10/min)", or "(2 per 15s)" with a shorter window."""
    per = "/min" if gate.rate_window_seconds == RATE_WINDOW_SECONDS else f" per {gate.rate_window_seconds:g}s"
    return f"eviction rate limit ({gate.max_evictions_per_minute}{per})"


def plan_drains(
    nodes: Sequence[DrainNode],
    pods_by_node: Mapping[str, Sequence[DrainPod]],
    policy: DrainConfig,
    now: float,
    *,
    evictions_last_minute: int,
    gpu_nodes: int,
    schedulable_gpu_nodes: int,
) -> DrainPlan:
    """The whole pass: per node its pod actions, with the gate applied (draining nodes first)."""
    gate = policy.gate
    held: list[str] = []
    draining = sum(1 for n in nodes if n.started is not None and not n.finished)
    floor_ok = gpu_nodes == 0 or 100.0 * schedulable_gpu_nodes / gpu_nodes >= gate.min_schedulable_percent
    budget = max(0, gate.max_evictions_per_minute - evictions_last_minute)
    plans: list[NodePlan] = []
    for node in sorted(nodes, key=lambda n: (n.started is None, n.started or 0.0, n.name)):
        chosen = scope_of(node, pods_by_node.get(node.name, ()))
        scope, note, actions = chosen.scope, chosen.note, _actions(node, chosen, policy, now)
        moving = [a for a in actions if a.verdict is not DrainVerdict.REPORT]
        if node.started is None:
            why = ""
            if not moving:
                plans.append(NodePlan(node.name, scope, tuple(actions), note, done=True))
                continue
            if policy.paused or node.paused:
                why = "paused"
            elif draining >= gate.max_draining_nodes:
                why = f"{draining} nodes draining (max_draining_nodes {gate.max_draining_nodes})"
            elif not floor_ok:
                why = (f"only {schedulable_gpu_nodes} of {gpu_nodes} GPU nodes accept pods "
                       f"(min_schedulable_percent {gate.min_schedulable_percent:g})")  # fmt: skip
            if why:
                held.append(f"{node.name}: {why}")
                plans.append(NodePlan(node.name, scope, tuple(_hold(a) for a in actions), note, held=why))
                continue
            draining += 1
            start = True
        else:
            start = False
            if policy.paused or node.paused:
                plans.append(
                    NodePlan(node.name, scope, tuple(_hold(a) for a in actions), note, held="paused")
                )
                continue
        limited: list[PodAction] = []
        for a in actions:
            if a.verdict in (DrainVerdict.EVICT, DrainVerdict.DELETE):
                if budget <= 0:
                    limited.append(
                        PodAction(a.pod, DrainVerdict.BACKOFF, a.mode, a.rule, "eviction rate limit")
                    )
                    if rate_limit_note(gate) not in held:
                        held.append(rate_limit_note(gate))
                    continue
                budget -= 1
            limited.append(a)
        plans.append(NodePlan(node.name, scope, tuple(limited), note, start=start, done=not moving))
    by_name = {n.name: n for n in nodes}
    plans = [
        replace(
            n,
            events_owed=events_owed(by_name[n.node].evictions, pods_by_node.get(n.node, ())),
            quarantined_at=by_name[n.node].quarantined_at,
        )
        for n in plans
    ]
    return DrainPlan(tuple(plans), tuple(held))


def _hold(a: PodAction) -> PodAction:
    if a.verdict is DrainVerdict.REPORT:
        return a
    return PodAction(a.pod, DrainVerdict.BACKOFF, a.mode, a.rule, "drain held by the gate")


def plan_to_dict(plan: DrainPlan) -> dict[str, object]:
    """The plan as JSON (`gpuwarden plan -o json`)."""
    return {
        "gate_closed": list(plan.gate_closed),
        "nodes": [
            {
                "node": n.node,
                "scope": n.scope,
                "scope_note": n.scope_note,
                "start": n.start,
                "done": n.done,
                "held": n.held,
                "pods": [
                    {
                        "pod": a.pod.key,
                        "verdict": a.verdict.value,
                        "mode": a.mode,
                        "rule": a.rule,
                        "reason": a.reason,
                    }
                    for a in n.actions
                ],
            }
            for n in plan.nodes
        ],
    }
