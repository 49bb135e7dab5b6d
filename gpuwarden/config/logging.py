"""The `logging:` section — level and format of gpuwarden's structured logs.

Why: operators ship logs to Loki or Elasticsearch (JSON) and read them at a terminal (text); the same binary
must do both without a rebuild. Applied once by the CLI through `gpuwarden.logs.setup`; library code never
configures logging.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from gpuwarden.config.base import Section


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


Level = Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)]


class LoggingConfig(Section):
    """Log level and format."""

    level: Level = Field(
        default="info",
        description="Lowest level written (case-insensitive). info: one line per action and per problem, "
        "quiet when nothing changes.",
    )
    format: Literal["json", "text", "auto"] = Field(
        default="auto",
        description="json: one object per line, every field a key; text: for humans; auto: text on a "
        "terminal, json otherwise (in a pod).",
    )
    loggers: dict[str, Level] = Field(
        default_factory=dict,
        description="Per-logger levels, e.g. {aiohttp.access: warning, gpuwarden.kube: debug}.",
    )
