"""Navigate the config models by the paths a YAML file uses (`health.breaker.max_percent`).

Why: the loader and the error report both need to ask "which model validates the mapping at this path?" —
to suggest the key a typo meant, and to read `breaker:` with every child commented out as "defaults" rather
than as null. Keys are matched by their written form (alias) first, then by field name.
"""

from __future__ import annotations

import types
from collections.abc import Hashable, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


def unwrap(annotation: Any) -> Any:
    """Strip `Annotated[...]` and `X | None` down to X."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return unwrap(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return unwrap(members[0])
    return annotation


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def nullable(annotation: Any) -> bool:
    """Whether null is an accepted value (`X | None`)."""
    if get_origin(annotation) is Annotated:
        return nullable(get_args(annotation)[0])
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def field_name(model: type[BaseModel], key: Hashable) -> str | None:
    """The field a YAML key sets: matched by alias or by name."""
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return name
    return None


def written_keys(model: type[BaseModel]) -> list[str]:
    """The keys as written in YAML (aliases where defined), in declaration order."""
    return [info.alias or name for name, info in model.model_fields.items()]


def model_at(path: Sequence[Hashable], root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `path`, or None when `path` is not a model."""
    current: Any = root
    for seg in path:
        current = unwrap(current)
        if is_model(current):
            name = field_name(current, seg)
            if name is None:
                return None
            current = current.model_fields[name].annotation
        elif get_origin(current) is list:
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    current = unwrap(current)
    return current if is_model(current) else None


def fill_empty_sections(data: Any, annotation: Any) -> None:
    """Replace null by {} in place wherever a non-nullable model is expected (`breaker:` with no children)."""
    target = unwrap(annotation)
    if is_model(target) and isinstance(data, dict):
        for key, value in data.items():
            name = field_name(target, key)
            if name is None:
                continue
            field_type = target.model_fields[name].annotation
            if value is None and is_model(unwrap(field_type)) and not nullable(field_type):
                data[key] = value = {}
            fill_empty_sections(value, field_type)
    elif get_origin(target) is list and isinstance(data, list):
        for item in data:
            fill_empty_sections(item, get_args(target)[0])
    elif get_origin(target) is dict and isinstance(data, dict):
        for item in data.values():
            fill_empty_sections(item, get_args(target)[1])
