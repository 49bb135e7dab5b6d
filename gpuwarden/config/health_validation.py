"""The `health.validation:` section — an active check before a quarantined node returns to service.

Why: passive return to service is optimistic — an idle node that looks healthy fails again under load
(NVSentinel #695, #1427; its answer is a validation request before clearing, PR #1749). With this section on,
a release that the healthy period allows first runs a Job the operator names (a DCGM diagnostic, an NCCL test)
pinned to the node and tolerating our taint; only its success lifts the quarantine. A failure (or a timeout)
keeps the quarantine, is recorded on the node with why, and starts the healthy period again; after
`max_attempts` failures the node stays quarantined for a human (Warning Event `GPUValidationExhausted`).
Off by default: the image and its arguments are the operator's choice.
"""

from __future__ import annotations

import re

import yaml
from pydantic import Field, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, PositiveCount, Seconds

PLACEHOLDERS = re.compile(r"\{(node|gpus|reason)\}")


class ValidationConfig(Section):
    """Run a validation Job on a quarantined node before releasing it."""

    enabled: bool = Field(default=False, description="Validate before every release after a healthy period.")
    job_template: str = Field(
        default="",
        description="A batch/v1 Job as YAML; {node}, {gpus} (comma-separated UUIDs) and {reason} are "
        "substituted. gpuwarden sets its name, namespace and labels, pins it to the node "
        "(spec.template.spec.nodeName), adds a toleration for gpuwarden.io/gpu-unhealthy, and defaults "
        "restartPolicy to Never and backoffLimit to 0. Its pod must request the GPUs it tests.",
    )
    timeout_seconds: Seconds = Field(
        default=1800.0,
        description="A Job neither succeeded nor failed after this long counts as failed (timed out). 30 min "
        "fits a DCGM level-3 diagnostic.",
    )
    max_attempts: PositiveCount = Field(
        default=3,
        description="Failed validations before the node stays quarantined for an operator "
        "(gpuwarden.io/release=now lifts it).",
    )
    namespace: str = Field(
        default="",
        description="Namespace of the Jobs; empty: the controller's own (its Role must allow jobs there).",
    )

    @model_validator(mode="after")
    def _template(self) -> ValidationConfig:
        if not self.enabled:
            return self
        if not self.job_template.strip():
            raise FieldError("job_template", "is required when validation is enabled")
        try:
            obj = yaml.safe_load(PLACEHOLDERS.sub("x", self.job_template))
        except yaml.YAMLError as exc:
            raise FieldError("job_template", f"is not YAML: {exc}") from None
        if not isinstance(obj, dict) or obj.get("kind") != "Job" or obj.get("apiVersion") != "batch/v1":
            raise FieldError("job_template", "must be one batch/v1 Job")
        containers = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
        if not containers:
            raise FieldError("job_template", "needs spec.template.spec.containers")
        return self
