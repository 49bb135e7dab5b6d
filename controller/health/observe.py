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
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from controller.gpus.dra import dra_class_for_node
from controller.gpus.objects import sharing_of
from controller.health.snapshot import (
    BreakerEvent,
    BreakerState,
    ConditionState,
    DeviceRulesApi,
    FleetSnapshot,
    JobState,
    NodeState,
    OwnedRule,
    Streak,
    Taint,
)
from controller.health.telemetry import Querier, Queries, Telemetry, build_queries, read_telemetry
from gpuwarden.config.health import HealthConfig
from gpuwarden.errors import PrometheusError
from gpuwarden.kube.resources import Resource
from gpuwarden.quarantine import DeviceRef, decode, iso, parse_iso
from gpuwarden.wellknown import BREAKER_RESET as BREAKER_RESET_ANNOTATION
from gpuwarden.wellknown import GPU_DEGRADED_CONDITION as DEGRADED_CONDITION
from gpuwarden.wellknown import GPU_HEALTHY_CONDITION as CONDITION_TYPE
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import VALIDATION_NODE as VALIDATION_NODE_LABEL

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
JOBS = Resource("batch", "v1", "jobs", "Job", namespaced=True)
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False)
"""DRA devices per node (listed by `spec.nodeName` for a DRA-backed node with something to say)."""
DEVICE_TAINT_RULES = Resource(
    "resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", namespaced=False
)
"""DRA device taints (GA in 1.37; v1alpha3/v1beta2 before, which we do not use): a 404 on the list of ours
means not served, and DRA-backed nodes get the node-level quarantine (devicerules.py)."""
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
    conditions = status.get("conditions") or []
    cond = next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)
    degraded = next((c for c in conditions if c.get("type") == DEGRADED_CONDITION), None)
    allocatable = (status.get("allocatable") or {}).get(gpu_resource)
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
        ready_since=ready_since(conditions),
        gpu_allocatable=None if allocatable is None else _quantity(allocatable),
        sharing=sharing_of(obj, gpu_resource, expected_label=""),
        degraded=ConditionState(str(degraded.get("status", "")), str(degraded.get("reason", "")),
                                str(degraded.get("message", ""))) if degraded else None,
    )  # fmt: skip


def ready_since(conditions: list[JsonObject]) -> float | None:
    """When the node last became Ready (its Ready condition's lastTransitionTime while True): the (re)boot
    time the boot grace counts from. None when not Ready or unreadable: no grace, the signals are read."""
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if not ready or ready.get("status") != "True":
        return None
    try:
        return parse_iso(ready.get("lastTransitionTime"))
    except ValueError:
        return None


