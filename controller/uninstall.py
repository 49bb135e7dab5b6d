"""`gpuwarden uninstall`: lift exactly what gpuwarden wrote, so `helm uninstall` leaves the cluster as it was.

Why it exists: our taints, node conditions, annotations and DeviceTaintRules live on objects the release does
not own, so deleting the release leaves them behind - a quarantine taint outliving its controller keeps a node
empty forever. The chart runs this as a pre-delete hook (docs/uninstall.md); it can also be run by hand.

What it must not do: touch anything not ours. The keys it lifts are `gpuwarden.wellknown`'s WRITTEN_* lists
(operator overrides such as `gpuwarden.io/release` and every foreign key are kept); a taint or condition is
removed by index with a JSON-patch `test` of its key or type first, so a concurrent writer that moved the list
makes the patch fail rather than lose its change (the kubelet's heartbeats change other conditions freely).
`plan_uninstall` is pure; `apply` is the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.health.observe import DEVICE_TAINT_RULES
from gpuwarden.errors import KubeError, KubeNotFound
from gpuwarden.kube import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    LEASES,
    NODES,
    PODS,
    JsonObject,
    KubeClient,
    PatchType,
    Resource,
)
from gpuwarden.wellknown import (
    DISRUPTION_HOLD,
    KARPENTER_DO_NOT_DISRUPT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WRITTEN_NODE_ANNOTATIONS,
    WRITTEN_NODE_CONDITIONS,
    WRITTEN_NODE_LABELS,
    WRITTEN_NODE_TAINTS,
    WRITTEN_POD_ANNOTATIONS,
    WRITTEN_POD_LABELS,
)

DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
CONTROLLER = "gpuwarden-controller"
NODE_AGENT = "gpuwarden-node-agent"
BREAKER = "gpuwarden-quarantine-breaker"
ROUNDS = 3


@dataclass(frozen=True)
class Lift:
    """What to take off one node or pod. Empty tuples / None: nothing of that kind."""

    kind: str  # "Node" | "Pod"
    name: str
    namespace: str | None = None
    annotations: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    taints: tuple[tuple[int, str], ...] = ()  # (index as read, key) of ours
    conditions: tuple[tuple[int, str], ...] = ()  # (index as read, type) of ours

    def describe(self) -> str:
        parts = [*(f"annotation {k}" for k in self.annotations), *(f"label {k}" for k in self.labels)]
        parts += [f"taint {key}" for _, key in self.taints]
        parts += [f"condition {kind}" for _, kind in self.conditions]
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: " + ", ".join(parts)


@dataclass(frozen=True)
class UninstallPlan:
    lifts: tuple[Lift, ...]
    rules: tuple[str, ...]  # DeviceTaintRules of ours, deleted
    namespaced: tuple[tuple[str, str], ...] = field(default=())  # (kind, name) in the release namespace

    def lines(self) -> list[str]:
        return [
            *(lift.describe() for lift in self.lifts),
            *(f"DeviceTaintRule {name}: deleted" for name in self.rules),
            *(f"{kind} {name}: deleted" for kind, name in self.namespaced),
        ]


def _meta(obj: JsonObject, key: str) -> dict[str, str]:
    value = obj.get("metadata", {}).get(key) or {}
    return dict(value) if isinstance(value, dict) else {}


def lift_node(node: JsonObject) -> Lift | None:
    """Our annotations, taint and conditions on one Node; None when it carries none."""
    name = str(node["metadata"]["name"])
    present = _meta(node, "annotations")
    annotations = tuple(k for k in WRITTEN_NODE_ANNOTATIONS if k in present)
    if DISRUPTION_HOLD in present and present.get(KARPENTER_DO_NOT_DISRUPT) == "true":
        annotations += (KARPENTER_DO_NOT_DISRUPT,)  # the hold the health loop set (its mark says so)
    labels = tuple(k for k in WRITTEN_NODE_LABELS if k in _meta(node, "labels"))
    taints = list(node.get("spec", {}).get("taints") or [])
    conditions = list(node.get("status", {}).get("conditions") or [])
    lift = Lift(
        "Node",
        name,
        annotations=annotations,
        labels=labels,
        taints=tuple((i, str(t["key"])) for i, t in enumerate(taints) if t.get("key") in WRITTEN_NODE_TAINTS),
        conditions=tuple(
            (i, str(c["type"])) for i, c in enumerate(conditions) if c.get("type") in WRITTEN_NODE_CONDITIONS
        ),
    )
    return lift if (annotations or labels or lift.taints or lift.conditions) else None


def lift_pod(pod: JsonObject) -> Lift | None:
    meta = pod["metadata"]
    annotations = tuple(k for k in WRITTEN_POD_ANNOTATIONS if k in _meta(pod, "annotations"))
    labels = tuple(k for k in WRITTEN_POD_LABELS if k in _meta(pod, "labels"))
    if not (annotations or labels):
        return None
    return Lift("Pod", str(meta["name"]), str(meta.get("namespace", "")), annotations, labels)


def plan_uninstall(
    nodes: Iterable[JsonObject],
    pods: Iterable[JsonObject],
    rules: Iterable[JsonObject],
    namespaced: Sequence[tuple[str, str]] = (),
) -> UninstallPlan:
    """Everything to lift, in a stable order (nodes, then pods, then our DeviceTaintRules)."""
    lifts = [lift for lift in map(lift_node, nodes) if lift is not None]
    lifts += [lift for lift in map(lift_pod, pods) if lift is not None]
    owned = sorted(
        str(r["metadata"]["name"]) for r in rules if _meta(r, "labels").get(MANAGED_BY_LABEL) == MANAGED_BY
    )
    return UninstallPlan(tuple(lifts), tuple(owned), tuple(namespaced))


def metadata_patch(lift: Lift) -> JsonObject | None:
    meta: dict[str, Any] = {}
    if lift.annotations:
        meta["annotations"] = dict.fromkeys(lift.annotations)
    if lift.labels:
        meta["labels"] = dict.fromkeys(lift.labels)
    return {"metadata": meta} if meta else None


def removal_patch(path: str, field: str, entries: tuple[tuple[int, str], ...]) -> list[JsonObject]:
    """Remove list entries by index, last first, each after a `test` that it is still the one read."""
    ops: list[JsonObject] = []
    for index, value in sorted(entries, reverse=True):
        ops += [{"op": "test", "path": f"{path}/{index}/{field}", "value": value},
                {"op": "remove", "path": f"{path}/{index}"}]  # fmt: skip
    return ops


async def apply(kube: KubeClient, plan: UninstallPlan, namespace: str) -> list[str]:
    """Apply the plan; return the failures (each naming its object), an empty list when all went."""
    failures: list[str] = []

    async def attempt(what: str, call: Any) -> None:
        try:
            await call
        except KubeNotFound:
            pass
        except KubeError as exc:
            failures.append(f"{what}: {exc}")

    for lift in plan.lifts:
        resource = NODES if lift.kind == "Node" else PODS
        if (body := metadata_patch(lift)) is not None:
            await attempt(lift.describe(), kube.patch(resource, lift.name, body, namespace=lift.namespace))
        if lift.taints:
            ops = removal_patch("/spec/taints", "key", lift.taints)
            await attempt(lift.describe(), kube.patch(NODES, lift.name, ops, patch_type=PatchType.JSON))
        if lift.conditions:
            ops = removal_patch("/status/conditions", "type", lift.conditions)
            call = kube.patch(NODES, lift.name, ops, patch_type=PatchType.JSON, subresource="status")
            await attempt(lift.describe(), call)
    for name in plan.rules:
        await attempt(f"DeviceTaintRule {name}", kube.delete(DEVICE_TAINT_RULES, name))
    kinds = {"Lease": LEASES, "ConfigMap": CONFIG_MAPS}
    for kind, name in plan.namespaced:
        await attempt(f"{kind} {name}", kube.delete(kinds[kind], name, namespace=namespace))
    return failures


async def stop_writers(
    kube: KubeClient, namespace: str, node_agent_namespace: str, wait_seconds: float
) -> None:
    """Stop what would write again: the controller scaled to 0, the node agent's DaemonSet deleted; wait
    until their pods are gone (at most `wait_seconds`)."""
    scale = {"spec": {"replicas": 0}}
    with contextlib.suppress(KubeNotFound):
        await kube.patch(DEPLOYMENTS, CONTROLLER, scale, namespace=namespace, subresource="scale")
    with contextlib.suppress(KubeNotFound):
        await kube.delete(DAEMONSETS, NODE_AGENT, namespace=node_agent_namespace)
    selectors = [(namespace, "app.kubernetes.io/component=controller"),
                 (node_agent_namespace, "app.kubernetes.io/component=node-agent")]  # fmt: skip
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        left = 0
        for ns, selector in selectors:
            left += len((await kube.list_objects(PODS, namespace=ns, label_selector=selector)).items)
        if not left:
            return
        await asyncio.sleep(1)


async def observe(kube: KubeClient, namespace: str, lease: str) -> UninstallPlan:
    nodes = (await kube.list_objects(NODES)).items
    pods = (await kube.list_objects(PODS)).items
    try:
        rules = (
            await kube.list_objects(DEVICE_TAINT_RULES, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}")
        ).items
    except KubeNotFound:  # no resource.k8s.io/v1 DeviceTaintRules on this cluster
        rules = []
    namespaced = []
    for kind, resource, name in (("Lease", LEASES, lease), ("ConfigMap", CONFIG_MAPS, BREAKER)):
        try:
            await kube.get(resource, name, namespace=namespace)
        except KubeNotFound:
            continue
        namespaced.append((kind, name))
    return plan_uninstall(nodes, pods, rules, namespaced)


async def run_uninstall(
    kube: KubeClient,
    *,
    namespace: str,
    node_agent_namespace: str,
    lease: str,
    stop: bool,
    dry_run: bool,
    stop_timeout: float = 120.0,
) -> tuple[UninstallPlan, list[str]]:
    """Stop the writers (unless `dry_run` or not `stop`), then plan and lift; return the plan, failures."""
    if stop and not dry_run:
        await stop_writers(kube, namespace, node_agent_namespace, stop_timeout)
    plan = await observe(kube, namespace, lease)
    if dry_run:
        return plan, []
    lifted = plan
    for _ in range(
        ROUNDS
    ):  # a patch refused by its `test` (a concurrent writer) is planned again from a fresh read
        failures = await apply(kube, plan, namespace)
        if not failures:
            break
        plan = await observe(kube, namespace, lease)
    return lifted, failures
