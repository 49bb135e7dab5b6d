"""Validation before return to service: a Job pinned to the quarantined node must succeed before the release.

Why: a node that merely looks healthy while idle fails again under load (NVSentinel #695, #1427 → PR #1749).
When `health.validation` is on, the release the healthy period allows becomes: start the operator's Job
(DCGM diagnostic, NCCL test) on that node, tolerating our taint → it succeeds: release; it fails or times out:
keep the quarantine, record why on the node (`gpuwarden.io/quarantine` → `validation`), start the healthy
period again; after `max_attempts` failures the node waits for an operator. Everything it needs is in the
record and the Jobs the snapshot lists, so a restarted controller follows the same Job. Each step's Event
is owed in the record (`validation.event`) from the write that records the step until the Event exists, and
named after the quarantine and the attempt, so a leader killed in between loses no Event and repeats none.

What it must not do: no I/O, no clock reads. It renders the Job (act.py creates it, in the configured or the
controller's namespace) and never plans a release on anything but the named Job's success.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from controller.health import plan as p
from controller.health.snapshot import NodeState
from gpuwarden.config.health_validation import PLACEHOLDERS, ValidationConfig
from gpuwarden.quarantine import QuarantineRecord
from gpuwarden.wellknown import QUARANTINE_TAINT as TAINT_KEY
from gpuwarden.wellknown import VALIDATION_NODE as VALIDATION_NODE_LABEL

EVENT_VALIDATION_STARTED = "GPUValidationStarted"
EVENT_VALIDATION_FAILED = "GPUValidationFailed"
EVENT_VALIDATION_EXHAUSTED = "GPUValidationExhausted"
SKIP_VALIDATION_RUNNING = "validation-running"
SKIP_VALIDATION_EXHAUSTED = "validation-exhausted"


def job_name(node: str, attempt: int, since: float | None = None) -> str:
    """A DNS-label Job name, unique per node, quarantine (`since`: when it started) and attempt (node names
    can be longer than a label allows). The quarantine is in the name because finished Jobs are not deleted
    by us: without it a later quarantine of the node would find the earlier one's succeeded Job under the
    same name, take it as its own and release the node unvalidated."""
    key = node if since is None else f"{node}/{int(since)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"gpuwarden-validate-{digest}-{attempt}"


def render_job(template: str, *, name: str, node: str, gpus: str, reason: str) -> dict[str, Any]:
    """The Job from the operator's template, substituted, named, labelled, pinned and tolerating our taint."""
    values = {"node": node, "gpus": gpus, "reason": reason}
    job = yaml.safe_load(PLACEHOLDERS.sub(lambda m: values[m.group(1)], template))
    job = copy.deepcopy(job)
    meta = job.setdefault("metadata", {})
    meta["name"] = name
    meta.pop("namespace", None)
    meta.pop("generateName", None)
    meta.setdefault("labels", {})[VALIDATION_NODE_LABEL] = node
    spec = job.setdefault("spec", {})
    spec.setdefault("backoffLimit", 0)
    pod = spec.setdefault("template", {})
    pod.setdefault("metadata", {}).setdefault("labels", {})[VALIDATION_NODE_LABEL] = node
    pod_spec = pod.setdefault("spec", {})
    pod_spec["nodeName"] = node
    pod_spec.setdefault("restartPolicy", "Never")
    tolerations = pod_spec.setdefault("tolerations", [])
    if not any(t.get("key") == TAINT_KEY for t in tolerations):
        tolerations.append({"key": TAINT_KEY, "operator": "Exists"})
    return dict(job)


@dataclass(frozen=True, slots=True)
class Step:
    """What validation says at the moment a release is due: release (with a note), or an action / a skip."""

    release: bool
    note: str = ""
    action: p.Action | None = None
    skip: tuple[str, str] | None = None


