"""The idle verdict of each GPU pod, and the plan of a pass: pure functions of (snapshot, policy, now).

Why it exists: "idle" must be decided one way, table-tested, and err toward *not idle*:

* a pod is idle only when every GPU it holds has data covering the window and stayed under the threshold;
  one busy GPU makes it busy (a multi-GPU job with one GPU working is working);
* a GPU held through a replica (time-slicing, MPS) is read whole (the snapshot's join): a sharer is idle
  only when all of its GPU is, never while another sharer keeps it busy; a MIG device is judged on its own
  instance's profiling field;
* missing data (no series for a held GPU, too few samples, a NaN, a failed query) is **unknown**, never
  idle (docs/architecture.md, safety rule 1) — and unknown changes nothing: an `idle-since` stays;
* young pods (inside `warmup_seconds`, or younger than the window) and opted-out pods (namespace glob,
  exclude label, a rule with action `ignore`) are never idle;
* an acknowledgement (`gpuwarden.io/idle-ack-until` in the future) holds any action on an idle pod.

Action `prefer-as-victim`: an idle pod is reported and marked `idle-reclaimable`, which GPU preemption reads
(controller.gpus.victims: such pods are taken first, and may yield to a pending pod of equal priority). The
mark is kept only while the pod is idle, reported and not acknowledged: unknown data, an acknowledgement or a
rule that no longer says prefer-as-victim removes it (the `idle-since` stays where it would stay).

Action `evict`: an idle pod already reported whose `idle-since` is `evict_after_seconds` old is evicted,
within the hourly budget (`max_evictions_per_hour` minus the evictions of the last hour); the rest wait.

The plan: mark newly idle pods (`idle-since` = now - window, the earliest time the data proves; at most
`max_marks_per_pass`), clear `idle-since` from pods that are no longer idle (busy, young, excluded) —
never from unknown or acknowledged ones. What it must not do: log, read the clock, or touch the cluster.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller.idle.snapshot import GpuReading, IdlePod, IdleSnapshot, parse_time
from gpuwarden.config.idle import IdleAction, IdleConfig


class IdleVerdict(StrEnum):
    IDLE = "idle"
    BUSY = "busy"
    UNKNOWN = "unknown"
    YOUNG = "young"
    EXCLUDED = "excluded"


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    config: IdleConfig
    dry_run: bool


def policy_from_config(config: IdleConfig, *, dry_run: bool | None = None) -> IdlePolicy:
    """The pass's policy; `dry_run` (the CLI's --dry-run) can only add dry-run, never lift it."""
    return IdlePolicy(config, dry_run=config.dry_run or bool(dry_run))


@dataclass(frozen=True, slots=True)
class Judgement:
    pod: IdlePod
    verdict: IdleVerdict
    reason: str
    rule: str = "default"
    acknowledged: bool = False
    action: IdleAction = "report"


@dataclass(frozen=True, slots=True)
class Mark:
    """Report a newly idle pod: write `idle-since`, Event the pod and its owner."""

    pod: IdlePod
    since: float
    rule: str
    message: str
    reclaimable: bool = False
    """The rule says prefer-as-victim: `idle-reclaimable` is written with `idle-since`."""


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Set (`reclaimable`) or remove our `idle-reclaimable` mark on a pod already reported idle."""

    pod: IdlePod
    reclaimable: bool
    rule: str
    message: str


@dataclass(frozen=True, slots=True)
class Unmark:
    """Remove our `idle-since` from a pod that is no longer idle."""

    pod: IdlePod
    verdict: IdleVerdict
    message: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict an idle pod through the Eviction API (its owner recreates it, or it is gone)."""

    pod: IdlePod
    rule: str
    message: str


@dataclass(frozen=True, slots=True)
class IdlePlan:
    now: float
    dry_run: bool
    telemetry: bool
    judgements: tuple[Judgement, ...]
    marks: tuple[Mark, ...] = ()
    unmarks: tuple[Unmark, ...] = ()
    reclaims: tuple[Reclaim, ...] = ()
    evictions: tuple[Evict, ...] = ()
    over_budget: tuple[str, ...] = ()
    """Pods due for eviction that the hourly budget holds."""
    deferred: tuple[str, ...] = ()
    """Pods newly idle but over the per-pass budget: marked on a later pass."""
    problems: tuple[str, ...] = field(default=())

    @property
    def counts(self) -> dict[str, int]:
        states = Counter("acknowledged" if j.acknowledged else j.verdict.value for j in self.judgements)
        return dict(states)

    def idle_gpus_by_namespace(self) -> dict[str, int]:
        """GPUs held by idle pods (acknowledged ones too: they are idle), by namespace."""
        out: Counter[str] = Counter()
        for j in self.judgements:
            if j.verdict is IdleVerdict.IDLE:
                out[j.pod.namespace] += j.pod.gpus
        return dict(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "telemetry": self.telemetry,
            "counts": self.counts,
            "idle": [
                {"pod": j.pod.key, "gpus": j.pod.gpus, "since": j.pod.idle_since_text, "rule": j.rule,
                 "acknowledged": j.acknowledged, "reason": j.reason, "action": j.action,
                 "reclaimable": j.pod.reclaimable}
                for j in self.judgements if j.verdict is IdleVerdict.IDLE
            ],
            "mark": [{"pod": m.pod.key, "since": m.since, "rule": m.rule, "message": m.message,
                      "reclaimable": m.reclaimable} for m in self.marks],
            "unmark": [{"pod": u.pod.key, "verdict": u.verdict.value, "message": u.message}
                       for u in self.unmarks],
            "reclaimable": [{"pod": r.pod.key, "set": r.reclaimable, "rule": r.rule, "message": r.message}
                            for r in self.reclaims],
            "evict": [{"pod": e.pod.key, "rule": e.rule, "message": e.message} for e in self.evictions],
            "over_budget": list(self.over_budget),
            "deferred": list(self.deferred),
            "problems": list(self.problems),
        }  # fmt: skip


def _matches(globs: list[str], namespace: str) -> bool:
    return any(fnmatch.fnmatchcase(namespace, g) for g in globs)


def action_of(pod: IdlePod, config: IdleConfig) -> tuple[IdleAction, str]:
    """The first matching rule's action and name, else the default action."""
    for rule in config.rules:
        if rule.namespaces and not _matches(rule.namespaces, pod.namespace):
            continue
        if any(pod.labels.get(k) != v for k, v in rule.match_labels.items()):
            continue
        return rule.action, rule.name
    return config.default_action, "default"


