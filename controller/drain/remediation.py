"""Remediation hand-off after a drain: which escalation step a node is at, and what to do next. Pure.

Why it exists: a drained node must not sit quarantined forever, and must not be rebooted after it recovered
(NVSentinel #121, #1280: drains and reboots outliving a recovery). The steps run in order once the drain is
done; each ends in a recorded outcome: `succeeded` (the node was released by the health controller — its
healthy period passed — or the step's object reports its completion condition True), `failed` (the condition
is False), `timed-out`; the last failing step makes the whole hand-off `exhausted` (an Event; the node stays
quarantined for a human). A released node ends any active step at once and its markers are removed, so
nothing acts on a healthy node. State lives on the Node (`gpuwarden.io/remediation`), so a new leader
continues. No I/O, no clock, no logging.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.config.remediation import RemediationConfig, RemediationStep
from gpuwarden.quarantine import iso, parse_iso


@dataclass(frozen=True, slots=True)
class StepOutcome:
    name: str
    outcome: str
    at: float
    why: str = ""


@dataclass(frozen=True, slots=True)
class RemediationState:
    step: int
    started: float
    history: tuple[StepOutcome, ...] = ()
    final: str = ""
    object_path: str = ""
    """API path of the object the active step created (object steps), to read its condition."""

    def encode(self) -> str:
        return json.dumps(
            {"step": self.step, "started": iso(self.started), "final": self.final, "object": self.object_path,
             "history": [{"name": h.name, "outcome": h.outcome, "at": iso(h.at), "why": h.why}
                         for h in self.history]},
            sort_keys=True, separators=(",", ":"),
        )  # fmt: skip


def decode(text: str | None) -> RemediationState | None:
    if not text:
        return None
    try:
        raw = json.loads(text)
        started = parse_iso(raw["started"])
        history = tuple(
            StepOutcome(str(h["name"]), str(h["outcome"]), parse_iso(h["at"]) or 0.0, str(h.get("why", "")))
            for h in raw.get("history") or []
        )
        return RemediationState(
            int(raw["step"]), started or 0.0, history, str(raw.get("final", "")), str(raw.get("object", ""))
        )
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: treated as absent is unsafe (a restart), so callers skip such nodes


@dataclass(frozen=True, slots=True)
class NodeRemediation:
    node: str
    quarantined: bool
    drain_done: bool
    state: RemediationState | None
    readable: bool = True
    condition: bool | None = None
    """The active object step's completion condition (None: absent or unknown)."""
    gpus: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RemediationDecision:
    node: str
    state: RemediationState | None
    """The state to write (None: remove the annotation)."""
    apply: RemediationStep | None = None
    """A step to start now (set its marker / create its object)."""
    remove: tuple[RemediationStep, ...] = ()
    """Steps whose label / annotation markers to remove."""
    event: tuple[str, str] | None = None
    """(reason, note)."""
    context: Mapping[str, str] = field(default_factory=dict)
    delete_object: str = ""
    """API path of a finished step's object to delete, so nothing acts on it any more."""


def _marker(step: RemediationStep) -> bool:
    return step.action in ("label", "annotation")


def decide(n: NodeRemediation, policy: RemediationConfig, now: float) -> RemediationDecision | None:
    """What to do for one node now; None: nothing."""
    if not policy.enabled or not policy.steps or not n.readable:
        return None
    steps = policy.steps
    ctx = {"node": n.node, "gpus": ",".join(n.gpus), "reason": n.reason}
    st = n.state
    if st is None:
        if n.quarantined and n.drain_done:
            first = steps[0]
            return RemediationDecision(
                n.node, RemediationState(0, now), apply=first, context={**ctx, "step": first.name},
                event=("GPURemediationStarted", f"step {first.name} ({first.action})"),
            )  # fmt: skip
        return None
    if st.final:
        if not n.quarantined:
            return RemediationDecision(
                n.node, None
            )  # the node was released after the hand-off ended: forget it
        return None
    current = steps[min(st.step, len(steps) - 1)]
    if not n.quarantined:
        done = (
            *st.history,
            StepOutcome(current.name, "succeeded", now, "node released by the health controller"),
        )
        return RemediationDecision(n.node, RemediationState(st.step, st.started, done, "succeeded"),
                        remove=tuple(s for s in steps[: st.step + 1] if _marker(s)),
                        delete_object=st.object_path,
                        event=("GPURemediationSucceeded", f"step {current.name}: node released"))  # fmt: skip
    if current.action == "object" and n.condition is True:
        done = (
            *st.history,
            StepOutcome(current.name, "succeeded", now, f"{current.complete_condition}=True"),
        )
        return RemediationDecision(n.node, RemediationState(st.step, st.started, done, "succeeded"),
                        event=("GPURemediationSucceeded",
                               f"step {current.name}: {current.complete_condition}=True; the node is "
                               "released once healthy for the healthy period"))  # fmt: skip
    outcome = ""
    if current.action == "object" and n.condition is False:
        outcome, why = "failed", f"{current.complete_condition}=False"
    elif now - st.started >= current.timeout_seconds:
        outcome, why = "timed-out", f"no success within {current.timeout_seconds:g}s"
    if not outcome:
        return None
    history = (*st.history, StepOutcome(current.name, outcome, now, why))
    if st.step + 1 >= len(steps):
        return RemediationDecision(n.node, RemediationState(st.step, st.started, history, "exhausted"),
                        remove=tuple(s for s in steps if _marker(s)), delete_object=st.object_path,
                        event=("GPURemediationExhausted",
                               f"every step failed (last: {current.name} {outcome}); the node stays "
                               "quarantined for an operator"))  # fmt: skip
    nxt = steps[st.step + 1]
    note = f"step {current.name} {outcome} ({why}); next: {nxt.name}"
    return RemediationDecision(n.node, RemediationState(st.step + 1, now, history), apply=nxt,
                    remove=(current,) if _marker(current) else (), context={**ctx, "step": nxt.name},
                    delete_object=st.object_path,
                    event=("GPURemediationEscalated", note))  # fmt: skip


_PLACEHOLDER = re.compile(r"\{(node|gpus|reason|step)\}")


def render_template(template: str, context: Mapping[str, str]) -> dict[str, Any]:
    """The step's object: {node}, {gpus}, {reason}, {step} substituted (YAML braces untouched), parsed."""
    import yaml

    obj = yaml.safe_load(_PLACEHOLDER.sub(lambda m: context.get(m.group(1), ""), template))
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        raise ValueError("remediation template must be one object with apiVersion and kind")
    return obj
