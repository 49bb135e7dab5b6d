"""Per-node health assessment: turn one node's telemetry into findings, or say it is unknown.

Why separate from `decide.py`: "what is wrong with this node" (thresholds, the XID catalog, staleness) is a
different question from "what do we do about it" (breaker, release, operator overrides), and each is
table-tested on its own.

What it must not do: no I/O, no clock reads (`now` is passed in), no actions. It never turns missing data into
a verdict: a node without fresh telemetry is `unknown`, and a metric that is not exported yields no finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from controller.health.grading import stalled
from controller.health.policy import HealthPolicy, reason_class
from controller.health.snapshot import GpuTelemetry, NodeState
from gpuwarden.quarantine import Evidence

Status = Literal["healthy", "faulty", "unknown"]
RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}


@dataclass(frozen=True, slots=True)
class Finding:
    """Something observed on a GPU (or the node). `quarantine` says whether it warrants a taint."""

    reason: str
    reason_class: str
    quarantine: bool
    why: str
    gpu: str = ""
    xid: int | None = None
    value: float | None = None
    first_seen: float | None = None
    recovery: str = "reset"  # reset | reboot | none (see catalog.Recovery)

    @property
    def fingerprint(self) -> str:
        return f"{self.reason}/{self.gpu}"

    def evidence(self) -> Evidence:
        return Evidence(self.reason, self.gpu, self.xid, self.value, self.first_seen)


@dataclass(frozen=True, slots=True)
class Assessment:
    """The verdict on one node: `unknown` carries `why`; `faulty` has at least one quarantining finding."""

    status: Status
    findings: tuple[Finding, ...] = ()
    why: str = ""
    stalled: tuple[str, ...] = ()  # UUIDs of stalled GPUs that made the node unknown

    @property
    def quarantining(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.quarantine)


def _finding(policy: HealthPolicy, reason: str, quarantine: bool, why: str, **kw: object) -> Finding:
    return Finding(reason, reason_class(reason, policy.catalog), quarantine, why, **kw)  # type: ignore[arg-type]


def _xid_findings(gpu: GpuTelemetry, policy: HealthPolicy) -> list[Finding]:
    out: list[Finding] = []
    for obs in gpu.xids:
        entry = policy.catalog.lookup(obs.code)
        escalated = entry.escalate_after is not None and obs.count >= entry.escalate_after
        if not obs.recent and not escalated:
            continue  # a sticky value from an old episode is not an event
        quarantine = entry.quarantine or escalated
        if entry.xid_class == "unknown":
            quarantine = policy.quarantine_unknown_xid
            verdict = (
                "quarantined (health.xid.quarantine_unknown)" if quarantine else "reported, not quarantined"
            )
            why = f"XID {obs.code} is not in the catalog: {verdict}"
        elif entry.quarantine:
            why = f"XID {obs.code} ({entry.description or entry.mnemonic}): NVIDIA action {entry.action}"
        elif escalated:
            why = (
                f"XID {obs.code} repeated {obs.count}x on one GPU within the repeat window "
                f"(escalates at {entry.escalate_after})"
            )
        else:
            why = f"XID {obs.code} is class {entry.xid_class} (NVIDIA action {entry.action}): not quarantined"
        out.append(
            Finding(
                entry.reason,
                entry.xid_class,
                quarantine,
                why,
                gpu=gpu.uuid,
                xid=obs.code,
                value=float(obs.count),
                first_seen=obs.first_seen,
                recovery=entry.recovery,
            )
        )
    return out


def _memory_findings(gpu: GpuTelemetry, policy: HealthPolicy, now: float) -> list[Finding]:
    """One GPU's memory findings, in this order: ECC error counts, retired pages, remapped rows, and the
    recovery action the driver asks for."""
    return [
        *_ecc_findings(gpu, policy, now),
        *_retired_page_findings(gpu, policy),
        *_row_remap_findings(gpu, policy),
        *_recovery_action_findings(gpu, policy),
    ]


def _ecc_findings(gpu: GpuTelemetry, policy: HealthPolicy, now: float) -> list[Finding]:
    """Double-bit ECC errors rising within the window; a single-bit ECC rate at or over its limit."""
    out: list[Finding] = []
    u = gpu.uuid
    if gpu.dbe_volatile_increase is not None and gpu.dbe_volatile_increase >= policy.dbe_increase_threshold:
        out.append(
            _finding(
                policy,
                "ecc-dbe",
                True,
                f"volatile double-bit ECC errors rose by {gpu.dbe_volatile_increase:g} within the window",
                gpu=u,
                value=gpu.dbe_volatile,
                first_seen=now,
            )
        )
    sbe_limit = policy.sbe_rate_per_hour
    sbe_per_hour = None if gpu.sbe_volatile_rate is None else gpu.sbe_volatile_rate * 3600.0
    if sbe_per_hour is not None and sbe_limit is not None and sbe_per_hour >= sbe_limit:
        out.append(
            _finding(
                policy,
                "sbe-rate",
                True,
                f"single-bit ECC rate {sbe_per_hour:.0f}/h >= {sbe_limit:g}/h",
                gpu=u,
                value=sbe_per_hour,
                recovery="none",
            )
        )
    return out


def _retired_page_findings(gpu: GpuTelemetry, policy: HealthPolicy) -> list[Finding]:
    """Retired pages at or over DCGM's limit; double-bit retired pages over the soft limit and still growing
    within a week; pages pending retirement."""
    out: list[Finding] = []
    u = gpu.uuid
    retired = (gpu.retired_sbe or 0.0) + (gpu.retired_dbe or 0.0)
    if (gpu.retired_sbe is not None or gpu.retired_dbe is not None) and retired >= policy.retired_pages_limit:
        out.append(
            _finding(
                policy,
                "retired-pages",
                True,
                f"{retired:g} retired pages >= DCGM limit {policy.retired_pages_limit}",
                gpu=u,
                value=retired,
                recovery="none",
            )
        )
    if (
        gpu.retired_dbe is not None
        and gpu.retired_dbe > policy.retired_dbe_soft_limit
        and (gpu.retired_dbe_increase_week or 0.0) > 1
    ):
        out.append(
            _finding(
                policy,
                "retired-dbe",
                True,
                f"{gpu.retired_dbe:g} DBE retired pages > "
                f"{policy.retired_dbe_soft_limit} and {gpu.retired_dbe_increase_week:g} more in a week",
                gpu=u,
                value=gpu.retired_dbe,
                recovery="none",
            )
        )
    if gpu.retired_pending is not None and gpu.retired_pending > 0:
        out.append(
            _finding(
                policy,
                "retired-pending",
                policy.retired_pending_quarantines,
                "pages pending retirement (cleared by a GPU reset)",
                gpu=u,
                value=gpu.retired_pending,
            )
        )
    return out


def _row_remap_findings(gpu: GpuTelemetry, policy: HealthPolicy) -> list[Finding]:
    """Uncorrectable remapped rows at or over their limit; a failed row remapping."""
    out: list[Finding] = []
    u = gpu.uuid
    rows = gpu.uncorrectable_remapped_rows
    rows_limit = policy.uncorrectable_remapped_rows_limit
    if rows is not None and rows_limit is not None and rows >= rows_limit:
        out.append(
            _finding(
                policy,
                "uncorrectable-remapped-rows",
                True,
                f"{rows:g} uncorrectable remapped rows >= {rows_limit}",
                gpu=u,
                value=rows,
                recovery="none",
            )
        )
    if gpu.row_remap_failure is not None and gpu.row_remap_failure > 0:
        out.append(
            _finding(
                policy,
                "row-remap-failure",
                policy.row_remap_failure_quarantines,
                "row remapping failed (DCGM FAIL; needs RMA)",
                gpu=u,
                value=gpu.row_remap_failure,
                recovery="none",
            )
        )
    return out


def _recovery_action_findings(gpu: GpuTelemetry, policy: HealthPolicy) -> list[Finding]:
    """The driver asking for a recovery action (anything but NONE)."""
    out: list[Finding] = []
    u = gpu.uuid
    action = gpu.recovery_action
    if action is not None and action != 0:
        name = RECOVERY_ACTIONS.get(action, str(action))
        out.append(
            _finding(
                policy,
                "recovery-action",
                policy.recovery_action_quarantines,
                f"driver asks for recovery action {name}",
                gpu=u,
                value=float(action),
            )
        )
    return out


def expected_gpus(node: NodeState, policy: HealthPolicy) -> tuple[int | None, str]:
    """The node's physical GPU baseline and where it came from: the expected-GPUs label, else the physical
    count its sharing publishes (gpuwarden.gpusharing: GFD's count on time-sliced, MPS and MIG mixed nodes,
    the capacity on whole-GPU ones), never the replicas or MIG instances it advertises. None: unknown (MIG
    single without the label or a topology), and an unknown baseline judges no GPU missing."""
    raw = node.labels.get(policy.signals.expected_gpus_label, "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw), f"label {policy.signals.expected_gpus_label}"
    sharing = node.sharing
    if sharing is None:
        return node.gpu_capacity, "node advertises"
    if not sharing.shared:
        return sharing.physical, sharing.source
    return sharing.physical, f"{sharing.mode.value} node, {sharing.source}"


def _missing_finding(
    node: NodeState, fresh: list[GpuTelemetry], count: int, policy: HealthPolicy, now: float
) -> Finding:
    """Fewer fresh GPUs than the node's baseline while others report: a GPU fell off (XID 79 or worse)."""
    expected, source = expected_gpus(node, policy)
    missing = (expected or 0) - count
    gone = [g.last_sample for g in node.gpus or () if g not in fresh and g.last_sample is not None]
    never_seen = len(gone) < missing  # some GPU has not reported at all within observe's lookback
    since = None if never_seen or not gone else min(gone)
    gone_for = float("inf") if since is None else now - since
    grace = policy.gpu_missing_grace
    what = f"{source} {expected} GPUs, DCGM reports {count} ({missing} missing"
    if grace is None:
        why, quarantine = f"{what}; health.gpu_missing_grace_seconds is null)", False
    elif gone_for < grace:
        why, quarantine = f"{what} for {gone_for:.0f}s, grace {grace:.0f}s)", False
    else:
        why, quarantine = f"{what}" + (f" since {gone_for:.0f}s)" if since is not None else ")"), True
    return _finding(policy, "gpu-missing", quarantine, why, value=float(count), first_seen=since)


