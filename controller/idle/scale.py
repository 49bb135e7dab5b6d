"""Action `scale-down`, the pure part: which owners of idle pods to scale down, to how many, or why not.

Why a module: scaling an owner is the action that gives GPUs back without an eviction the owner undoes at
once (a ReplicaSet replaces an evicted pod within seconds). It runs in two steps so the I/O stays in the
shell: `due` picks, from a pass's judgements, the pods whose rule says scale-down, idle, reported and
unacknowledged for `scale_down_after_seconds`; the loop then reads their owners (`ScaleTarget`: the
Deployment above a ReplicaSet, a StatefulSet or a bare ReplicaSet, its `/scale` replicas and the
HorizontalPodAutoscaler that targets it) and `plan_scale_downs` decides:

* one action per owner and pass, whatever number of its pods are idle: `one-less` takes one replica,
  `zero` all of them;
* never below an HPA's `minReplicas`: the target is clamped to it, and when that leaves nothing to take the
  owner is *held* with the HPA named (HPAs with `minReplicas: 0` allow zero - HPAScaleToZero);
* an owner we cannot scale (a bare pod, a Job, a CRD, an unreadable `/scale`) is held with the reason, so
  the pod stays reported and the operator sees why nothing else happens;
* at most `max_scale_downs_per_hour` owners in any hour (what is left of it is `budget`); the rest wait.

What it must not do: read the clock, log, or touch the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.idle.decide import IdleVerdict, Judgement
from controller.idle.snapshot import IdlePod, parse_time
from gpuwarden.config.idle import IdleConfig

SCALABLE = ("Deployment", "StatefulSet", "ReplicaSet")
"""Owner kinds whose `/scale` subresource is scaled (a pod's ReplicaSet resolves to its Deployment)."""


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """The owner a pod's idleness scales, as observed: its `/scale` replicas and the HPA targeting it."""

    namespace: str
    kind: str
    name: str
    replicas: int | None = None
    """`spec.replicas` of its `/scale` (None: not read)."""
    resource_version: str = ""
    """Of the `/scale` read: the scale-down is a precondition on it (a changed owner is decided again)."""
    hpa: str = ""
    hpa_min: int | None = None
    problem: str = ""
    """Why it cannot be scaled ("" when it can)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class ScaleDown:
    """Scale `target` from its replicas to `replicas`; `pods` are its idle pods that asked for it."""

    target: ScaleTarget
    replicas: int
    pods: tuple[IdlePod, ...]
    message: str


@dataclass(frozen=True, slots=True)
class ScaleHeld:
    """A due scale-down not done, and why (HPA floor, nothing scalable, budget)."""

    target: ScaleTarget | None
    pods: tuple[IdlePod, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """A pass's scale-downs and the due ones held."""

    downs: tuple[ScaleDown, ...] = ()
    held: tuple[ScaleHeld, ...] = ()


def due(judgements: Iterable[Judgement], config: IdleConfig, now: float) -> list[IdlePod]:
    """Pods under a scale-down rule, idle, unacknowledged and reported `scale_down_after_seconds` ago."""
    out = []
    for j in judgements:
        if j.verdict is not IdleVerdict.IDLE or j.acknowledged or j.action != "scale-down":
            continue
        since = parse_time(j.pod.idle_since_text)
        if since is not None and now - since >= config.scale_down_after_seconds:
            out.append(j.pod)
    return out


def plan_scale_downs(
    pods: Sequence[IdlePod], targets: Mapping[str, ScaleTarget], config: IdleConfig, budget: int
) -> tuple[list[ScaleDown], list[ScaleHeld]]:
    """One decision per owner of the due `pods` (`targets`: pod key -> its observed owner)."""
    by_owner: dict[str, list[IdlePod]] = {}
    unowned: list[ScaleHeld] = []
    owner_of: dict[str, ScaleTarget] = {}
    for pod in pods:
        target = targets.get(pod.key)
        if target is None:
            unowned.append(ScaleHeld(None, (pod,), "no owner to scale (a bare pod)"))
            continue
        by_owner.setdefault(target.key, []).append(pod)
        owner_of[target.key] = target
    downs: list[ScaleDown] = []
    held = unowned
    for key in sorted(by_owner):
        target, idle = owner_of[key], tuple(by_owner[key])
        why = _blocked(target)
        if why:
            held.append(ScaleHeld(target, idle, why))
            continue
        have = target.replicas or 0  # known and positive: `_blocked` said so
        wanted = 0 if config.scale_down_to == "zero" else have - 1
        floor = target.hpa_min if target.hpa_min is not None else 0
        replicas = max(wanted, floor, 0)
        if replicas >= have:
            held.append(
                ScaleHeld(
                    target,
                    idle,
                    f"HorizontalPodAutoscaler {target.hpa} keeps minReplicas "
                    f"{target.hpa_min} (the {target.kind} has {target.replicas})",
                )
            )
            continue
        if len(downs) >= budget:
            held.append(
                ScaleHeld(target, idle, f"budget: {config.max_scale_downs_per_hour} scale-downs per hour")
            )
            continue
        clamp = f", held at the HPA's minReplicas {floor}" if replicas > wanted else ""
        names = ", ".join(p.name for p in idle)
        downs.append(
            ScaleDown(
                target,
                replicas,
                idle,
                f"{target.kind} {target.name} scaled {target.replicas} -> {replicas}{clamp}: "
                f"idle pod(s) {names}",
            )
        )
    return downs, held


def _blocked(target: ScaleTarget) -> str:
    if target.problem:
        return target.problem
    if target.kind not in SCALABLE:
        kinds = ", ".join(SCALABLE)
        return f"owner {target.kind} {target.name} is not scaled by gpuwarden ({kinds})"
    if target.replicas is None:
        return f"{target.kind} {target.name}: replicas unknown"
    if target.replicas <= 0:
        return f"{target.kind} {target.name} is at 0 replicas already"
    return ""
