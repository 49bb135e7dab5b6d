"""The GPU quarantine as every deployable reads it: the `gpuwarden.io/quarantine` record, and the one rule
that says which of a node's GPUs are quarantined.

Why it exists: the health controller writes the quarantine (taint + record); the GPU model (extender,
make-room, nominations), drain and the node agent's device plugin must all read it the same way, and the
record must survive a restart or a leader change because it lives on the Node. The record holds the
evidence (reason, XID, GPU UUIDs, first seen, values) an operator reads with `kubectl describe node`, plus
the little state the decision needs: when the quarantine began (breaker window), the bootID then (reboot
recovery), when the evidence was last seen gone (healthy period), which evidence an operator already
dismissed (no re-taint for the same evidence), and whether the quarantine's (or release's, or a validation
step's) Event is still to be written (a leader killed between the record and its Event).

The rule (`node_quarantine`, `quarantined_ids`): a node is quarantined only while it carries our taint - a
record alone quarantines nothing (a released or stale record keeps its evidence only to remember what was
dismissed). Its faulty GPUs are the UUIDs the record's evidence names, mapped to the ids pods record through
whatever topology knows the UUIDs; the whole node is quarantined only when that cannot be told (node-level
evidence such as a missing GPU, no readable record, a UUID no topology maps).

What it must not do: no I/O, no clock reads. Unparseable annotations decode to `None` with an error string;
they are never fatal and never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from gpuwarden.wellknown import QUARANTINE_RECORD, QUARANTINE_TAINT

RecordState = Literal["quarantined", "released"]
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, order=True)
class DeviceRef:
    """One DRA device as `resource.k8s.io/v1` names it: driver, pool and device name (ANDed in a
    DeviceTaintRule's `deviceSelector`, the same three in a ResourceClaim's `allocation.devices.results[]`),
    plus the GPU UUID it carries (its ResourceSlice entry's `uuid` attribute; what DCGM evidence names)."""

    driver: str
    pool: str
    device: str
    uuid: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """What identifies the device to the API (the UUID is ours, for people)."""
        return (self.driver, self.pool, self.device)

    def to_json(self) -> dict[str, str]:
        return {"driver": self.driver, "pool": self.pool, "device": self.device, "uuid": self.uuid}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeviceRef:
        ref = cls(str(raw["driver"]), str(raw["pool"]), str(raw["device"]), str(raw.get("uuid", "")))
        if not (ref.driver and ref.pool and ref.device):
            raise ValueError(f"device {raw!r} lacks driver, pool or device")
        return ref


def iso(ts: float | None) -> str | None:
    """Unix seconds → RFC 3339 UTC with second precision (what humans read in the annotation)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected an RFC 3339 time, got {value!r}")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Evidence:
    """One finding that justified (or still justifies) the quarantine."""

    reason: str  # e.g. xid-79, ecc-dbe, row-remap-failure, gpu-missing
    gpu: str = ""  # GPU UUID; "" for node-level evidence such as gpu-missing
    xid: int | None = None
    value: float | None = None
    first_seen: float | None = None

    @property
    def fingerprint(self) -> str:
        """Identity of the evidence across loops: the same reason on the same GPU."""
        return f"{self.reason}/{self.gpu}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason}
        if self.gpu:
            out["gpu"] = self.gpu
        if self.xid is not None:
            out["xid"] = self.xid
        if self.value is not None:
            out["value"] = self.value
        if self.first_seen is not None:
            out["first_seen"] = iso(self.first_seen)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Evidence:
        xid = raw.get("xid")
        value = raw.get("value")
        return cls(
            reason=str(raw["reason"]),
            gpu=str(raw.get("gpu", "")),
            xid=int(xid) if xid is not None else None,
            value=float(value) if value is not None else None,
            first_seen=parse_iso(raw.get("first_seen")),
        )


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """The decoded annotation. `state=released` records survive only to remember dismissed evidence."""

    state: RecordState
    reason: str
    reason_class: str = ""
    effect: str = "NoSchedule"
    evidence: tuple[Evidence, ...] = ()
    quarantined_at: float | None = None
    boot_id: str = ""
    healthy_since: float | None = None
    released_at: float | None = None
    released_by: str = ""
    suppressed: tuple[str, ...] = field(default=())
    # Validation before release (validation.py): the Job running now, when it started, how many ran, why each
    # failed. Kept across passes on the Node so a restarted controller follows the same Job.
    validation_job: str = ""
    validation_started: float | None = None
    validation_attempts: int = 0
    validation_failures: tuple[str, ...] = ()
    validation_event: str = ""
    """The reason of a validation Event still to be written (e.g. `GPUValidationStarted`): set with the
    record change it reports, cleared once the Event exists (named after the quarantine and the attempt)."""
    devices: tuple[DeviceRef, ...] = ()
    """DRA-backed node, device-scoped quarantine: the faulty devices, each under a DeviceTaintRule of ours
    (`controller/health/devicerules.py`); the node's taint is then only the quarantine's marker
    (PreferNoSchedule). Empty: a node-level quarantine (device plugin node, or the fallback)."""
    scope_note: str = ""
    """Why a DRA-backed node got a node-level quarantine instead (e.g. DeviceTaintRule v1 not served)."""
    sharing: str = ""
    """On a node that shares its GPUs (time-slicing, MPS, MIG): what each quarantined physical GPU carries,
    e.g. `time-slicing: 8 physical GPUs, 4 replicas each (32 nvidia.com/gpu)` (gpuwarden.gpusharing). The
    record names physical GPUs (dcgm-exporter's UUID is the parent's, also on MIG series); a fault on one
    covers every replica and MIG instance on it. Empty on whole-GPU nodes."""
    event_pending: bool = False
    """Written with the taint (or the release) and cleared once its Event exists: a leader killed between
    the two leaves it set, and the next pass writes the missing Event (named after the record, so once)."""

    @property
    def first_seen(self) -> float | None:
        seen = [e.first_seen for e in self.evidence if e.first_seen is not None]
        return min(seen) if seen else None

    @property
    def fingerprints(self) -> frozenset[str]:
        return frozenset(e.fingerprint for e in self.evidence)

    def with_(self, **changes: Any) -> QuarantineRecord:
        return replace(self, **changes)

    def encode(self) -> str:
        """Stable JSON (sorted keys) so an unchanged record is byte-identical and never re-patched."""
        body: dict[str, Any] = {
            "version": SCHEMA_VERSION,
            "state": self.state,
            "reason": self.reason,
            "class": self.reason_class,
            "effect": self.effect,
            "evidence": [e.to_json() for e in self.evidence],
            "gpus": sorted({e.gpu for e in self.evidence if e.gpu}),
            "xids": sorted({e.xid for e in self.evidence if e.xid is not None}),
            "first_seen": iso(self.first_seen),
            "quarantined_at": iso(self.quarantined_at),
        }
        if self.boot_id:
            body["boot_id"] = self.boot_id
        if self.healthy_since is not None:
            body["healthy_since"] = iso(self.healthy_since)
        if self.released_at is not None:
            body["released_at"] = iso(self.released_at)
        if self.released_by:
            body["released_by"] = self.released_by
        if self.suppressed:
            body["suppressed"] = sorted(self.suppressed)
        if (
            self.validation_job
            or self.validation_attempts
            or self.validation_failures
            or self.validation_event
        ):
            body["validation"] = {
                "job": self.validation_job,
                "started": iso(self.validation_started),
                "attempts": self.validation_attempts,
                "failures": list(self.validation_failures),
            }
            if self.validation_event:
                body["validation"]["event"] = self.validation_event
        if self.devices:
            body["devices"] = [d.to_json() for d in sorted(self.devices)]
        if self.scope_note:
            body["scope_note"] = self.scope_note
        if self.sharing:
            body["sharing"] = self.sharing
        if self.event_pending:
            body["event"] = "pending"
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> tuple[QuarantineRecord | None, str]:
    """Decode the annotation; returns (record, "") or (None, why it could not be read)."""
    if not text:
        return None, ""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        validation = raw.get("validation") or {}
        if not isinstance(validation, dict):
            raise ValueError("validation is not an object")
        state = raw.get("state")
        if state not in ("quarantined", "released"):
            raise ValueError(f"unknown state {state!r}")
        return (
            QuarantineRecord(
                state=state,
                reason=str(raw.get("reason", "")),
                reason_class=str(raw.get("class", "")),
                effect=str(raw.get("effect", "NoSchedule")),
                evidence=tuple(Evidence.from_json(e) for e in raw.get("evidence", [])),
                quarantined_at=parse_iso(raw.get("quarantined_at")),
                boot_id=str(raw.get("boot_id", "")),
                healthy_since=parse_iso(raw.get("healthy_since")),
                released_at=parse_iso(raw.get("released_at")),
                released_by=str(raw.get("released_by", "")),
                suppressed=tuple(str(s) for s in raw.get("suppressed", [])),
                validation_job=str(validation.get("job", "")),
                validation_started=parse_iso(validation.get("started")),
                validation_attempts=int(validation.get("attempts", 0)),
                validation_failures=tuple(str(f) for f in validation.get("failures", [])),
                validation_event=str(validation.get("event", "")),
                devices=tuple(DeviceRef.from_json(d) for d in raw.get("devices", [])),
                scope_note=str(raw.get("scope_note", "")),
                sharing=str(raw.get("sharing", "")),
                event_pending=raw.get("event") == "pending",
            ),
            "",
        )
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable {text[:40]!r}: {exc}"


@dataclass(frozen=True, slots=True)
class NodeQuarantine:
    """What our quarantine says about one node's GPUs."""

    reason: str
    """The taint's value (e.g. `xid-79`)."""
    uuids: frozenset[str] | None
    """The faulty GPUs' UUIDs; None: the whole node (node-level evidence, or no readable record)."""


def node_quarantine(
    taints: Iterable[Mapping[str, Any]], annotations: Mapping[str, Any]
) -> NodeQuarantine | None:
    """The node's quarantine from its taints and annotations; None when our taint is absent."""
    taint = next((t for t in taints if t.get("key") == QUARANTINE_TAINT), None)
    if taint is None:
        return None
    reason = str(taint.get("value") or "quarantined")
    record, _ = decode(annotations.get(QUARANTINE_RECORD))
    if record is None or record.state != "quarantined" or not record.evidence:
        return NodeQuarantine(reason, None)
    gpus = [e.gpu for e in record.evidence]
    return NodeQuarantine(reason, None if "" in gpus else frozenset(gpus))


def quarantined_ids(
    quarantine: NodeQuarantine | None, ids: Iterable[str], uuid_to_id: Mapping[str, str]
) -> frozenset[str]:
    """Which of the node's GPU ids are quarantined: none without the taint, the faulty GPUs' ids when every
    faulty UUID maps through `uuid_to_id`, else all of them (unsure = the whole node)."""
    if quarantine is None:
        return frozenset()
    uuids = quarantine.uuids
    if uuids is None or not uuids <= uuid_to_id.keys():
        return frozenset(ids)
    return frozenset(uuid_to_id[u] for u in uuids)
