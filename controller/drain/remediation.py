"""Remediation hand-off after a drain: which escalation step a node is at, and what to do next. Pure.

Why it exists: a drained node must not sit quarantined forever, and must not be rebooted after it recovered
(NVSentinel #121, #1280: drains and reboots outliving a recovery). The steps run in order once the drain is
done; each ends in a recorded outcome: `succeeded` (the node was released by the health controller — its
healthy period passed — or the step's object reports its completion condition True), `failed` (the condition
is False), `timed-out`; the last failing step makes the whole hand-off `exhausted` (an Event; the node stays
quarantined for a human). A released node ends any active step at once and its markers are removed, so
nothing acts on a healthy node. State lives on the Node (`gpuwarden.io/remediation`), so a new leader
continues. No I/O, no clock, no logging.

Each transition's Event (and the deletion of the step object it finished) is owed in the state it writes
(`event`, `delete`) and settled once done; the Event is named after the state (`event_name`). A leader killed
after the state leaves the debt on the Node, and the next pass only settles it (`RemediationDecision.finish`);
killed before, the state on the Node is unchanged and the next pass decides the same transition again (its
step object's 409 AlreadyExists is ours). So each Event is written exactly once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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
    event: tuple[str, str] | None = None
    """(reason, note) of the Event this state's transition owes, until it is written."""
    delete: str = ""
    """API path of the finished step's object, owed a deletion (so nothing acts on it), until deleted."""

    @property
    def owes(self) -> bool:
        return self.event is not None or bool(self.delete)

    def settled(self) -> RemediationState:
        return replace(self, event=None, delete="")

    def encode(self) -> str:
        body: dict[str, Any] = {
            "step": self.step, "started": iso(self.started), "final": self.final, "object": self.object_path,
            "history": [{"name": h.name, "outcome": h.outcome, "at": iso(h.at), "why": h.why}
                        for h in self.history],
        }  # fmt: skip
        if self.event is not None:
            body["event"] = {"reason": self.event[0], "note": self.event[1]}
        if self.delete:
            body["delete"] = self.delete
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def event_name(node: str, state: RemediationState) -> str:
    """The one name of a transition's Event: the node, the Event, the step's start (hex) and the step."""
    reason = state.event[0].lower() if state.event else ""
    return f"{node}.{reason}.{int(state.started):x}.{state.step}"


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
        owed = raw.get("event")
        event = (str(owed["reason"]), str(owed.get("note", ""))) if owed else None
        return RemediationState(
            int(raw["step"]), started or 0.0, history, str(raw.get("final", "")), str(raw.get("object", "")),
            event, str(raw.get("delete", "")),
        )  # fmt: skip
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
    """The state to write (None: remove the annotation), with what its transition owes (Event, deletion)."""
    apply: RemediationStep | None = None
    """A step to start now (set its marker / create its object)."""
    remove: tuple[RemediationStep, ...] = ()
    """Steps whose label / annotation markers to remove."""
    context: Mapping[str, str] = field(default_factory=dict)
    finish: bool = False
    """The state on the Node already owes its Event or deletion: settle that, write nothing else."""

    @property
    def event(self) -> tuple[str, str] | None:
        """(reason, note) of the Event this decision owes."""
        return self.state.event if self.state is not None else None


def _marker(step: RemediationStep) -> bool:
    return step.action in ("label", "annotation")


def decide(n: NodeRemediation, policy: RemediationConfig, now: float) -> RemediationDecision | None:
    """What to do for one node now; None: nothing."""
    if not policy.enabled or not policy.steps or not n.readable:
        return None
    steps = policy.steps
    ctx = {"node": n.node, "gpus": ",".join(n.gpus), "reason": n.reason}
    st = n.state
    now = float(int(now))  # whole seconds, as the state on the Node keeps them (the Event's name)
    if st is not None and st.owes:
        return RemediationDecision(
            n.node, st, finish=True
        )  # a leader died after the state: settle, nothing else
    if st is None:
        if n.quarantined and n.drain_done:
            first = steps[0]
            started = RemediationState(
                0, now, event=("GPURemediationStarted", f"step {first.name} ({first.action})")
            )
            return RemediationDecision(n.node, started, apply=first, context={**ctx, "step": first.name})
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
        event = ("GPURemediationSucceeded", f"step {current.name}: node released")
        ended = replace(
            st, history=done, final="succeeded", object_path="", event=event, delete=st.object_path
        )
        return RemediationDecision(n.node, ended, remove=tuple(s for s in steps[: st.step + 1] if _marker(s)))
    if current.action == "object" and n.condition is True:
        done = (
            *st.history,
            StepOutcome(current.name, "succeeded", now, f"{current.complete_condition}=True"),
        )
        note = f"step {current.name}: {current.complete_condition}=True; the node is released once healthy"
        event = ("GPURemediationSucceeded", f"{note} for the healthy period")
        return RemediationDecision(
            n.node, replace(st, history=done, final="succeeded", object_path="", event=event)
        )
    outcome = ""
    if current.action == "object" and n.condition is False:
        outcome, why = "failed", f"{current.complete_condition}=False"
    elif now - st.started >= current.timeout_seconds:
        outcome, why = "timed-out", f"no success within {current.timeout_seconds:g}s"
    if not outcome:
        return None
    history = (*st.history, StepOutcome(current.name, outcome, now, why))
    if st.step + 1 >= len(steps):
        note = f"every step failed (last: {current.name} {outcome})"
        event = ("GPURemediationExhausted", f"{note}; the node stays quarantined for an operator")
        ended = replace(
            st, history=history, final="exhausted", object_path="", event=event, delete=st.object_path
        )
        return RemediationDecision(n.node, ended, remove=tuple(s for s in steps if _marker(s)))
    nxt = steps[st.step + 1]
    event = ("GPURemediationEscalated", f"step {current.name} {outcome} ({why}); next: {nxt.name}")
    escalated = RemediationState(st.step + 1, now, history, event=event, delete=st.object_path)
    return RemediationDecision(
        n.node, escalated, apply=nxt, remove=(current,) if _marker(current) else (),
        context={**ctx, "step": nxt.name},
    )  # fmt: skip


_PLACEHOLDER = re.compile(r"\{(node|gpus|reason|step)\}")


def render_template(template: str, context: Mapping[str, str]) -> dict[str, Any]:
    """The step's object: {node}, {gpus}, {reason}, {step} substituted (YAML braces untouched), parsed."""
    import yaml

    obj = yaml.safe_load(_PLACEHOLDER.sub(lambda m: context.get(m.group(1), ""), template))
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        raise ValueError("remediation template must be one object with apiVersion and kind")
    return obj
