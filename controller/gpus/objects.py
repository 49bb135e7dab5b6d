"""Reading Kubernetes objects into what the GPU model needs: a pod's GPU request (restartable sidecars
included), policy and GPU assignment; a node's GPU count, published topology and quarantine.

Why a module of its own: these conventions (`gpuwarden.wellknown`; "Names other pieces rely on" in
docs/architecture.md) are shared by the model, the bind protocol, drain and the tests, and must be read one
way only. Parsing is
lenient about absent fields (a pod without GPUs is simply not interesting) and strict about meaning (an
unreadable topology is an error string, never a guess). No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.gpus.topology import NodeTopology, TopologyError, parse_annotation
from gpuwarden.gpusharing import GpuSharing, SharingMode, is_gpu_resource, node_sharing
from gpuwarden.quarantine import NodeQuarantine, node_quarantine
from gpuwarden.wellknown import (
    EXPECTED_GPUS,
    IDLE_ACK_UNTIL,
    IDLE_RECLAIMABLE,
    parse_gpu_ids,
    parse_time_value,
)
from gpuwarden.wellknown import GPU_CLAIMED_AT as CLAIMED_AT_ANNOTATION
from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_NODE as CLAIM_NODE_ANNOTATION
from gpuwarden.wellknown import GPU_RESERVED_UNTIL as RESERVED_UNTIL_ANNOTATION
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from gpuwarden.wellknown import TOPOLOGY_POLICY as POLICY_ANNOTATION

JsonObject = dict[str, Any]


def int_value(value: Any) -> int:
    """A whole number as JSON may hold one (an int, or a string of digits); anything else is 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def _amount(container: Mapping[str, Any], resource: str) -> int:
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    return int_value(limits.get(resource, requests.get(resource, 0)))


def _shares(container: Mapping[str, Any], resource: str) -> int:
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    total = 0
    for name, value in limits.items():
        if isinstance(name, str) and is_gpu_resource(name, resource):
            total += int_value(value)
    for name, value in requests.items():
        if name not in limits and isinstance(name, str) and is_gpu_resource(name, resource):
            total += int_value(value)
    return total


def effective_request(app: Iterable[int], init: Iterable[tuple[int, bool]]) -> int:
    """A pod's effective request from its containers' amounts: app containers + restartable sidecars, or
    the largest init step if larger. `init`: each init container's amount and whether it is a sidecar
    (`restartPolicy: Always`), in order. The one home of the rule, for a pod's JSON and its protobuf."""
    sidecars = init_peak = 0
    for amount, sidecar in init:
        if sidecar:
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + amount)
    return max(sum(app) + sidecars, init_peak)


