"""Turn validation failures into problems a person can act on, and format them for `check-config`.

Why: pydantic's errors name a location tuple and say "Input should be ...". An operator needs the dotted
field (`health.breaker.max_percent`), what was wrong with the value they wrote, how to fix it, and where the
value came from (a line of the file, an environment variable, a command-line flag). One problem per line, all
at once. This module only translates and formats; reading files and applying overrides is `loader`'s job.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpuwarden.config.fieldtypes import FieldError
from gpuwarden.config.modelpath import model_at, written_keys
from gpuwarden.config.root import Config
from gpuwarden.config.yamlsource import Path, dotted

Problem = tuple[str, str]
"""(dotted field path, message with a fix hint)."""

_KINDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string (quote it)",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "list_type": "a list",
    "path_type": "a file path",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def format_problems(problems: Sequence[Problem], file: str | None = None) -> str:
    """One line per problem, `FILE: field.path: message`, newline-terminated ('' when there are none)."""
    prefix = f"{file}: " if file else ""
    return "".join(f"{prefix}{field}: {message}\n" for field, message in problems)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _unknown_key(path: Sequence[Hashable], root: type[BaseModel]) -> str:
    key = str(path[-1])
    model = model_at(path[:-1], root)
    if model is None:
        return "unknown key; remove it"
    known = written_keys(model)
    for candidates in (known, list(model.model_fields)):  # the written (alias) keys first
        lowered = {c.lower(): c for c in candidates}
        close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {lowered[close[0]]!r}?"
    return f"unknown key; valid keys here: {', '.join(known)}"


def _message(error: ErrorDetails, path: Sequence[Hashable], root: type[BaseModel]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(path, root)
    if kind == "missing":
        return "required, but missing; add it"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {_show(value)}"
    if kind in _BOUNDS:
        bound = next(iter(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")))
        return f"must be {_BOUNDS[kind]} {_show(bound)}, got {_show(value)}"
    if kind in _KINDS:
        return f"expected {_KINDS[kind]}, got {_show(value)}"
    if kind == "url_parsing":
        return f"not a valid URL ({ctx.get('error', 'unparseable')}), got {_show(value)}; e.g. http://prometheus:9090"
    if kind == "url_scheme":
        return f"URL scheme must be http or https, got {_show(value)}; e.g. http://prometheus:9090"
    text = error["msg"]
    text = text[0].lower() + text[1:] if text else "invalid value"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return f"{text}, got {_show(value)}"
    return text


def _origin(path: Sequence[Hashable], origins: Mapping[Path, str]) -> str:
    """Where the value at `path` came from: its own or its nearest parent's origin, else a child's (an
    unknown section created by an environment variable has an origin only at the variable's full path)."""
    for end in range(len(path), 0, -1):
        found = origins.get(tuple(path[:end]))
        if found is not None:
            return found
    prefix = tuple(path)
    return next((o for p, o in origins.items() if p[: len(prefix)] == prefix), "")


def problems_from_validation(
    exc: ValidationError, origins: Mapping[Path, str] | None = None, root: type[BaseModel] = Config
) -> list[Problem]:
    """Every error of `exc` as (field, message + fix + where the value came from).

    `origins` maps data paths to 'line 12' / 'from GPUWARDEN_X' / ...; `root` is the model validated.
    """
    problems: list[Problem] = []
    for error in exc.errors():
        path: list[Hashable] = list(error["loc"])
        key_error = bool(path) and path[-1] == "[key]"
        if key_error:
            path.pop()
        ctx_error = (error.get("ctx") or {}).get("error")
        if isinstance(ctx_error, FieldError):
            path.extend(ctx_error.field.split("."))
        message = _message(error, path, root)
        if key_error:
            message = f"invalid key: {message}"
        where = _origin(path, origins or {})
        if where:
            message += f" ({where})"
        problems.append((dotted(tuple(path)) or "(root)", message))
    return problems
