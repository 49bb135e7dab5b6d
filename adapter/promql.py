"""PromQL literals and label matchers, escaped so that no request can inject PromQL.

Why: every string that reaches a query from outside — namespace, object names, metricLabelSelector keys and
values — goes through these few functions. Values become double-quoted PromQL strings with every quote,
backslash and control character escaped; values inside `=~`/`!~` are additionally regex-escaped, so a
selector value always matches itself literally (prometheus-adapter passes `in` values through as raw regex;
we do not). Label names are checked, never escaped: a name that is not a Prometheus label name is refused.

Pure functions only; no knowledge of rules, registries or HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
MatchOp = Literal["=", "!=", "=~", "!~"]

_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_SIMPLE_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


class InvalidLabelName(ValueError):
    """A label name that PromQL cannot express as a bare identifier."""


def quote(value: str) -> str:
    """`value` as a double-quoted PromQL string literal that Prometheus unquotes back to `value` exactly.

    Follows Go's strconv.Quote, which is what PromQL's lexer undoes: printable characters pass through,
    quotes/backslashes/controls are escaped, other non-printables become \\u/\\U escapes.
    """
    out = ['"']
    for ch in value:
        esc = _SIMPLE_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def regex_escape(value: str) -> str:
    """Escape RE2 metacharacters so the pattern matches `value` literally (and nothing else)."""
    return "".join("\\" + ch if ch in _RE2_SPECIAL else ch for ch in value)


def literal_alternation(values: Iterable[str]) -> str:
    """A regex matching exactly the given literal values (Prometheus anchors it)."""
    return "|".join(regex_escape(v) for v in values)


def check_label_name(name: str) -> str:
    """Return `name` if it is a valid Prometheus label name, else raise InvalidLabelName naming it."""
    if not LABEL_NAME.match(name):
        raise InvalidLabelName(f"{name!r} is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    return name


def label_matcher(name: str, op: MatchOp, value: str) -> str:
    """`name<op>"value"` with `value` quoted; for regex ops the caller passes an already-built regex."""
    return f"{check_label_name(name)}{op}{quote(value)}"


def names_matcher(label: str, names: list[str]) -> str:
    """Matcher selecting series whose `label` is one of `names`: `=` for one, literal `=~` for several."""
    if len(names) == 1:
        return label_matcher(label, "=", names[0])
    return label_matcher(label, "=~", literal_alternation(names))
