"""Pure placement decisions: which nodes can host the pod's GPUs, how well, and on exactly which GPUs.

Why it exists: filter, prioritize and bind must agree, and every rule here (NUMA alignment, quarantine,
nominated pods, pods whose GPUs we cannot see) needs a table test with a reason a user can read in
`kubectl describe pod`. So the three verbs share one evaluation of (pod, NodeView, settings, now):

* a rejection is *unresolvable* when no preemption could help (the topology cannot fit the request even on
  an empty node, GPUs quarantined, node unknown, bad annotation) and *resolvable* when freeing GPUs would;
* pods whose GPU set we cannot see (count-only) are placed adversarially: a node passes a single-NUMA
  request only if a fitting NUMA node exists wherever those GPUs actually are;
* a pod nominated to a node (it preempted there) counts the GPUs of terminating and lower-priority pods on
  that node as free: the scheduler is removing them, and our watch may not have seen it yet
  (`yielding_holders`);
* `single-numa` asks for one NUMA node. A pod asking for more GPUs than *any* NUMA node in the fleet holds
  (`Settings.fleet_max_numa_gpus`) gets the fewest whole NUMA nodes instead: nothing better exists.

It must not do I/O, log, read the clock (`now` is a parameter) or import anything that does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

from controller.extenderv1 import MAX_EXTENDER_PRIORITY
from controller.gpus.model import Holder, NodeView
from controller.gpus.objects import PodInfo, claim_fresh
from controller.gpus.placement import Need, alignment, fits, group_sizes, known_groups, min_span, place
from controller.gpus.topology import Gpu
from gpuwarden.config.extender import ExtenderConfig
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from gpuwarden.wellknown import TOPOLOGY_POLICY as POLICY_ANNOTATION

MAX_SCORE = MAX_EXTENDER_PRIORITY
"""The top of the placement score scale: kube-scheduler's `MaxExtenderPriority`, so a score is what the
prioritize verb answers as it is."""


class Policy(StrEnum):
    """Values of the pod annotation `gpuwarden.io/topology-policy`."""

    SINGLE_NUMA = "single-numa"
    PREFER_NUMA = "prefer-numa"
    SINGLE_PCIE = "single-pcie"
    NONE = "none"


_CONSTRAINT = {Policy.SINGLE_NUMA: "numa", Policy.SINGLE_PCIE: "pcie"}
_LEVEL_NAME = {"numa": "NUMA node", "pcie": "PCIe switch"}
LOCALITY = {
    "single": 1.0, "nvlink": 1.0, "pcie": 0.9, "numa": 0.8,
    "whole-numa": 0.7, "unknown": 0.4, "cross-numa": 0.3,
}  # fmt: skip
"""Locality credit of a placement by `placement.alignment` (the locality part of the score)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Decision knobs, mapped from the config's extender section; `fleet_max_numa_gpus` from the model."""

    default_policy: Policy = Policy.SINGLE_NUMA
    claim_ttl_seconds: float = 60.0
    error_trend_threshold: float = 10.0
    """Correctable (SBE) errors per hour on the node that earn the full penalty; less earns a share."""
    error_trend_penalty: int = 3
    fit_weight: float = 2.0
    locality_weight: float = 1.0
    count_nominated: bool = True
    resource: str = "nvidia.com/gpu"
    fleet_max_numa_gpus: int = 0
    """Most healthy GPUs on one NUMA node anywhere; 0 = unknown (single-numa then never spreads)."""


def settings_from_config(cfg: ExtenderConfig, resource: str) -> Settings:
    """The decision knobs from the `extender` section (every capability that asks the model uses these)."""
    return Settings(
        default_policy=Policy(cfg.default_policy),
        claim_ttl_seconds=cfg.claim_ttl_seconds,
        error_trend_threshold=cfg.scoring.error_trend_sbe_per_hour,
        error_trend_penalty=cfg.scoring.error_trend_penalty,
        fit_weight=cfg.scoring.fit_weight,
        locality_weight=cfg.scoring.locality_weight,
        count_nominated=cfg.count_nominated_pods,
        resource=resource,
    )


