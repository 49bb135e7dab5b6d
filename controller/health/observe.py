"""Observe: Prometheus telemetry + Node objects + the breaker's stored state → one `FleetSnapshot`.

Why it exists: the decision must see the fleet as one consistent, typed value — nodes, their taints, our
annotations, exclusion labels, bootIDs and GPU capacity from the API, joined with each node's GPUs from DCGM —
and must be told plainly when Prometheus could not be read. That is the whole job of this module.

What it must not do: decide or write anything. A Prometheus failure never raises out of `observe()`: it yields
a snapshot with `prometheus_ok=False` (everything unknown). Kubernetes read failures do raise: without the
nodes there is nothing to decide about, and the loop retries next interval.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from controller.health.snapshot import BreakerState, ConditionState, FleetSnapshot, NodeState, Taint
from controller.health.telemetry import Querier, Queries, Telemetry, build_queries, read_telemetry
from gpuwarden.config.health import HealthConfig
from gpuwarden.errors import PrometheusError
from gpuwarden.quarantine import iso, parse_iso
from gpuwarden.wellknown import BREAKER_RESET as BREAKER_RESET_ANNOTATION
from gpuwarden.wellknown import GPU_HEALTHY_CONDITION as CONDITION_TYPE

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
BREAKER_DATA_KEY = "state"


def _quantity(raw: object) -> int:
    """An integer resource quantity ("8"); GPU counts are never fractional or suffixed."""
    try:
        return int(str(raw))
    except ValueError:
        return 0


def node_state(obj: JsonObject, gpu_resource: str = "nvidia.com/gpu") -> NodeState:
    """The parts of a Node object the decision reads (telemetry joined later)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == CONDITION_TYPE), None)
    return NodeState(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in spec.get("taints") or []
        ),
        gpu_capacity=_quantity((status.get("capacity") or {}).get(gpu_resource, 0)),
        boot_id=str((status.get("nodeInfo") or {}).get("bootID", "")),
        unschedulable=bool(spec.get("unschedulable", False)),
        condition=ConditionState(str(cond.get("status", "")), str(cond.get("reason", "")),
                                 str(cond.get("message", ""))) if cond else None,
    )  # fmt: skip


def breaker_state(obj: JsonObject | None) -> BreakerState:
    """Decode the breaker ConfigMap; absent means closed (deleting it is an operator reset)."""
    if not obj:
        return BreakerState()
    meta = obj.get("metadata") or {}
    reset = (meta.get("annotations") or {}).get(BREAKER_RESET_ANNOTATION, "").lower() in ("now", "true")
    raw = (obj.get("data") or {}).get(BREAKER_DATA_KEY)
    try:
        body = json.loads(raw) if raw else {}
        return BreakerState(
            open=bool(body.get("open", False)),
            opened_at=parse_iso(body.get("opened_at")),
            clear_since=parse_iso(body.get("clear_since")),
            reason=str(body.get("reason", "")),
            reset_requested=reset,
        )
    except (ValueError, TypeError, AttributeError):
        log.warning("breaker state unreadable; keeping it OPEN until reset", extra={"data": str(raw)[:200]})
        return BreakerState(True, None, None, "stored breaker state unreadable", reset_requested=reset)


def encode_breaker(state: BreakerState) -> str:
    body = {
        "open": state.open,
        "opened_at": iso(state.opened_at),
        "clear_since": iso(state.clear_since),
        "reason": state.reason,
    }
    return json.dumps(body, sort_keys=True)


def node_identity(node: NodeState) -> Iterable[str]:
    """Names DCGM may use for this node: the node name, then its hostname label (they usually agree)."""
    yield node.name
    host = node.labels.get("kubernetes.io/hostname")
    if host and host != node.name:
        yield host


def join(
    nodes: Iterable[NodeState],
    telemetry: Telemetry | None,
    *,
    now: float,
    breaker: BreakerState,
    error: str = "",
) -> FleetSnapshot:
    """Attach each node's GPUs; `telemetry=None` means Prometheus could not be read."""
    joined: list[NodeState] = []
    matched: set[str] = set()
    for node in nodes:
        gpus, fresh, newest = None, None, None
        if telemetry is not None:
            for ident in node_identity(node):
                gpus = telemetry.for_node(ident)
                if gpus is not None:
                    matched.add(ident)
                    fresh, newest = telemetry.fresh.get(ident, 0), telemetry.newest.get(ident)
                    break
        joined.append(replace(node, gpus=gpus, fresh_gpus=fresh, newest_sample=newest))
    unmatched = tuple(sorted(telemetry.identities() - matched)) if telemetry is not None else ()
    return FleetSnapshot(
        taken_at=now,
        nodes=tuple(joined),
        prometheus_ok=telemetry is not None,
        prometheus_error=error,
        breaker=breaker,
        unmatched_telemetry=unmatched,
        queries=telemetry.queries if telemetry is not None else 0,
    )


class Observer:
    """Builds snapshots for one config; the queries are built once."""

    def __init__(
        self, cfg: HealthConfig, *, gpu_resource: str = "nvidia.com/gpu", step: float | None = None
    ) -> None:
        self.cfg = cfg
        self.gpu_resource = gpu_resource
        self.queries: Queries = build_queries(cfg, step=step)

    async def observe(
        self, prom: Querier, node_objects: Iterable[JsonObject], breaker_obj: JsonObject | None, now: float
    ) -> FleetSnapshot:
        """One snapshot at `now` (Prometheus evaluated at `now`, nodes as given, e.g. from an informer)."""
        nodes = [node_state(o, self.gpu_resource) for o in node_objects]
        breaker = breaker_state(breaker_obj)
        try:
            telemetry = await read_telemetry(prom, self.queries, self.cfg, now)
        except PrometheusError as exc:
            log.warning("Prometheus unavailable; every node is unknown this pass", extra={"error": str(exc)})
            return join(nodes, None, now=now, breaker=breaker, error=exc.message)
        if telemetry.unattributed:
            log.debug("DCGM series without node or UUID label", extra={"series": telemetry.unattributed})
        return join(nodes, telemetry, now=now, breaker=breaker)
