"""Domain health: an NVLink domain (an NVL72 rack's clique) judged from its trays, graded like node signals.

Why it exists: a multi-node job needs the whole fabric, not one node. When a tray loses NVLink bandwidth or
the fabric goes down, the schedulers that place 64-GPU jobs inside a clique (Kueue TAS, KAI) must stop
choosing that clique, while single-node work may keep using its healthy trays. Per-node health cannot say
that; this module aggregates the node signals per domain (../shared/reference/autoscalers-and-domains.md §C).

Rules, table-tested in tests/unit/test_health_domains.py:
- the evidence is the node grading (`grading.py`): the hits that held this pass, confirmed or still
  debouncing, so boot grace applies (GB200 reports Fabric Manager `not_started` where no host FM runs; during
  a boot's grace nothing counts) and the domain's own debounce (below) runs alongside the tray's: with equal
  `consecutive` the domain is published in the pass its tray's signal is confirmed, not `consecutive` passes
  later; a signal set to `off` is never read, one set to `observe` still counts for its domain;
- *fabric down* on a tray: Fabric Manager status failing or a fatal NVSwitch SXid; *bandwidth lost*: a fabric
  health mask fault or NVLink errors over the threshold;
- `failed` when more than `failed_percent` of the members report fabric down (the fabric, not one tray);
- `degraded` when any tray lost bandwidth or reports fabric down, or more than `max_trays_out` trays are out
  (quarantined by us, or missing from `expected_trays` labelled members);
- `unknown` when nothing above holds but a member's telemetry is unknown (safety rule 1: never healthy on
  missing data; an excluded member is not read and does not make its domain unknown); an unknown domain
  neither starts nor releases anything and keeps its streaks;
- a verdict counts after `consecutive` passes in a row (`debounce.advance`, `is_domain_key` streaks):
  publishing and release both wait for it, so a published domain stays so until `healthy` held as long.

What it must not do: no I/O, no clock reads, no patches or Events (the plan says what to write; act writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from controller.gpus.domains import node_domain
from controller.health import plan as p
from controller.health.debounce import advance, streak_key
from controller.health.grading import FleetGrading, Graded
from controller.health.snapshot import NodeState, Streak
from gpuwarden.config.domains import DomainHealth, DomainsConfig
from gpuwarden.wellknown import NVLINK_DOMAIN_CONDITION, NVLINK_DOMAIN_HEALTH

DomainState = Literal["healthy", "degraded", "failed", "unknown"]
Published = Literal["degraded", "failed"]

FABRIC_DOWN_SIGNALS = frozenset({"fabric_manager", "nvswitch_fatal"})
BANDWIDTH_SIGNALS = frozenset({"fabric_health", "nvlink_errors"})

EVENT_DOMAIN_DEGRADED = "NVLinkDomainDegraded"
EVENT_DOMAIN_RELEASED = "NVLinkDomainHealthy"


@dataclass(frozen=True, slots=True)
class Tray:
    """One member as the domain rules see it: known telemetry or not, ours quarantined, the fabric
    evidence (confirmed hits' `why`) and what it carries of ours now."""

    node: str
    known: bool
    quarantined: bool = False
    fabric_down: tuple[str, ...] = ()
    bandwidth_lost: tuple[str, ...] = ()
    published: str | None = None
    """The `gpuwarden.io/nvlink-domain-health` label's value on the node now (None: absent)."""
    excluded: bool = False


def tray_of(node: NodeState, graded: Iterable[Graded], known: bool) -> Tray:
    """The member's evidence from the graded hits that held this pass (silenced ones are not graded)."""
    confirmed = [g for g in graded if g.action != "off"]
    down = tuple(sorted({f"{g.hit.reason} on {g.hit.gpu or 'node'}" for g in confirmed
                         if g.hit.signal in FABRIC_DOWN_SIGNALS}))  # fmt: skip
    lost = tuple(sorted({f"{g.hit.reason} on {g.hit.gpu or 'node'}" for g in confirmed
                         if g.hit.signal in BANDWIDTH_SIGNALS}))  # fmt: skip
    return Tray(
        node.name,
        known,
        quarantined=node.our_taint is not None,
        fabric_down=down,
        bandwidth_lost=lost,
        published=node.labels.get(NVLINK_DOMAIN_HEALTH),
        excluded=node.excluded,
    )


def judge(trays: tuple[Tray, ...], cfg: DomainHealth) -> tuple[DomainState, tuple[str, ...]]:
    """One pass's verdict on one domain and why (the rules in the module docstring)."""
    down = [t for t in trays if t.known and t.fabric_down]
    if trays and len(down) * 100.0 > cfg.failed_percent * len(trays):
        share = f"{len(down)} of {len(trays)} trays"
        return "failed", (f"fabric down on {share} (> {cfg.failed_percent:g}%)",)
    why: list[str] = []
    for t in trays:
        if t.known and (t.bandwidth_lost or t.fabric_down):
            why.append(f"{t.node}: " + ", ".join(t.fabric_down + t.bandwidth_lost))
    quarantined = [t.node for t in trays if t.quarantined]
    missing = max(0, cfg.expected_trays - len(trays))
    out = len(quarantined) + missing
    if out > cfg.max_trays_out:
        parts = [f"{len(quarantined)} quarantined"] if quarantined else []
        parts += [f"{missing} missing of {cfg.expected_trays}"] if missing else []
        why.append(f"{out} trays out (> {cfg.max_trays_out}): {', '.join(parts)}")
    if why:
        return "degraded", tuple(why)
    unknown = [t.node for t in trays if not t.known and not t.excluded]
    if unknown:
        return "unknown", (f"telemetry unknown on {', '.join(unknown)}",)
    return "healthy", ()


@dataclass(frozen=True, slots=True)
class DomainVerdict:
    """One domain this pass: the raw verdict, how long it held, and what its members should carry."""

    domain: str
    state: DomainState
    why: tuple[str, ...]
    members: tuple[Tray, ...]
    count: int = 0
    needed: int = 1
    since: float | None = None
    published: Published | None = None
    """What the members carry now (the most severe label value among them; None: nothing)."""

    @property
    def confirmed(self) -> bool:
        return self.state != "unknown" and self.count >= self.needed

    @property
    def target(self) -> Published | None:
        """What the members should carry after this pass: the verdict once confirmed, else what they carry."""
        if not self.confirmed:
            return self.published
        return None if self.state == "healthy" else "failed" if self.state == "failed" else "degraded"


@dataclass(frozen=True, slots=True)
class MemberChange:
    """One node's publication to change: its label value (None: remove), condition, taint (by option)."""

    node: str
    domain: str
    label: Published | None
    taint: bool
    message: str


@dataclass
class DomainGrading:
    """Every domain's verdict, the member changes they call for, and the streaks to carry."""

    verdicts: dict[str, DomainVerdict] = field(default_factory=dict)
    changes: tuple[MemberChange, ...] = ()
    streaks: dict[str, Streak] = field(default_factory=dict)


def _published(trays: Iterable[Tray]) -> Published | None:
    values = {t.published for t in trays}
    return "failed" if "failed" in values else "degraded" if values - {None} else None


DOMAIN_KEY_PREFIX = "domain:"
"""Domain streaks share the health loop's streak map with the node signals' (`<node>/<signal>/<gpu>`): a
node name never holds a colon, so a key `domain:<name>/domain_<state>/` is never a node's."""


def is_domain_key(key: str) -> bool:
    return key.startswith(DOMAIN_KEY_PREFIX)


def _key(domain: str, state: DomainState) -> str:
    return streak_key(DOMAIN_KEY_PREFIX + domain, f"domain_{state}", "")


def grade_domains(
    nodes: Iterable[NodeState],
    grading: FleetGrading,
    known: set[str],
    cfg: DomainsConfig,
    previous: Mapping[str, Streak],
    now: float,
) -> DomainGrading:
    """Judge every domain among `nodes` (`known`: nodes whose telemetry was evaluated this pass) and plan
    the member changes: a node's label follows its domain's `target`; a node carrying our label while in no
    domain loses it. Excluded nodes (`gpuwarden.io/exclude=true`) are judged as members but never changed."""
    out = DomainGrading()
    if not cfg.enabled or cfg.health.action == "off":
        return out
    members: dict[str, list[Tray]] = {}
    strays: list[Tray] = []
    for node in nodes:
        tray = tray_of(node, grading.graded.get(node.name, ()), node.name in known)
        domain = node_domain(node.labels, cfg.clique_label)
        if domain is not None:
            members.setdefault(domain, []).append(tray)
        elif tray.published is not None:
            strays.append(tray)
    held: dict[str, str] = {}
    evaluated: set[str] = set()
    judged: dict[str, tuple[DomainState, tuple[str, ...], tuple[Tray, ...]]] = {}
    for domain, found in sorted(members.items()):
        trays = tuple(sorted(found, key=lambda t: t.node))
        state, why = judge(trays, cfg.health)
        judged[domain] = (state, why, trays)
        if state != "unknown":
            evaluated.add(domain)
            held[_key(domain, state)] = domain
    out.streaks = advance(previous, held, evaluated, now)
    changes: list[MemberChange] = []
    publish = cfg.health.action in ("degrade", "quarantine")
    for domain, (state, why, trays) in judged.items():
        streak = out.streaks.get(_key(domain, state)) if state != "unknown" else None
        verdict = DomainVerdict(
            domain,
            state,
            why,
            trays,
            count=streak.count if streak else 0,
            needed=cfg.health.consecutive,
            since=streak.since if streak else None,
            published=_published(trays),
        )
        out.verdicts[domain] = verdict
        if not publish:
            continue
        target = verdict.target
        message = _message(domain, target, verdict.why)
        for t in trays:
            if not t.excluded and t.published != target:
                changes.append(
                    MemberChange(t.node, domain, target, cfg.health.action == "quarantine", message)
                )
    if publish:
        for t in strays:
            if not t.excluded:
                changes.append(
                    MemberChange(t.node, "", None, False, "the node is in no NVLink domain any more")
                )
    out.changes = tuple(changes)
    return out


def _message(domain: str, target: Published | None, why: tuple[str, ...]) -> str:
    if target is None:
        return f"NVLink domain {domain} is healthy"
    return f"NVLink domain {domain} is {target}: " + "; ".join(why)


def publication_action(change: MemberChange) -> p.Action:
    """A member change as a health plan action: the label (and taint, by option), the `NVLinkDomainHealthy`
    condition, and an Event on the node (dry-run: the Event only, as for every health action)."""
    pub = p.DomainPublication(change.label, change.taint and change.label is not None)
    if change.label is None:
        condition = p.ConditionUpdate(
            "True", "NVLinkDomainHealthy", change.message, type=NVLINK_DOMAIN_CONDITION
        )
        event = p.EventSpec(EVENT_DOMAIN_RELEASED, "Normal", change.message, "ReleaseDomain")
        return p.Action("domain-release", change.node, "nvlink-domain-healthy", change.message,
                        condition=condition, event=event, domain=pub)  # fmt: skip
    reason = f"NVLinkDomain{change.label.capitalize()}"
    condition = p.ConditionUpdate("False", reason, change.message, type=NVLINK_DOMAIN_CONDITION)
    note = change.message + ("; members tainted" if pub.taint else "; no taint: single-node work may stay")
    event = p.EventSpec(EVENT_DOMAIN_DEGRADED, "Warning", note, "DegradeDomain")
    return p.Action("domain-degrade", change.node, f"nvlink-domain-{change.label}", change.message,
                    condition=condition, event=event, domain=pub)  # fmt: skip
