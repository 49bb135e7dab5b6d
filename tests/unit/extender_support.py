"""Builders for the extender's unit tests: Kubernetes JSON for GPU nodes and pods, and a fed ClusterModel.

Shapes follow the real API objects (camelCase JSON) so the same builders serve the model, the wire tests
and the fake API server used by the bind tests.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from controller.gpus.model import ClusterModel
from gpuwarden.errors import KubeConflict, KubeNotFound

RESOURCE = "nvidia.com/gpu"


def topology(
    numa: int = 2, per_numa: int = 4, *, pcie: int = 2, nvlink: str = "pair", uuids: bool = True
) -> dict[str, Any]:
    """`gpuwarden.io/gpu-topology` content: `numa` NUMA nodes of `per_numa` GPUs, `pcie` switches per NUMA
    node, NVLink domains per `pair` of GPUs, per `numa` node, or `none`."""
    out: dict[str, Any] = {}
    per_switch = max(1, per_numa // max(1, pcie))
    for i in range(numa * per_numa):
        n = i // per_numa
        gpu: dict[str, Any] = {"numa": n, "pcie": f"pci{n}-{(i % per_numa) // per_switch}"}
        if nvlink == "pair":
            gpu["nvlink"] = f"nvl{i // 2}"
        elif nvlink == "numa":
            gpu["nvlink"] = f"nvl{n}"
        if uuids:
            gpu["uuid"] = f"GPU-{i:04d}"
        out[str(i)] = gpu
    return out


def node(
    name: str,
    gpus: int = 8,
    *,
    topo: dict[str, Any] | str | None = "default",
    taint: str | None = None,
    quarantine: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A v1.Node with `gpus` allocatable; `topo="default"` = 2 NUMA x gpus/2, None = no annotation."""
    ann = dict(annotations or {})
    if topo == "default":
        ann["gpuwarden.io/gpu-topology"] = json.dumps(topology(2, gpus // 2))
    elif isinstance(topo, dict):
        ann["gpuwarden.io/gpu-topology"] = json.dumps(topo)
    elif isinstance(topo, str):
        ann["gpuwarden.io/gpu-topology"] = topo
    if quarantine is not None:
        ann["gpuwarden.io/quarantine"] = json.dumps(quarantine)
    spec: dict[str, Any] = {}
    if taint is not None:
        spec["taints"] = [{"key": "gpuwarden.io/gpu-unhealthy", "value": taint, "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": ann, "resourceVersion": "1"},
        "spec": spec,
        "status": {"allocatable": {RESOURCE: str(gpus), "cpu": "64"}, "capacity": {RESOURCE: str(gpus)}},
    }


def quarantine_record(*gpus: str, reason: str = "xid-79") -> dict[str, Any]:
    """A `gpuwarden.io/quarantine` record as the health controller writes it ("" = node-level evidence)."""
    return {
        "version": 1,
        "state": "quarantined",
        "reason": reason,
        "class": "hardware",
        "effect": "NoSchedule",
        "evidence": [{"reason": reason, **({"gpu": g} if g else {})} for g in gpus],
        "gpus": sorted(g for g in gpus if g),
        "xids": [79],
    }


def pod(
    name: str,
    gpus: int = 1,
    *,
    namespace: str = "ml",
    node: str = "",
    ids: str | None = None,
    policy: str | None = None,
    priority: int | None = None,
    nominated: str = "",
    phase: str | None = None,
    uid: str | None = None,
    claim: tuple[str, float] | None = None,
    resource_version: str = "100",
    deleting: bool = False,
    disrupted: str = "",
) -> dict[str, Any]:
    """A v1.Pod asking for `gpus` GPUs (limits); `claim=(node, claimed_at)` adds an in-flight claim;
    `deleting` sets a deletionTimestamp, `disrupted` a DisruptionTarget condition with that reason
    (PreemptionByScheduler: a preemption victim)."""
    annotations: dict[str, str] = {}
    labels: dict[str, str] = {"app": name}
    if ids is not None:
        annotations["gpuwarden.io/gpu-ids"] = ids
    if policy is not None:
        annotations["gpuwarden.io/topology-policy"] = policy
    if claim is not None:
        annotations["gpuwarden.io/gpu-node"] = claim[0]
        annotations["gpuwarden.io/gpu-claimed-at"] = f"{claim[1]:.3f}"
        labels["gpuwarden.io/gpu-node"] = claim[0]
    containers: list[dict[str, Any]] = [{"name": "main", "image": "trainer"}]
    if gpus:
        containers[0]["resources"] = {"limits": {RESOURCE: str(gpus)}}
    spec: dict[str, Any] = {"schedulerName": "default-scheduler", "containers": containers}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    status: dict[str, Any] = {"phase": phase or ("Running" if node else "Pending")}
    if nominated:
        status["nominatedNodeName"] = nominated
    if disrupted:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": disrupted}]
    extra_meta: dict[str, Any] = {"deletionTimestamp": "2023-11-14T22:13:20Z"} if deleting else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": resource_version,
            "labels": labels,
            "annotations": annotations,
            **extra_meta,
        },
        "spec": spec,
        "status": status,
    }


