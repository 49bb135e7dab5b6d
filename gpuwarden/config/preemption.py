"""The `preemption:` section — bounds on scheduler preemption, enforced in the extender's `preempt` verb.

Why: preemption can cascade (A preempts B, B's replacement preempts C) and ping-pong between two workloads
(kubernetes#130429; Kueue KEP-1337, KEP-14468). kube-scheduler honours an extender's answer to `preempt`, so
the budgets, chain limit and back-off here are what stop a storm. Budgets count victims (one `Preempted`
event each), in sliding windows; they are sized so that one high-priority job taking two 8-GPU nodes is never
throttled while a fleet-wide cascade is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import (
    Count,
    DnsLabel,
    FieldError,
    Integer,
    PositiveCount,
    QualifiedName,
    Seconds,
)
from gpuwarden.wellknown import TENANT


class Budget(Section):
    """At most `max_victims` pods preempted per `window_seconds` (sliding) in one scope."""

    max_victims: PositiveCount = Field(description="Victims allowed per window.")
    window_seconds: Seconds = Field(description="Sliding window in seconds.")


class Backoff(Section):
    """Exponential back-off per (preemptor workload, node), after Kueue's reclaim back-off (KEP-14468)."""

    base_seconds: Seconds = Field(
        default=60.0, description="First back-off after a preemption, in seconds. Kueue's default."
    )
    max_seconds: Seconds = Field(default=3600.0, description="Back-off cap in seconds. Kueue's default.")
    reset_seconds: Seconds = Field(
        default=600.0,
        description="Seconds without a preemption after which the back-off starts again from base. "
        "Kueue's default.",
    )
    burst_seconds: Seconds = Field(
        default=30.0,
        le=3600,
        description="Preemptions within this many seconds of a back-off round's start belong to that "
        "round instead of doubling the back-off: one scheduling decision evicts several pods over a few "
        "seconds. 30 s covers kube-scheduler's victim deletions and their Events arriving. Must be less "
        "than base_seconds, or the next round would join the previous one and the back-off never grow.",
    )

    @model_validator(mode="after")
    def _base_below_max(self) -> Backoff:
        if self.base_seconds > self.max_seconds:
            raise FieldError("base_seconds", f"must not exceed max_seconds ({self.max_seconds:g})")
        return self

    @model_validator(mode="after")
    def _burst_below_base(self) -> Backoff:
        # A round waits at least base_seconds; a preemption within burst_seconds of the round's start joins
        # that round. With burst >= base the next preemption after the wait still joins it: no doubling.
        if self.burst_seconds >= self.base_seconds:
            raise FieldError(
                "burst_seconds",
                f"must be less than base_seconds ({self.base_seconds:g}), got {self.burst_seconds:g}: "
                "otherwise the next round counts as the same burst and the back-off never grows",
            )
        return self


class MakeRoomConfig(Section):
    """GPU preemption by the controller: make room on fragmented nodes (docs/preemption.md)."""

    enabled: bool = Field(
        default=False,
        description="Evict lower-priority pods (Eviction API, PodDisruptionBudgets honoured) so that a "
        "pending GPU pod rejected only for topology gets a GPU set its policy accepts. Off by default: it "
        "evicts.",
    )
    dry_run: bool = Field(
        default=False,
        description="Plan, count and event GPU preemptions ('[dry-run]') without reserving or evicting.",
    )
    interval_seconds: Seconds = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds between passes of the leader's loop.",
    )
    min_pending_seconds: Seconds = Field(
        default=5.0,
        le=3600,
        description="A pod must have been unschedulable (PodScheduled=False) this long: the scheduler and "
        "the extender get the first chance.",
    )
    reservation_seconds: Seconds = Field(
        default=180.0,
        gt=0,
        le=3600,
        description="The freed GPUs are held for the preemptor this long (a claim with a deadline) so no "
        "other pod takes them while victims exit; longer than the victims' termination grace period.",
    )
    max_victims_per_pod: PositiveCount = Field(
        default=4, le=12, description="Most pods evicted to make room for one preemptor."
    )
    max_preemptors_per_pass: PositiveCount = Field(
        default=10, description="Most preemptors given room per pass (the throttle's budgets also apply)."
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Only make room for pods in these namespaces. Empty: every namespace.",
    )


class Tenant(Section):
    """A tenant named in config: the namespaces it owns (globs) and, optionally, its guaranteed GPUs."""

    name: DnsLabel = Field(description="The tenant's name (in Events, metrics and `gpuwarden plan`).")
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespace globs (fnmatch: `team-a-*`, `ml-?`) owned by this tenant, for namespaces "
        "that carry no tenant label. A namespace matching several tenants belongs to the first listed.",
    )
    guaranteed_gpus: Count | None = Field(
        default=None,
        description="GPUs guaranteed to the tenant (Kueue's nominal quota). null: the sum of the "
        "`requests.<gpu resource>` hard limits of its namespaces' ResourceQuotas (0 when none).",
    )


