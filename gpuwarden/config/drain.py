"""The `drain:` section — moving running work off quarantined GPUs, and the gate that bounds it.

Why: quarantine only stops *new* pods; the job on a GPU that fell off the bus keeps running into the wall or
hangs its NCCL peers. Draining evicts it through the Eviction API (PodDisruptionBudgets hold) with GPU
precision: a one-GPU fault moves only the pods holding that GPU. Everything an operator must be able to
reason about is here: which pods wait for completion, how fast the fleet may be drained, when it stops.
Off by default: draining ends running work, and the quarantine breaker already bounds the taint side.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, Percent, PositiveCount, Seconds
from gpuwarden.config.remediation import RemediationConfig
from gpuwarden.wellknown import DRAIN_EXCLUDE

DrainMode = Literal["immediate", "allow-completion", "never"]


class DrainRule(Section):
    """One mode rule: pods matching its namespaces and/or labels get its mode (first matching rule wins)."""

    name: str = Field(min_length=1, max_length=63, description="Shown in Events and `gpuwarden plan`.")
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces the rule applies to. Empty: every namespace."
    )
    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Pod labels that must all match. Empty: every pod."
    )
    mode: DrainMode = Field(
        description="immediate: evict now; allow-completion: wait for the pod to finish, up to "
        "completion_deadline_seconds, then evict; never: report only."
    )
    completion_deadline_seconds: Seconds = Field(
        default=3600.0,
        description="allow-completion: seconds from the start of the drain after which the pod is evicted.",
    )
    delete_after_seconds: Seconds | None = Field(
        default=None,
        description="Seconds after which a pod that Evictions cannot move (a PDB) is deleted instead. null "
        "(default): never; a PDB is respected for as long as it forbids the eviction.",
    )


class DrainGate(Section):
    """Bounds on draining across the fleet; a closed gate adds nothing and forces nothing."""

    max_draining_nodes: PositiveCount = Field(
        default=2, description="At most this many nodes draining at once. 2: a bad batch cannot empty a rack."
    )
    max_evictions_per_minute: PositiveCount = Field(
        default=10,
        description="Fleet-wide evictions per minute. 10: the scheduler and the jobs' controllers keep up.",
    )
    rate_window_seconds: Seconds = Field(
        default=60.0,
        description="The window max_evictions_per_minute counts evictions over, in seconds. 60 (the minute "
        "the name says): leave it; the e2e tests shorten it so a rate across leaders is proven in seconds.",
    )
    min_schedulable_percent: Percent = Field(
        default=75.0,
        description="No new drain while fewer than this percentage of GPU nodes accept pods (untainted, "
        "not cordoned): evicted pods would have nowhere to go, and a mass fault is more likely a bug.",
    )


class DrainConfig(Section):
    """The drain loop (leader-elected, part of the health controller)."""

    enabled: bool = Field(default=False, description="Drain quarantined nodes. Off: quarantine only.")
    dry_run: bool = Field(
        default=False, description="Plan, log and event the drains; evict nothing, write no drain state."
    )
    paused: bool = Field(
        default=False,
        description="Stop starting and advancing drains (nothing is cancelled); the node annotation "
        "`gpuwarden.io/drain-pause=true` pauses one node.",
    )
    default_mode: DrainMode = Field(
        default="immediate",
        description="Mode of pods no rule matches. immediate: a pod on a failed GPU cannot finish its work.",
    )
    rules: list[DrainRule] = Field(default_factory=list, description="Mode rules, first match wins.")
    exclude_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system"],
        description="Never drained (report only). kube-system: cluster infrastructure has its own lifecycle.",
    )
    exclude_label: str = Field(
        default=DRAIN_EXCLUDE,
        description='Pods with this label set to "true" are never drained (report only).',
    )
    retry_backoff_seconds: Seconds = Field(
        default=10.0, description="First retry after an Eviction answered 429 (PDB); doubles up to 2 min."
    )
    gate: DrainGate = Field(default_factory=DrainGate, description="Fleet-wide bounds.")
    remediation: RemediationConfig = Field(
        default_factory=RemediationConfig, description="Hand-off of drained nodes to a remediator (opt-in)."
    )

    @model_validator(mode="after")
    def _unique_rule_names(self) -> DrainConfig:
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FieldError("rules", f"rule names must be unique; repeated: {', '.join(dup)}")
        return self