def gpu_state(reading: GpuReading, config: IdleConfig) -> tuple[IdleVerdict, str]:
    """One GPU: busy (at or over the threshold), idle (under it, window covered) or unknown."""
    needed = config.window_seconds / config.scrape_interval_seconds * config.min_coverage_percent / 100
    gpu = f"shared GPU {reading.gpu} (all sharers)" if reading.shared else f"GPU {reading.gpu}"
    if reading.conflict:
        return IdleVerdict.UNKNOWN, f"{gpu} is reported for {reading.conflict}"
    if reading.max_percent is not None and reading.max_percent >= config.threshold_percent:
        return IdleVerdict.BUSY, f"{gpu} peaked at {reading.max_percent:g}%"
    power = config.power_threshold_watts
    if power is not None and reading.max_watts is not None and reading.max_watts >= power:
        return IdleVerdict.BUSY, f"{gpu} drew {reading.max_watts:g} W (>= {power:g} W)"
    if power is not None and reading.max_watts is None:
        return IdleVerdict.UNKNOWN, f"{gpu} has no power data (power corroboration is on)"
    if reading.max_percent is None or reading.samples < needed:
        return IdleVerdict.UNKNOWN, f"{gpu} has {reading.samples} samples, needs {needed:g}"
    return IdleVerdict.IDLE, f"{gpu} peaked at {reading.max_percent:g}%"


def judge(pod: IdlePod, readings: tuple[GpuReading, ...], config: IdleConfig, now: float) -> Judgement:
    """The verdict of one pod at `now` (see the module docstring for the order of the rules)."""
    action, rule = action_of(pod, config)
    if _matches(config.exclude_namespaces, pod.namespace):
        return Judgement(pod, IdleVerdict.EXCLUDED, "namespace excluded", rule)
    if pod.labels.get(config.exclude_label) == "true":
        return Judgement(pod, IdleVerdict.EXCLUDED, f"label {config.exclude_label}=true", rule)
    if action == "ignore":
        return Judgement(pod, IdleVerdict.EXCLUDED, f"rule {rule} ignores it", rule, action=action)
    if pod.started is None:
        return Judgement(pod, IdleVerdict.UNKNOWN, "start time unknown", rule)
    age = now - pod.started
    if age < max(config.warmup_seconds, config.window_seconds):
        return Judgement(pod, IdleVerdict.YOUNG, f"running {age:.0f}s, judged after "
                         f"{max(config.warmup_seconds, config.window_seconds):g}s", rule)  # fmt: skip
    states = [gpu_state(r, config) for r in readings]
    busy = [why for v, why in states if v is IdleVerdict.BUSY]
    if busy:
        return Judgement(pod, IdleVerdict.BUSY, "; ".join(busy), rule)
    unknown = [why for v, why in states if v is IdleVerdict.UNKNOWN]
    expected = pod.expected
    if len(readings) < expected:
        unknown.append(f"{expected - len(readings)} of {expected} GPUs have no data")
    if unknown:
        return Judgement(pod, IdleVerdict.UNKNOWN, "; ".join(unknown), rule)
    ack = parse_time(pod.ack_until_text)
    gpus = (
        f"{expected} GPUs (shared GPUs: every sharer)"
        if any(r.shared for r in readings)
        else f"{expected} GPUs"
    )
    reason = (f"all {gpus} under {config.threshold_percent:g}% for {config.window_seconds:g}s "
              f"(peak {max((r.max_percent or 0.0) for r in readings):g}%)")  # fmt: skip
    return Judgement(
        pod, IdleVerdict.IDLE, reason, rule, acknowledged=ack is not None and ack > now, action=action
    )


