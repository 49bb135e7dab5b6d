"""From the watch caches (raw Node and Pod JSON) to the drain plan's inputs.

Why a module: what counts as "quarantined", "a GPU pod", "which GPUs it holds" and "a schedulable GPU node" is
read the same way the rest of gpuwarden reads it — the health controller's taint and record, the extender's
topology annotation and `gpuwarden.io/gpu-ids` (the node agent's actual set once it reconciled the pod).
Unreadable data is unknown: a node whose record cannot be read is not drained; a pod whose GPU set is unknown
widens the scope to the whole node (never narrows it). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.drain.plan import DrainNode, DrainPod, Eviction
from controller.drain.state import DrainState, decode
from controller.gpus.devices import claim_names, pod_devices
from controller.gpus.dra import dra_class_for_node
from controller.gpus.objects import gpu_share_request
from controller.gpus.physical import mig_places
from controller.gpus.topology import TopologyError, parse_annotation, uuid_map
from gpuwarden.gpusharing import is_gpu_resource, node_sharing
from gpuwarden.quarantine import decode as decode_record
from gpuwarden.quarantine import node_quarantine
from gpuwarden.wellknown import DRAIN as DRAIN_ANNOTATION
from gpuwarden.wellknown import DRAIN_PAUSE as PAUSE_ANNOTATION
from gpuwarden.wellknown import GPU_IDS as GPU_IDS_ANNOTATION
from gpuwarden.wellknown import GPU_IDS_SOURCE, GPU_IDS_SOURCE_KUBELET, parse_gpu_ids
from gpuwarden.wellknown import GPU_TOPOLOGY as TOPOLOGY_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY

QUARANTINE_TAINT = TAINT_KEY
QUARANTINE_ANNOTATION = RECORD_ANNOTATION
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DrainSnapshot:
    nodes: tuple[DrainNode, ...]
    pods_by_node: Mapping[str, tuple[DrainPod, ...]]
    states: Mapping[str, DrainState]
    """Drain state on quarantined nodes (a cancelled one: only its ledger, carried into the new drain)."""
    released: tuple[str, ...]
    """Nodes carrying a drain state but no longer quarantined: their drain is cancelled (cancel.py)."""
    gpu_nodes: int
    schedulable_gpu_nodes: int
    problems: tuple[str, ...] = field(default=())
    unknown: tuple[str, ...] = ()
    """Nodes whose drain state or quarantine record cannot be read: left alone entirely."""
    recovering: tuple[str, ...] = ()
    """Quarantined nodes whose evidence is gone (healthy period running): no remediation step starts."""
    released_states: Mapping[str, DrainState] = field(default_factory=dict)
    """The drain states of the `released` nodes."""

    def ledgers(self) -> list[tuple[Eviction, ...]]:
        """Every readable eviction ledger - quarantined and released nodes': the fleet's rate."""
        return [n.evictions for n in self.nodes] + [s.evictions for s in self.released_states.values()]


def _annotations(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def drain_pod(obj: Obj, resource: str, claims: Mapping[tuple[str, str], Obj] | None = None) -> DrainPod:
    """`claims` (namespace, name) -> ResourceClaim: given for pods on a device-scoped quarantine's node."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    ann = _annotations(obj)
    ids = ann.get(GPU_IDS_ANNOTATION)
    return DrainPod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        gpu_ids=parse_gpu_ids(ids),
        gpus=gpu_share_request(obj.get("spec") or {}, resource),
        owner_kinds=tuple(str(o.get("kind", "")) for o in meta.get("ownerReferences") or []),
        mirror=MIRROR_ANNOTATION in ann,
        phase=str(status.get("phase", "")),
        terminating=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
        claims=claim_names(obj) != (),
        devices=pod_devices(obj, claims) if claims is not None else None,
        actual=ann.get(GPU_IDS_SOURCE) == GPU_IDS_SOURCE_KUBELET,
    )


def _allocatable(node: Obj, resource: str) -> int:
    """What the node offers of GPUs or shares of one (replicas, MIG devices count as the GPUs they are on)."""
    total = 0
    for name, value in ((node.get("status") or {}).get("allocatable") or {}).items():
        if isinstance(name, str) and is_gpu_resource(name, resource):
            try:
                total += int(value or 0)
            except (TypeError, ValueError):
                continue
    return total


def _schedulable(node: Obj) -> bool:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    return not any(
        t.get("effect") in ("NoSchedule", "NoExecute")
        and t.get("key") in (QUARANTINE_TAINT, "node.kubernetes.io/unschedulable")
        for t in spec.get("taints") or []
    )


def device_scoped(nodes: Iterable[Obj]) -> set[str]:
    """Nodes under our taint whose quarantine record names DRA devices: their pods' claims are read."""
    out: set[str] = set()
    for n in nodes:
        if not any(t.get("key") == QUARANTINE_TAINT for t in (n.get("spec") or {}).get("taints") or []):
            continue
        record, _ = decode_record(_annotations(n).get(QUARANTINE_ANNOTATION))
        if record is not None and record.state == "quarantined" and record.devices:
            out.add(str((n.get("metadata") or {}).get("name", "")))
    return out


