"""The `health:` section — GPU-health quarantine policy: what counts as failed, how hard to act, when to stop.

Why: every number that decides whether a node is tainted is policy an operator must be able to read and tune
without reading code — XID classification overrides, ECC and row-remap thresholds, the taint effect per
reason class, the circuit breaker and the release hysteresis. The XID catalog itself ships as data with the
controller; this section only overrides it. The defaults follow ../shared/reference/gpu-health.md: DCGM's own
FAIL limits for ECC, NVIDIA's catalog for XIDs, and a breaker stricter than NVSentinel's (50 % in 5 min),
because one crashed job once flagged 77 nodes there. Acting is on by default (`dry_run: false`) — a
quarantine controller that does nothing until configured protects nobody — and the breaker bounds the harm.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import (
    Count,
    DnsLabel,
    FieldError,
    LabelMatchers,
    LabelName,
    NoBool,
    Percent,
    PositiveCount,
    Seconds,
)
from gpuwarden.config.health_signals import SignalsConfig
from gpuwarden.config.health_validation import ValidationConfig

ReasonClass = Literal["app", "hw_mem", "hw_pcie", "hw_link", "fw_drv", "info"]
"""Why a GPU is considered failed, after gpu-health.md Appendix B. Non-XID evidence maps onto the same
classes: ECC, retired pages and row remapping → hw_mem; a GPU missing from DCGM → hw_pcie (fallen off the
bus); a non-zero GPU recovery action → fw_drv."""

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
XidCode = Annotated[int, NoBool, Field(ge=1, le=999)]


class XidOverride(Section):
    """Overrides one entry of the shipped XID catalog; unset fields keep the catalog's value."""

    class_: ReasonClass | None = Field(default=None, alias="class", description="Reason class.")
    quarantine: bool | None = Field(
        default=None, description="Quarantine on the first occurrence (true) or never by itself (false)."
    )
    escalate_after: PositiveCount | None = Field(
        default=None,
        description="For a non-quarantining XID: quarantine once it occurred this many times on the same "
        "GPU within xid.escalation_window_seconds (e.g. 2 for XID 31, after NVSentinel).",
    )

    @model_validator(mode="after")
    def _meaningful(self) -> XidOverride:
        if self.class_ is None and self.quarantine is None and self.escalate_after is None:
            raise ValueError("empty override: set at least one of class, quarantine, escalate_after")
        if self.quarantine is True and self.escalate_after is not None:
            raise FieldError(
                "escalate_after", "has no effect when quarantine is true (the first occurrence quarantines)"
            )
        return self


class XidPolicy(Section):
    """How XID events are read and classified."""

    source: Literal["auto", "gauge", "count"] = Field(
        default="auto",
        description="`count`: DCGM_EXP_XID_ERRORS_COUNT (per-XID counts, off in dcgm-exporter by default); "
        "`gauge`: changes of the sticky last-XID gauge DCGM_FI_DEV_XID_ERRORS; `auto`: count where "
        "present, else gauge.",
    )
    event_window_seconds: Seconds = Field(
        default=300.0,
        ge=30,
        description="An XID is current evidence while it occurred within this many seconds. 5 min is "
        "dcgm-exporter's XID count window, so both sources agree.",
    )
    escalation_window_seconds: Seconds = Field(
        default=86400.0,
        description="Window for counting repeats of an escalating XID on one GPU. 24 h after NVSentinel's "
        "RepeatedXID31OnSameGPU rule.",
    )
    quarantine_unknown: bool = Field(
        default=False,
        description="Quarantine on an XID the catalog does not know. false: an Event and a metric only "
        "(EKS' behaviour); an unknown code is more often new driver noise than a new hardware fault.",
    )
    overrides: dict[XidCode, XidOverride] = Field(
        default_factory=dict,
        description="Per-XID overrides of the shipped catalog, e.g. {109: {quarantine: false}} or "
        "{13: {escalate_after: 3}}.",
    )