def model(
    nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]] = (), nrts: Iterable[dict[str, Any]] = ()
) -> ClusterModel:
    """A synced ClusterModel fed with the given objects."""
    m = ClusterModel(RESOURCE)
    for n in nodes:
        m.upsert_node(n)
    for p in pods:
        m.upsert_pod(p)
    for t in nrts:
        m.upsert_nrt(t)
    m.nodes_synced = m.pods_synced = True
    return m


def nrt(name: str, per_numa: list[int], *, ids: list[str] | None = None) -> dict[str, Any]:
    """A NodeResourceTopology with one `type: Node` zone per entry of `per_numa` (GPUs on it)."""
    zones = []
    cursor = 0
    for n, count in enumerate(per_numa):
        zone: dict[str, Any] = {
            "name": f"node-{n}",
            "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": "32", "allocatable": "32", "available": "30"},
                {
                    "name": RESOURCE,
                    "capacity": str(count),
                    "allocatable": str(count),
                    "available": str(count),
                },
            ],
        }
        if ids is not None:
            zone["attributes"] = [
                {"name": "gpuwarden.io/gpu-ids", "value": ",".join(ids[cursor : cursor + count])}
            ]
        cursor += count
        zones.append(zone)
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": zones,
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakePodApi:
    """An in-memory API server for pods with the semantics bind relies on: resourceVersion bumps on every
    write, merge patches conditional on `metadata.resourceVersion`, label-selector LISTs that see every
    write at once (consistent reads), and pods/binding that refuses an already bound pod. `on_write` lets a
    test play the watch (feed the model) or interleave another binder."""

    def __init__(self, pods: Iterable[dict[str, Any]] = ()) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.revision = 1000
        self.calls: list[str] = []
        self.on_write: list[Any] = []
        self.fail_binding: Exception | None = None
        self.jitter: random.Random | None = None
        """When set, every call yields to the event loop 0-3 times so concurrent binds interleave."""
        for p in pods:
            self.add(p)

    def add(self, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.pods[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj

    async def _yield(self) -> None:
        if self.jitter is not None:
            for _ in range(self.jitter.randint(0, 3)):
                await asyncio.sleep(0)

    def _get(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self.pods.get(f"{namespace}/{name}")
        if obj is None:
            raise KubeNotFound(f"pods {name!r} not found", status=404)
        return obj

    async def _written(self, obj: dict[str, Any]) -> None:
        for hook in self.on_write:
            result = hook(copy.deepcopy(obj))
            if hasattr(result, "__await__"):
                await result

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        await self._yield()
        self.calls.append(f"get {namespace}/{name}")
        return copy.deepcopy(self._get(namespace, name))

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        await self._yield()
        self.calls.append(f"patch {namespace}/{name}")
        obj = self._get(namespace, name)
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise KubeConflict("the object has been modified", status=409, reason="Conflict")
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        _merge(obj, patch)
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        await self._written(obj)
        return copy.deepcopy(obj)

    async def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        await self._yield()
        self.calls.append(f"list {label_selector}")
        key, _, value = label_selector.partition("=")
        return [
            copy.deepcopy(p)
            for p in self.pods.values()
            if (p["metadata"].get("labels") or {}).get(key) == value
        ]

    def held(self, node: str = "n") -> Counter[str]:
        """How many pods bound to `node` hold each GPU id (by their recorded `gpuwarden.io/gpu-ids`)."""
        counts: Counter[str] = Counter()
        for obj in self.pods.values():
            if obj["spec"].get("nodeName") == node:
                ids = (obj["metadata"].get("annotations") or {}).get("gpuwarden.io/gpu-ids", "")
                counts.update(i for i in ids.split(",") if i)
        return counts

    async def list_node_pods(self, node: str) -> list[dict[str, Any]]:
        await self._yield()
        self.calls.append(f"list spec.nodeName={node}")
        return [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName") == node]

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None = None
    ) -> None:
        """pods/binding: refuses a pod already bound (409); copies `annotations` onto the pod in the same
        write, as kube-apiserver's BindingREST does."""
        await self._yield()
        self.calls.append(f"bind {namespace}/{name} {node}" + (" +annotations" if annotations else ""))
        if self.fail_binding is not None:
            raise self.fail_binding
        obj = self._get(namespace, name)
        if obj["metadata"]["uid"] != uid:
            raise KubeConflict("UID precondition failed", status=409)
        if obj["spec"].get("nodeName"):
            raise KubeConflict(
                f"pod {name} is already assigned to node {obj['spec']['nodeName']}", status=409
            )
        obj["spec"]["nodeName"] = node
        if annotations:
            obj["metadata"].setdefault("annotations", {}).update(annotations)
        obj["status"].pop("nominatedNodeName", None)
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        await self._written(obj)
