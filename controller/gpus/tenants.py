"""Tenants, their guaranteed GPU shares, and the cross-tenant rule every preemption obeys.

Why it exists: kube-scheduler's preemption ignores namespaces, so one team's PriorityClass decides another
team's jobs. A *tenant* is a set of namespaces (the namespace label `gpuwarden.io/tenant`, else the first
config tenant whose globs match, else the namespace alone); each has a guaranteed GPU share (config, else
the sum of its namespaces' ResourceQuota `requests.<gpu resource>` hard limits). The rule says whom a
preemption may take:

* `any` — everyone (kube-scheduler's behaviour, the default);
* `within-tenant` — only pods of the preemptor's own tenant;
* `over-share` — pods of another tenant only while that tenant holds more GPUs than its share, and only as
  many GPUs as bring it back to the share: a guarantee is never broken by someone else's preemption, so a
  tenant 1 GPU over its share does not lose a 4-GPU pod (Kueue reclaims from a queue while it still
  borrows, and may overshoot; docs/preemption.md compares the two).

Pods of the preemptor's own namespace are always allowed (a namespace is in exactly one tenant). A pod whose
tenant cannot be told (its Namespace not in the snapshot) is never taken from another namespace under
`within-tenant` or `over-share`: unknown is never "preemptable".

The victim choice (`victims.plan_victims`) asks `refuse` while it searches, so the verb's added victims and
make-room's plans pick only allowed pods; the throttle (`decide_preemption`) asks it again for every
candidate, the scheduler's own victims included, so a refused victim drops the node with its reason.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from gpuwarden.config.preemption import TenantsConfig
from gpuwarden.wellknown import TENANT


class Rule(StrEnum):
    ANY = "any"
    WITHIN_TENANT = "within-tenant"
    OVER_SHARE = "over-share"


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """The `preemption.tenants` config section, as the rule reads it."""

    rule: Rule = Rule.ANY
    label: str = TENANT
    groups: tuple[tuple[str, tuple[str, ...], int | None], ...] = ()
    """(tenant name, namespace globs, guaranteed GPUs or None = from ResourceQuotas), first match wins."""


def policy_from_config(cfg: TenantsConfig) -> TenantPolicy:
    """The policy for a validated `preemption.tenants` section."""
    groups = tuple((t.name, tuple(t.namespaces), t.guaranteed_gpus) for t in cfg.tenants)
    return TenantPolicy(Rule(cfg.rule), cfg.namespace_label, groups)


def tenant_of(namespace: str, labels: Mapping[str, str], policy: TenantPolicy) -> str:
    """The tenant of a namespace: its label, else the first config tenant whose glob matches, else itself."""
    label = labels.get(policy.label)
    if label:
        return label
    for name, globs, _ in policy.groups:
        if any(fnmatchcase(namespace, g) for g in globs):
            return name
    return namespace


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Who is in which tenant, what each is guaranteed and what it holds now (bound, not terminating)."""

    rule: Rule = Rule.ANY
    namespaces: Mapping[str, str] = field(default_factory=dict)
    """namespace -> tenant, for every namespace in the snapshot."""
    share: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)

    def tenant(self, namespace: str) -> str | None:
        return self.namespaces.get(namespace)

    def excess(self, tenant: str) -> int:
        """GPUs held beyond the guaranteed share (negative: below it)."""
        return self.held.get(tenant, 0) - self.share.get(tenant, 0)

    def preemptable(self, tenant: str) -> int:
        """GPUs of the tenant other tenants' preemptions may take now (for `gpuwarden plan`)."""
        if self.rule is Rule.ANY:
            return self.held.get(tenant, 0)
        if self.rule is Rule.WITHIN_TENANT:
            return 0
        return max(0, self.excess(tenant))

    def tenants(self) -> list[str]:
        return sorted(set(self.namespaces.values()) | set(self.share) | set(self.held))


def _quantity(value: Any) -> int:
    """A ResourceQuota GPU quantity (`8`, `"8"`, `"8000m"`) as whole GPUs, rounded down; 0 if unreadable."""
    text = str(value).strip()
    try:
        if text.endswith("m"):
            return int(text[:-1]) // 1000
        return int(float(text))
    except ValueError:
        return 0


