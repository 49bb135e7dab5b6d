"""Validate the config and print chosen sections as `view`'s tagged JSON: the child process of
`gpuwarden.config.view.load_in_child`, so the process that serves never imports pydantic.

Run as `python -m gpuwarden.config.export` with a JSON request on stdin:
`{"path": str | null, "overrides": {dotted field: value}, "sections": [section, ...]}`; the environment is
this process's own (`GPUWARDEN_*` overrides). Exit 0: the sections on stdout. Exit 1: every problem on
stderr exactly as `load_config`'s callers print them (`format_problems`), each naming its field.

What it must not do: print anything else on stdout, or turn a value into something `view.decode` would give
back differently (an unknown type is an error, not a string).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import AnyUrl, BaseModel

from gpuwarden.config.loader import load_config
from gpuwarden.config.report import format_problems
from gpuwarden.config.view import MAP, PATH, RECORD
from gpuwarden.errors import ConfigError


def encode(value: Any) -> Any:
    """The tagged JSON form of a validated value (`view.decode` gives it back)."""
    if isinstance(value, BaseModel):
        return {RECORD: {name: encode(getattr(value, name)) for name in type(value).model_fields}}
    if isinstance(value, Path):
        return {PATH: str(value)}
    if isinstance(value, AnyUrl):
        return str(value)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"config mapping with a non-string key: {sorted(map(repr, value))}")
        return {MAP: {k: encode(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"config value of type {type(value).__name__} has no exported form")


def export(path: Path | None, overrides: dict[str, object], sections: list[str]) -> str:
    """The sections of the loaded config as one record (raises `ConfigError` like `load_config`)."""
    config = load_config(path, os.environ, overrides)
    return json.dumps({RECORD: {name: encode(getattr(config, name)) for name in sections}})


def main() -> int:
    request = json.load(sys.stdin)
    path = Path(request["path"]) if request.get("path") is not None else None
    try:
        text = export(path, request.get("overrides") or {}, list(request["sections"]))
    except ConfigError as exc:
        sys.stderr.write(format_problems(exc.problems, str(path or "(defaults)")))
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
