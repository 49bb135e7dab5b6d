"""Every `gpuwarden.io/*` name other pieces rely on, and the format of its value: one home for all of them.

Why it exists: the adapter, the controller, the node agent, the charts and the harness meet on these keys
(a taint the scheduler honours, annotations a user reads in `kubectl describe`, a GPU set the node agent
hands to the container). Defined in several places they drift; here each is defined once, the way
Kubernetes keeps `well_known_labels.go`. The value formats that more than one piece reads or writes are here
too: a GPU set is written one way (`format_gpu_ids`) and read one way (`parse_gpu_ids`).

What it must not do: import anything from gpuwarden or a deployable (every layer imports it), decide
anything, or do I/O. Keys used only by the test harness (test bed labels, demo markers) live in the harness.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

DOMAIN = "gpuwarden.io"

# --- nodes: GPU health (the controller's quarantine) --------------------------------------------------------
QUARANTINE_TAINT = "gpuwarden.io/gpu-unhealthy"
"""Taint key; value `<reason>` (e.g. `xid-79`), effect configurable per reason class (default NoSchedule)."""
QUARANTINE_RECORD = "gpuwarden.io/quarantine"
"""Node annotation, JSON: reason, xid, GPU UUIDs, first seen, values (gpuwarden.quarantine)."""
RELEASE = "gpuwarden.io/release"
"""Operator override on a node: value `now` lifts the quarantine at the next pass."""
RELEASE_NOW = "now"
EXCLUDE = "gpuwarden.io/exclude"
"""Node label: `true` means never touch this node."""
BREAKER_RESET = "gpuwarden.io/reset"
"""Annotation on the quarantine breaker's state ConfigMap: `now` (or `true`) closes an open breaker."""
GPU_HEALTHY_CONDITION = "GPUHealthy"
"""Node condition type written by the quarantine (False while quarantined)."""
GPU_DEGRADED_CONDITION = "GPUDegraded"
"""Node condition type for degradation signals graded `degrade` (no taint)."""
DEGRADATION = "gpuwarden.io/degradation"
"""Node annotation, JSON, present only while a `GPUDegraded` change's Event is owed: the change (status,
message), the Event's note and when it was decided (`at`, RFC 3339, whole seconds: the Event's name)."""
NVLINK_DOMAIN_HEALTH = "gpuwarden.io/nvlink-domain-health"
"""Node label on every member of an NVLink domain (the clique) we judge `degraded` or `failed`; absent while
the domain is healthy. What multi-node schedulers read (Kueue TAS: required node affinity `DoesNotExist`)."""
NVLINK_DOMAIN_TAINT = "gpuwarden.io/nvlink-domain-degraded"
"""Taint on every member of a degraded domain, only when `domains.health.action` is `quarantine`."""
NVLINK_DOMAIN_CONDITION = "NVLinkDomainHealthy"
"""Node condition type on every member of a graded domain (False while the domain is degraded or failed)."""
DEVICE_RULE_NODE = "gpuwarden.io/quarantine-node"
"""Label on a DeviceTaintRule of ours (resource.k8s.io/v1): the node whose quarantine it belongs to. The
rule is named `gpuwarden-<node>-<hash of driver/pool/device>` and also labelled
`app.kubernetes.io/managed-by: gpuwarden`; its taint key is `QUARANTINE_TAINT`, value the reason."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuwarden"

EXPECTED_GPUS = "gpuwarden.io/expected-gpus"
"""Node label (the default of `health.signals.expected_gpus_label`): the node's expected GPU count."""
VALIDATION_NODE = "gpuwarden.io/validation-node"
"""Label on a validation Job (and its pods): the node it validates before the quarantine is released."""

# --- nodes: GPU topology ------------------------------------------------------------------------------------
GPU_TOPOLOGY = "gpuwarden.io/gpu-topology"
"""Node annotation, JSON: GPU id -> {numa, pcie, nvlink, uuid, mig: [{uuid, gi, ci, profile}]} (written by the
node agent; `mig` lists a MIG-enabled GPU's MIG devices)."""
NRT_GPU_IDS_ATTRIBUTE = "gpuwarden.io/gpu-ids"
"""NodeResourceTopology zone attribute listing the zone's GPU ids (else they are numbered in NUMA order)."""

