"""Kubernetes field selectors (`fieldSelector=metadata.name=x,metadata.namespace!=y`) as metrics-server
applies them to NodeMetrics and PodMetrics.

Why: metrics-server matches a parsed `fields.Selector` against `generic.AddObjectMetaFieldsSet`: for nodes
only `metadata.name`, for pods `metadata.name` and `metadata.namespace`. A field outside that set reads as
"" (so `spec.nodeName=x` matches nothing and `spec.nodeName!=x` everything) rather than an error; a string
that does not parse is a 400. The grammar is apimachinery's `fields.ParseSelector`: comma-separated
`key=value`, `key==value`, `key!=value`, with `\\` escaping `,`, `=`, `!` and `\\` in values.
Pure functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


class FieldSelectorError(ValueError):
    """A field selector that does not parse; the message names why."""


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: Literal["=", "!="]
    value: str


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def matches(self, fields: Mapping[str, str]) -> bool:
        for req in self.requirements:
            actual = fields.get(req.field, "")
            if (actual == req.value) != (req.op == "="):
                return False
        return True


EVERYTHING = FieldSelector()


def _split(text: str, sep: str) -> list[str]:
    """Split on unescaped `sep`, keeping escapes for the next stage."""
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if escaped:
        raise FieldSelectorError(f"invalid field selector {text!r}: trailing backslash")
    parts.append("".join(current))
    return parts


def _unescape(value: str, whole: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=!":
                raise FieldSelectorError(f"invalid field selector {whole!r}: invalid escape sequence \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise FieldSelectorError(f"invalid field selector {whole!r}: unescaped {ch!r} in value")
        else:
            out.append(ch)
    return "".join(out)


def _term(term: str, whole: str) -> FieldRequirement:
    for symbol, op in (("!=", "!="), ("==", "="), ("=", "=")):
        index = _unescaped_index(term, symbol)
        if index >= 0:
            key, value = term[:index].strip(), term[index + len(symbol) :]
            if not key:
                raise FieldSelectorError(f"invalid field selector {whole!r}: empty field name")
            op_: Literal["=", "!="] = "!=" if op == "!=" else "="
            return FieldRequirement(key, op_, _unescape(value, whole))
    raise FieldSelectorError(f"invalid field selector {whole!r}: {term!r} is not key=value or key!=value")


def _unescaped_index(term: str, symbol: str) -> int:
    i, escaped = 0, False
    while i < len(term):
        ch = term[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif term.startswith(symbol, i):
            return i
        i += 1
    return -1


def parse(text: str) -> FieldSelector:
    """Parse as apimachinery's fields.ParseSelector does; "" is everything."""
    if not text.strip():
        return EVERYTHING
    terms = [t for t in _split(text, ",")]
    if any(not t.strip() for t in terms):
        raise FieldSelectorError(f"invalid field selector {text!r}: empty term")
    return FieldSelector(tuple(_term(t, text) for t in terms))


def object_fields(name: str, namespace: str | None) -> dict[str, str]:
    """`generic.AddObjectMetaFieldsSet`: metadata.name, and metadata.namespace for namespaced objects."""
    fields = {"metadata.name": name}
    if namespace is not None:
        fields["metadata.namespace"] = namespace
    return fields