class TenantsConfig(Section):
    """Whom a preemption may take GPUs from across tenants (docs/preemption.md, *Tenants*)."""

    rule: Literal["any", "within-tenant", "over-share"] = Field(
        default="any",
        description="`any`: victims from every tenant (kube-scheduler's behaviour; the default, so that "
        "upgrading changes nothing). `within-tenant`: victims only from the preemptor's tenant. "
        "`over-share`: a victim in another tenant only while that tenant holds more GPUs than its "
        "guaranteed share, and only as many GPUs as bring it back to the share (Kueue's reclaim of "
        "borrowed quota). Applied by the preempt verb and by GPU preemption (make-room).",
    )
    namespace_label: QualifiedName = Field(
        default=TENANT,
        description="Namespace label naming the namespace's tenant; it wins over `tenants[].namespaces`.",
    )
    tenants: list[Tenant] = Field(
        default_factory=list,
        description="Tenants by namespace glob, with guaranteed shares. A namespace with neither the label "
        "nor a matching glob is a tenant of its own, named after it, with the share of its own quotas: a "
        "namespace is Kubernetes' unit of ownership, and pooling unrelated namespaces into one default "
        "tenant would let them preempt each other under `within-tenant`.",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> TenantsConfig:
        seen: set[str] = set()
        for i, tenant in enumerate(self.tenants):
            if tenant.name in seen:
                raise FieldError(f"tenants.{i}.name", f"tenant {tenant.name!r} is listed twice")
            seen.add(tenant.name)
        return self


class PreemptionConfig(Section):
    """The preemption throttle: budgets, chain and ping-pong detection, back-off; GPU preemption."""

    enabled: bool = Field(
        default=True,
        description="Throttle in the extender's preempt verb. false: pass the scheduler's candidates "
        "through unchanged.",
    )
    dry_run: bool = Field(
        default=False,
        description="Compute and log/event throttling decisions but pass candidates through unchanged.",
    )
    global_budget: Budget | None = Field(
        default_factory=lambda: Budget(max_victims=50, window_seconds=300),
        description="Cluster-wide victims per window. Default 50 per 5 min. null: no global budget.",
    )
    namespace_budget: Budget | None = Field(
        default_factory=lambda: Budget(max_victims=20, window_seconds=300),
        description="Victims per preemptor namespace per window. Default 20 per 5 min. null: none.",
    )
    workload_budget: Budget | None = Field(
        default_factory=lambda: Budget(max_victims=16, window_seconds=600),
        description="Victims per preemptor workload (owning ReplicaSet, Job, ...) per window. Default 16 "
        "per 10 min: two 8-GPU nodes of single-GPU pods. null: none.",
    )
    max_chain_depth: PositiveCount = Field(
        default=2,
        description="Longest allowed preemption chain: 1 allows no preemption by a recent victim, 2 allows "
        "one follow-on (a legitimate priority ladder) but not a cascade.",
    )
    chain_window_seconds: Seconds = Field(
        default=900.0,
        description="A victim stays 'recent' for chain and ping-pong detection this many seconds: long "
        "enough for its controller to recreate it and for the replacement to be scheduled.",
    )
    prevent_ping_pong: bool = Field(
        default=True,
        description="Never let a preemptor evict a pod of a workload that recently preempted it (A↔B).",
    )
    backoff: Backoff = Field(default_factory=Backoff, description="Per (workload, node) back-off.")
    exempt_min_priority: Integer | None = Field(
        default=2_000_000_000,
        description="Preemptors with at least this priority are never throttled. 2e9 is "
        "system-cluster-critical: node agents must always fit. null: throttle everyone.",
    )
    make_room: MakeRoomConfig = Field(
        default_factory=MakeRoomConfig,
        description="GPU preemption by the controller for pods rejected only because the free GPUs are "
        "fragmented (kube-scheduler v1.35 cannot preempt for them).",
    )
    tenants: TenantsConfig = Field(
        default_factory=TenantsConfig,
        description="The cross-tenant rule: which tenants' pods a preemption may take (default `any`).",
    )
    event_interval_seconds: Seconds = Field(
        default=60.0,
        le=86400,
        description="At most one PreemptionThrottled Event per preemptor and verdict per this many "
        "seconds; the scheduler retries a throttled pod every few seconds. Repeats within the Event "
        "recorder's window are counted on the Event (series) rather than written anew.",
    )