def tenancy_from(
    namespaces: Iterable[Mapping[str, Any]],
    quotas: Iterable[Mapping[str, Any]],
    held: Iterable[tuple[str, int]],
    policy: TenantPolicy,
    resource: str,
) -> Tenancy:
    """Tenancy from Namespace objects, ResourceQuota objects and (namespace, GPUs) per GPU holder.

    A tenant's share is its config `guaranteed_gpus` when set, else the sum over its namespaces' quotas of
    `spec.hard["requests.<resource>"]` (the limit a platform team already writes per team)."""
    of: dict[str, str] = {}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        name = str(meta.get("name", ""))
        if name:
            of[name] = tenant_of(name, meta.get("labels") or {}, policy)
    configured = {name: gpus for name, _, gpus in policy.groups if gpus is not None}
    share: dict[str, int] = dict(configured)
    key = f"requests.{resource}"
    for quota in quotas:
        tenant = of.get(str((quota.get("metadata") or {}).get("namespace", "")))
        hard = (quota.get("spec") or {}).get("hard") or {}
        if tenant is None or tenant in configured or key not in hard:
            continue
        share[tenant] = share.get(tenant, 0) + _quantity(hard[key])
    holding: dict[str, int] = {}
    for namespace, gpus in held:
        tenant = of.get(namespace)
        if tenant is not None and gpus > 0:
            holding[tenant] = holding.get(tenant, 0) + gpus
    return Tenancy(policy.rule, of, share, holding)


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod a preemption would take: `pod` is `namespace/name`, `gpus` the GPUs it holds."""

    pod: str
    gpus: int

    @property
    def namespace(self) -> str:
        return self.pod.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why `victim` may not be taken (a sentence for Events, logs and the filter's note)."""

    victim: str
    tenant: str | None
    reason: str


def refuse(
    preemptor_namespace: str,
    victims: Sequence[Victim],
    tenancy: Tenancy,
    taken: Mapping[str, int] | None = None,
) -> Refusal | None:
    """The first victim the rule refuses (in the order given), or None when all may be taken.

    `taken`: GPUs already taken from each tenant by other preemptions decided in the same pass; the
    victims' GPUs add to it, so under `over-share` several victims of one tenant together stay within what
    it holds beyond its share."""
    if tenancy.rule is Rule.ANY:
        return None
    mine = tenancy.tenant(preemptor_namespace)
    took: dict[str, int] = dict(taken or {})
    for v in victims:
        if v.namespace == preemptor_namespace:
            continue
        theirs = tenancy.tenant(v.namespace)
        if theirs is None:
            return Refusal(v.pod, None, f"{v.pod}: tenant of namespace {v.namespace} unknown")
        if mine is not None and theirs == mine:
            continue
        if tenancy.rule is Rule.WITHIN_TENANT:
            return Refusal(
                v.pod, theirs, f"{v.pod} is in tenant {theirs}, not {mine or '?'} (rule within-tenant)"
            )
        left = tenancy.excess(theirs) - took.get(theirs, 0)
        if left <= 0 or v.gpus > left:
            held, share = tenancy.held.get(theirs, 0), tenancy.share.get(theirs, 0)
            return Refusal(
                v.pod,
                theirs,
                f"{v.pod} is in tenant {theirs}, which holds {held} GPUs of a {share}-GPU share: taking "
                f"its {v.gpus} would leave it below its share (rule over-share, "
                f"{max(0, left)} GPUs preemptable)",
            )
        took[theirs] = took.get(theirs, 0) + v.gpus
    return None


def taken_by(victims: Iterable[Victim], tenancy: Tenancy) -> dict[str, int]:
    """GPUs per tenant these victims hold (what a decided preemption takes, for the next `refuse`)."""
    out: dict[str, int] = {}
    for v in victims:
        tenant = tenancy.tenant(v.namespace)
        if tenant is not None:
            out[tenant] = out.get(tenant, 0) + v.gpus
    return out
