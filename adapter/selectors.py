"""Kubernetes label selectors: parse the full grammar, match object labels, and convert to PromQL matchers.

Why: `labelSelector` picks the objects (resolved against our pod/node label cache) and `metricLabelSelector`
narrows the series (converted to PromQL label matchers). Both arrive as the string form that
`labels.Parse` in apimachinery accepts: `=`, `==`, `!=`, `in (…)`, `notin (…)`, `key` (exists), `!key`,
`key > n`, `key < n`, comma-separated, whitespace-tolerant. A selector we cannot parse, or cannot map onto
PromQL exactly, is a 400 naming the problem — never a best-effort query that could select the wrong series.

Pure functions only. Requirements are kept sorted by key and values sorted and de-duplicated, as
apimachinery does, so the string form is canonical and can key caches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from adapter import promql
from adapter.wire import LabelSelector, LabelSelectorRequirement

Op = Literal["=", "==", "!=", "in", "notin", "exists", "!", "gt", "lt"]

_SPECIAL = frozenset("=!(),<>")
_WHITESPACE = frozenset(" \t\r\n")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_INTEGER = re.compile(r"^-?[0-9]+\Z")


class SelectorError(ValueError):
    """A selector that does not parse, or that cannot be expressed in PromQL; the message names why."""


@dataclass(frozen=True, order=True)
class Requirement:
    """One `key op values` clause."""

    key: str
    op: Op
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        symbol = {"gt": ">", "lt": "<"}.get(self.op, self.op)
        return f"{self.key}{symbol}{self.values[0]}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        """apimachinery's Requirement.Matches."""
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op in ("=", "==", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present or not _INTEGER.match(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if self.op == "gt" else int(value) < bound


@dataclass(frozen=True)
class Selector:
    """A parsed selector; empty means "everything"."""

    requirements: tuple[Requirement, ...] = ()

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


EVERYTHING = Selector()


# --- parsing ---------------------------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _WHITESPACE:
            i += 1
        elif ch in _SPECIAL:
            two = text[i : i + 2]
            if two in ("==", "!="):
                out.append(two)
                i += 2
            else:
                out.append(ch)
                i += 1
        else:
            j = i
            while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _is_ident(tok: str | None) -> bool:
    return tok is not None and tok[0] not in _SPECIAL


def _shown(tok: str | None) -> str:
    return "end of string" if tok is None else tok


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise SelectorError(f"invalid label key {key!r}: prefix must be a DNS subdomain")
    if len(name) > 63 or not _NAME.match(name):
        raise SelectorError(
            f"invalid label key {key!r}: name must be 63 characters or less, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )


def _check_value(key: str, value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(
            f"invalid label value {value!r} for key {key!r}: must be 63 characters or less, empty or "
            "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric character"
        )


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str | None:
        tok = self.peek()
        self.pos += 1
        return tok

    def requirement(self) -> Requirement:
        negated = self.peek() == "!"
        if negated:
            self.take()
        key = self.take()
        if not _is_ident(key) or key in ("in", "notin"):
            raise SelectorError(f"found {_shown(key)!r}, expected: identifier")
        assert key is not None
        _check_key(key)
        if negated:
            return Requirement(key, "!")
        if self.peek() in (None, ","):
            return Requirement(key, "exists")
        op_tok = self.take()
        ops: dict[str | None, Op] = {
            "=": "=",
            "==": "==",
            "!=": "!=",
            "in": "in",
            "notin": "notin",
            ">": "gt",
            "<": "lt",
        }
        if op_tok not in ops:
            raise SelectorError(f"found {_shown(op_tok)!r}, expected: one of =, ==, !=, in, notin, >, <")
        op = ops[op_tok]
        values = self.value_set() if op in ("in", "notin") else (self.exact_value(),)
        for value in values:
            _check_value(key, value)
        if op in ("gt", "lt") and not _INTEGER.match(values[0]):
            raise SelectorError(f"for {op_tok!r} operator, the value of {key!r} must be an integer")
        return Requirement(key, op, tuple(sorted(set(values))))

    def exact_value(self) -> str:
        if self.peek() in (None, ","):
            return ""
        tok = self.take()
        if not _is_ident(tok):
            raise SelectorError(f"found {_shown(tok)!r}, expected: identifier (a label value)")
        assert tok is not None
        return tok

    def value_set(self) -> tuple[str, ...]:
        if (tok := self.take()) != "(":
            raise SelectorError(f"found {_shown(tok)!r}, expected: '('")
        values: list[str] = []
        expect_value = True
        while True:
            tok = self.take()
            if tok == ")":
                if expect_value and values:
                    values.append("")  # "(a,)" carries an empty value, as apimachinery reads it
                break
            if tok == ",":
                if expect_value:
                    values.append("")
                expect_value = True
            elif _is_ident(tok) and expect_value:
                assert tok is not None
                values.append(tok)
                expect_value = False
            else:
                raise SelectorError(f"found {_shown(tok)!r}, expected: ',', ')' or a label value")
        if not values:
            raise SelectorError("for 'in', 'notin' operators, values set can't be empty")
        return tuple(values)


def parse(text: str) -> Selector:
    """Parse a selector string as apimachinery's labels.Parse does; raise SelectorError naming the problem."""
    parser = _Parser(text)
    reqs: list[Requirement] = []
    if parser.peek() is None:
        return EVERYTHING
    while True:
        try:
            reqs.append(parser.requirement())
        except SelectorError as exc:
            raise SelectorError(f"invalid selector {text!r}: {exc}") from None
        tok = parser.take()
        if tok is None:
            break
        if tok != ",":
            raise SelectorError(f"invalid selector {text!r}: found {tok!r}, expected: ',' or end of string")
    return Selector(tuple(sorted(reqs)))


# --- conversions -----------------------------------------------------------------------------------------


def promql_matchers(selector: Selector) -> list[str]:
    """PromQL label matchers equivalent to `selector` (prometheus-adapter's table, with literal values).

    Raises SelectorError for what Prometheus cannot express exactly: `>`/`<`, and keys that are not
    Prometheus label names (e.g. `app.kubernetes.io/name`).
    """
    out: list[str] = []
    for req in selector.requirements:
        try:
            promql.check_label_name(req.key)
        except promql.InvalidLabelName as exc:
            raise SelectorError(f"metric label selector key {exc}") from None
        if req.op in ("=", "=="):
            out.append(promql.label_matcher(req.key, "=", req.values[0]))
        elif req.op == "!=":
            out.append(promql.label_matcher(req.key, "!=", req.values[0]))
        elif req.op == "in":
            out.append(promql.label_matcher(req.key, "=~", promql.literal_alternation(req.values)))
        elif req.op == "notin":
            out.append(promql.label_matcher(req.key, "!~", promql.literal_alternation(req.values)))
        elif req.op == "exists":
            out.append(promql.label_matcher(req.key, "!=", ""))
        elif req.op == "!":
            out.append(promql.label_matcher(req.key, "=", ""))
        else:
            raise SelectorError(f"operator in {str(req)!r} is not supported by Prometheus label matchers")
    return out


def values_by_label(selector: Selector) -> dict[str, str]:
    """`LabelValuesByName` for a metric selector: label -> values joined by `|` (prometheus-adapter)."""
    return {req.key: "|".join(req.values) for req in selector.requirements}


def to_label_selector(selector: Selector) -> LabelSelector | None:
    """metav1.LabelSelector for a MetricValue's `selector` (ParseToLabelSelector); None if empty."""
    if not selector:
        return None
    match_labels: dict[str, str] = {}
    exprs: list[LabelSelectorRequirement] = []
    for req in selector.requirements:
        if req.op in ("=", "=="):
            match_labels[req.key] = req.values[0]
        elif req.op in ("in", "notin", "!="):
            operator: Literal["In", "NotIn"] = "In" if req.op == "in" else "NotIn"
            exprs.append({"key": req.key, "operator": operator, "values": list(req.values)})
        elif req.op == "exists":
            exprs.append({"key": req.key, "operator": "Exists"})
        elif req.op == "!":
            exprs.append({"key": req.key, "operator": "DoesNotExist"})
        else:
            raise SelectorError(f"{str(req)!r} cannot be expressed as a LabelSelector")
    doc: LabelSelector = {}
    if match_labels:
        doc["matchLabels"] = match_labels
    if exprs:
        doc["matchExpressions"] = exprs
    return doc
