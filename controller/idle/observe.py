"""Observe: the pass's one Prometheus query, read into per-GPU usage — or None when it cannot be read; and,
only for pods due for a scale-down, their owners.

Why a module: the I/O of the idle pass is here, once. A failed, timed-out or malformed answer is not an
empty fleet: it is `None`, and the decision treats every pod as unknown (docs/architecture.md, safety
rule 1). Owners are read per pass for the few pods due (a pod's ReplicaSet, the Deployment above it, the
`/scale` of what is scaled, the namespace's HorizontalPodAutoscalers); an owner that cannot be read is a
`ScaleTarget` with a problem, never a guess. What it must not do: decide, or list pods (they come from the
shared informer).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from controller.idle.query import GpuUsage, idle_query, read_usage
from controller.idle.scale import ScaleTarget
from controller.idle.snapshot import IdlePod
from gpuwarden.config.idle import IdleConfig
from gpuwarden.errors import KubeError, KubeNotFound, PrometheusError
from gpuwarden.kube import CORE_EVENTS, DEPLOYMENTS, HPAS, REPLICASETS, STATEFULSETS, JsonObject, Resource
from gpuwarden.promtypes import InstantResult, Vector
from gpuwarden.wellknown import reporting_controller

log = logging.getLogger(__name__)


class Querier(Protocol):
    async def query(
        self,
        promql: str,
        time: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InstantResult: ...


async def observe_usage(prom: Querier, config: IdleConfig, now: float) -> tuple[GpuUsage, ...] | None:
    """Every GPU's peak utilization and sample count over the window ending at `now`; None: unknown."""
    promql = idle_query(
        config.metric_labels, config.window_seconds, power=config.power_threshold_watts is not None
    )
    try:
        result = await prom.query(promql, time=now)
    except PrometheusError as exc:
        log.warning("idle-GPU query failed; every pod is unknown this pass", extra={"error": str(exc)})
        return None
    if not isinstance(result, Vector):
        log.warning("idle-GPU query answered no vector; every pod is unknown this pass")
        return None
    return read_usage(((s.labels, s.value) for s in result.samples), config.metric_labels)


class OwnerReader(Protocol):
    """The reads `observe_targets` makes; `KubeClient` provides them."""

    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObject: ...

    async def list_objects(
        self, resource: Resource, *, namespace: str | None = None, field_selector: str | None = None
    ) -> Any: ...


SCALED: dict[str, Resource] = {
    "Deployment": DEPLOYMENTS,
    "StatefulSet": STATEFULSETS,
    "ReplicaSet": REPLICASETS,
}


def _controller(meta: JsonObject) -> tuple[str, str] | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _owner(kube: OwnerReader, pod: IdlePod) -> tuple[str, str] | str:
    """(kind, name) of what scales the pod: a ReplicaSet's Deployment when it has one; or a problem."""
    if pod.owner is None:
        return "no owner to scale (a bare pod)"
    kind, name = pod.owner.kind, pod.owner.name
    if kind != "ReplicaSet":
        return kind, name
    rs = await kube.get(REPLICASETS, name, namespace=pod.namespace)
    above = _controller(rs.get("metadata") or {})
    return above if above is not None and above[0] == "Deployment" else (kind, name)


def _hpa_for(hpas: Sequence[JsonObject], kind: str, name: str) -> tuple[str, int | None]:
    for hpa in hpas:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == kind and ref.get("name") == name:
            minimum = (hpa.get("spec") or {}).get("minReplicas")
            return str((hpa.get("metadata") or {}).get("name", "")), 1 if minimum is None else _int(minimum)
    return "", None


async def observe_targets(kube: OwnerReader, pods: Sequence[IdlePod]) -> dict[str, ScaleTarget]:
    """Pod key -> the owner its scale-down would scale (with a problem where it cannot be read)."""
    out: dict[str, ScaleTarget] = {}
    hpas: dict[str, Sequence[JsonObject]] = {}
    scales: dict[tuple[str, str, str], ScaleTarget] = {}
    for pod in pods:
        ns = pod.namespace
        try:
            owner = await _owner(kube, pod)
        except KubeError as exc:
            out[pod.key] = ScaleTarget(
                ns,
                pod.owner.kind if pod.owner else "",
                pod.owner.name if pod.owner else "",
                problem=f"owner not readable: {exc}",
            )
            continue
        if isinstance(owner, str):
            continue  # a bare pod: no target (`plan_scale_downs` says so)
        kind, name = owner
        if (ns, kind, name) in scales:
            out[pod.key] = scales[(ns, kind, name)]
            continue
        target = ScaleTarget(ns, kind, name)
        resource = SCALED.get(kind)
        if resource is not None:
            target = await _read_scale(kube, resource, target, hpas)
        scales[(ns, kind, name)] = out[pod.key] = target
    return out


async def _read_scale(
    kube: OwnerReader, resource: Resource, target: ScaleTarget, hpas: dict[str, Sequence[JsonObject]]
) -> ScaleTarget:
    ns = target.namespace
    try:
        scale = await kube.get(resource, target.name, namespace=ns, subresource="scale")
        if ns not in hpas:
            hpas[ns] = (await kube.list_objects(HPAS, namespace=ns)).items
    except KubeNotFound:
        return ScaleTarget(ns, target.kind, target.name, problem=f"{target.kind} {target.name} not found")
    except KubeError as exc:
        return ScaleTarget(ns, target.kind, target.name, problem=f"{target.kind} {target.name}: {exc}")
    hpa, minimum = _hpa_for(hpas[ns], target.kind, target.name)
    meta = scale.get("metadata") or {}
    return ScaleTarget(
        ns,
        target.kind,
        target.name,
        replicas=_int((scale.get("spec") or {}).get("replicas", 0)),
        resource_version=str(meta.get("resourceVersion", "")),
        hpa=hpa,
        hpa_min=minimum,
    )


async def our_events(kube: OwnerReader, reason: str) -> list[JsonObject] | None:
    """Our idle loop's Events with `reason`, cluster-wide (core/v1: it filters by reason and reporting
    component on the server); None when they cannot be listed."""
    selector = f"reason={reason},reportingComponent={reporting_controller('idle')}"
    try:
        listed = await kube.list_objects(CORE_EVENTS, field_selector=selector)
    except KubeError as exc:
        log.warning("idle budget: our Events not readable", extra={"reason": reason, "error": str(exc)})
        return None
    items: list[JsonObject] = listed.items
    return items
