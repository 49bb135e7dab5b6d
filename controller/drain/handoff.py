"""Carrying out remediation decisions: node markers, step objects, their conditions, the state on the Node.

Why a module: the hand-off's only contact with the cluster (the decisions are `remediation.decide`). A step
object is created from its template at the API path its apiVersion and `resource` name; its completion
condition is read back from that path. Dry-run logs and events, and writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import yaml

from controller.drain.observe import DrainSnapshot
from controller.drain.plan import DrainNode
from controller.drain.remediation import (
    NodeRemediation,
    RemediationDecision,
    RemediationState,
    decode,
    render_template,
)
from gpuwarden.config.remediation import RemediationConfig, RemediationStep
from gpuwarden.errors import KubeError
from gpuwarden.kube import NODES, EventRecorder, EventType, KubeClient, ObjectRef
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
    if name in snap.unknown or name in snap.recovering or (name not in quarantined and not text):
        # Unknown (unreadable record or state), or recovering (evidence gone, healthy period running): no
        # step starts or escalates, nothing is called succeeded.
        return None
    state = decode(text)
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
        if d.event is not None:
            reason, note = d.event
            with contextlib.suppress(KubeError):
                await self.events.emit(
                    ref, reason=reason, note=("[dry-run] " if dry_run else "") + note, action="Remediate",
                    type=EventType.WARNING if reason == "GPURemediationExhausted" else EventType.NORMAL,
                )  # fmt: skip
        if dry_run:
            log.info("[dry-run] remediation", extra={"node": d.node, "event": d.event})
            return
        labels: dict[str, str | None] = {}
        annotations: dict[str, str | None] = {}
        for step in d.remove:
            (labels if step.action == "label" else annotations)[step.key] = None
        state = d.state
        if d.delete_object:
            with contextlib.suppress(KubeError):
                await self.kube.request(
                    "DELETE", d.delete_object, verb="delete", resource="remediation-object"
                )
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
            await self.kube.request("POST", collection, verb="create", resource=step.resource, body=obj,
                                    content_type="application/json")  # fmt: skip
        except (KubeError, ValueError, yaml.YAMLError) as exc:
            # The step cannot start: record it, so it times out and the next step follows.
            log.warning("remediation object not created", extra={"node": d.node, "error": str(exc)})
            return state
        name = (obj.get("metadata") or {}).get("name", "")
        if state is None:
            return None
        return RemediationState(state.step, state.started, state.history, state.final, f"{collection}/{name}")
