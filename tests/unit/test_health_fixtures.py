"""Builders for hand-made health snapshots (shared by the health unit tests and the bench)."""

from __future__ import annotations

from typing import Any

from controller.health.snapshot import ConditionState, GpuTelemetry, NodeState, Taint, XidObservation
from gpuwarden.quarantine import Evidence, QuarantineRecord
from gpuwarden.wellknown import EXCLUDE as EXCLUDE_LABEL
from gpuwarden.wellknown import GPU_HEALTHY_CONDITION as CONDITION_TYPE
from gpuwarden.wellknown import QUARANTINE_RECORD as RECORD_ANNOTATION
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from gpuwarden.wellknown import RELEASE as RELEASE_ANNOTATION

NOW = 1_700_000_000.0
__all__ = ["CONDITION_TYPE", "NOW", "gpu", "node", "quarantined", "record"]


def gpu(node: str, i: int, *, age: float = 5.0, xids: tuple[Any, ...] = (), **kw: Any) -> GpuTelemetry:
    """GPU `i` of `node`; `xids` items are codes (recent, count 1) or XidObservation."""
    obs = tuple(
        x if isinstance(x, XidObservation) else XidObservation(int(x), True, 1, NOW - 20.0) for x in xids
    )
    xid_last = kw.pop("xid_last", obs[-1].code if obs else None)
    return GpuTelemetry(
        uuid=f"GPU-{node}-{i}", index=str(i), last_sample=NOW - age, xid_last=xid_last, xids=obs, **kw
    )


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    capacity: int | None = None,
    per_gpu: dict[int, dict[str, Any]] | None = None,
    age: float = 5.0,
    telemetry: bool = True,
    taints: tuple[Taint, ...] = (),
    rec: QuarantineRecord | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    boot_id: str = "boot-1",
    condition: ConditionState | None = None,
    excluded: bool = False,
    release: bool = False,
) -> NodeState:
    per_gpu = per_gpu or {}
    telem = tuple(
        gpu(name, i, age=per_gpu.get(i, {}).pop("age", age), **per_gpu.get(i, {})) for i in range(gpus)
    )
    ann = dict(annotations or {})
    if rec is not None:
        ann[RECORD_ANNOTATION] = rec.encode()
    if release:
        ann[RELEASE_ANNOTATION] = "now"
    lab = dict(labels or {})
    if excluded:
        lab[EXCLUDE_LABEL] = "true"
    return NodeState(
        name=name,
        labels=lab,
        annotations=ann,
        taints=taints,
        gpu_capacity=8 if capacity is None else capacity,
        boot_id=boot_id,
        condition=condition,
        gpus=telem if telemetry else None,
    )


def record(
    reason: str = "xid-79",
    *,
    gpu_index: int = 0,
    node_name: str = "n1",
    xid: int | None = 79,
    at: float = NOW - 3600.0,
    healthy_since: float | None = None,
    boot_id: str = "boot-1",
    state: str = "quarantined",
    suppressed: tuple[str, ...] = (),
    released_at: float | None = None,
) -> QuarantineRecord:
    ev = Evidence(reason, f"GPU-{node_name}-{gpu_index}", xid, 1.0, at - 30.0)
    return QuarantineRecord(
        state,  # type: ignore[arg-type]
        reason,
        "hw_pcie",
        "NoSchedule",
        (ev,),
        quarantined_at=at,
        boot_id=boot_id,
        healthy_since=healthy_since,
        released_at=released_at,
        released_by="operator-untaint" if state == "released" else "",
        suppressed=suppressed,
    )


def quarantined(name: str = "n1", reason: str = "xid-79", **kw: Any) -> NodeState:
    """A node carrying our taint, record and GPUHealthy=False; `kw` goes to `node()` or `record()`."""
    rec_kw = {k: kw.pop(k) for k in list(kw) if k in ("xid", "at", "healthy_since", "gpu_index")}
    rec = record(reason, node_name=name, boot_id="boot-1", **rec_kw)
    return node(
        name,
        taints=(Taint(TAINT_KEY, reason, "NoSchedule"),),
        rec=rec,
        condition=ConditionState("False", "GPUQuarantined"),
        **kw,
    )
