"""The extender's cluster model: per node, which GPUs exist, which are taken, quarantined or promised.

Why it exists: filter, prioritize and bind must all answer from the same picture, rebuilt purely from the API
(docs/architecture.md, safety rule 5) so any replica, or a restarted one, sees identical
state. `ClusterModel` is fed objects by the watch caches (nodes, pods, NodeResourceTopology) and keeps, per
node, an immutable `NodeView` that the pure decisions in `decide.py` read. A view is rebuilt only when
something on that node changed, so a filter over 500 candidates costs a dict lookup per node.

GPU occupancy comes from, in this order of certainty:
* non-terminated pods bound to the node with `gpuwarden.io/gpu-ids` - those exact GPUs;
* non-terminated pods bound to the node without a (valid) set, e.g. bound by another scheduler - a count
  of GPUs held *somewhere* on the node ("count-only"; decide.py accounts for them adversarially);
* unbound pods carrying our in-flight claim (see claims.py) - those GPUs, until the claim's TTL passes;
* pending pods with `status.nominatedNodeName` - a request that decide.py reserves when its priority is at
  least the incoming pod's (what kube-scheduler's `addGENominatedPods` does for in-tree plugins).

Each bound holder is also kept as a `Holder` (priority, terminating) so that decide.py can tell which GPUs a
preemption on this node is freeing for the pod nominated there.

Quarantine comes from the health controller's taint and its `gpuwarden.io/quarantine` record (GPU UUIDs).
This module does no I/O, reads no clock, and must not decide anything: it only describes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.gpus.domains import DomainPlacement, JobGroup, job_group, node_placement
from controller.gpus.dra import dra_class_for_node, extended_resource_classes, passthrough_note
from controller.gpus.objects import NodeInfo, PodInfo, node_info, pod_info
from controller.gpus.shared import shared_note
from controller.gpus.topology import NodeTopology, TopologyError, count_only, parse_nrt, uuid_map
from gpuwarden.quarantine import quarantined_ids


@dataclass(frozen=True, slots=True)
class Claim:
    """An unbound pod's in-flight claim on exact GPUs (written by bind, before the Binding)."""

    pod: str
    ids: tuple[str, ...]
    claimed_at: float | None
    until: float | None = None
    """A preemption reservation's deadline (holds until then instead of for the claim TTL)."""


