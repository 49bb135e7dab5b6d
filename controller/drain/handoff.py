"""Carrying out remediation decisions: node markers, step objects, their conditions, the state on the Node.

Why a module: the hand-off's only contact with the cluster (the decisions are `remediation.decide`). A step
object is created from its template at the API path its apiVersion and `resource` name; its completion
condition is read back from that path. Dry-run logs and events, and writes nothing.

The order of a transition's writes: the new step's object (409 AlreadyExists: ours, created by a leader that
died before the state) → markers + the state, owing the Event and the old object's deletion → the deletion
→ the Event, named after the state (409: written before) → the debt cleared, only over that same state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from controller.drain.observe import DrainSnapshot
from controller.drain.plan import DrainNode
from controller.drain.remediation import (
    NodeRemediation,
    RemediationDecision,
    RemediationState,
    decode,
    event_name,
    render_template,
)
from gpuwarden.config.remediation import RemediationConfig, RemediationStep
from gpuwarden.errors import KubeConflict, KubeError, KubeNotFound
from gpuwarden.kube import NODES, EventRecorder, EventType, KubeClient, ObjectRef, patch_with_retry
from gpuwarden.wellknown import REMEDIATION as REMEDIATION_ANNOTATION

log = logging.getLogger(__name__)


def object_path(obj: Mapping[str, Any], resource: str) -> str:
    """The collection URL of a template's object (core `v1` or `group/version`)."""
    api = str(obj["apiVersion"])
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    ns = (obj.get("metadata") or {}).get("namespace")
    return f"{base}/namespaces/{ns}/{resource}" if ns else f"{base}/{resource}"