class FleetSettings:
    """The settings every capability asks the model with: the configured knobs plus the fleet-derived
    NUMA size (`Settings.fleet_max_numa_gpus`, from the model). Calling it returns the same object while
    both are unchanged, so answers cached on node views (keyed by settings identity) stay valid."""

    def __init__(self, base: Settings, max_numa_gpus: Callable[[], int]) -> None:
        self.base = base
        self._max_numa_gpus = max_numa_gpus
        self._current = replace(base, fleet_max_numa_gpus=max_numa_gpus())
        self._for = base

    def __call__(self) -> Settings:
        numa = self._max_numa_gpus()
        if self._current.fleet_max_numa_gpus != numa or self._for is not self.base:
            self._current = replace(self.base, fleet_max_numa_gpus=numa)
            self._for = self.base
        return self._current


@dataclass(frozen=True, slots=True)
class Choice:
    """A concrete GPU set on a node, its alignment and its 0-10 score."""

    ids: tuple[str, ...]
    numa_nodes: tuple[int, ...]
    alignment: str
    score: int


@dataclass(frozen=True, slots=True)
class FitVerdict:
    """The outcome for one node: a `choice`, or a rejection `reason` that is `resolvable` or not."""

    node: str
    choice: Choice | None = None
    reason: str = ""
    resolvable: bool = False
    fragmented: bool = False
    """Enough GPUs are free by count but no set satisfies the policy: kube-scheduler would find no victims
    to preempt here (it counts), so the node is reported unresolvable; GPU preemption can still help."""

    @property
    def fits(self) -> bool:
        return self.choice is not None


@dataclass(frozen=True, slots=True)
class FilterResult:
    """`passed` in input order; every other input node in exactly one of the two maps."""

    passed: tuple[str, ...]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    fragmented: tuple[str, ...] = ()
    """The unresolvable nodes whose verdict is `fragmented` (victims.explain_room adds what would help)."""
    dra: tuple[str, ...] = ()
    """The passed nodes that are DRA-backed (dra.py): passed through unjudged, the scheduler's DRA plugin
    has already decided whether the pod's devices fit there."""
    shared: tuple[str, ...] = ()
    """The passed nodes that share their GPUs (shared.py): passed through unjudged, the scheduler's resource
    fit counts their replicas or MIG instances."""


def policy_of(pod: PodInfo, settings: Settings) -> Policy | str:
    """The pod's effective policy, or an error message for an unknown annotation value."""
    if pod.policy is None or not pod.policy.strip():
        return settings.default_policy if pod.gpus > 1 else Policy.NONE
    try:
        return Policy(pod.policy.strip().lower())
    except ValueError:
        return (
            f"invalid {POLICY_ANNOTATION} {pod.policy!r}: use single-numa, prefer-numa, single-pcie or none"
        )


def healthy_gpus(view: NodeView) -> list[Gpu]:
    """The node's non-quarantined GPUs (cached on the view; callers must not modify the list)."""
    healthy: list[Gpu] | None = view.memo.get("healthy")
    if healthy is None:
        healthy = [g for g in view.topology.gpus if g.id not in view.quarantined]
        view.memo["healthy"] = healthy
    return healthy


_ALWAYS = (float("-inf"), float("inf"))


def _memo_key(kind: str, pod: PodInfo, view: NodeView) -> tuple[str, int, str | None] | None:
    """Answers depend only on (request size, policy, settings) - and on the clock while claims are present
    (see `_memo_span`) - unless nominations are present, a holder is being preempted, the pod is nominated
    to this node or holds one of its claims (then the pod's identity and priority matter too, and nothing
    is cached)."""
    if view.nominated or (pod.nominated and pod.nominated == view.name) or view.preempting:
        return None
    if view.claims and pod.key in view.claim_pods:
        return None
    return (kind, pod.gpus, pod.policy)


def _memo_span(view: NodeView, s: Settings, now: float) -> tuple[float, float]:
    """The times an answer derived at `now` is valid for: always without claims; with claims, from `now`
    until the next claim expires (claims only ever turn from fresh to expired as the clock moves on, and
    a clock that steps back before `now` invalidates it)."""
    if not view.claims:
        return _ALWAYS
    return now, view.claims_stable_until(now, s.claim_ttl_seconds)