class EccPolicy(Section):
    """Memory-error thresholds. Defaults are DCGM's own health-watch limits (gpu-health.md §1.7).

    These counters are not exported by dcgm-exporter's default CSV; without them these checks see no data,
    which is *unknown*, never healthy or failed.
    """

    dbe_volatile_increase: PositiveCount = Field(
        default=1,
        description="Quarantine when DCGM_FI_DEV_ECC_DBE_VOL_TOTAL rises by at least this much within "
        "xid.event_window_seconds. 1: DCGM fails a GPU on any volatile double-bit error.",
    )
    sbe_rate_per_hour: float | None = Field(
        default=None,
        gt=0,
        description="Quarantine when single-bit (corrected) errors exceed this rate per hour. null: never; "
        "NVIDIA classes a high SBE rate (XID 92) as IGNORE and DCGM's SBE limit is a placeholder. The "
        "extender still scores rising SBE trends down.",
    )
    retired_pages_max: PositiveCount = Field(
        default=63,
        description="Quarantine when SBE + DBE retired pages reach this count "
        "(DCGM_LIMIT_MAX_RETIRED_PAGES).",
    )
    retired_dbe_pages_soft_limit: PositiveCount = Field(
        default=15,
        description="Quarantine when DBE retired pages exceed this and grew in the past week "
        "(DCGM's DBE soft limit).",
    )
    quarantine_on_pending_retirement: bool = Field(
        default=False,
        description="Quarantine while a page retirement is pending. false: DCGM only warns; the page is "
        "retired at the next GPU reset.",
    )
    quarantine_on_row_remap_failure: bool = Field(
        default=True, description="Quarantine on DCGM_FI_DEV_ROW_REMAP_FAILURE > 0 (DCGM: FAIL)."
    )
    uncorrectable_remapped_rows_max: PositiveCount | None = Field(
        default=512,
        description="Quarantine when uncorrectable remapped rows reach this count; 512 is DCGM's limit "
        "('GPU is in a bad state'). null: never.",
    )


class TaintEffects(Section):
    """Taint effect per reason class. NoSchedule by default: keep new work off, let running work finish."""

    app: TaintEffect = Field(default="NoSchedule", description="Escalated application-class XIDs.")
    hw_mem: TaintEffect = Field(default="NoSchedule", description="Memory: DBE, retired pages, row remap.")
    hw_pcie: TaintEffect = Field(default="NoSchedule", description="PCIe / fallen off the bus / GPU missing.")
    hw_link: TaintEffect = Field(default="NoSchedule", description="NVLink / C2C link errors.")
    fw_drv: TaintEffect = Field(default="NoSchedule", description="GSP / firmware / driver, recovery action.")
    info: TaintEffect = Field(
        default="NoSchedule", description="Informational XIDs overridden to quarantine."
    )


class Breaker(Section):
    """Circuit breaker on quarantine: a fleet-wide anomaly is far likelier a monitoring or app fault."""

    max_absolute: Count = Field(
        default=3,
        description="Quarantined nodes allowed at once: max(max_absolute, max_percent of GPU nodes). 3 lets "
        "a small fleet lose a node or two to real faults.",
    )
    max_percent: Percent = Field(
        default=10.0,
        description="Percent of GPU nodes allowed quarantined at once. 10 %: published fleets need ~5 % "
        "spare for hardware faults (NCSA Delta); EKS halts repairs above 20 %, NVSentinel at 50 %.",
    )
    max_new_per_window: PositiveCount = Field(
        default=5,
        description="New quarantines allowed per window_seconds. Real faults arrive about one per few "
        "hours even at 16,384 GPUs (Llama 3); five in an hour is an incident for a human.",
    )
    window_seconds: Seconds = Field(
        default=3600.0, ge=60, description="Sliding window for max_new_per_window, in seconds."
    )
    hold_seconds: Seconds = Field(
        default=900.0,
        description="Once open, the breaker closes only after its trip condition has been clear for this "
        "many seconds (or an operator resets it), so it does not flap at the limit.",
    )
    configmap_name: DnsLabel = Field(
        default="gpuwarden-quarantine-breaker",
        description="ConfigMap (in the controller's namespace) holding the breaker's state, shared by every "
        "replica and reset by operators. Change it only together with the controller Role's resourceNames "
        "(deploy/base/controller/role.yaml), e.g. for two controllers in one namespace.",
    )

    @model_validator(mode="after")
    def _allows_something(self) -> Breaker:
        if self.max_absolute == 0 and self.max_percent == 0:
            raise FieldError(
                "max_absolute",
                "max_absolute and max_percent are both 0, so no node could ever be quarantined; to observe "
                "without acting set health.dry_run: true instead",
            )
        return self