def _effective(spec: Mapping[str, Any], amount: Callable[[Mapping[str, Any]], int]) -> int:
    return effective_request(
        (amount(c) for c in spec.get("containers") or []),
        ((amount(c), c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or []),
    )


def gpu_request(spec: Mapping[str, Any], resource: str) -> int:
    """Effective GPU request of a pod: app containers + sidecars, or the largest init step if larger."""
    return _effective(spec, lambda c: _amount(c, resource))


def gpu_share_request(spec: Mapping[str, Any], resource: str) -> int:
    """Effective request of anything that hands out a GPU or a share of one (`resource`, its `.shared`
    rename, MIG-mixed `nvidia.com/mig-<profile>`): who may hold a physical GPU on a shared node."""
    return _effective(spec, lambda c: _shares(c, resource))


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the extender needs to know about one pod, read from its JSON."""

    key: str
    uid: str
    gpus: int
    priority: int = 0
    policy: str | None = None
    node_name: str = ""
    nominated: str = ""
    terminated: bool = False
    terminating: bool = False
    """Being deleted (deletionTimestamp) or marked for it by scheduler preemption (DisruptionTarget)."""
    preempted: bool = False
    """Chosen as a preemption victim (condition DisruptionTarget, reason PreemptionByScheduler)."""
    gpu_ids: tuple[str, ...] | None = None
    claim_node: str = ""
    claimed_at: float | None = None
    resource_version: str = ""
    reserved_until: float | None = None
    """A preemption reservation's deadline (`RESERVED_UNTIL_ANNOTATION`); None for an ordinary claim."""
    idle_reclaimable: bool = False
    """The idle loop marked it `idle-reclaimable` (idle under a prefer-as-victim rule)."""
    idle_ack_until: float | None = None
    """The owner's `idle-ack-until` (an unreadable one counts as none)."""

    @property
    def holds_gpus(self) -> bool:
        return not self.terminated and (self.gpus > 0 or self.gpu_ids is not None)

    def nodes(self) -> set[str]:
        """Every node this pod occupies or may occupy (bound, claimed or nominated)."""
        if not self.holds_gpus:
            return set()
        if self.node_name:
            return {self.node_name}
        return {n for n in (self.claim_node, self.nominated) if n}


def pod_info(obj: Mapping[str, Any], resource: str) -> PodInfo:
    """Parse a v1.Pod (JSON) into a `PodInfo`. A `DecodedPod` gives the `PodInfo` its decoder already read;
    it holds nothing else, so one decoded for another GPU resource is a `ValueError`."""
    if type(obj) is DecodedPod:
        if obj.resource != resource:
            raise ValueError(f"a pod decoded for {obj.resource!r} cannot be read for {resource!r}")
        return obj.info
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    priority = spec.get("priority")
    return read_pod_info(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        gpus=gpu_request(spec, resource),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        annotations=meta.get("annotations") or {},
        node_name=str(spec.get("nodeName") or ""),
        nominated=str(status.get("nominatedNodeName") or ""),
        phase=status.get("phase"),
        deleting=bool(meta.get("deletionTimestamp")),
        disruptions=[
            c.get("reason")
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ],
    )


def read_pod_info(
    *,
    key: str,
    uid: str,
    resource_version: str,
    gpus: int,
    priority: int,
    annotations: Mapping[Any, Any],
    node_name: str,
    nominated: str,
    phase: Any,
    deleting: bool,
    disruptions: Sequence[Any],
) -> PodInfo:
    """The `PodInfo` of a pod's read parts, whether read from its JSON (`pod_info`) or straight from its
    protobuf (`podproto.decoded_pod`): the one home of what the annotations, the phase and the conditions
    mean. `disruptions`: the reasons of its `DisruptionTarget` conditions whose status is True."""
    claimed_at: float | None
    try:
        claimed_at = float(annotations[CLAIMED_AT_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        claimed_at = None
    try:
        reserved_until: float | None = float(annotations[RESERVED_UNTIL_ANNOTATION])
    except (KeyError, TypeError, ValueError):
        reserved_until = None
    policy = annotations.get(POLICY_ANNOTATION)
    return PodInfo(
        key=key,
        uid=uid,
        gpus=gpus,
        priority=priority,
        policy=None if policy is None else str(policy),
        node_name=node_name,
        nominated=nominated,
        terminated=phase in ("Succeeded", "Failed"),
        terminating=deleting or bool(disruptions),
        preempted=any(reason == "PreemptionByScheduler" for reason in disruptions),
        gpu_ids=parse_gpu_ids(annotations.get(GPU_IDS_ANNOTATION)),
        claim_node=str(annotations.get(CLAIM_NODE_ANNOTATION) or ""),
        claimed_at=claimed_at,
        resource_version=resource_version,
        reserved_until=reserved_until,
        idle_reclaimable=annotations.get(IDLE_RECLAIMABLE) == "true",
        idle_ack_until=parse_time_value(annotations.get(IDLE_ACK_UNTIL)),
    )


class DecodedPod(dict[str, Any]):
    """A pod decoded straight into its `PodInfo` (`podproto.decoded_pod`, the GPU model's own protobuf pod
    feed): as a dict, only what an informer keys it by (metadata's name, namespace and resourceVersion) and
    its labels; `info` is what `pod_info` of its JSON gives for `resource`."""

    __slots__ = ("info", "resource")

    def __init__(self, metadata: dict[str, Any], info: PodInfo, resource: str) -> None:
        super().__init__(metadata=metadata)
        self.info = info
        self.resource = resource


def claim_fresh(claimed_at: float | None, reserved_until: float | None, now: float, ttl: float) -> bool:
    """Whether a claim still holds its GPUs: a reservation until its deadline, else for `ttl` after it was
    written (a claim without a readable time holds: unknown is never free)."""
    if reserved_until is not None:
        return now < reserved_until
    return claimed_at is None or now - claimed_at < ttl


WHOLE = GpuSharing(SharingMode.WHOLE)
"""A node that does not share its GPUs (the default for hand-made `NodeInfo`s)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The node object, parsed: GPU count, annotation topology and quarantine."""

    name: str
    allocatable: int
    topology: NodeTopology | None = None
    topology_error: str = ""
    quarantine: NodeQuarantine | None = None
    """Our quarantine of the node (`gpuwarden.quarantine.node_quarantine`); None: not quarantined."""
    sharing: GpuSharing = WHOLE
    """How the node shares its GPUs (gpuwarden.gpusharing): a shared node is passed through, never placed."""
    device_plugin: bool = True
    """The node's allocatable of the GPU resource is > 0 (a device plugin serves it there); False on a node
    without GPUs or with DRA-backed ones - kube-scheduler's own test (noderesources'
    `shouldDelegateResourceToDRA`, v1.37: at 0 the name goes to DRA when a DeviceClass maps it)."""

    @property
    def quarantine_reason(self) -> str | None:
        return self.quarantine.reason if self.quarantine is not None else None


def sharing_of(
    obj: Mapping[str, Any],
    resource: str,
    topology: NodeTopology | None = None,
    *,
    expected_label: str = EXPECTED_GPUS,
) -> GpuSharing:
    """A v1.Node's sharing mode and physical GPU count (`gpuwarden.gpusharing`), with its published topology
    (`topology`, else the node agent's annotation, read here) counting the physical GPUs where GFD does not
    (MIG single). `expected_label=""` leaves the expected-GPUs override to the caller (health's is
    configurable)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if topology is None:
        raw = (meta.get("annotations") or {}).get(TOPOLOGY_ANNOTATION)
        try:
            topology = parse_annotation(str(raw)) if raw is not None else None
        except TopologyError:
            topology = None
    return node_sharing(
        meta.get("labels") or {},
        status.get("capacity") or status.get("allocatable") or {},
        resource,
        expected_label=expected_label,
        topology_gpus=len(topology.gpus) or None if topology is not None else None,
    )


def node_info(obj: Mapping[str, Any], resource: str) -> NodeInfo:
    """Parse a v1.Node (JSON)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    allocatable = int_value((status.get("allocatable") or {}).get(resource, 0))
    topology, error = None, ""
    if TOPOLOGY_ANNOTATION in annotations:
        try:
            topology = parse_annotation(str(annotations[TOPOLOGY_ANNOTATION]))
        except TopologyError as exc:
            error = str(exc)
    quarantine = node_quarantine(spec.get("taints") or [], annotations)
    sharing = sharing_of(obj, resource, topology)
    return NodeInfo(
        str(meta.get("name", "")),
        allocatable,
        topology,
        error,
        quarantine,
        sharing,
        device_plugin=allocatable > 0 or sharing.slots > 0,
    )
