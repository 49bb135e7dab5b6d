"""The `idle:` section — finding pods that hold GPUs they do not use, and what is done about them.

Why: the scheduler counts requests, not use; a pod holding 8 GPUs at 0 % keeps another tenant's job Pending.
A pod is idle when every GPU it holds stayed under `threshold_percent` for `window_seconds` (DCGM
`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, else `DCGM_FI_DEV_GPU_UTIL`). Missing data is unknown, never idle; young
pods and opted-out pods are never idle. Per-namespace/label rules choose the action: `report` (the
`gpuwarden.io/idle-since` annotation, Events on the pod and its owner, metrics, an alert); `prefer-as-victim`
reports and marks the pod reclaimable (GPU preemption takes idle pods first, equal priority included);
`scale-down` reports first, then scales the pod's owner down (never below an HPA's minReplicas);
`evict` reports first, then evicts through the Eviction API (PodDisruptionBudgets hold) once the pod has
stayed idle `evict_after_seconds`, at most `max_evictions_per_hour` across the fleet.
Off by default and dry-run by default: an operator first sees what would be reported.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, LabelName, Percent, Seconds
from gpuwarden.wellknown import IDLE_EXCLUDE

IdleAction = Literal["report", "prefer-as-victim", "scale-down", "evict", "ignore"]
"""report: annotate, Event and count the idle pod; prefer-as-victim: report, and mark it
`gpuwarden.io/idle-reclaimable` so GPU preemption and the preempt verb take it before busy pods and a pending
pod of equal or higher priority may reclaim its GPUs; scale-down: report, then scale its owner (Deployment,
StatefulSet, ReplicaSet) down after `scale_down_after_seconds`; evict: report, then evict it after
`evict_after_seconds`; ignore: never judge pods the rule matches."""


class IdleRule(Section):
    """One policy rule: pods matching its namespaces and/or labels get its action (first match wins)."""

    name: str = Field(min_length=1, max_length=63, description="Shown in Events and `gpuwarden plan`.")
    namespaces: list[str] = Field(
        default_factory=list, description="Namespace globs (fnmatch, e.g. `team-*`). Empty: every namespace."
    )
    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Pod labels that must all match. Empty: every pod."
    )
    action: IdleAction = Field(
        description="What idle pods matching the rule get: report, prefer-as-victim, scale-down, evict or "
        "ignore."
    )


class IdleMetricLabels(Section):
    """Label names of dcgm-exporter's series. With Prometheus' default `honor_labels: false` the exporter's
    `pod`/`namespace` arrive as `exported_pod`/`exported_namespace`; released exporters say `Hostname`."""

    pod: LabelName = Field(default="pod", description="The label naming the pod that holds the GPU.")
    namespace: LabelName = Field(default="namespace", description="The label naming the pod's namespace.")
    node: LabelName = Field(default="Hostname", description="The label naming the node (`hostname` on main).")
    gpu: LabelName = Field(default="gpu", description="The label holding the GPU index (the `gpu-ids` id).")
    uuid: LabelName = Field(
        default="UUID",
        description="The label holding the physical GPU's UUID (the parent GPU's on MIG series): joins the "
        "kubelet's device IDs (GPU UUIDs, time-slicing/MPS replicas `<uuid>::<n>`, MIG devices) to their "
        "GPU.",
    )
    gpu_instance: LabelName = Field(
        default="GPU_I_ID",
        description="The label holding the MIG GPU instance id on per-instance series: a MIG device is "
        "judged on its own instance's DCGM_FI_PROF_GR_ENGINE_ACTIVE (DCGM_FI_DEV_GPU_UTIL does not exist on "
        "MIG).",
    )


class IdleConfig(Section):
    """The idle-GPU loop (leader-elected)."""

    enabled: bool = Field(
        default=False,
        description="Run idle-GPU detection. Off by default: it annotates and events tenants' pods.",
    )
    dry_run: bool = Field(
        default=True,
        description="Decide, log and count; write no annotation and emit Events prefixed [dry-run]. true by "
        "default (as gpu-pruner): an operator sees what would be reported before anything is written.",
    )
    loop_interval_seconds: Seconds = Field(
        default=60.0, description="Seconds between passes. 60 s: idleness is judged over tens of minutes."
    )
    threshold_percent: Percent = Field(
        default=1.0,
        description="A GPU is idle while its utilization stays under this percentage for the whole window "
        "(GR_ENGINE_ACTIVE is scaled to percent). 1 %: gpu-pruner's default of 0.01.",
    )
    window_seconds: Seconds = Field(
        default=1800.0,
        ge=60,
        description="How long every GPU of a pod must stay under the threshold. 30 min: gpu-pruner's "
        "default; HPC centres act after 15 min (warning) to 2 h (kill).",
    )
    warmup_seconds: Seconds = Field(
        default=600.0,
        description="A pod is never idle in its first this-many seconds (loading data, compiling kernels). "
        "It is also never judged before the window fits inside its lifetime.",
    )
    scrape_interval_seconds: Seconds = Field(
        default=30.0,
        description="dcgm-exporter's scrape interval, to tell a window with gaps from a full one.",
    )
    min_coverage_percent: Percent = Field(
        default=80.0,
        description="A GPU whose samples cover less than this share of the window is unknown, never idle "
        "(an exporter restart or a scrape outage is not idleness).",
    )
    power_threshold_watts: float | None = Field(
        default=None,
        gt=0,
        description="Corroboration (gpu-pruner's --power-threshold): a GPU whose power draw "
        "(DCGM_FI_DEV_POWER_USAGE) reached this many watts in the window is busy even under the utilization "
        "threshold; without power data it is unknown. null (default): utilization alone decides.",
    )
    default_action: IdleAction = Field(default="report", description="Action of pods no rule matches.")
    rules: list[IdleRule] = Field(default_factory=list, description="Policy rules, first match wins.")
    exclude_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system"],
        description="Namespace globs never judged. kube-system: infrastructure holding GPUs is not waste.",
    )
    exclude_label: str = Field(
        default=IDLE_EXCLUDE, description='Pods with this label set to "true" are never judged idle.'
    )
    metric_labels: IdleMetricLabels = Field(
        default_factory=IdleMetricLabels, description="dcgm-exporter's label names."
    )
    max_marks_per_pass: int = Field(
        default=50,
        ge=1,
        description="At most this many pods newly reported per pass (annotation + Events); the rest wait for "
        "the next pass. 50: a fleet-wide outage that looks like idleness cannot flood the Event stream.",
    )

    evict_after_seconds: Seconds = Field(
        default=3600.0,
        description="Action evict: a pod is evicted once its idle-since is this old (it was reported, and "
        "stayed idle, all that time). 1 h: time for the owner to react to the GPUIdle Event or acknowledge.",
    )
    scale_down_after_seconds: Seconds = Field(
        default=3600.0,
        description="Action scale-down: a pod's owner is scaled down once the pod's idle-since is this old. "
        "1 h: as evict_after_seconds, time for the owner to react to the GPUIdle Event or acknowledge.",
    )
    scale_down_to: Literal["one-less", "zero"] = Field(
        default="one-less",
        description="Action scale-down: `one-less` takes one replica per idle pod of the owner and pass "
        "(a Deployment's idle pod goes first: it gets the lowest pod-deletion-cost); `zero` scales the owner "
        "to 0. Never below a HorizontalPodAutoscaler's minReplicas: the scale-down is held and says why.",
    )
    max_scale_downs_per_hour: int = Field(
        default=5,
        ge=1,
        description="Action scale-down: at most this many owners scaled down across the fleet in any hour "
        "(counted from gpuwarden's GPUIdleScaledDown Events: a leader change grants no fresh budget). 5: a "
        "wrong threshold cannot empty a cluster.",
    )
    max_evictions_per_hour: int = Field(
        default=5,
        ge=1,
        description="Action evict: at most this many idle evictions across the fleet in any hour (counted "
        "from gpuwarden's GPUIdlePodEvicted Events: a leader change grants no fresh budget). 5: a wrong "
        "threshold cannot empty a cluster.",
    )

    @model_validator(mode="after")
    def _check(self) -> IdleConfig:
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise FieldError("rules", f"rule names must be unique; repeated: {', '.join(dup)}")
        if self.scrape_interval_seconds * 2 > self.window_seconds:
            raise FieldError(
                "scrape_interval_seconds",
                f"must be at most half of window_seconds ({self.window_seconds:g}) so a window holds samples",
            )
        return self