def inputs(
    node: Mapping[str, Any], snap: DrainSnapshot, quarantined: Mapping[str, DrainNode]
) -> NodeRemediation | None:
    """The hand-off's view of one node (None: nothing to consider: healthy and no remediation state).
    `quarantined`: the snapshot's nodes by name, built once per pass."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    ann = meta.get("annotations") or {}
    text = ann.get(REMEDIATION_ANNOTATION)
    state = decode(text)
    owed = state is not None and state.owes  # settled whatever the node's health says now
    if not owed and (
        name in snap.unknown or name in snap.recovering or (name not in quarantined and not text)
    ):
        # Unknown (unreadable record or state), or recovering (evidence gone, healthy period running): no
        # step starts or escalates, nothing is called succeeded.
        return None
    drain = snap.states.get(name)
    q = quarantined.get(name)
    return NodeRemediation(
        node=name,
        quarantined=q is not None,
        # Done, and nothing left on the node that the drain only reported (mode never, excluded, blocked).
        drain_done=drain is not None and drain.done is not None and not drain.blocked,
        state=state,
        readable=not text or state is not None,
        gpus=tuple(sorted(q.fault_gpus)) if q else (),
        reason="",
    )


class Handoff:
    def __init__(self, kube: KubeClient, events: EventRecorder) -> None:
        self.kube = kube
        self.events = events

    async def condition(self, n: NodeRemediation, policy: RemediationConfig) -> bool | None:
        """The active object step's completion condition, read from its object."""
        st = n.state
        if st is None or st.final or not st.object_path or st.step >= len(policy.steps):
            return None
        step = policy.steps[st.step]
        try:
            obj = await self.kube.request("GET", st.object_path, verb="get", resource=step.resource)
        except KubeError:
            return None
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == step.complete_condition:
                return {"True": True, "False": False}.get(str(cond.get("status")))
        return None

    async def apply(
        self, d: RemediationDecision, node_obj: Mapping[str, Any] | None, *, dry_run: bool
    ) -> None:
        ref = (
            ObjectRef.of(dict(node_obj))
            if node_obj
            else ObjectRef(api_version="v1", kind="Node", name=d.node)
        )
        if dry_run:
            if d.event is not None:
                reason, note = d.event
                with contextlib.suppress(KubeError):
                    await self.events.emit(ref, reason=reason, note=f"[dry-run] {note}", action="Remediate",
                                           type=_event_type(reason))  # fmt: skip
            log.info("[dry-run] remediation", extra={"node": d.node, "event": d.event})
            return
        state = d.state if d.finish else await self._write_state(d)
        if state is None or not state.owes:
            return
        if state.delete:
            try:
                await self.kube.request("DELETE", state.delete, verb="delete", resource="remediation-object")
            except KubeNotFound:
                pass
            except KubeError as exc:  # not retried: a step object we may not delete is left for an operator
                log.warning("remediation object not deleted", extra={"node": d.node, "error": str(exc)})
        if state.event is not None:
            reason, note = state.event
            if not await self.events.emit_once(ref, name=event_name(d.node, state), reason=reason, note=note,
                                               action="Remediate", type=_event_type(reason)):  # fmt: skip
                return  # still owed on the Node: the next pass tries again under the same name
        try:
            await patch_with_retry(self.kube, NODES, d.node, lambda cur: settle_patch(cur, state))
        except KubeError as exc:
            log.warning("remediation debt not cleared; settled again next pass",
                        extra={"node": d.node, "error": str(exc)})  # fmt: skip

    async def _write_state(self, d: RemediationDecision) -> RemediationState | None:
        """The markers and the state (with what it owes); returns the state written, None if not written."""
        labels: dict[str, str | None] = {}
        annotations: dict[str, str | None] = {}
        for step in d.remove:
            (labels if step.action == "label" else annotations)[step.key] = None
        state = d.state
        if d.apply is not None:
            state = await self._start(d, d.apply, labels, annotations, state)
        annotations[REMEDIATION_ANNOTATION] = None if state is None else state.encode()
        patch: dict[str, Any] = {"metadata": {"annotations": annotations}}
        if labels:
            patch["metadata"]["labels"] = labels
        try:
            await self.kube.patch(NODES, d.node, patch)
        except KubeError as exc:
            log.warning("remediation state not written", extra={"node": d.node, "error": str(exc)})
            return None
        return state

    async def _start(
        self, d: RemediationDecision, step: RemediationStep, labels: dict[str, str | None],
        annotations: dict[str, str | None], state: RemediationState | None,
    ) -> RemediationState | None:  # fmt: skip
        if step.action == "label":
            labels[step.key] = step.value
            return state
        if step.action == "annotation":
            annotations[step.key] = step.value
            return state
        try:
            obj = render_template(step.template, d.context)
            collection = object_path(obj, step.resource)
            path = f"{collection}/{(obj.get('metadata') or {}).get('name', '')}"
            if state is not None and state.delete == path:
                # The new step's object is the finished step's (one name for both): gone first, then anew.
                with contextlib.suppress(KubeNotFound):
                    await self.kube.request("DELETE", path, verb="delete", resource=step.resource)
                state = replace(state, delete="")
            await self.kube.request("POST", collection, verb="create", resource=step.resource, body=obj,
                                    content_type="application/json")  # fmt: skip
        except KubeConflict:
            pass  # AlreadyExists: created by a leader that died before it recorded the step
        except (KubeError, ValueError, yaml.YAMLError) as exc:
            # The step cannot start: record it, so it times out and the next step follows.
            log.warning("remediation object not created", extra={"node": d.node, "error": str(exc)})
            return state
        return None if state is None else replace(state, object_path=path)


def _event_type(reason: str) -> EventType:
    return EventType.WARNING if reason == "GPURemediationExhausted" else EventType.NORMAL


def settle_patch(current: Mapping[str, Any], owed: RemediationState) -> dict[str, Any] | None:
    """Clear the debt once settled - only over the state that owed it (a newer state is left alone)."""
    text = ((current.get("metadata") or {}).get("annotations") or {}).get(REMEDIATION_ANNOTATION)
    if decode(text) != decode(owed.encode()):
        return None
    return {"metadata": {"annotations": {REMEDIATION_ANNOTATION: owed.settled().encode()}}}