@dataclass(frozen=True, slots=True)
class Nominated:
    """A pending pod nominated to this node by preemption; its GPUs are promised, not yet placed."""

    pod: str
    gpus: int
    priority: int
    policy: str | None


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod bound to the node and holding GPUs: its exact ones (`ids`) and those we cannot see (`unknown`).

    Kept so that a pod nominated to this node can see which GPUs its preemption is freeing (decide.py)."""

    pod: str
    ids: tuple[str, ...]
    unknown: int
    priority: int
    terminating: bool
    preempted: bool = False
    uid: str = ""
    idle: bool = False
    """Marked `idle-reclaimable` by the idle loop: a preferred victim (`reclaimable`)."""
    idle_ack_until: float | None = None

    def reclaimable(self, now: float) -> bool:
        """Idle under a prefer-as-victim rule and not acknowledged at `now`: taken first by GPU preemption,
        and it yields to a pending pod of equal priority too."""
        return self.idle and (self.idle_ack_until is None or self.idle_ack_until <= now)


@dataclass(frozen=True, slots=True)
class NodeView:
    """Everything decide.py needs about one node, immutable. GPU ids are strings, as in the annotation."""

    name: str
    allocatable: int
    topology: NodeTopology
    topology_error: str = ""
    quarantined: frozenset[str] = frozenset()
    quarantine_reason: str | None = None
    used: frozenset[str] = frozenset()
    used_unknown: int = 0
    claims: tuple[Claim, ...] = ()
    nominated: tuple[Nominated, ...] = ()
    holders: tuple[Holder, ...] = ()
    """The bound pods that make up `used` and `used_unknown`."""
    error_trend: float | None = None
    dra_class: str = ""
    """The DeviceClass through which DRA serves the GPU resource on this node ("" = device plugin or no GPUs;
    dra.py): the extender passes such a node through and promises no GPU set on it."""
    passthrough: str = ""
    """Why the extender passes this node through unjudged ("" = it is judged): DRA allocates its GPUs
    (`dra_class`) or it shares them (shared.py). No GPU set is chosen, recorded, freed or promised there."""
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """decide.py's cache of answers derived from this (immutable) view; dropped with the view."""
    preempting: bool = field(init=False, compare=False, repr=False, default=False)
    """Whether a pod here is a preemption victim (answers then depend on the incoming pod's priority);
    derived from `holders` once, as it is asked for every candidate node of every request."""
    lowest_priority: float = field(init=False, compare=False, repr=False, default=float("inf"))
    """The lowest priority among holders (+inf without holders; -inf when one is terminating, which any
    incoming pod may be waiting for), derived once like `preempting`."""
    claim_pods: frozenset[str] = field(init=False, compare=False, repr=False, default=frozenset())
    """The pods of `claims` (a pod's own claim never counts against it), derived once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "preempting", any(h.preempted for h in self.holders))
        if self.claims:
            object.__setattr__(self, "claim_pods", frozenset(c.pod for c in self.claims))
        if any(h.terminating for h in self.holders):
            lowest = float("-inf")
        else:
            lowest = float(min((h.priority for h in self.holders), default=float("inf")))
        object.__setattr__(self, "lowest_priority", lowest)

    def may_yield_to(self, priority: int) -> bool:
        """Whether a holder here is terminating or of lower priority than `priority` (what the incoming
        pod's preemption could be freeing)."""
        return self.lowest_priority < priority

    def emptied(self) -> NodeView:
        """This node as if no pod held, claimed or was nominated to any of its GPUs (fresh answer cache):
        what "could this pod ever fit here?" is asked of."""
        return replace(self, used=frozenset(), used_unknown=0, claims=(), nominated=(), memo={})

    def claims_stable_until(self, now: float, ttl: float) -> float:
        """Until when (from `now` on) every claim here stays as fresh or expired as it is at `now`: the
        earliest expiry still ahead (+inf when none is); answers derived at `now` hold until then."""
        ahead = [
            c.until if c.until is not None else c.claimed_at + ttl  # type: ignore[operator]
            for c in self.claims
            if c.until is not None or c.claimed_at is not None
        ]
        return min((t for t in ahead if t > now), default=float("inf"))

    def with_claims(self, extra: Iterable[Claim]) -> NodeView:
        """This view plus claims not yet seen by the watch (a replica's own in-flight binds)."""
        seen = {c.pod for c in self.claims}
        added = tuple(c for c in extra if c.pod not in seen)
        return replace(self, claims=self.claims + added, memo={}) if added else self


def build_view(
    info: NodeInfo,
    nrt: NodeTopology | str | None,
    pods: Iterable[PodInfo],
    error_trend: float | None = None,
    dra_class: str = "",
) -> NodeView:
    """Join a node, its NRT (topology or parse error) and the pods related to it into a `NodeView`."""
    topology: NodeTopology | None = info.topology
    error = info.topology_error
    if isinstance(nrt, NodeTopology):
        topology, error = nrt, ""
    elif isinstance(nrt, str):
        topology, error = None, nrt
    if topology is None:
        topology = count_only(info.allocatable)
    ids = {g.id for g in topology.gpus}
    quarantined = quarantined_ids(info.quarantine, ids, uuid_map(topology, info.topology))
    used: set[str] = set()
    unknown = 0
    claims: list[Claim] = []
    nominated: list[Nominated] = []
    holders: list[Holder] = []
    for pod in sorted(pods, key=lambda p: p.key):
        if pod.node_name == info.name:
            known = [i for i in pod.gpu_ids or () if i in ids and i not in used]
            used.update(known)
            hidden = max(pod.gpus, len(pod.gpu_ids or ())) - len(known)
            unknown += hidden
            holder = Holder(
                pod.key, tuple(known), hidden, pod.priority, pod.terminating, pod.preempted, pod.uid,
                pod.idle_reclaimable, pod.idle_ack_until,
            )  # fmt: skip
            holders.append(holder)
        elif not pod.node_name and pod.claim_node == info.name and pod.gpu_ids:
            claim_ids = tuple(i for i in pod.gpu_ids if i in ids)
            claims.append(Claim(pod.key, claim_ids, pod.claimed_at, pod.reserved_until))
        elif not pod.node_name and pod.nominated == info.name and pod.gpus > 0:
            nominated.append(Nominated(pod.key, pod.gpus, pod.priority, pod.policy))
    return NodeView(
        name=info.name,
        allocatable=info.allocatable,
        topology=topology,
        topology_error=error,
        quarantined=quarantined,
        quarantine_reason=info.quarantine_reason,
        used=frozenset(used),
        used_unknown=unknown,
        claims=tuple(claims),
        nominated=tuple(nominated),
        holders=tuple(holders),
        error_trend=error_trend,
        dra_class=dra_class,
        passthrough=(
            passthrough_note(info.name, dra_class)
            if dra_class
            else shared_note(info.name, info.sharing)
            if info.sharing.shared
            else ""
        ),
    )


class NotSynced(Exception):
    """The model has not completed its first list; answering from it now could double-book GPUs."""


class ClusterModel:
    """Incrementally maintained index from watch events to per-node `NodeView`s.

    Single-threaded by design (one asyncio loop feeds and reads it). `synced` turns true once the node and
    pod caches have completed their first list; until then the extender answers with an `Error`.
    `topology_source` (config `extender.topology_source`): auto = NRT when an object describes the node's
    GPUs, else the annotation; nrt or annotation = only that source.
    """

    def __init__(
        self,
        resource: str = "nvidia.com/gpu",
        topology_source: str = "auto",
        placement: DomainPlacement | None = None,
    ) -> None:
        if topology_source not in ("auto", "nrt", "annotation"):
            raise ValueError(f"topology_source must be auto, nrt or annotation, not {topology_source!r}")
        self.resource = resource
        self.topology_source = topology_source
        self._nodes: dict[str, NodeInfo] = {}
        self._nrt: dict[str, NodeTopology | str] = {}
        self._pods: dict[str, PodInfo] = {}
        self._by_node: dict[str, set[str]] = {}
        self._trends: dict[str, float] = {}
        self._views: dict[str, NodeView] = {}
        self._stale: dict[str, NodeView] = {}
        """Views dropped by a change, until their node's next view is built: when the new one is equal (the
        change did not touch what decisions read, e.g. a pod's status or resourceVersion), the old view and
        the answers cached on it are kept."""
        self._dra_classes: dict[str, str] = {}
        """extended resource -> DeviceClass (dra.py), from the DeviceClass watch when the feed runs one."""
        self._numa_max: dict[str, int] = {}
        self._numa_max_count: Counter[int] = Counter()
        self.nodes_synced = False
        self.pods_synced = False
        self._change_listeners: list[Callable[[Collection[str]], None]] = []
        self.placement = placement
        """NVLink-domain placement of multi-pod jobs (domains.py); None: off."""
        self._domain_of: dict[str, tuple[str | None, str | None]] = {}
        """node -> (its domain, the health published on it), for nodes in a domain or carrying our label."""
        self._jobs: dict[JobGroup, dict[str, str]] = {}
        """a multi-pod job -> its pods bound to a node (pod key -> node name)."""
        self._job_of: dict[str, JobGroup] = {}

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    def add_change_listener(self, listener: Callable[[Collection[str]], None]) -> None:
        """`listener(names)` is called whenever these nodes' views are dropped (a change that may alter them):
        for what is derived from views and kept elsewhere (the extender's pre-encoded answers)."""
        self._change_listeners.append(listener)

    def _dirty(self, names: Collection[str]) -> None:
        for name in names:
            view = self._views.pop(name, None)
            if view is not None:
                self._stale[name] = view
        for listener in self._change_listeners:
            listener(names)

    def _topology_changed(self, name: str) -> None:
        """Keep `max_numa_gpus()` O(1): a count of nodes per largest-NUMA-node size."""
        old = self._numa_max.pop(name, None)
        if old is not None:
            self._numa_max_count[old] -= 1
        info, nrt = self._nodes.get(name), self._nrt.get(name)
        topology = nrt if isinstance(nrt, NodeTopology) else info.topology if info is not None else None
        if info is None or topology is None:
            return
        sizes = Counter(g.numa for g in topology.gpus if g.numa is not None)
        if sizes:
            self._numa_max[name] = max(sizes.values())
            self._numa_max_count[self._numa_max[name]] += 1
        self._dirty([name])

    def max_numa_gpus(self) -> int:
        """The most GPUs one NUMA node holds anywhere in the fleet (0 when no node publishes NUMA data)."""
        return max((size for size, nodes in self._numa_max_count.items() if nodes > 0), default=0)

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        info = node_info(obj, self.resource)
        if self.placement is not None:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            where = node_placement(labels, self.placement.clique_label)
            if where != (None, None):
                self._domain_of[info.name] = where
            else:
                self._domain_of.pop(info.name, None)
        if self.topology_source == "nrt":
            info = replace(info, topology=None, topology_error="")
        old = self._nodes.get(info.name)
        if old != info:
            self._nodes[info.name] = info
            self._dirty([info.name])
            if old is None or old.topology != info.topology:
                self._topology_changed(info.name)

    def delete_node(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._domain_of.pop(name, None)
        self._topology_changed(name)
        self._dirty([name])
        self._stale.pop(name, None)  # no view will be built for it again to take this one's place

    def upsert_nrt(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if self.topology_source == "annotation":
            return
        try:
            parsed: NodeTopology | str | None = parse_nrt(obj, self.resource)
        except TopologyError as exc:
            parsed = f"NodeResourceTopology unreadable: {exc}"
        if parsed is None:
            self.delete_nrt(name)
        elif self._nrt.get(name) != parsed:
            self._nrt[name] = parsed
            self._topology_changed(name)

    def delete_nrt(self, name: str) -> None:
        if self._nrt.pop(name, None) is not None:
            self._topology_changed(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        info = pod_info(obj, self.resource)
        if self.placement is not None:
            self._index_job(info, (obj.get("metadata") or {}).get("labels") or {})
        old = self._pods.get(info.key)
        if not info.holds_gpus:
            self.delete_pod(info.key)
            return
        if old == info:
            return
        if old is not None and replace(old, resource_version=info.resource_version) == info:
            # a write that changed nothing the views read (a bound pod's status, its conditions): the new
            # resourceVersion is kept for bind's preconditions, the node's view and its answers stay
            self._pods[info.key] = info
            return
        old_nodes = old.nodes() if old is not None else set()
        new_nodes = info.nodes()
        self._pods[info.key] = info
        for name in old_nodes - new_nodes:
            self._by_node.get(name, set()).discard(info.key)
        for name in new_nodes:
            self._by_node.setdefault(name, set()).add(info.key)
        self._dirty(old_nodes | new_nodes)

    def _index_job(self, info: PodInfo, labels: Mapping[str, str]) -> None:
        """Keep the job index: a bound, live GPU pod of a multi-pod job under its job."""
        assert self.placement is not None
        group = job_group(info.key.split("/", 1)[0], labels, self.placement.job_labels)
        placed = group is not None and info.node_name and info.holds_gpus and not info.terminating
        if not placed:
            self._unindex_job(info.key)
            return
        assert group is not None
        if self._job_of.get(info.key) not in (None, group):
            self._unindex_job(info.key)
        self._job_of[info.key] = group
        self._jobs.setdefault(group, {})[info.key] = info.node_name

    def _unindex_job(self, key: str) -> None:
        group = self._job_of.pop(key, None)
        if group is not None:
            pods = self._jobs.get(group, {})
            pods.pop(key, None)
            if not pods:
                self._jobs.pop(group, None)

    def sibling_domains(self, group: JobGroup) -> Counter[str]:
        """How many of the job's bound pods run in each NVLink domain."""
        out: Counter[str] = Counter()
        for node in self._jobs.get(group, {}).values():
            domain = self._domain_of.get(node, (None, None))[0]
            if domain is not None:
                out[domain] += 1
        return out

    def node_domain(self, name: str) -> tuple[str | None, str | None]:
        """(the node's NVLink domain, the health published on it), (None, None) when it has neither."""
        return self._domain_of.get(name, (None, None))

    def delete_pod(self, key: str) -> None:
        self._unindex_job(key)
        old = self._pods.pop(key, None)
        if old is None:
            return
        for name in old.nodes():
            self._by_node.get(name, set()).discard(key)
        self._dirty(old.nodes())

    def set_error_trends(self, trends: Mapping[str, float]) -> None:
        """Replace the per-node correctable-error trends (from Prometheus); absent = unknown."""
        changed = {n for n in set(trends) | set(self._trends) if trends.get(n) != self._trends.get(n)}
        self._trends = dict(trends)
        self._dirty(changed)

    def pod(self, key: str) -> PodInfo | None:
        return self._pods.get(key)

    def pods_on(self, name: str) -> list[PodInfo]:
        """Every cached pod bound to, claiming, or nominated to node `name`."""
        return [self._pods[k] for k in self._by_node.get(name, ())]

    def held_by_namespace(self) -> list[tuple[str, int]]:
        """(namespace, GPUs) per bound pod that holds GPUs and is not leaving: what tenants hold now."""
        return [
            (p.key.split("/", 1)[0], p.gpus)
            for p in self._pods.values()
            if p.node_name and p.gpus > 0 and not p.terminated and not p.terminating
        ]

    def set_device_classes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """The cluster's DeviceClasses (all of them, as listed or after a watch event): which extended
        resources DRA serves; nodes without a device plugin are re-viewed when that changes."""
        classes = extended_resource_classes(objs)
        if classes != self._dra_classes:
            self._dra_classes = classes
            self._dirty([name for name, info in self._nodes.items() if not info.device_plugin])

    def _dra_class(self, info: NodeInfo) -> str:
        return dra_class_for_node(info.device_plugin, self.resource, self._dra_classes)

    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    def node_count(self) -> int:
        return len(self._nodes)

    def view(self, name: str) -> NodeView | None:
        """The node's current view, or None when the node is unknown."""
        cached = self._views.get(name)
        if cached is not None:
            return cached
        info = self._nodes.get(name)
        old = self._stale.pop(name, None)
        if info is None:
            return None
        pods = (self._pods[k] for k in self._by_node.get(name, ()))
        view = build_view(info, self._nrt.get(name), pods, self._trends.get(name), self._dra_class(info))
        if old is not None and old == view:
            view = old
        self._views[name] = view
        return view

    def views_of(self, names: Iterable[str]) -> list[tuple[str, NodeView | None]]:
        """(name, view) for each name, as `view` gives them: one C-level dict lookup per cached view (the
        common case for a filter's 500 candidates), `view()` only for the ones to (re)build."""
        get, view = self._views.get, self.view
        return [(name, get(name) or view(name)) for name in names]

    def fresh_view(self, name: str, listed: Iterable[PodInfo]) -> NodeView | None:
        """The node's view with every pod that records a GPU set taken from `listed` (a consistent LIST of
        the node's claim label, see claims.py) instead of the watch cache, which may lag: victims already
        deleted are gone, claims written a moment ago are there. Pods without a recorded set (count-only
        holders, nominated pods) still come from the cache, as no LIST by label can find them."""
        info = self._nodes.get(name)
        if info is None:
            return None
        fresh = {p.key: p for p in listed if p.holds_gpus}
        cached = (self._pods[k] for k in self._by_node.get(name, ()))
        pods = [p for p in cached if p.key not in fresh and p.gpu_ids is None]
        return build_view(
            info, self._nrt.get(name), [*pods, *fresh.values()], self._trends.get(name), self._dra_class(info)
        )