def need_for(k: int, policy: Policy, healthy: list[Gpu], settings: Settings) -> Need:
    """What a set for k GPUs under `policy` must satisfy on a node with these healthy GPUs."""
    level = _CONSTRAINT.get(policy) if k > 1 else None
    if level == "numa" and 0 < settings.fleet_max_numa_gpus < k and all(g.numa is not None for g in healthy):
        return Need(k, "numa", max(1, min_span(group_sizes(healthy, "numa"), k)))
    return Need(k, level)


def unresolvable_reason(
    pod: PodInfo, view: NodeView, need: Need, policy: Policy, healthy: list[Gpu], s: Settings
) -> str:
    """Why the node could never host the pod, even with no other pod on it; "" when it could."""
    k = pod.gpus
    if view.quarantine_reason is not None and not healthy:
        return f"GPUs quarantined by gpuwarden ({view.quarantine_reason})"
    if k > view.allocatable:
        return f"node has {view.allocatable} {s.resource} allocatable; {k} requested"
    if k > len(healthy):
        bad = len(view.topology.gpus) - len(healthy)
        return (
            f"only {len(healthy)} healthy GPUs ({bad} quarantined: {view.quarantine_reason}); {k} requested"
        )
    if need.level is None or fits(healthy, 0, need):
        return ""
    level = need.level
    if all(getattr(g, level) is None for g in healthy):
        if view.topology_error:
            return f"GPU topology unreadable ({view.topology_error}); policy {policy} needs it"
        if not view.topology.known:
            return (
                f"GPU topology unknown (no NodeResourceTopology, no {TOPOLOGY_ANNOTATION} annotation); "
                f"policy {policy} for {k} GPUs needs it"
            )
        return (
            f"GPU topology does not say which {_LEVEL_NAME[level]} each GPU is on; policy {policy} needs it"
        )
    sized = known_groups(healthy, level)
    per = ", ".join(f"{getattr(g[0], level)}: {len(g)}" for g in sized)
    largest = max(len(g) for g in sized)
    return (
        f"at most {largest} healthy GPUs per {_LEVEL_NAME[level]} ({per}); {k} requested with policy {policy}"
    )


def yielding_holders(pod: PodInfo, view: NodeView) -> list[Holder]:
    """The holders whose GPUs count as free for `pod`: when the scheduler nominated it to this node (so it
    has already chosen victims here), the pods that are terminating or of lower priority; else only pods of
    lower priority that the scheduler marked as preemption victims (DisruptionTarget/PreemptionByScheduler).

    Why this is safe: kube-scheduler preempts only pods of strictly lower priority, and its own
    NodeResourcesFit keeps counting the victims' GPUs until their deletion reaches its cache, so passing
    here never lets the pod bind early; bind then chooses the exact GPUs without this allowance, from a
    consistent LIST (bind.py). Why it is needed: victims vanish within milliseconds and the scheduler retries
    the preemptor at once; our watch may not have seen the deletion yet, and an extender rejection is not
    requeued by pod-deletion events (the pod would wait for the 5-minute unschedulable flush). A
    lower-priority pod the scheduler reprieved can make this pass wrongly; bind then fails once and the
    scheduler, which cleared the nomination, decides again without the allowance."""
    if pod.nominated and pod.nominated == view.name:
        return [h for h in view.holders if h.pod != pod.key and (h.terminating or h.priority < pod.priority)]
    # The scheduler may retry the preemptor before its nomination reaches the pod object it sends us (the
    # status patch is asynchronous): victims it marked preempted of lower priority still count as free.
    return [h for h in view.holders if h.preempted and h.priority < pod.priority]


