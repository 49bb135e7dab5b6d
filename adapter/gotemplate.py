"""The subset of Go's text/template that prometheus-adapter configs use, with `<<` `>>` delimiters.

Why: `metricsQuery` and `resources.template` are Go templates, and our config must accept prometheus-adapter's
rules unchanged. Real configs use field access (`<<.Series>>`, `<<.LabelMatchers>>`, `<<.GroupBy>>`,
`<<.GroupBySlice>>`, `<<.LabelValuesByName.pod>>`), `index` (`<<index .LabelValuesByName "pod">>`), `len`,
comments and trim markers (`<<-` / `->>`). Those are supported with Go's printing rules (a slice prints as
`[a b]`, a map as `map[k:v]` with sorted keys). Anything else (`if`, `range`, pipelines, other functions) is
rejected when the config is loaded, with a message naming the action — never silently mis-rendered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

Value: TypeAlias = str | Sequence[str] | Mapping[str, str]

_ACTION = re.compile(r"<<(-\s)?\s*(.*?)\s*(\s-)?>>", re.DOTALL)
_FIELD = re.compile(r"^\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_STRING = re.compile(r'^"((?:[^"\\]|\\.)*)"$|^`([^`]*)`$')
_ARG = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`|\S+')


class TemplateError(ValueError):
    """The template cannot be parsed, or uses a construct this subset does not support.

    `reason` is the problem alone (for a report that already names the field); str() also quotes the source.
    """

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"template {source!r}: {reason}")
        self.source = source
        self.reason = reason


@dataclass(frozen=True)
class _Field:
    path: tuple[str, ...]


@dataclass(frozen=True)
class _Literal:
    text: str


@dataclass(frozen=True)
class _Call:
    func: str
    args: tuple[_Field | _Literal, ...]


_Node: TypeAlias = str | _Field | _Call  # str = literal text between actions


def _go_format(value: Value | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{k}:{value[k]}" for k in sorted(value)) + "]"
    return "[" + " ".join(value) + "]"


def _arg(token: str, fields: frozenset[str], source: str) -> _Field | _Literal:
    if _FIELD.match(token):
        path = tuple(token[1:].split("."))
        if path[0] not in fields:
            allowed = ", ".join(f".{f}" for f in sorted(fields))
            raise TemplateError(source, f"unknown field .{path[0]} (available: {allowed})")
        return _Field(path)
    if token.isdigit():
        return _Literal(token)
    m = _STRING.match(token)
    if m:
        raw = m.group(1) if m.group(1) is not None else m.group(2)
        return _Literal(bytes(raw, "utf-8").decode("unicode_escape") if m.group(1) is not None else raw)
    raise TemplateError(source, f"unsupported argument {token!r}")


class Template:
    """A compiled template; `render(values)` is pure and cannot fail once compiled."""

    def __init__(self, source: str, fields: frozenset[str]) -> None:
        self.source = source
        self.fields = fields
        self.nodes: list[_Node] = []
        pos = 0
        for m in _ACTION.finditer(source):
            text = source[pos : m.start()]
            if m.group(1):
                text = text.rstrip()
            if text:
                self.nodes.append(text)
            pos = m.end()
            if m.group(3):
                rest = source[pos:]
                pos += len(rest) - len(rest.lstrip())
            self._action(m.group(2))
        if "<<" in source[pos:] or ">>" in source[pos:]:
            raise TemplateError(source, "unclosed or stray delimiter")
        if source[pos:]:
            self.nodes.append(source[pos:])

    def _action(self, body: str) -> None:
        if body.startswith("/*") and body.endswith("*/"):
            return
        tokens = _ARG.findall(body)
        if not tokens:
            raise TemplateError(self.source, "empty action")
        head = tokens[0]
        if head.startswith(".") or head[0] in '"`':
            if len(tokens) != 1:
                raise TemplateError(self.source, f"unsupported action <<{body}>>")
            arg = _arg(head, self.fields, self.source)
            self.nodes.append(arg if isinstance(arg, _Field) else arg.text)
            return
        if head not in ("index", "len"):
            raise TemplateError(
                self.source, f"unsupported action <<{body}>> (supported: field access, index, len, comments)"
            )
        args = tuple(_arg(t, self.fields, self.source) for t in tokens[1:])
        if (head == "len" and len(args) != 1) or (head == "index" and len(args) < 2):
            raise TemplateError(self.source, f"wrong number of arguments in <<{body}>>")
        self.nodes.append(_Call(head, args))

    def render(self, values: Mapping[str, Value]) -> str:
        out: list[str] = []
        for node in self.nodes:
            if isinstance(node, str):
                out.append(node)
            elif isinstance(node, _Field):
                out.append(_go_format(_resolve(node, values)))
            else:
                out.append(_go_format(_call(node, values)))
        return "".join(out)

    def calls(self) -> bool:
        """Whether the template calls a function (`index`, `len`) anywhere."""
        return any(isinstance(node, _Call) for node in self.nodes)

    def mentions(self, field: str) -> bool:
        """Whether the template reads `field` anywhere (used to check `resources.template`)."""
        for node in self.nodes:
            args = node.args if isinstance(node, _Call) else (node,)
            if any(isinstance(a, _Field) and a.path[0] == field for a in args):
                return True
        return False


def _resolve(arg: _Field | _Literal, values: Mapping[str, Value]) -> Value | None:
    if isinstance(arg, _Literal):
        return arg.text
    value: Value | None = values.get(arg.path[0])
    for key in arg.path[1:]:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _call(call: _Call, values: Mapping[str, Value]) -> Value | None:
    target = _resolve(call.args[0], values)
    if call.func == "len":
        return str(len(target)) if target is not None else "0"
    for arg in call.args[1:]:
        key = _resolve(arg, values)
        if isinstance(target, Mapping) and isinstance(key, str):
            target = target.get(key, "")
        elif isinstance(target, Sequence) and not isinstance(target, str) and isinstance(key, str):
            idx = int(key) if key.lstrip("-").isdigit() else -1
            target = target[idx] if 0 <= idx < len(target) else ""
        else:
            return ""
    return target


def compile_template(source: str, fields: frozenset[str]) -> Template:
    """Compile `source`; raise TemplateError naming the problem."""
    return Template(source, fields)
