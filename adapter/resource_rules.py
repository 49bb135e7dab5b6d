"""prometheus-adapter's `resourceRules`, compiled: the PromQL of metrics.k8s.io and how to read its answer.

Why a stage of its own: `kubectl top` and HPA Resource metrics are served from two rules (cpu, memory), each
with a container query and a node query, rendered with prometheus-adapter's template arguments
(`LabelMatchers`: namespace matcher then object matcher; `GroupBy`: `pod,<containerLabel>` or the node label)
so kube-prometheus's config renders the text prometheus-adapter sends (`render_like_upstream`). The
adapter itself asks differently (`Scope`): never a regex of pod names, but every object at once — one
query for all pods of the cluster, grouped by `<namespace>,<pod>,<container>`, whoever asked — and reads
the namespace back from the result. Every value that reaches a query is quoted and regex-escaped by
`adapter.promql`; in the adapter's own scopes only `!=""` matchers and validated namespaces appear.

Honest timing: a second, small query per rule reads the newest raw sample time of each object from the
series the template matches (`timestamp()` of each `name{...<<.LabelMatchers>>...}` selector), so
`timestamp` says how old the data is rather than when the query ran; `window` is the longest rate range of
the query (the interval the value can cover), not the configured constant.

Label mapping: when two labels of a rule map to one resource, the first one listed in `overrides` is used
(prometheus-adapter iterates a Go map and picks one at random: prometheus-adapter#398).
Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from adapter import compact, promql, resources
from adapter.gotemplate import Template, TemplateError, Value
from adapter.naming import (
    ResourceConverter,
    RuleError,
    compile_label_template,
    compile_query_template,
    parse_duration,
    rate_window_seconds,
)
from adapter.resources import NAMESPACES, NODES, PODS

if TYPE_CHECKING:
    from gpuwarden.config.metric_rules import ResourceRule, ResourceRules

Kind = Literal["pods", "nodes"]
ObjectKey = tuple[str, str]
"""(namespace, name); namespace is "" for nodes."""

ALL_NAMESPACES = "*"
PAUSE_CONTAINER = "POD"
_MAPPED = ((NAMESPACES, "namespace"), (PODS, "pod"), (NODES, "node"))
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*<<-?\s*\.LabelMatchers\s*-?>>[^{}]*)\}")


@dataclass(frozen=True)
class CompiledResourceRule:
    """One of `cpu` / `memory`, ready to render."""

    name: Literal["cpu", "memory"]
    container_query: Template
    node_query: Template
    container_stamps: tuple[Template, ...]
    node_stamps: tuple[Template, ...]
    namespace_label: str
    pod_label: str
    node_label: str
    container_label: str
    container_window: int | None
    node_window: int | None

    @property
    def batchable(self) -> bool:
        """Whether one query can answer every namespace: the container query groups by `<<.GroupBy>>`."""
        return self.container_query.mentions("GroupBy") or self.container_query.mentions("GroupBySlice")


@dataclass(frozen=True)
class CompiledResourceRules:
    cpu: CompiledResourceRule
    memory: CompiledResourceRule
    window_fallback: int

    def window(self, kind: Kind) -> int:
        """Seconds reported as `window`: the longest rate range of either query, else the configured one."""
        found = [
            w
            for rule in (self.cpu, self.memory)
            if (w := rule.container_window if kind == "pods" else rule.node_window) is not None
        ]
        return max(found) if found else self.window_fallback


@dataclass(frozen=True)
class Scope:
    """What one query covers: every node, every pod (`namespace` "*"), or the pods of one namespace."""

    kind: Kind
    namespace: str = ""

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}" if self.namespace else self.kind


@dataclass
class Usage:
    """One rule's answer for one scope: usage per object and container (nodes: container ""), and the
    newest raw sample time per object (the query's evaluation time where none could be read)."""

    values: dict[ObjectKey, dict[str, float]] = field(default_factory=dict)
    times: dict[ObjectKey, float] = field(default_factory=dict)


def _stamp_templates(source: str, where: str) -> tuple[Template, ...]:
    out = []
    for name, body in _SELECTOR.findall(source):
        try:
            out.append(compile_query_template(f"{name}{{{body}}}"))
        except TemplateError as exc:  # pragma: no cover - the whole query compiled already
            raise RuleError(f"{where}: {exc}") from None
    return tuple(out)


def _unmapped(missing: list[str]) -> str:
    return f"no label maps to {', '.join(missing)}; add overrides such as " + ", ".join(
        f"{m}: {{resource: {m}}}" for m in missing
    )


def _compile_one(key: Literal["cpu", "memory"], rule: ResourceRule) -> CompiledResourceRule:
    where = f"resourceRules.{key}"
    try:
        template = extractor = None
        if rule.resources.template:
            template, extractor = compile_label_template(rule.resources.template)
        container = compile_query_template(rule.container_query)
        node = compile_query_template(rule.node_query)
    except TemplateError as exc:
        raise RuleError(f"{where}: {exc}") from None
    overrides = {
        label: resources.normalize(gr.resource, gr.group) for label, gr in rule.resources.overrides.items()
    }
    converter = ResourceConverter(overrides, template, extractor)
    labels: dict[str, str] = {}
    missing = []
    for gr, what in _MAPPED:
        label = converter.label_for(gr)
        if label is None or not promql.LABEL_NAME.match(label):
            missing.append(what)
        else:
            labels[what] = label
    if missing:
        raise RuleError(f"{where}.resources: {_unmapped(missing)}")
    assert rule.container_label is not None  # required by the config model
    return CompiledResourceRule(
        name=key,
        container_query=container,
        node_query=node,
        container_stamps=_stamp_templates(rule.container_query, where),
        node_stamps=_stamp_templates(rule.node_query, where),
        namespace_label=labels["namespace"],
        pod_label=labels["pod"],
        node_label=labels["node"],
        container_label=rule.container_label,
        container_window=rate_window_seconds(rule.container_query),
        node_window=rate_window_seconds(rule.node_query),
    )


def compile_resource_rules(rules: ResourceRules) -> CompiledResourceRules:
    """Compile both rules; every problem at once in one RuleError."""
    compiled: dict[str, CompiledResourceRule] = {}
    problems: list[str] = []
    for key in ("cpu", "memory"):
        rule = getattr(rules, key)
        assert rule is not None  # required by the config model
        try:
            compiled[key] = _compile_one(key, rule)
        except RuleError as exc:
            problems.append(str(exc))
    if problems:
        raise RuleError("; ".join(problems))
    window = parse_duration(rules.window) if rules.window else None
    return CompiledResourceRules(compiled["cpu"], compiled["memory"], int(window or 0))


def resource_rule_problems(section: Mapping[str, object]) -> list[tuple[tuple[str, ...], str]]:
    """(path within `resourceRules`, reason) for `check-config`: templates that do not compile and
    resources no label maps to, on the raw mapping (values of the wrong type are left to the models)."""
    problems: list[tuple[tuple[str, ...], str]] = []
    for key in ("cpu", "memory"):
        rule = section.get(key)
        if not isinstance(rule, Mapping):
            continue
        for query in ("containerQuery", "nodeQuery"):
            source = rule.get(query)
            if isinstance(source, str):
                try:
                    compile_query_template(source)
                except TemplateError as exc:
                    problems.append(((key, query), exc.reason))
        mapping = rule.get("resources")
        source = mapping.get("template") if isinstance(mapping, Mapping) else None
        if isinstance(source, str):
            try:
                compile_label_template(source)
            except TemplateError as exc:
                problems.append(((key, "resources", "template"), exc.reason))
                continue
        from gpuwarden.config.metric_rules import ResourceRule  # check-config only: pydantic

        try:
            parsed = ResourceRule.model_validate(rule)
        except ValueError:
            continue  # the config models report it
        template = compile_label_template(parsed.resources.template)[0] if parsed.resources.template else None
        overrides = {
            label: resources.normalize(gr.resource, gr.group)
            for label, gr in parsed.resources.overrides.items()
        }
        converter = ResourceConverter(overrides, template, None)
        missing = [what for gr, what in _MAPPED if not promql.LABEL_NAME.match(converter.label_for(gr) or "")]
        if missing:
            problems.append(((key, "resources"), _unmapped(missing)))
    return problems


# --- rendering ----------------------------------------------------------------------------------------------


def _args(matchers: list[str], values: dict[str, str], group_by: list[str]) -> dict[str, Value]:
    return {
        "Series": "",
        "LabelMatchers": ",".join(matchers),
        "LabelValuesByName": values,
        "GroupBy": ",".join(group_by),
        "GroupBySlice": group_by,
    }


def scope_args(rule: CompiledResourceRule, scope: Scope) -> tuple[dict[str, Value], list[str]]:
    """Template arguments for the adapter's own query of `scope`, and the labels identifying an object."""
    if scope.kind == "nodes":
        label = rule.node_label
        return _args([promql.label_matcher(label, "!=", "")], {label: ".+"}, [label]), [label]
    ns, pod = rule.namespace_label, rule.pod_label
    if scope.namespace == ALL_NAMESPACES:
        matchers = [promql.label_matcher(ns, "!=", ""), promql.label_matcher(pod, "!=", "")]
        group = [ns, pod, rule.container_label]
        return _args(matchers, {ns: ".+", pod: ".+"}, group), [ns, pod]
    matchers = [promql.label_matcher(ns, "=", scope.namespace), promql.label_matcher(pod, "!=", "")]
    group = [pod, rule.container_label]
    return _args(matchers, {ns: scope.namespace, pod: ".+"}, group), [pod]


def _render(template: Template, args: Mapping[str, Value], where: str) -> str:
    text = template.render(args)
    if not text.strip():
        raise RuleError(f"{where}: empty query produced by metrics query template")
    return text


def scope_queries(rule: CompiledResourceRule, scope: Scope) -> tuple[str, str | None]:
    """(value query, timestamp query or None) for `scope`."""
    args, keys = scope_args(rule, scope)
    pods = scope.kind == "pods"
    value = _render(rule.container_query if pods else rule.node_query, args, f"resourceRules.{rule.name}")
    stamps = rule.container_stamps if pods else rule.node_stamps
    by = ",".join(keys)
    parts = [f"min by ({by}) (timestamp({s.render(args)}))" for s in stamps]
    return value, " or ".join(parts) or None


def render_like_upstream(rule: CompiledResourceRule, kind: Kind, namespace: str, names: Sequence[str]) -> str:
    """The query prometheus-adapter v0.12 sends for `names` (pods of `namespace`, or nodes): `=` for one
    name, an alternation for several (ours regex-escaped: identical for names without metacharacters)."""
    if not names:
        raise RuleError("no names to query")
    matchers: list[str] = []
    values: dict[str, str] = {}
    if kind == "pods":
        matchers.append(promql.label_matcher(rule.namespace_label, "=", namespace))
        values[rule.namespace_label] = namespace
        label, group = rule.pod_label, [rule.pod_label, rule.container_label]
    else:
        label, group = rule.node_label, [rule.node_label]
    matchers.append(promql.names_matcher(label, list(names)))
    values[label] = "|".join(names)
    template = rule.container_query if kind == "pods" else rule.node_query
    return _render(template, _args(matchers, values, group), f"resourceRules.{rule.name}")


# --- reading answers ---------------------------------------------------------------------------------------

Sampled = Sequence[tuple[Mapping[str, str], float, float]]
"""(labels, value, timestamp) per result sample."""


def _key(rule: CompiledResourceRule, scope: Scope, labels: Mapping[str, str]) -> ObjectKey | None:
    if scope.kind == "nodes":
        name = labels.get(rule.node_label, "")
        return ("", compact.name(name)) if name else None
    namespace = labels.get(rule.namespace_label, "") if scope.namespace == ALL_NAMESPACES else scope.namespace
    name = labels.get(rule.pod_label, "")
    return (compact.name(namespace), compact.name(name)) if namespace and name else None


def read_usage(rule: CompiledResourceRule, scope: Scope, values: Sampled, stamps: Sampled) -> Usage:
    """Usage from the value and timestamp answers of `scope_queries`.

    Series without the object's labels, containers named "" (pod-level cgroups) or `POD` (the pause
    container; not a valid container name) are dropped; NaN and ±Inf are no data; a negative value (an
    irate across a counter reset) is 0, as prometheus-adapter clamps it. The first sample of a key wins.
    """
    usage = Usage()
    shared = compact.Stamps()
    for labels, value, ts in values:
        key = _key(rule, scope, labels)
        if key is None or not math.isfinite(value):
            continue
        container = ""
        if scope.kind == "pods":
            container = labels.get(rule.container_label, "")
            if container in ("", PAUSE_CONTAINER):
                continue
        per_object = usage.values.setdefault(key, {})
        if container not in per_object:
            per_object[compact.name(container)] = max(value, 0.0)
            stamp = shared.shared(ts)
            usage.times[key] = min(usage.times.get(key, stamp), stamp)
    for labels, value, _ in stamps:
        key = _key(rule, scope, labels)
        if key in usage.values and math.isfinite(value):
            usage.times[key] = min(value, usage.times[key])
    return usage
