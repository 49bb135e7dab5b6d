"""The `nominations:` section — when a pending pod's `status.nominatedNodeName` is stale and gets cleared.

Why: a nomination that outlives its reason keeps GPUs reserved for a pod that will never land there
(kubernetes#85677, #106780, #95752). Clearing one too early is worse: it removes the scheduler's own guard
against preempting a second set of victims elsewhere. The TTLs here are the only knobs between those two
failure modes; the terminating-victim guard itself is not configurable.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import DnsLabel, FieldError, Seconds


class Escalation(Section):
    """Opt-in: evict a pod whose nomination stays stuck, through the Eviction API (PDBs respected)."""

    enabled: bool = Field(
        default=False,
        description="Evict pods stuck past evict_after_seconds. Off: eviction deletes work, and a stuck "
        "nomination is usually fixed by clearing it.",
    )
    evict_after_seconds: Seconds = Field(
        default=3600.0,
        description="Seconds a pod may stay pending with a nomination before it is evicted so its "
        "controller recreates it. 1 h: far beyond any graceful termination.",
    )


class NominationsConfig(Section):
    """The nomination cleanup loop (leader-elected)."""

    enabled: bool = Field(default=True, description="Run the nomination cleanup loop in the controller.")
    dry_run: bool = Field(
        default=False,
        description="Decide and emit Events but never patch pods/status. false: a stale nomination only "
        "ever blocks capacity, and the terminating-victim guard keeps clearing safe.",
    )
    loop_interval_seconds: Seconds = Field(
        default=30.0,
        description="Seconds between scans of pending pods. 30 s: nominations matter on the scale of "
        "minutes, and one scan of 10,000 pending pods is cheap from the watch cache.",
    )
    ttl_seconds: Seconds = Field(
        default=300.0,
        ge=30,
        description="A nomination older than this, with no victim on the node still terminating, is stale. "
        "5 min: the scheduler binds within seconds of the last victim leaving, so older means stuck.",
    )
    not_ready_grace_seconds: Seconds = Field(
        default=60.0,
        description="A nominated node must be NotReady this long before its nominations count as stale, so "
        "a kubelet blip does not reshuffle preemptors.",
    )
    namespaces: list[DnsLabel] = Field(
        default_factory=list,
        description="Only clear nominations of pods in these namespaces. Empty: every namespace.",
    )
    escalation: Escalation = Field(default_factory=Escalation, description="Eviction of stuck pods.")

    @model_validator(mode="after")
    def _escalation_after_ttl(self) -> NominationsConfig:
        if self.escalation.evict_after_seconds <= self.ttl_seconds:
            raise FieldError(
                "escalation.evict_after_seconds",
                f"must be greater than ttl_seconds ({self.ttl_seconds:g}): clearing the nomination comes "
                "first, eviction only if that did not help",
            )
        return self