def free_gpus(
    pod: PodInfo,
    view: NodeView,
    healthy: list[Gpu],
    s: Settings,
    now: float,
    freed: Sequence[Holder] = (),
) -> tuple[list[Gpu], int, str]:
    """Healthy GPUs not taken, the count held where we cannot see, and a note on what else holds GPUs.
    `freed`: holders to count as gone as well (victims.py asks "what if these were preempted?")."""
    taken = set(view.used)
    unknown = view.used_unknown
    yielded = yielding_holders(pod, view)
    if freed:
        yielded = [*yielded, *(h for h in freed if h not in yielded)]
    for holder in yielded:
        taken.difference_update(holder.ids)
        unknown -= holder.unknown
    for claim in view.claims:
        # the same arithmetic as `NodeView.claims_stable_until`, which bounds answers cached with claims
        fresh = claim_fresh(claim.claimed_at, claim.until, now, s.claim_ttl_seconds)
        if claim.pod != pod.key and fresh:
            taken.update(claim.ids)
    free = [g for g in healthy if g.id not in taken] if taken else healthy
    notes = [f"{unknown} held by pods without a recorded GPU set"] if unknown else []
    if yielded:
        count = sum(len(h.ids) + h.unknown for h in yielded)
        notes.append(f"{count} counted free: held by pods being preempted for it on its nominated node")
    # Never promise more than the node's allocatable count (a device plugin may report fewer GPUs).
    missing = len(free) - unknown - max(0, view.allocatable - len(taken) - unknown)
    if missing > 0:
        unknown += missing
        notes.append(f"{missing} in the topology but not allocatable")
    promised = 0
    for nominee in sorted(view.nominated, key=lambda n: (-n.priority, n.pod)):
        if not s.count_nominated or nominee.pod == pod.key or nominee.priority < pod.priority:
            continue
        their = policy_of(PodInfo(nominee.pod, "", nominee.gpus, policy=nominee.policy), s)
        their = their if isinstance(their, Policy) else Policy.NONE
        picked = place(free, unknown, need_for(nominee.gpus, their, healthy, s))
        if picked is None:
            unknown += nominee.gpus
        else:
            free = [g for g in free if g not in picked]
        promised += nominee.gpus
    if promised:
        notes.append(f"{promised} promised to nominated pods of priority >= {pod.priority}")
    return free, unknown, ("; " + ", ".join(notes)) if notes else ""


def scheduler_free(pod: PodInfo, view: NodeView, s: Settings, now: float) -> int:
    """GPUs free on the node *by count*, as kube-scheduler's NodeResourcesFit sees them for `pod`:
    allocatable minus every bound holder's request (terminating ones too), fresh claims of other pods
    (binds in flight, assumed in its cache) and nominated pods of at least its priority. When this covers
    the request, its preemption dry run finds no victim on the node and fails the whole attempt
    (`expected at least one victim pod`, kubernetes v1.35 preemption.go)."""
    held = len(view.used) + view.used_unknown
    held += sum(
        len(c.ids)
        for c in view.claims
        if c.pod != pod.key and claim_fresh(c.claimed_at, c.until, now, s.claim_ttl_seconds)
    )
    held += sum(n.gpus for n in view.nominated if n.pod != pod.key and n.priority >= pod.priority)
    return view.allocatable - held


def _summary(gpus: list[Gpu], level: str) -> str:
    found = sorted(known_groups(gpus, level), key=lambda g: str(getattr(g[0], level)))
    prefix = "NUMA" if level == "numa" else ""
    return ", ".join(f"{prefix}{getattr(g[0], level)}: {len(g)} free" for g in found) or "none free"


@dataclass(frozen=True, slots=True)
class Fit:
    need: Need
    healthy: list[Gpu]
    free: list[Gpu]
    unknown: int


def assess(pod: PodInfo, view: NodeView | None, s: Settings, now: float, name: str) -> FitVerdict | Fit:
    """A rejection, or the free GPUs among which a set satisfying the policy is guaranteed to exist."""
    if view is None:
        return FitVerdict(name, reason="node not (yet) known to the gpuwarden extender's cache")
    if view.passthrough:  # no GPU set can be promised where DRA allocates or GPUs are shared (make-room,
        return FitVerdict(name, reason=view.passthrough)  # preemption, choose)
    key = _memo_key("assess", pod, view)
    if key is not None:
        hit = view.memo.get(key)
        if hit is not None and hit[0] is s and hit[2] <= now < hit[3]:
            return hit[1]  # type: ignore[no-any-return]
    result = _assess_view(pod, view, s, now, name)
    if key is not None:
        view.memo[key] = (s, result, *_memo_span(view, s, now))
    return result