def _reclaim(j: Judgement) -> Reclaim | None:
    """Whether a reported pod's `idle-reclaimable` mark must be set or removed: it belongs on a pod that is
    idle, reported, unacknowledged and under a prefer-as-victim rule - nowhere else (unknown data included:
    GPU preemption must not act on an idleness it can no longer see). Unmarked pods lose it with the
    `idle-since` (`Unmark`)."""
    pod = j.pod
    if pod.idle_since_text is None:
        return None
    wanted = j.verdict is IdleVerdict.IDLE and not j.acknowledged and j.action == "prefer-as-victim"
    if wanted == pod.reclaimable:
        return None
    if wanted:
        return Reclaim(pod, True, j.rule, f"GPUs idle and reclaimable by preemption (rule {j.rule})")
    why = "acknowledged" if j.acknowledged else f"rule {j.rule} says {j.action}"
    if j.verdict is not IdleVerdict.IDLE:
        why = f"{j.verdict.value}: {j.reason}"
    return Reclaim(pod, False, j.rule, f"no longer reclaimable ({why})")


def plan_idle(snapshot: IdleSnapshot, policy: IdlePolicy, now: float) -> IdlePlan:
    """Judge every GPU pod and plan the pass's marks, unmarks, reclaimable marks and evictions."""
    config = policy.config
    judgements: list[Judgement] = []
    for pod in snapshot.pods:
        if not snapshot.telemetry:
            judgements.append(Judgement(pod, IdleVerdict.UNKNOWN, "utilization query failed"))
        else:
            judgements.append(judge(pod, snapshot.readings.get(pod.key, ()), config, now))
    marks: list[Mark] = []
    unmarks: list[Unmark] = []
    reclaims: list[Reclaim] = []
    evictions: list[Evict] = []
    over_budget: list[str] = []
    budget = max(0, config.max_evictions_per_hour - snapshot.recent_evictions)
    deferred: list[str] = []
    problems: list[str] = []
    for j in judgements:
        pod = j.pod
        if pod.ack_until_text is not None and parse_time(pod.ack_until_text) is None:
            problems.append(f"{pod.key}: unreadable idle-ack-until {pod.ack_until_text!r} (not acknowledged)")
        if j.verdict is IdleVerdict.IDLE and not j.acknowledged and pod.idle_since_text is None:
            if len(marks) >= config.max_marks_per_pass:
                deferred.append(pod.key)
                continue
            prefer = j.action == "prefer-as-victim"
            marks.append(Mark(pod, now - config.window_seconds, j.rule, f"GPUs idle: {j.reason}", prefer))
            continue
        no_longer = j.verdict in (IdleVerdict.BUSY, IdleVerdict.YOUNG, IdleVerdict.EXCLUDED)
        if no_longer and pod.idle_since_text is not None:
            unmarks.append(Unmark(pod, j.verdict, f"no longer idle ({j.verdict.value}): {j.reason}"))
            continue
        reclaim = _reclaim(j)
        if reclaim is not None:
            reclaims.append(reclaim)
        if j.verdict is IdleVerdict.IDLE and not j.acknowledged and j.action == "evict":
            since = parse_time(pod.idle_since_text)
            if since is None or now - since < config.evict_after_seconds:
                continue
            if len(evictions) >= budget:
                over_budget.append(pod.key)
                continue
            idle_for = (now - since) / 60
            evictions.append(Evict(pod, j.rule, f"idle for {idle_for:.0f} min (rule {j.rule}): {j.reason}"))
    return IdlePlan(
        now=now,
        dry_run=policy.dry_run,
        telemetry=snapshot.telemetry,
        judgements=tuple(judgements),
        marks=tuple(marks),
        unmarks=tuple(unmarks),
        reclaims=tuple(reclaims),
        evictions=tuple(evictions),
        over_budget=tuple(over_budget),
        deferred=tuple(deferred),
        problems=tuple(problems),
    )


def table_lines(doc: dict[str, Any]) -> list[str]:
    """`gpuwarden plan -o table`'s idle section from `IdlePlan.to_dict()`: each idle pod, since when, and
    its action."""
    idle = doc.get("idle") or []
    failed = "" if doc.get("telemetry") else " (utilization query failed: every pod unknown)"
    lines = ["", "IDLE GPUS" + ("" if idle else ": no idle pod") + failed]
    marking, evicting = ({x["pod"] for x in doc.get(k) or []} for k in ("mark", "evict"))
    held = set(doc.get("over_budget") or [])
    for i in idle:
        act = "report" if i["pod"] in marking else "evict" if i["pod"] in evicting else "reported"
        if i.get("action") == "prefer-as-victim" and act != "evict":
            act += ", reclaimable by preemption"
        elif i.get("action") == "scale-down":
            act += ", its owner scaled down when due"
        if i["acknowledged"]:
            act = "held (acknowledged)"
        elif i["pod"] in held:
            act = "evict held (budget)"
        lines.append(f"  {i['pod']} ({i['gpus']} GPUs) since {i['since'] or 'now'}: {act}; {i['reason']}")
    return lines
