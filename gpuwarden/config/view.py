"""A validated config as plain, frozen records: what a process reads when it must not import pydantic.

Why: pydantic and the config models cost the adapter ~11 MiB of RSS for the life of the process, though it
reads its config once, at start. `gpuwarden adapter` therefore validates in a short child process
(`gpuwarden.config.export`: the same `load_config`, every problem named by field as ever) that prints the
validated sections as tagged JSON; the server turns that into `Record`s here. A record has the model's
field names and values (a `Path` stays a `Path`), nothing else: no validators, no methods — the serving code
only reads fields. Types: code keeps its annotations against the models; a record stands in for one.

What it must not do: import pydantic or any model (`tests/unit` checks), or accept anything but what
`encode` produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RECORD = "$record"
PATH = "$path"
MAP = "$map"
"""Tags of the JSON form: `{"$record": {field: value}}`, `{"$path": "..."}`, `{"$map": {key: value}}`."""


class Record:
    """Frozen attribute access to one model's fields (the validated values, decoded)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"config record has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"config records are frozen (setting {name!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self._fields == other._fields

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._fields)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"Record({inner})"


def decode(value: Any) -> Any:
    """The Python value of `encode`'s JSON form."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(f"not a tagged config value: {sorted(value)}")
        ((tag, inner),) = value.items()
        if tag == RECORD:
            return Record({k: decode(v) for k, v in inner.items()})
        if tag == PATH:
            return Path(inner)
        if tag == MAP:
            return {k: decode(v) for k, v in inner.items()}
        raise ValueError(f"unknown config value tag {tag!r}")
    return value


def loads(text: str) -> Record:
    """The root record of `export`'s output."""
    root = decode(json.loads(text))
    if not isinstance(root, Record):
        raise ValueError("the exported config is not a record")
    return root


class ExportFailed(Exception):
    """The child found problems in the config: `text` lists each, naming its field, ready to print."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def load_in_child(path: Path | None, overrides: Mapping[str, object], sections: Sequence[str]) -> Record:
    """`load_config(path, os.environ, overrides)` run in a child process; its `sections` as records.

    Raises `ExportFailed` with the child's report (config problems, or why it could not run).
    """
    request = {
        "path": None if path is None else str(path),
        "overrides": dict(overrides),
        "sections": list(sections),
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's modules
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.config.export"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise ExportFailed(done.stderr or f"config validation exited with {done.returncode}\n")
    return loads(done.stdout)