def _assess_view(pod: PodInfo, view: NodeView, s: Settings, now: float, name: str) -> FitVerdict | Fit:
    policy = policy_of(pod, s)
    if not isinstance(policy, Policy):
        return FitVerdict(name, reason=policy)
    healthy = healthy_gpus(view)
    need = need_for(pod.gpus, policy, healthy, s)
    why = unresolvable_reason(pod, view, need, policy, healthy, s)
    if why:
        return FitVerdict(name, reason=why)
    free, unknown, note = free_gpus(pod, view, healthy, s, now)
    if fits(free, unknown, need):
        return Fit(need, healthy, free, unknown)
    counted = scheduler_free(pod, view, s, now)
    if counted >= pod.gpus and need.level is not None and len(free) - unknown >= pod.gpus:
        level = need.level
        sizes = sorted(group_sizes(free, level), reverse=True)
        if need.span > 1:
            where = f"the {need.span} fullest {_LEVEL_NAME[level]}s have {sum(sizes[: need.span])}"
        else:
            where = f"largest {_LEVEL_NAME[level]} has {sizes[0] if sizes else 0}"
        why = (
            f"fragmented: {len(free) - unknown} free, {where} "
            f"({_summary(free, level)}; {pod.gpus} requested with policy {policy}){note}"
        )
        return FitVerdict(name, reason=why, fragmented=True)
    if need.level is None:
        why = f"{max(0, len(free) - unknown)} healthy GPUs free; {pod.gpus} requested{note}"
    elif need.span > 1:
        why = f"no {pod.gpus} free GPUs on {need.span} NUMA nodes ({_summary(free, 'numa')}){note}"
    else:
        lvl = _LEVEL_NAME[need.level]
        why = f"no {lvl} with {pod.gpus} free GPUs ({_summary(free, need.level)}){note}"
    # enough by count (quarantined or unseen GPUs): the scheduler's dry run would find no victim here
    return FitVerdict(name, reason=why, resolvable=counted < pod.gpus)


def _score(chosen: list[Gpu], fit: Fit, view: NodeView, s: Settings) -> int:
    """0-10: weighted mean of the set's locality and how tightly it packs its NUMA node and the node
    (fit: the mean fill of both after placement, so partly used nodes fill up before empty ones are opened),
    minus the correctable-error penalty."""
    healthy, k = len(fit.healthy), len(chosen)
    node_fill = (healthy - (len(fit.free) - k)) / healthy if healthy else 0.0
    numa = {g.numa for g in chosen}
    group_fill = node_fill
    if len(numa) == 1 and None not in numa:
        size = sum(1 for g in fit.healthy if g.numa in numa)
        left = sum(1 for g in fit.free if g.numa in numa) - k
        group_fill = 1.0 - left / size if size else 0.0
    span = fit.need.span if fit.need.level == "numa" else 1
    packing = (group_fill + node_fill) / 2
    weights = s.fit_weight + s.locality_weight
    locality = LOCALITY[alignment(chosen, span)]
    raw = 10.0 * (s.locality_weight * locality + s.fit_weight * packing) / weights if weights > 0 else 0.0
    penalty = 0
    trend = view.error_trend
    if trend is not None and trend > 0 and s.error_trend_threshold > 0:
        penalty = round(s.error_trend_penalty * min(1.0, trend / s.error_trend_threshold))
    return max(0, min(MAX_SCORE, round(raw) - penalty))


def choose_gpus(
    pod: PodInfo, view: NodeView | None, settings: Settings, now: float, node: str = ""
) -> FitVerdict:
    """The exact GPU set for `pod` on this node, with its score; or why there is none."""
    name = view.name if view is not None else node
    if pod.gpus <= 0:
        return FitVerdict(name, Choice((), (), "none", 0))
    fit = assess(pod, view, settings, now, name)
    if isinstance(fit, FitVerdict):
        return fit
    assert view is not None
    key = _memo_key("choose", pod, view)
    if key is not None:
        hit = view.memo.get(key)
        if hit is not None and hit[0] is settings and hit[2] <= now < hit[3]:
            return hit[1]  # type: ignore[no-any-return]
    verdict = choose_from(pod, view, fit, settings)
    if key is not None:
        view.memo[key] = (settings, verdict, *_memo_span(view, settings, now))
    return verdict