# --- nodes: drain and remediation -------------------------------------------------------------------------
DRAIN = "gpuwarden.io/drain"
"""Node annotation, JSON: the drain's progress (controller.drain.state)."""
DRAIN_PAUSE = "gpuwarden.io/drain-pause"
"""Operator override on a node: `true` pauses its drain."""
DRAIN_EXCLUDE = "gpuwarden.io/drain-exclude"
"""Pod label (the config default of `drain.exclude_label`): `true` keeps the pod from being evicted."""
REMEDIATION = "gpuwarden.io/remediation"
"""Node annotation, JSON: the remediation hand-off's step and escalation."""

EXTENDER_URL = "gpuwarden.io/extender-url"
"""Lease annotation (the controller's Lease, extender bind protocol `leader`): where the holder's extender
takes forwarded binds, e.g. `http://10.0.0.7:8888/gpuwarden`."""

# --- pods: the GPU set (extender bind, node agent) ----------------------------------------------------------
GPU_IDS = "gpuwarden.io/gpu-ids"
"""Pod annotation: the GPU set assigned at bind, `format_gpu_ids` form (e.g. `0,1,2,3`)."""
NUMA_NODE = "gpuwarden.io/numa-node"
"""Pod annotation: the NUMA node(s) of the GPU set, comma-separated."""
TOPOLOGY_POLICY = "gpuwarden.io/topology-policy"
"""Pod annotation: `single-numa` (default for multi-GPU), `prefer-numa`, `single-pcie` or `none`."""
GPU_NODE = "gpuwarden.io/gpu-node"
"""Pod label (label-safe node name, for selection) and annotation (full node name) of a GPU claim."""
GPU_CLAIMED_AT = "gpuwarden.io/gpu-claimed-at"
"""Pod annotation: Unix time the claim was written (claims of unbound pods expire after a TTL)."""
GPU_RESERVED_UNTIL = "gpuwarden.io/gpu-reserved-until"
"""Pod annotation written with a claim by GPU preemption: the claim holds until this Unix time."""
PREEMPTION = "gpuwarden.io/preemption"
"""Pod annotation on a preemptor, JSON (controller/preemption/record.py): the preemption allowed for it - by
the preempt verb or by GPU preemption - with its victims per node, when, until when it counts, its chain
depth and (GPU preemption) its progress. Written before the verb answers and before the first eviction, so
every replica and the next leader count those victims; GPU preemption's next pass finishes a half-done one."""
GPU_IDS_REQUESTED = "gpuwarden.io/gpu-ids-requested"
"""Pod annotation by the node agent: the set the scheduler recorded, when the kubelet gave another."""
GPU_IDS_SOURCE = "gpuwarden.io/gpu-ids-source"
"""Pod annotation by the node agent: `kubelet` once `gpu-ids` holds the set the kubelet actually gave."""
GPU_IDS_SOURCE_KUBELET = "kubelet"