def job_state(obj: JsonObject) -> JobState:
    """Outcome: succeeded (status.succeeded), failed (condition Failed=True), or running."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    status = obj.get("status") or {}
    if int(status.get("succeeded") or 0) > 0:
        return JobState(name, "succeeded")
    failed = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "Failed" and c.get("status") == "True"
        ),
        None,
    )
    if failed is not None:
        why = ": ".join(str(x) for x in (failed.get("reason"), failed.get("message")) if x)
        return JobState(name, "failed", why)
    return JobState(name, "running")


def validation_jobs(jobs: Iterable[JsonObject]) -> dict[str, dict[str, JobState]]:
    """Per node (our validation-node label): its validation Jobs by name."""
    out: dict[str, dict[str, JobState]] = {}
    for job in jobs:
        node = ((job.get("metadata") or {}).get("labels") or {}).get(VALIDATION_NODE_LABEL)
        if node:
            state = job_state(job)
            out.setdefault(node, {})[state.name] = state
    return out


def admission_failures(pods: Iterable[JsonObject], reasons: Iterable[str], *, since: float) -> dict[str, int]:
    """Per node: pods rejected at admission (status.reason in `reasons`) created at or after `since`."""
    wanted = set(reasons)
    out: dict[str, int] = {}
    for pod in pods:
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or status.get("reason") not in wanted:
            continue
        try:
            created = parse_iso((pod.get("metadata") or {}).get("creationTimestamp"))
        except ValueError:
            continue
        if created is not None and created >= since:
            out[node] = out.get(node, 0) + 1
    return out


def breaker_state(obj: JsonObject | None) -> BreakerState:
    """Decode the breaker ConfigMap; absent means closed (deleting it is an operator reset)."""
    if not obj:
        return BreakerState()
    meta = obj.get("metadata") or {}
    reset_value = (meta.get("annotations") or {}).get(BREAKER_RESET_ANNOTATION)
    reset = str(reset_value or "").lower() in ("now", "true")  # a null (a patch clearing it) is no reset
    raw = (obj.get("data") or {}).get(BREAKER_DATA_KEY)
    try:
        body = json.loads(raw) if raw else {}
        return BreakerState(
            open=bool(body.get("open", False)),
            opened_at=parse_iso(body.get("opened_at")),
            clear_since=parse_iso(body.get("clear_since")),
            reason=str(body.get("reason", "")),
            reset_requested=reset,
            starts=tuple((str(node), float(parse_iso(at) or 0.0)) for node, at in body.get("starts") or ()),
            owed=tuple(
                BreakerEvent(str(e["reason"]), float(parse_iso(e["at"]) or 0.0), str(e.get("note", "")))
                for e in body.get("owed") or ()
            ),
        )
    except (ValueError, TypeError, AttributeError, KeyError):
        log.warning("breaker state unreadable; keeping it OPEN until reset", extra={"data": str(raw)[:200]})
        return BreakerState(True, None, None, "stored breaker state unreadable", reset_requested=reset)


def encode_breaker(state: BreakerState) -> str:
    body: dict[str, Any] = {
        "open": state.open,
        "opened_at": iso(state.opened_at),
        "clear_since": iso(state.clear_since),
        "reason": state.reason,
    }
    if state.starts:
        body["starts"] = [[node, iso(at)] for node, at in state.starts]
    if state.owed:
        body["owed"] = [{"reason": e.reason, "at": iso(e.at), "note": e.note} for e in state.owed]
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
    streaks: Mapping[str, Streak] | None = None,
    admission: Mapping[str, int] | None = None,
    jobs: Mapping[str, Mapping[str, JobState]] | None = None,
) -> FleetSnapshot:
    """Attach each node's GPUs; `telemetry=None` means Prometheus could not be read.

    `streaks`: the debounce state of the previous pass; `admission`: pods rejected at admission per node
    (None: not read, so no node gets a count).
    """
    joined: list[NodeState] = []
    matched: set[str] = set()
    for node in nodes:
        gpus, fresh, newest = None, None, None
        switches: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        if telemetry is not None:
            for ident in node_identity(node):
                gpus = telemetry.for_node(ident)
                if gpus is not None:
                    matched.add(ident)
                    fresh, newest = telemetry.fresh.get(ident, 0), telemetry.newest.get(ident)
                    switches = telemetry.nvswitch.get(ident, switches)
                    break
        joined.append(
            replace(
                node,
                gpus=gpus,
                fresh_gpus=fresh,
                newest_sample=newest,
                nvswitch_fatal=switches[0],
                nvswitch_non_fatal=switches[1],
                admission_failures=None if admission is None else admission.get(node.name, 0),
                validation_jobs=dict((jobs or {}).get(node.name, {})),
            )
        )
    unmatched = tuple(sorted(telemetry.identities() - matched)) if telemetry is not None else ()
    return FleetSnapshot(
        taken_at=now,
        nodes=tuple(joined),
        prometheus_ok=telemetry is not None,
        prometheus_error=error,
        breaker=breaker,
        unmatched_telemetry=unmatched,
        queries=telemetry.queries if telemetry is not None else 0,
        streaks=dict(streaks or {}),
    )


def dra_backed(node: NodeState, classes: Mapping[str, str], gpu_resource: str) -> bool:
    """The node's GPUs are served by DRA: no allocatable of the resource above 0, a DeviceClass naming it
    (`controller.gpus.dra`, the scheduler's own per-node split)."""
    return bool(dra_class_for_node(bool(node.gpu_allocatable), gpu_resource, classes))


def device_scoped(node: NodeState) -> bool:
    """The node's quarantine record names devices (its DeviceTaintRules must be known, DRA-backed or not)."""
    record, _ = decode(node.annotations.get(RECORD_ANNOTATION))
    return record is not None and bool(record.devices)


def needs_devices(node: NodeState) -> bool:
    """A DRA-backed node whose ResourceSlices are worth reading this pass: its telemetry has something to
    say (a quarantine may be decided or widened); a quiet fleet costs no list."""
    return bool(node.gpus)


def attach_dra(
    snap: FleetSnapshot,
    devices: Mapping[str, Mapping[str, DeviceRef]],
    *,
    api: DeviceRulesApi,
    why: str = "",
    owned: Iterable[OwnedRule] = (),
) -> FleetSnapshot:
    """The snapshot with DRA facts: `devices` has an entry (UUID -> device, maybe empty) per DRA-backed
    node; the DeviceTaintRule API's state and our rules."""
    nodes = tuple(
        replace(n, dra_devices=dict(devices[n.name])) if n.name in devices else n for n in snap.nodes
    )
    return replace(snap, nodes=nodes, device_rules=api, device_rules_why=why, owned_rules=tuple(owned))


class Observer:
    """Builds snapshots for one config; the queries are built once."""

    def __init__(
        self, cfg: HealthConfig, *, gpu_resource: str = "nvidia.com/gpu", step: float | None = None
    ) -> None:
        self.cfg = cfg
        self.gpu_resource = gpu_resource
        self.queries: Queries = build_queries(cfg, step=step)

    async def observe(
        self,
        prom: Querier,
        node_objects: Iterable[JsonObject],
        breaker_obj: JsonObject | None,
        now: float,
        *,
        streaks: Mapping[str, Streak] | None = None,
        failed_pods: Iterable[JsonObject] | None = None,
        jobs: Iterable[JsonObject] = (),
    ) -> FleetSnapshot:
        """One snapshot at `now` (Prometheus evaluated at `now`, nodes as given, e.g. from an informer).

        `streaks`: the previous plan's debounce state; `failed_pods`: pods in phase Failed (None: not read);
        `jobs`: our validation Jobs.
        """
        by_node = validation_jobs(jobs)
        nodes = [node_state(o, self.gpu_resource) for o in node_objects]
        breaker = breaker_state(breaker_obj)
        adm = self.cfg.signals.admission_failures
        admission = (
            None
            if failed_pods is None
            else admission_failures(failed_pods, adm.reasons, since=now - adm.window_seconds)
        )
        try:
            telemetry = await read_telemetry(prom, self.queries, self.cfg, now)
        except PrometheusError as exc:
            log.warning("Prometheus unavailable; every node is unknown this pass", extra={"error": str(exc)})
            return join(
                nodes, None, now=now, breaker=breaker, error=exc.message, streaks=streaks, jobs=by_node
            )
        if telemetry.unattributed:
            log.debug("DCGM series without node or UUID label", extra={"series": telemetry.unattributed})
        return join(
            nodes, telemetry, now=now, breaker=breaker, streaks=streaks, admission=admission, jobs=by_node
        )