def choose_from(pod: PodInfo, view: NodeView, fit: Fit, settings: Settings) -> FitVerdict:
    name = view.name
    picked = place(fit.free, fit.unknown, fit.need)
    if picked is None:  # not expected: assess checked `fits` for the same need
        return FitVerdict(name, reason=f"no GPU set of {pod.gpus} found", resolvable=True)
    numa = tuple(sorted({g.numa for g in picked if g.numa is not None}))
    span = fit.need.span if fit.need.level == "numa" else 1
    choice = Choice(
        tuple(g.id for g in picked), numa, alignment(picked, span), _score(picked, fit, view, settings)
    )
    return FitVerdict(name, choice)


def filter_nodes(
    pod: PodInfo, nodes: Sequence[tuple[str, NodeView | None]], settings: Settings, now: float
) -> FilterResult:
    """Split the candidates into passed, failed (preemption may help) and unresolvable, with reasons."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    fragmented: list[str] = []
    dra: list[str] = []
    shared: list[str] = []
    if pod.gpus <= 0:
        return FilterResult(tuple(name for name, _ in nodes), failed, unresolvable)
    key, nominated = ("assess", pod.gpus, pod.policy), pod.nominated
    for name, view in nodes:
        if view is not None and view.passthrough:
            passed.append(name)
            (dra if view.dra_class else shared).append(name)
            continue
        # `assess`'s memo read inline (the same key and conditions as `_memo_key`): most candidates of a
        # request hit it, and two calls per node are a visible share of a 500-node request
        hit = None
        if (
            view is not None
            and not (view.nominated or view.preempting)
            and (not nominated or nominated != view.name)
            and not (view.claims and pod.key in view.claim_pods)
        ):
            hit = view.memo.get(key)
        if hit is not None and hit[0] is settings and hit[2] <= now < hit[3]:
            verdict = hit[1]
        else:
            verdict = assess(pod, view, settings, now, name)
        if not isinstance(verdict, FitVerdict):
            passed.append(name)
        elif verdict.resolvable:
            failed[name] = verdict.reason
        else:
            unresolvable[name] = verdict.reason
            if verdict.fragmented:
                fragmented.append(name)
    return FilterResult(tuple(passed), failed, unresolvable, tuple(fragmented), tuple(dra), tuple(shared))


def never_fits(pod: PodInfo, view: NodeView, settings: Settings, now: float) -> str:
    """Why `pod` could never fit on this node, not even with every pod on it gone (topology, quarantine,
    allocatable, policy); "" when the emptied node could host it."""
    verdict = filter_nodes(pod, [(view.name, view.emptied())], settings, now)
    return verdict.unresolvable.get(view.name, "")


class NodeScore(NamedTuple):
    """One node's prioritize answer; `wire.encode_host_priorities` turns a list into `HostPriorityList`
    JSON (a plain tuple: building 500 pydantic objects per request would cost a visible share of it)."""

    host: str
    score: int


def score_nodes(
    pod: PodInfo, nodes: Sequence[tuple[str, NodeView | None]], settings: Settings, now: float
) -> list[NodeScore]:
    """An integer 0-10 per candidate (0 where the pod does not fit), in input order."""
    out: list[NodeScore] = []
    key, nominated = ("choose", pod.gpus, pod.policy), pod.nominated
    for name, view in nodes:
        hit = None  # `choose_gpus`'s memo read inline, as in `filter_nodes`
        if (
            pod.gpus > 0
            and view is not None
            and not (view.nominated or view.preempting)
            and (not nominated or nominated != view.name)
            and not (view.claims and pod.key in view.claim_pods)
        ):
            hit = view.memo.get(key)
        if hit is not None and hit[0] is settings and hit[2] <= now < hit[3]:
            choice = hit[1].choice
        else:
            choice = choose_gpus(pod, view, settings, now, node=name).choice
        out.append(NodeScore(name, choice.score if choice is not None else 0))
    return out


def warm(views: Iterable[NodeView], gpu_counts: Sequence[int], settings: Settings, now: float) -> int:
    """Compute and cache each view's answers (filter and prioritize) for pods of these sizes under the
    default policy, as the first request of each size would; returns how many answers were computed."""
    shapes = [PodInfo("", "", k) for k in gpu_counts]
    done = 0
    for view in views:
        for shape in shapes:
            choose_gpus(shape, view, settings, now)
            done += 1
    return done
