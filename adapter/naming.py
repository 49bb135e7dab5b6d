"""prometheus-adapter discovery rules, compiled: series filters, metric names, label ↔ resource mapping.

Why: a rule from the config (`gpuwarden.config.metric_rules.DiscoveryRule`, prometheus-adapter's format,
already validated) is turned once, at start-up, into a `CompiledRule` whose methods answer the questions of
the later stages — does this series belong to the rule, what metric name does it get, which Kubernetes
resources do its labels describe, which label holds a given resource's name — with prometheus-adapter's
semantics (Go `regexp.Expand` for `as`, `<<.Group>>_<<.Resource>>` label templates, overrides first, the
implicit `is` filter from `name.matches`, `namespaced` only for external rules). Query text is built in
`adapter.queries`; series discovery in `adapter.registry`. Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapter import resources
from adapter.gotemplate import Template, TemplateError, compile_template
from adapter.resources import GroupResource
from gpuwarden.config.templatefields import QUERY_TEMPLATE_FIELDS, RESOURCE_TEMPLATE_FIELDS

if TYPE_CHECKING:
    from gpuwarden.config.metric_rules import DiscoveryRule

_EXPAND = re.compile(r"\$(?:\{(\w+)\}|(\w+)|(\$))")
_RATE_RANGE = re.compile(r"\b(?:rate|irate|increase|delta|idelta|deriv)\s*\([^()]*?\[([0-9smhdwy]+)\]")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class RuleError(ValueError):
    """A rule that cannot be compiled; the message names the rule and the field."""


def sanitize_group(group: str) -> str:
    """prometheus-adapter's GroupNameSanitizer: `.` and `-` become `_` (so `apps` stays `apps`)."""
    return group.replace(".", "_").replace("-", "_")


def go_expand(template: str, match: re.Match[str]) -> str:
    """Go's `regexp.Expand`: `$1`, `${1}`, `$name`, `${name}`, `$$`; unknown groups expand to nothing."""

    def one(m: re.Match[str]) -> str:
        if m.group(3):
            return "$"
        ref = m.group(1) or m.group(2)
        try:
            value = match.group(int(ref)) if ref.isdigit() else match.group(ref)
        except IndexError:  # unknown group number or name
            return ""
        return value or ""

    return _EXPAND.sub(one, template)


def parse_duration(text: str) -> float | None:
    """Prometheus duration (`90s`, `1m30s`, `2h`) in seconds; None if it is not one."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def rate_window_seconds(metrics_query: str) -> int | None:
    """The `windowSeconds` to report: the longest range inside rate-like functions, None for gauges."""
    windows = [parse_duration(d) for d in _RATE_RANGE.findall(metrics_query)]
    found = [w for w in windows if w]
    return int(max(found)) if found else None


@dataclass(frozen=True)
class ResourceConverter:
    """Label ↔ group-resource mapping of one rule: overrides first, then the label template."""

    overrides: dict[str, GroupResource]
    template: Template | None
    extractor: re.Pattern[str] | None
    _by_resource: dict[GroupResource, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for label, gr in self.overrides.items():
            self._by_resource.setdefault(gr, label)

    def resource_for_label(self, label: str) -> GroupResource | None:
        """The group-resource a series label names, or None (most labels name none)."""
        if label in self.overrides:
            return self.overrides[label]
        if self.extractor is None:
            return None
        m = self.extractor.match(label)
        if not m:
            return None
        groups = m.groupdict()
        group = groups.get("group") or ""
        kind = resources.lookup(groups["resource"])
        if kind is None or (group and sanitize_group(kind.group) != group):
            return None  # as prometheus-adapter skips labels its RESTMapper cannot resolve
        return kind.group_resource

    def resources_for(self, labels: Iterable[str]) -> tuple[list[GroupResource], bool]:
        """(resources named by the labels, whether one of them is `namespaces`), in label order."""
        found: list[GroupResource] = []
        for label in sorted(labels):
            gr = self.resource_for_label(label)
            if gr is not None and gr not in found:
                found.append(gr)
        return found, resources.NAMESPACES in found

    def label_for(self, gr: GroupResource) -> str | None:
        """The label holding `gr`'s object names, or None if this rule cannot say."""
        if gr in self._by_resource:
            return self._by_resource[gr]
        if self.template is None:
            return None
        label = self.template.render({"Group": sanitize_group(gr.group), "Resource": resources.singular(gr)})
        return label or None