class HealthConfig(Section):
    """GPU-health quarantine loop: observe DCGM metrics, decide, taint."""

    enabled: bool = Field(default=True, description="Run the quarantine loop in the controller.")
    dry_run: bool = Field(
        default=False,
        description="Compute, log and event every plan but patch nothing. false: quarantine is the point of "
        "the loop; the breaker and the unknown-data rule bound the damage. Use true for a first rollout.",
    )
    loop_interval_seconds: Seconds = Field(
        default=10.0,
        description="Seconds between observe-decide-act passes. 10 s keeps detection within the goal "
        "(interval + 2 s) at a constant, small number of Prometheus queries per pass.",
    )
    max_sample_age_seconds: Seconds = Field(
        default=120.0,
        description="A GPU whose newest DCGM sample is older than this is unknown (exporter down or stale): "
        "no taint added, none removed. 120 s = four 30 s dcgm-exporter collection intervals.",
    )
    subquery_step_seconds: Seconds = Field(
        default=15.0,
        ge=1,
        le=300,
        description="Resolution of the subqueries that find when an XID / ECC series first appeared "
        "(min_over_time(timestamp(...)[window:step])). Set it to Prometheus' scrape interval of "
        "dcgm-exporter or lower: a coarser step can miss a short-lived XID; a finer one only costs query "
        "time. 15 s is Prometheus' common scrape interval.",
    )
    node_labels: list[LabelName] = Field(
        default_factory=lambda: ["Hostname", "hostname"],
        min_length=1,
        description="Labels naming the node on DCGM series, first present wins. Released dcgm-exporters "
        "emit Hostname, newer ones hostname; use [node] for a relabelled label.",
    )
    gpu_uuid_label: LabelName = Field(
        default="UUID", description="Label holding the GPU UUID (`uuid` with dcgm-exporter -o)."
    )
    label_matchers: LabelMatchers = Field(
        default="",
        description='Extra PromQL matchers added to every DCGM selector, e.g. `cluster="prod"` when one '
        "Prometheus serves several clusters. Empty: none.",
    )
    healthy_period_seconds: Seconds = Field(
        default=1800.0,
        description="A quarantine lifts only after its evidence has been gone this long (and the reason's "
        "recovery condition holds). 30 min damps intermittent hardware that fails again within minutes.",
    )
    gpu_missing_grace_seconds: Seconds | None = Field(
        default=120.0,
        description="Quarantine (hw_pcie) when DCGM reports fewer GPUs than the node advertises for this "
        "long; covers XID 79, which DCGM may not report. null: never.",
    )
    quarantine_on_recovery_action: bool = Field(
        default=True,
        description="Quarantine (fw_drv) while DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION asks for a reset, reboot "
        "or drain (any non-zero value; XID 154).",
    )
    xid: XidPolicy = Field(default_factory=XidPolicy, description="XID reading and catalog overrides.")
    ecc: EccPolicy = Field(default_factory=EccPolicy, description="ECC / retired pages / row remap.")
    taint_effects: TaintEffects = Field(default_factory=TaintEffects, description="Effect per reason class.")
    breaker: Breaker = Field(default_factory=Breaker, description="Circuit breaker.")
    device_taint_effect: Literal["NoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="Effect of the DeviceTaintRule (resource.k8s.io/v1) that quarantines one faulty GPU on a "
        "DRA-backed node (docs/health.md#dra-backed-nodes); dry-run writes effect None instead. NoSchedule: "
        "no new claim gets the device, and the drain moves the pods holding it through the Eviction API "
        "(PodDisruptionBudgets hold). NoExecute makes kube-controller-manager delete those pods without the "
        "Eviction API (no PDBs) and, before Kubernetes 1.38, misses pods of DRA-backed extended resources.",
    )
    signals: SignalsConfig = Field(
        default_factory=SignalsConfig,
        description="Fabric and degradation signals, each graded quarantine / degrade / observe.",
    )
    hold_autoscaler_disruption: bool = Field(
        default=False,
        description="Set Karpenter's `karpenter.sh/do-not-disrupt: true` on a node while it is quarantined "
        "(its evidence pending, its validation Job running), marked `gpuwarden.io/disruption-hold`, and lift "
        "it with the quarantine: consolidation would otherwise delete an emptied quarantined node, evidence "
        "and all (docs/extender.md#autoscalers). false: no autoscaler annotation is written. An operator's "
        "own do-not-disrupt is never touched.",
    )
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig,
        description="A validation Job that must succeed before a release after the healthy period.",
    )

    @model_validator(mode="after")
    def _labels_unique(self) -> HealthConfig:
        if len(set(self.node_labels)) != len(self.node_labels):
            raise FieldError("node_labels", f"lists a label twice: {self.node_labels}")
        return self
