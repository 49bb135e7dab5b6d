"""Environment and command-line overrides of the config file: parsed into (path, value, origin) and applied.

Why a module of its own: the full loader (`loader.py`) and the node agent's lean loader (`lean.py`) apply
overrides the same way, and the lean one must not import pydantic. Nothing here knows what a field means.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping
from typing import Any

import yaml

from gpuwarden.config.sections import SECTIONS
from gpuwarden.config.yamlsource import Path as DataPath
from gpuwarden.config.yamlsource import dotted

Problem = tuple[str, str]
"""(field, message), as `report.Problem`."""

ENV_PREFIX = "GPUWARDEN_"
CLI_ORIGIN = "from the command line"


def parse_env_value(raw: str) -> Any:
    """An environment value: YAML/JSON for lists and mappings, None for null, otherwise the string itself."""
    text = raw.strip()
    if text in ("null", "~", "Null", "NULL"):
        return None
    if text.startswith(("[", "{")):
        return yaml.safe_load(text)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return json.loads(text)
    return raw


def env_overrides(env: Mapping[str, str]) -> tuple[list[tuple[DataPath, Any, str]], list[Problem]]:
    """(path, value, origin) for every `GPUWARDEN_<SECTION>__<KEY>` variable, sorted by name; and problems."""
    overrides: list[tuple[DataPath, Any, str]] = []
    problems: list[Problem] = []
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        if "__" not in rest:
            section = next((s for s in SECTIONS if rest.lower().startswith(s + "_")), None)
            if section is not None:
                fixed = f"{ENV_PREFIX}{section.upper()}__{rest[len(section) + 1 :]}"
                problems.append((f"env {name}", f"not applied: separate the section with '__', i.e. {fixed}"))
            continue
        parts = rest.lower().split("__")
        if any(not p for p in parts):
            problems.append((f"env {name}", "empty path segment: use exactly two '_' between keys"))
            continue
        try:
            value = parse_env_value(env[name])
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            problems.append((".".join(parts), f"cannot parse the value of {name} as YAML/JSON: {exc}"))
            continue
        overrides.append((tuple(parts), value, f"from {name}"))
    return overrides, problems


def cli_overrides(values: Mapping[str, object]) -> tuple[list[tuple[DataPath, Any, str]], list[Problem]]:
    """(path, value, origin) for dotted-path overrides; None values (flags not given) are skipped."""
    overrides: list[tuple[DataPath, Any, str]] = []
    problems: list[Problem] = []
    for key, value in values.items():
        if value is None:
            continue
        parts = tuple(key.split("."))
        if any(not p for p in parts):
            problems.append(("(command line)", f"{key!r} is not a dotted field path such as prometheus.url"))
            continue
        overrides.append((parts, value, CLI_ORIGIN))
    return overrides, problems


def _match_key(mapping: dict[Any, Any], seg: Hashable) -> Hashable:
    """The existing key `seg` refers to (exact, else case-insensitive, so `79` finds the int key 79)."""
    if seg in mapping:
        return seg
    lowered = str(seg).lower()
    return next((k for k in mapping if str(k).lower() == lowered), seg)


def apply_override(
    raw: dict[Any, Any], path: DataPath, value: Any, origin: str, origins: dict[DataPath, str]
) -> Problem | None:
    """Set `path` in `raw` (creating mappings as needed) and record where the value came from."""
    node = raw
    actual: list[Hashable] = []
    for seg in path[:-1]:
        key = _match_key(node, seg)
        actual.append(key)
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return (
                dotted(tuple(actual)),
                f"cannot apply override ({origin}): the value here is not a mapping",
            )
        node = child
    key = _match_key(node, path[-1])
    node[key] = value
    full = (*actual, key)
    for known in [p for p in origins if p[: len(full)] == full]:
        del origins[known]
    origins[full] = origin
    return None