@dataclass(frozen=True)
class CompiledRule:
    """One rule, ready for discovery and query building."""

    index: int
    external: bool
    series_query: str
    filters: tuple[tuple[re.Pattern[str], bool], ...]
    name_pattern: re.Pattern[str]
    name_as: str
    resources: ResourceConverter
    query: Template
    namespaced: bool
    window_seconds: int | None

    @property
    def where(self) -> str:
        return f"{'externalRules' if self.external else 'rules'}[{self.index}]"

    def accepts(self, series_name: str) -> bool:
        """All `seriesFilters` (and the implicit `is` of `name.matches`) agree."""
        return all(bool(rx.search(series_name)) == positive for rx, positive in self.filters)

    def metric_name(self, series_name: str) -> str | None:
        """The metric name served for `series_name`, or None if `name.matches` does not match it."""
        m = self.name_pattern.search(series_name)
        return go_expand(self.name_as, m) if m else None


def _extractor(template: Template) -> re.Pattern[str]:
    parts: list[str] = []
    for node in template.nodes:
        if isinstance(node, str):
            parts.append(re.escape(node))
        elif getattr(node, "path", None) == ("Group",):
            parts.append("(?P<group>.+?)" if "(?P<group>" not in "".join(parts) else ".+?")
        elif getattr(node, "path", None) == ("Resource",):
            parts.append("(?P<resource>.+?)" if "(?P<resource>" not in "".join(parts) else ".+?")
        else:
            raise TemplateError(template.source, "a label template may only use <<.Group>> and <<.Resource>>")
    return re.compile("^" + "".join(parts) + "$")


def compile_query_template(source: str) -> Template:
    """A `metricsQuery` as the adapter runs it; raise TemplateError naming the problem."""
    return compile_template(source, frozenset(QUERY_TEMPLATE_FIELDS))


def compile_label_template(source: str) -> tuple[Template, re.Pattern[str]]:
    """A `resources.template` and the regex that reads group and resource back out of a label name."""
    template = compile_template(source, frozenset(RESOURCE_TEMPLATE_FIELDS))
    return template, _extractor(template)


def template_problems(rule: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(key path within the rule, reason) for each template of a raw, not yet validated, rule mapping that
    `compile_rule` would reject; values that are not strings are left to the config models."""
    problems: list[tuple[tuple[str, ...], str]] = []
    for key in ("metricsQuery", "metrics_query"):
        source = rule.get(key)
        if isinstance(source, str):
            try:
                compile_query_template(source)
            except TemplateError as exc:
                problems.append(((key,), exc.reason))
    mapping = rule.get("resources")
    source = mapping.get("template") if isinstance(mapping, Mapping) else None
    if isinstance(source, str):
        try:
            compile_label_template(source)
        except TemplateError as exc:
            problems.append((("resources", "template"), exc.reason))
    return problems


def compile_rule(rule: DiscoveryRule, index: int, *, external: bool) -> CompiledRule:
    """Compile one config rule; raise RuleError naming the rule and field."""
    where = f"{'externalRules' if external else 'rules'}[{index}]"
    try:
        template = extractor = None
        if rule.resources.template:
            template, extractor = compile_label_template(rule.resources.template)
        query = compile_query_template(rule.metrics_query)
    except TemplateError as exc:
        raise RuleError(f"{where}: {exc}") from None
    overrides = {
        label: resources.normalize(gr.resource, gr.group) for label, gr in rule.resources.overrides.items()
    }
    filters = [(re.compile(f.is_ or f.is_not or ""), f.is_ is not None) for f in rule.series_filters]
    matches = rule.name.matches or ".*"
    pattern = re.compile(matches)
    if rule.name.matches:
        filters.append((pattern, True))
    name_as = rule.name.as_ or ("$0" if pattern.groups == 0 else "$1")
    if pattern.groups > 1 and not rule.name.as_:
        raise RuleError(f"{where}.name.as: required, {matches!r} has {pattern.groups} capture groups")
    return CompiledRule(
        index=index,
        external=external,
        series_query=rule.series_query,
        filters=tuple(filters),
        name_pattern=pattern,
        name_as=name_as,
        resources=ResourceConverter(overrides, template, extractor),
        query=query,
        namespaced=rule.resources.namespaced is not False,
        window_seconds=rate_window_seconds(rule.metrics_query),
    )


def compile_rules(rules: list[DiscoveryRule], *, external: bool) -> list[CompiledRule]:
    """Compile every rule; all problems are reported at once in one RuleError."""
    compiled: list[CompiledRule] = []
    problems: list[str] = []
    for i, rule in enumerate(rules):
        try:
            compiled.append(compile_rule(rule, i, external=external))
        except RuleError as exc:
            problems.append(str(exc))
    if problems:
        raise RuleError("; ".join(problems))
    return compiled