def fresh_gpus(node: NodeState, policy: HealthPolicy, now: float) -> list[GpuTelemetry]:
    """The node's GPUs with a sample younger than the staleness limit."""
    return [
        g for g in node.gpus or () if g.last_sample is not None and now - g.last_sample <= policy.staleness
    ]


def assess_node(
    node: NodeState, policy: HealthPolicy, now: float, extra: tuple[Finding, ...] = ()
) -> Assessment:
    """Healthy, faulty or unknown, with every finding (quarantining or not) and a reason for unknown.

    `extra`: findings from the graded signals (`grading.py`, already debounced), added to a known node's.
    """
    if node.gpus is None or (not node.gpus and not node.fresh_gpus):
        return Assessment(
            "unknown",
            why="no DCGM telemetry for this node (exporter down, absent, or node-identity label mismatch)",
        )
    fresh = fresh_gpus(node, policy, now)
    count = node.fresh_gpus if node.fresh_gpus is not None else len(fresh)
    if not count:
        seen = [g.last_sample for g in node.gpus if g.last_sample is not None]
        newest = node.newest_sample if node.newest_sample is not None else max(seen, default=None)
        age = f"{now - newest:.0f}s old" if newest is not None else "no presence samples"
        return Assessment("unknown", why=f"DCGM telemetry is stale ({age} > {policy.staleness:.0f}s)")
    frozen = stalled(node, policy.signals)
    if frozen:
        return Assessment(
            "unknown",
            why=f"DCGM telemetry stalled: {policy.signals.stall_metric} unchanged for "
            f"{policy.signals.stall_seconds:.0f}s on {', '.join(frozen)}",
            stalled=frozen,
        )
    findings: list[Finding] = []
    for gpu in fresh:
        findings.extend(_xid_findings(gpu, policy))
        findings.extend(_memory_findings(gpu, policy, now))
    expected, _ = expected_gpus(node, policy)
    if expected is not None and expected and count < expected:
        findings.append(_missing_finding(node, fresh, count, policy, now))
    findings.extend(extra)
    status: Status = "faulty" if any(f.quarantine for f in findings) else "healthy"
    return Assessment(status, tuple(findings))


def recovery_holds(
    evidence: Evidence, node: NodeState, quarantined_boot_id: str, policy: HealthPolicy
) -> str:
    """'' when the evidence's recovery condition holds now; otherwise why not (for the skip reason)."""
    rebooted = bool(quarantined_boot_id) and bool(node.boot_id) and node.boot_id != quarantined_boot_id
    if rebooted:
        return ""
    gpu = next((g for g in node.gpus or () if g.uuid == evidence.gpu), None)
    if evidence.xid is not None:
        entry = policy.catalog.lookup(evidence.xid)
        if entry.recovery == "reboot":
            return f"{evidence.reason} needs a reboot (bootID unchanged)"
        if gpu is not None and gpu.xid_last == evidence.xid:
            return f"{evidence.reason}: XID value on {evidence.gpu} not reset and node not rebooted"
        return ""
    if evidence.reason == "ecc-dbe" and gpu is not None and (gpu.dbe_volatile or 0.0) > 0:
        return f"ecc-dbe: volatile DBE counter on {evidence.gpu} not reset and node not rebooted"
    return ""