# --- pods: nominations and idle GPUs ------------------------------------------------------------------------
NOMINATION = "gpuwarden.io/nomination"
"""Pod annotation, JSON: when the controller first saw the pod's nominatedNodeName."""
IDLE_SINCE = "gpuwarden.io/idle-since"
"""Pod annotation (set by gpuwarden): RFC 3339 time since every GPU of the pod stayed idle."""
IDLE_RECLAIMABLE = "gpuwarden.io/idle-reclaimable"
"""Pod annotation (set by gpuwarden): `true` on an idle pod whose rule's action is `prefer-as-victim` - GPU
preemption and the preempt verb take it first, and a pending pod of equal priority may reclaim its GPUs."""
IDLE_ACK_UNTIL = "gpuwarden.io/idle-ack-until"
"""Pod annotation (set by users): RFC 3339 time until which no idle-GPU action is taken."""
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Kubernetes' pod annotation (not ours): a ReplicaSet scaled down removes its lowest-cost pods first; the
idle loop sets it on an idle pod before scaling its Deployment down by one, so the idle pod is the one
removed."""
IDLE_EXCLUDE = "gpuwarden.io/idle-exclude"
"""Pod label (the config default of `idle.exclude_label`): `true` means the pod is never judged idle."""

# --- nodes: autoscalers (Karpenter) ----------------------------------------------------------------------
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
"""Karpenter's node annotation (not ours): `true` keeps consolidation and drift away from the node (not
expiration, repair or forced termination). The health loop sets it on a quarantined node while
`health.hold_autoscaler_disruption` is on, so the evidence and the validation Job are not deleted with it."""
DISRUPTION_HOLD = "gpuwarden.io/disruption-hold"
"""Node annotation (set by gpuwarden): `quarantine` when the health loop set `KARPENTER_DO_NOT_DISRUPT` - it
lifts only a hold it set (an operator's own `do-not-disrupt` has no such mark and is never touched)."""

# --- namespaces: tenants (the preemption rule across tenants) -----------------------------------------------
TENANT = "gpuwarden.io/tenant"
"""Namespace label: the tenant (team) the namespace belongs to; namespaces with one value form one tenant
(the default of `preemption.tenants.namespace_label`)."""

# --- what gpuwarden writes on objects it does not own (lifted by `gpuwarden uninstall`) -------------------
# Operator overrides (release, exclude, drain-pause, idle-ack-until, ...) and users' labels are theirs: kept.
WRITTEN_NODE_ANNOTATIONS = (QUARANTINE_RECORD, DEGRADATION, DRAIN, REMEDIATION, GPU_TOPOLOGY, DISRUPTION_HOLD)
"""`KARPENTER_DO_NOT_DISRUPT` is lifted with `DISRUPTION_HOLD`, and only where that mark says we set it."""
WRITTEN_NODE_CONDITIONS = (GPU_HEALTHY_CONDITION, GPU_DEGRADED_CONDITION, NVLINK_DOMAIN_CONDITION)
WRITTEN_NODE_TAINTS = (QUARANTINE_TAINT, NVLINK_DOMAIN_TAINT)
WRITTEN_NODE_LABELS = (NVLINK_DOMAIN_HEALTH,)
WRITTEN_POD_ANNOTATIONS = (
    GPU_IDS,
    NUMA_NODE,
    GPU_NODE,
    GPU_CLAIMED_AT,
    GPU_RESERVED_UNTIL,
    PREEMPTION,
    GPU_IDS_REQUESTED,
    GPU_IDS_SOURCE,
    NOMINATION,
    IDLE_SINCE,
    IDLE_RECLAIMABLE,
)
WRITTEN_POD_LABELS = (GPU_NODE,)
DISPLACED_SERVICE = "gpuwarden.io/displaced-service"
"""APIService annotation (the chart's `apiServices.takeOver`): `<namespace>/<name>` of the Service that served
it before gpuwarden took it over (docs/uninstall.md gives it back)."""


def gpu_id_key(gpu_id: str) -> tuple[int, int, str]:
    """The order of GPU ids everywhere: numeric ids in numeric order ("2" < "10"), then the rest
    alphabetically."""
    return (0, int(gpu_id), "") if gpu_id.isdigit() else (1, 0, gpu_id)


def canonical_gpu_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """A GPU set in its one order: unique, sorted by `gpu_id_key`, blanks dropped."""
    return tuple(sorted({i.strip() for i in ids if i.strip()}, key=gpu_id_key))


def parse_gpu_ids(text: str | None) -> tuple[str, ...] | None:
    """The value of `gpu-ids` read: `"3, 1,1"` -> ("1", "3"); None when absent or blank (nothing recorded)."""
    if text is None:
        return None
    ids = canonical_gpu_ids(text.split(","))
    return ids or None


def format_gpu_ids(ids: Iterable[str]) -> str:
    """The value of `gpu-ids` written: ("3", "1") -> "1,3"."""
    return ",".join(canonical_gpu_ids(ids))


def parse_time_value(text: object) -> float | None:
    """The value format of the time annotations (`idle-since`, `idle-ack-until`): RFC 3339 with a zone
    (`2026-12-02T07:00:00Z`) as Unix seconds; None when absent, unreadable or without a zone."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def reporting_controller(component: str) -> str:
    """The `reportingController` of our Events: `gpuwarden.io/<component>` (e.g. `gpuwarden.io/health`)."""
    return f"{DOMAIN}/{component}"