def build_snapshot(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    *,
    resource: str,
    claims: Mapping[tuple[str, str], Obj] | None = None,
    dra_classes: Mapping[str, str] | None = None,
) -> DrainSnapshot:
    """`claims`: the ResourceClaims of the pods on device-scoped quarantines' nodes (None: not read, so those
    pods' devices are unknown and the drain there is node-wide). `dra_classes`: extended resource name ->
    DeviceClass (`controller.gpus.dra`); a node whose GPUs DRA serves counts as a GPU node for the gate's
    floor like a device-plugin one (None: not read, only device-plugin and topology-annotated nodes count)."""
    nodes = list(nodes)
    scoped = device_scoped(nodes)
    # Only quarantined nodes (and released ones still carrying a drain state) need their pods parsed: at
    # 5,000 nodes and 40,000 pods that is the difference between ~20 and ~400 ms per pass.
    tainted_nodes = {
        str((n.get("metadata") or {}).get("name", ""))
        for n in nodes
        if any(t.get("key") == QUARANTINE_TAINT for t in (n.get("spec") or {}).get("taints") or [])
    }
    # ... and released nodes still carrying a drain state: their ledger's Events owed depend on their pods.
    wanted = tainted_nodes | {
        str((n.get("metadata") or {}).get("name", "")) for n in nodes if DRAIN_ANNOTATION in _annotations(n)
    }
    by_node: dict[str, list[DrainPod]] = {}
    for obj in pods:
        bound = (obj.get("spec") or {}).get("nodeName")
        if bound and bound in wanted:
            on_devices = claims if bound in scoped else None
            by_node.setdefault(str(bound), []).append(drain_pod(obj, resource, on_devices))
    out: list[DrainNode] = []
    states: dict[str, DrainState] = {}
    released: dict[str, DrainState] = {}
    unknown: list[str] = []
    recovering: list[str] = []
    problems: list[str] = []
    gpu_nodes = schedulable = 0
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        ann = _annotations(node)
        allocatable = _allocatable(node, resource) > 0
        if (
            allocatable
            or TOPOLOGY_ANNOTATION in ann
            or dra_class_for_node(allocatable, resource, dra_classes or {})
        ):
            gpu_nodes += 1
            schedulable += _schedulable(node)
        tainted = name in tainted_nodes
        if not tainted and DRAIN_ANNOTATION not in ann:
            continue  # the common case: a healthy node with no drain to cancel
        state, why = decode(ann.get(DRAIN_ANNOTATION))
        if why:
            problems.append(f"{name}: {why}")  # unknown: neither drained nor cancelled; the state is kept
            unknown.append(name)
            continue
        record, rwhy = decode_record(ann.get(QUARANTINE_ANNOTATION))
        if tainted and record is None:
            # Our taint without a readable record: unknown, never "released" (that would cancel the drain).
            problems.append(f"{name}: {rwhy or 'tainted without a quarantine record'}")
            unknown.append(name)
            continue
        if not tainted or record is None or record.state != "quarantined":
            if state is not None:
                released[name] = state
            continue
        if record.healthy_since is not None:
            recovering.append(name)
        quarantine = node_quarantine((node.get("spec") or {}).get("taints") or [], ann)
        faulty = quarantine.uuids if quarantine is not None else None
        try:
            topo = parse_annotation(ann[TOPOLOGY_ANNOTATION]) if TOPOLOGY_ANNOTATION in ann else None
        except TopologyError as exc:
            problems.append(f"{name}: {exc}")
            topo = None
        uuid_to_id = uuid_map(topo)
        meta = node.get("metadata") or {}
        sharing = node_sharing(
            meta.get("labels") or {},
            (node.get("status") or {}).get("capacity") or {},
            resource,
            topology_gpus=len(topo.gpus) if topo is not None else None,
        )
        if state is not None:
            states[name] = state
        drain = state if state is not None and state.cancelled is None else None  # cancelled: not begun
        out.append(
            DrainNode(
                name=name,
                fault_gpus=faulty or frozenset(),
                uuid_to_id=uuid_to_id,
                fault_devices=record.devices,
                dra=bool(record.devices or record.scope_note),
                started=drain.started if drain is not None else None,
                history=dict(drain.history) if drain is not None else {},
                paused=ann.get(PAUSE_ANNOTATION) == "true",
                finished=drain is not None and drain.done is not None,
                evictions=state.evictions if state is not None else (),
                quarantined_at=record.quarantined_at,
                migs=mig_places(topo),
                sharing=sharing,
            )
        )
    return DrainSnapshot(
        nodes=tuple(out),
        pods_by_node={k: tuple(v) for k, v in by_node.items()},
        states=states,
        released=tuple(released),
        released_states=released,
        unknown=tuple(unknown),
        recovering=tuple(recovering),
        gpu_nodes=gpu_nodes,
        schedulable_gpu_nodes=schedulable,
        problems=tuple(problems),
    )
