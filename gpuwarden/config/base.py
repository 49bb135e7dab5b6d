"""The base of every config model: unknown keys rejected, validated on assignment, frozen after load.

Why a shared base: the rule "an unknown key is an error that names the field" must hold for every section,
including the ones added later, without each model remembering to say so.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: unknown keys rejected, values validated, immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True)