def plan_validation(node: NodeState, record: QuarantineRecord, cfg: ValidationConfig, now: float) -> Step:
    """The validation step for a quarantined node whose healthy period is over and recovery holds."""
    attempts = record.validation_attempts
    if not record.validation_job:
        if attempts >= cfg.max_attempts:
            why = "; ".join(record.validation_failures) or "validation failed"
            message = (
                f"{attempts} validations failed ({why}): an operator must release the node "
                "(gpuwarden.io/release=now)"
            )
            return Step(False, skip=(SKIP_VALIDATION_EXHAUSTED, message))
        name = job_name(node.name, attempts + 1, record.quarantined_at)
        gpus = ",".join(sorted({e.gpu for e in record.evidence if e.gpu}))
        job = render_job(cfg.job_template, name=name, node=node.name, gpus=gpus, reason=record.reason)
        running = record.with_(
            validation_job=name,
            validation_started=now,
            validation_attempts=attempts + 1,
            validation_event=EVENT_VALIDATION_STARTED,
        )
        event = validation_event(node.name, running, cfg)
        return Step(
            False,
            action=p.Action(
                "start-validation",
                node.name,
                "validation-started",
                event.note,
                record=running,
                create_job=job,
                event=event,
                after_event=running.with_(validation_event=""),
                settles="validation",
            ),
        )
    job_state = node.validation_jobs.get(record.validation_job)
    if job_state is not None and job_state.state == "succeeded":
        return Step(True, note=f"validation Job {record.validation_job} succeeded")
    started = record.validation_started if record.validation_started is not None else now
    if job_state is not None and job_state.state == "failed":
        why = f"Job {record.validation_job} failed" + (f": {job_state.why}" if job_state.why else "")
    elif now - started >= cfg.timeout_seconds:
        gone = "" if job_state is not None else " (the Job is gone)"
        why = f"Job {record.validation_job} timed out after {cfg.timeout_seconds:.0f}s{gone}"
    else:
        left = cfg.timeout_seconds - (now - started)
        message = f"validation Job {record.validation_job} running; times out in {left:.0f}s"
        return Step(False, skip=(SKIP_VALIDATION_RUNNING, message))
    failures = (*record.validation_failures, why)
    owed = EVENT_VALIDATION_EXHAUSTED if attempts >= cfg.max_attempts else EVENT_VALIDATION_FAILED
    failed = record.with_(
        validation_job="",
        validation_started=None,
        healthy_since=None,
        validation_failures=failures,
        validation_event=owed,
    )
    event = validation_event(node.name, failed, cfg)
    return Step(
        False,
        action=p.Action(
            "update-record",
            node.name,
            "validation-failed",
            event.note,
            record=failed,
            event=event,
            after_event=failed.with_(validation_event=""),
            settles="validation",
        ),
    )


def validation_event_name(node: str, record: QuarantineRecord) -> str:
    """The one name of a validation step's Event: the node, the Event, the quarantine's start, the attempt."""
    reason = record.validation_event.lower()
    return f"{node}.{reason}.{int(record.quarantined_at or 0):x}.{record.validation_attempts}"


def validation_event(node: str, record: QuarantineRecord, cfg: ValidationConfig) -> p.EventSpec:
    """The Event the record's validation mark owes, from the record alone: the step that sets the mark and
    a later pass finishing it (the leader died after the record) write the same Event under the same name."""
    reason, attempts = record.validation_event, record.validation_attempts
    name = validation_event_name(node, record)
    if reason == EVENT_VALIDATION_STARTED:
        note = (
            f"healthy period over; validation Job {record.validation_job} "
            f"(attempt {attempts}/{cfg.max_attempts}) started"
        )
        return p.EventSpec(reason, "Normal", note, "Validate", name=name)
    why = record.validation_failures[-1] if record.validation_failures else "validation failed"
    if reason == EVENT_VALIDATION_EXHAUSTED:
        note = f"validation failed {attempts}x ({why}); quarantine kept until an operator releases the node"
    else:
        note = f"validation failed ({why}); quarantine kept, the healthy period starts again"
    return p.EventSpec(reason, "Warning", note, "Validate", name=name)


def finish_validation(node: str, record: QuarantineRecord, cfg: ValidationConfig) -> p.Action:
    """A validation step recorded but its Event not (the leader died in between): the Event (or 409), then
    the mark cleared. Nothing else is planned for the node in that pass, so no write races the mark."""
    return p.Action(
        "finish-event",
        node,
        "validation-event-pending",
        f"validation recorded, but its {record.validation_event} Event is not recorded as written",
        event=validation_event(node, record, cfg),
        after_event=record.with_(validation_event=""),
        settles="validation",
    )
