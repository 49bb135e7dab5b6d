"""The `drain.remediation` section — handing a drained node to whatever repairs it, with escalation.

Why: gpuwarden quarantines and drains; repairing is someone else's job (Medik8s self-node-remediation, a cloud
node replacement, a GPU-reset job, a maintenance CR such as NVSentinel's). After a drain is done the steps run
in order, each by setting a label, an annotation or creating an object from a template, until one succeeds or
all time out. Success is the node being released by the health controller (its healthy period passed: the
fault is gone) or, for an object step, a status condition on that object. Every step ends in a recorded state.
Off by default: it acts on nodes, and what acts on the label is outside gpuwarden.
"""

from __future__ import annotations

import re
from typing import Literal

import yaml
from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, Seconds


class RemediationStep(Section):
    """One escalation step."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Step name (e.g. gpu-reset, reboot, replace); shown in the node's state.",
    )
    action: Literal["label", "annotation", "object"] = Field(
        description="label / annotation: set `key`=`value` on the Node for an external remediator; object: "
        "create `template` (YAML; {node}, {gpus}, {reason}, {step} are substituted)."
    )
    key: str = Field(default="", description="Label or annotation key (label / annotation actions).")
    value: str = Field(default="true", description="Label or annotation value.")
    template: str = Field(default="", description="The object to create (object action), as YAML.")
    resource: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
        description="object: the plural resource name of the template's kind (e.g. gpuresets), for its URL.",
    )
    complete_condition: str = Field(
        default="Complete",
        description="object: the status condition type whose True status means the step succeeded "
        "(False means it failed and the next step starts).",
    )
    timeout_seconds: Seconds = Field(
        default=1800.0, description="Seconds before the step counts as timed out and the next one starts."
    )

    @model_validator(mode="after")
    def _needs(self) -> RemediationStep:
        if self.action in ("label", "annotation") and not self.key:
            raise FieldError("key", f"is required for a {self.action} step")
        if self.action == "object" and not self.template:
            raise FieldError("template", "is required for an object step")
        if self.action == "object":
            try:
                obj = yaml.safe_load(re.sub(r"\{(node|gpus|reason|step)\}", "x", self.template))
            except yaml.YAMLError as exc:
                raise FieldError("template", f"is not YAML: {exc}") from None
            if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
                raise FieldError("template", "must be one object with apiVersion and kind")
        if self.action == "object" and not self.resource:
            raise FieldError("resource", "is required for an object step (the kind's plural, e.g. gpuresets)")
        return self


class RemediationConfig(Section):
    """Escalating hand-off of drained nodes: each step until one succeeds or every one timed out."""

    enabled: bool = Field(default=False, description="Hand drained nodes to the steps below.")
    steps: list[RemediationStep] = Field(
        default_factory=list,
        description="Escalation steps in order (e.g. gpu-reset, then reboot, then replace).",
    )

    @model_validator(mode="after")
    def _steps(self) -> RemediationConfig:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise FieldError("steps", "step names must be unique")
        if self.enabled and not self.steps:
            raise FieldError("steps", "at least one step is needed when remediation is enabled")
        return self
