"""The `domains:` section — NVLink domains (GB200/GB300 NVL72 racks): how a node's domain is read, when a
domain is degraded, and how the extender keeps a multi-pod job inside one.

Why a section of its own: the domain is read by the GPU model (plan, extender) and graded by health; one home
for its label key keeps the two from disagreeing on which nodes share a fabric. An NVL72 is 18 compute trays
(Kubernetes nodes of 4 GPUs) on one NVLink fabric, labelled by GPU feature discovery with
`nvidia.com/gpu.clique=<cluster uuid>.<clique id>` (../shared/reference/autoscalers-and-domains.md §C.1).
Defaults and their sources are in docs/health.md and docs/extender.md ("NVLink domains").
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import Count, Percent, PositiveCount, QualifiedName
from gpuwarden.config.health_signals import SignalAction

CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""GPU feature discovery's label (k8s-device-plugin `internal/lm/imex.go`); the DRA driver writes the same."""


class DomainHealth(Section):
    """When a domain is degraded or failed, graded like the node signals (action, debounce)."""

    action: SignalAction = Field(
        default="degrade",
        description="degrade: node label gpuwarden.io/nvlink-domain-health and condition NVLinkDomainHealthy "
        "on every member + an Event + a metric, no taint (single-node work keeps using healthy trays); "
        "quarantine: the same plus taint gpuwarden.io/nvlink-domain-degraded:NoSchedule on every member "
        "(the option); observe: the metric only; off: domains are not graded.",
    )
    consecutive: PositiveCount = Field(
        default=3,
        description="Passes in a row the domain's verdict must hold before it is published (and before a "
        "published one is released). The tray signals under it are already debounced per node; this one "
        "rides out a tray's label dropping for a reboot (GFD omits the clique label until the fabric is "
        "attached). 3 like the node signals (NVSentinel PR #1715).",
    )
    max_trays_out: Count = Field(
        default=2,
        description="More trays out than this (quarantined by us, or missing from expected_trays) degrades "
        "the domain. 2: a 64-GPU job needs 16 of an NVL72's 18 trays [our inference from the rack's shape].",
    )
    expected_trays: PositiveCount = Field(
        default=18,
        description="Members a domain should have; fewer labelled nodes count as missing trays. 18: 'a GB200 "
        "NVL72 includes 18 nodes' (dra-driver-nvidia-gpu #804).",
    )
    failed_percent: Percent = Field(
        default=50.0,
        description="The fabric is down (domain failed) when more than this share of the members report a "
        "Fabric Manager failure or a fatal NVSwitch SXid: a switch-tray fault shows on every tray at once; a "
        "single tray's failure is that tray's and only degrades the domain [our inference].",
    )


class DomainsConfig(Section):
    """NVLink domains: the clique label, domain health and placement of multi-pod jobs inside one domain."""

    enabled: bool = Field(
        default=True,
        description="Read NVLink domains at all. Nodes without the clique label are in no domain, so a fleet "
        "without NVL72 racks is unaffected.",
    )
    clique_label: QualifiedName = Field(
        default=CLIQUE_LABEL,
        description="Node label naming the node's NVLink domain. GPU feature discovery writes "
        "nvidia.com/gpu.clique=<cluster uuid>.<clique id> on fabric-attached GPUs only.",
    )
    job_labels: list[QualifiedName] = Field(
        default_factory=lambda: [
            "batch.kubernetes.io/job-name",
            "jobset.sigs.k8s.io/jobset-name",
            "kueue.x-k8s.io/pod-group-name",
            "scheduling.x-k8s.io/pod-group",
        ],
        description="Pod labels that make pods siblings of one multi-pod job (the first present one counts, "
        "within the pod's namespace): Job (Kubernetes >= 1.27), JobSet, Kueue's plain pod groups, the "
        "scheduler-plugins coscheduling PodGroup.",
    )
    placement_weight: Annotated[Count, Field(le=10)] = Field(
        default=5,
        description="The share of the extender's 0-10 score given to a node in the NVLink domain a job's "
        "siblings already use (most of them; the GPU-topology score is scaled into the rest). 5: the "
        "domain decides between racks, the GPU set still ranks nodes inside one. Nodes of a domain "
        "published degraded or failed score 0 for job pods whatever this is; 0 turns the preference off.",
    )
    health: DomainHealth = Field(default_factory=DomainHealth, description="Domain health rules.")
