"""NVLink domains: which nodes share one NVLink fabric (a GB200/GB300 NVL72 rack's clique), and their GPUs.

Why it exists: on an NVL72 the unit a multi-node job needs is the rack, not the node: 18 compute trays of 4
GPUs on one fabric, labelled by GPU feature discovery `nvidia.com/gpu.clique=<cluster uuid>.<clique id>`
(../shared/reference/autoscalers-and-domains.md §C.1). Health grades a domain from its members' signals,
the extender keeps a job's pods inside one, `gpuwarden plan` and the dashboard show them: all three read the
domain from here, so they agree on who is a member.

The whole label value is the domain's name: two racks may share a clique id under different cluster UUIDs
(dra-driver-nvidia-gpu #377), so the id alone never names a domain. A node without the label is in no domain
(GFD omits it while the fabric is not attached, or when the GPUs disagree): it is never guessed into one.

Placement inside a domain is worded here too (`job_group`, `placement_score`), as a pure rule the extender
applies to its answers: a pod of a multi-pod job (pods sharing a job or pod-group label) is steered toward
the domain its siblings already run in, and never placed into one health published degraded or failed
(`domain_refusal`: filter rejects those members); pods of no such job (single-node work) are filtered and
scored as before, so they may keep using a degraded rack's healthy trays.

What it must not do: no I/O, no clock, no decision about health (health's); it only describes, and words
the placement rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.gpus.objects import NodeInfo, node_info
from gpuwarden.wellknown import NVLINK_DOMAIN_HEALTH

JobGroup = tuple[str, str, str]
"""(namespace, label key, label value): the pods of one multi-pod job."""
UNHEALTHY = frozenset({"degraded", "failed"})


@dataclass(frozen=True, slots=True)
class DomainMember:
    """One tray of a domain: the node and its physical GPUs (None: the node does not say how many)."""

    node: str
    gpus: int | None
    quarantined: bool = False


@dataclass(frozen=True, slots=True)
class Domain:
    """One NVLink domain: its name (the full clique label value) and its members, sorted by node name."""

    name: str
    members: tuple[DomainMember, ...]

    @property
    def cluster_uuid(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def clique_id(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def gpus(self) -> int:
        return sum(m.gpus or 0 for m in self.members)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(m.node for m in self.members)


def node_domain(labels: Mapping[str, str], label: str) -> str | None:
    """The node's domain name from its labels (None: in no domain; an empty value is no domain either)."""
    value = labels.get(label)
    return value or None


def _gpus(info: NodeInfo) -> int | None:
    if info.sharing.physical is not None:
        return info.sharing.physical
    if info.topology is not None and info.topology.gpus:
        return len(info.topology.gpus)
    return info.allocatable or None


def domains_of(nodes: Iterable[Mapping[str, Any]], label: str, resource: str) -> dict[str, Domain]:
    """Every domain among `nodes` (v1.Node JSON), by name, each with its members and their GPUs."""
    members: dict[str, list[DomainMember]] = {}
    for obj in nodes:
        meta = obj.get("metadata") or {}
        name = node_domain(meta.get("labels") or {}, label)
        if name is None:
            continue
        info = node_info(obj, resource)
        members.setdefault(name, []).append(
            DomainMember(info.name, _gpus(info), quarantined=info.quarantine is not None)
        )
    ordered = sorted(members.items())
    return {name: Domain(name, tuple(sorted(found, key=lambda m: m.node))) for name, found in ordered}


def domain_of_node(nodes: Iterable[Mapping[str, Any]], label: str) -> dict[str, str]:
    """Node name → its domain name, for the nodes that are in one."""
    out: dict[str, str] = {}
    for obj in nodes:
        meta = obj.get("metadata") or {}
        name = node_domain(meta.get("labels") or {}, label)
        if name is not None:
            out[str(meta.get("name", ""))] = name
    return out


def domain_rows(domains: Mapping[str, Domain]) -> list[dict[str, Any]]:
    """What `gpuwarden plan` shows per domain: name, clique id, members (node, GPUs, quarantined), totals."""
    return [
        {
            "domain": d.name,
            "clique_id": d.clique_id,
            "cluster_uuid": d.cluster_uuid,
            "trays": len(d.members),
            "gpus": d.gpus,
            "quarantined_trays": sum(1 for m in d.members if m.quarantined),
            "members": [{"node": m.node, "gpus": m.gpus, "quarantined": m.quarantined} for m in d.members],
        }
        for d in domains.values()
    ]


@dataclass(frozen=True, slots=True)
class DomainPlacement:
    """The placement rule's settings (config `domains`): which label names a node's domain, which pod labels
    make siblings, and how much of the 0-10 score the sibling domain is worth."""

    clique_label: str
    job_labels: tuple[str, ...]
    weight: int


def job_group(namespace: str, labels: Mapping[str, str], keys: Sequence[str]) -> JobGroup | None:
    """The pod's job by the first of `keys` it carries with a non-empty value (None: no multi-pod job)."""
    for key in keys:
        value = labels.get(key)
        if value:
            return (namespace, key, value)
    return None


def node_placement(labels: Mapping[str, str], clique_label: str) -> tuple[str | None, str | None]:
    """(the node's domain, the health health published on it: degraded / failed / None)."""
    return node_domain(labels, clique_label), labels.get(NVLINK_DOMAIN_HEALTH) or None


def preferred_domains(siblings: Counter[str]) -> frozenset[str]:
    """The domains holding the most of a job's placed pods (all of them on a tie)."""
    if not siblings:
        return frozenset()
    most = max(siblings.values())
    return frozenset(d for d, n in siblings.items() if n == most)


def placement_score(
    score: int, domain: str | None, health: str | None, preferred: frozenset[str], weight: int
) -> int:
    """A job pod's 0-10 score on a node, from its GPU-topology `score` there:
    - a node of a domain published degraded or failed scores 0 (filter has rejected it: `domain_refusal`);
    - no sibling placed yet (`preferred` empty): the topology score;
    - else `weight` for a node of the preferred domain, plus the topology score scaled into the rest."""
    if health in UNHEALTHY:
        return 0
    if not preferred:
        return score
    bonus = weight if domain is not None and domain in preferred else 0
    return bonus + score * (10 - weight) // 10


def domain_refusal(domain: str | None, health: str | None, group: JobGroup) -> str | None:
    """Why a pod of the multi-pod job `group` may not be placed on a node of `domain` whose published health
    is `health` (the filter's per-node reason), None when it may: members of a degraded or failed domain are
    refused, whatever their own GPUs' state (the job needs the domain's fabric, not one tray)."""
    if health not in UNHEALTHY:
        return None
    where = f"NVLink domain {domain}" if domain else "its NVLink domain"
    _, key, value = group
    return (
        f"gpuwarden: node is in {where}, published {health} ({NVLINK_DOMAIN_HEALTH}); "
        f"pods of multi-pod job {key}={value} are not placed in a {health} domain"
    )
