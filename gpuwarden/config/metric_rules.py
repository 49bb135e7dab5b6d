"""prometheus-adapter's metric discovery rules (`rules`, `externalRules`, `resourceRules`), byte-compatible.

Why: a drop-in replacement must load a prometheus-adapter config file unchanged, so the key names are
prometheus-adapter's own camelCase ones (`seriesQuery`, `seriesFilters`, `isNot`, `metricsQuery`, ...) and
unknown keys are rejected exactly as its `yaml.UnmarshalStrict` does. The checks prometheus-adapter only makes
at start-up or per request (filter shape, `as` with several capture groups, templates that cannot render) are
made here, at load time, with the field named. Rendering and series matching live in `adapter/`, not here.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from gpuwarden.config.base import Section
from gpuwarden.config.fieldtypes import FieldError, LabelName, Regex
from gpuwarden.config.templatefields import QUERY_TEMPLATE_FIELDS, RESOURCE_TEMPLATE_FIELDS

_ACTION = re.compile(r"<<(.*?)>>", re.DOTALL)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
_FIELD_REF = re.compile(r"(?<![\w$)\]])\.([A-Za-z_]\w*)")
_EXPAND_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+)|\$)")


def check_template(template: str, known: tuple[str, ...]) -> list[str]:
    """Problems with a `<< >>`-delimited Go template: unbalanced delimiters or unknown `.Field` references."""
    problems: list[str] = []
    stripped = _ACTION.sub("", template)
    if "<<" in stripped or ">>" in stripped:
        problems.append("unbalanced '<<' / '>>' template delimiters")
    for action in _ACTION.findall(template):
        for name in _FIELD_REF.findall(_QUOTED.sub('""', action)):
            if name not in known:
                fields = ", ".join(f"<<.{k}>>" for k in known)
                problems.append(f"unknown template field .{name}; available: {fields}")
    return problems


class RegexFilter(Section):
    """One series filter: exactly one of `is` (keep matching series) or `isNot` (drop them)."""

    is_: Regex | None = Field(default=None, alias="is", description="Keep only series whose name matches.")
    is_not: Regex | None = Field(default=None, alias="isNot", description="Drop series whose name matches.")

    @model_validator(mode="after")
    def _exactly_one(self) -> RegexFilter:
        if self.is_ is not None and self.is_not is not None:
            raise ValueError(
                f"cannot have both an `is` ({self.is_!r}) and `isNot` ({self.is_not!r}) expression in a "
                "single filter; split it into two filters"
            )
        if self.is_ is None and self.is_not is None:
            raise ValueError("must have either an `is` or `isNot` expression in a filter")
        return self


class GroupResource(Section):
    """A Kubernetes group-resource a series label maps to, e.g. {group: apps, resource: deployment}."""

    group: str = Field(
        default="", description="API group; empty for the core group (pods, nodes, namespaces)."
    )
    resource: str = Field(
        min_length=1, description="Resource, singular or plural (`pod` and `pods` both work), lower case."
    )


class ResourceMapping(Section):
    """How series labels map to Kubernetes objects."""

    template: str | None = Field(
        default=None,
        description="Go template (delimiters << >>) turning a group-resource into a label name, e.g. "
        "`kube_<<.Group>>_<<.Resource>>`; must use <<.Resource>>.",
    )
    overrides: dict[LabelName, GroupResource] = Field(
        default_factory=dict,
        description="Explicit label → group-resource mappings, e.g. {namespace: {resource: namespace}, "
        "pod: {resource: pod}}.",
    )
    namespaced: bool | None = Field(
        default=None,
        description="externalRules only: false stops the adapter from adding a namespace matcher. "
        "null: true, as in prometheus-adapter.",
    )

    @field_validator("template")
    @classmethod
    def _template_renders(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problems = check_template(value, RESOURCE_TEMPLATE_FIELDS)
        if not re.search(r"<<-?\s*\.Resource\s*-?>>", value):
            problems.append("must include at least `<<.Resource>>` in the label template")
        if problems:
            raise ValueError("; ".join(problems))
        return value


class NameMapping(Section):
    """How a series name becomes the metric name served to HPAs."""

    matches: Regex = Field(
        default=".*",
        description="Regex applied to the series name; it also acts as an implicit `is` filter. An empty "
        "string means `.*`, as in prometheus-adapter.",
    )
    as_: str = Field(
        default="",
        alias="as",
        description="Replacement (Go `regexp.Expand` syntax: `$1`, `${1}_per_second`, `${name}`). Empty: "
        "`$0` when `matches` has no capture group, `$1` when it has one; required with more.",
    )

    @model_validator(mode="after")
    def _as_is_expandable(self) -> NameMapping:
        pattern = re.compile(self.matches or ".*")
        if not self.as_:
            if pattern.groups > 1:
                raise FieldError(
                    "as",
                    f"must specify an 'as' value for name matcher {self.matches!r}: it has "
                    f"{pattern.groups} capture groups; e.g. as: '${{1}}'",
                )
            return self
        for braced, bare in _EXPAND_REF.findall(self.as_):
            ref = braced or bare
            if not ref:
                continue  # `$$`, a literal dollar
            if ref.isdigit():
                if int(ref) > pattern.groups:
                    raise FieldError(
                        "as",
                        f"refers to ${ref} but {self.matches!r} has only {pattern.groups} capture groups",
                    )
            elif ref not in pattern.groupindex:
                hint = f"; write ${{{ref[0]}}}{ref[1:]}" if bare and ref[0].isdigit() else ""
                raise FieldError(
                    "as", f"refers to group {ref!r}, which {self.matches!r} does not define{hint}"
                )
        return self


class DiscoveryRule(Section):
    """One prometheus-adapter discovery rule: find series, name them, map them to objects, query them."""

    series_query: str = Field(
        alias="seriesQuery",
        min_length=1,
        description="Series selector sent as `match[]` to /api/v1/series on every relist, e.g. "
        '`DCGM_FI_DEV_GPU_UTIL{pod!=""}`.',
    )
    series_filters: list[RegexFilter] = Field(
        default_factory=list,
        alias="seriesFilters",
        description="Further filters on the discovered series names; all must match.",
    )
    resources: ResourceMapping = Field(
        default_factory=ResourceMapping, description="Label → Kubernetes resource mapping."
    )
    name: NameMapping = Field(default_factory=NameMapping, description="Series name → metric name.")
    metrics_query: str = Field(
        alias="metricsQuery",
        min_length=1,
        description="Go template (delimiters << >>) of the PromQL that computes the values, e.g. "
        "`sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)`.",
    )

    @field_validator("metrics_query")
    @classmethod
    def _query_renders(cls, value: str) -> str:
        problems = check_template(value, QUERY_TEMPLATE_FIELDS)
        if problems:
            raise ValueError("; ".join(problems))
        return value


class ResourceRule(Section):
    """prometheus-adapter's metrics.k8s.io rule for cpu or memory: one query per container, one per node."""

    container_query: str = Field(
        default="",
        alias="containerQuery",
        description="Go template (delimiters << >>) of the PromQL giving usage per container: cores for cpu, "
        "bytes for memory. `<<.GroupBy>>` is the pod label and `containerLabel` (the namespace label "
        "first when all namespaces are asked at once), `<<.LabelMatchers>>` restricts to the pods asked.",
    )
    node_query: str = Field(
        default="",
        alias="nodeQuery",
        description="Go template of the PromQL giving usage per node; `<<.GroupBy>>` is the node label.",
    )
    resources: ResourceMapping = Field(
        default_factory=ResourceMapping,
        description="Which labels hold namespace, pod and node names (`overrides`, else `template`); "
        "`namespaced` is accepted and ignored, as prometheus-adapter does here. When two labels map to "
        "one resource, the first one listed is used (prometheus-adapter picks one at random).",
    )
    container_label: LabelName | None = Field(
        default=None,
        alias="containerLabel",
        description="Label holding the container name in containerQuery's result. Series without it (or "
        'with `""` or the pause container `POD`) are not containers and are dropped.',
    )

    @field_validator("container_query", "node_query")
    @classmethod
    def _query_renders(cls, value: str) -> str:
        problems = check_template(value, QUERY_TEMPLATE_FIELDS)
        if problems:
            raise ValueError("; ".join(problems))
        return value


class ResourceRules(Section):
    """prometheus-adapter's `resourceRules`: serve metrics.k8s.io (`kubectl top`, HPA Resource metrics)."""

    cpu: ResourceRule | None = Field(default=None, description="CPU usage rule (cores).")
    memory: ResourceRule | None = Field(default=None, description="Memory usage rule (working-set bytes).")
    window: str = Field(
        default="",
        description="prometheus-adapter reports this constant as every item's `window`. gpuwarden reports "
        "the range of the queries' rate()/irate() instead (the interval the value really covers) and uses "
        "this only when neither query has one (e.g. a recording rule). A Prometheus duration: `5m`, `120s`.",
    )

    @field_validator("window")
    @classmethod
    def _duration(cls, value: str) -> str:
        if value and not _is_duration(value):
            raise ValueError(f"{value!r} is not a Prometheus duration such as 5m, 120s or 1h30m")
        return value

    @model_validator(mode="after")
    def _both_resources(self) -> ResourceRules:
        for key in ("cpu", "memory"):
            rule = getattr(self, key)
            if rule is None:
                raise FieldError(key, "required: metrics.k8s.io serves cpu and memory together")
            if not rule.container_query.strip():
                raise FieldError(f"{key}.containerQuery", "required: the query for pods' containers")
            if not rule.node_query.strip():
                raise FieldError(f"{key}.nodeQuery", "required: the query for nodes")
            if rule.container_label is None:
                raise FieldError(
                    f"{key}.containerLabel", "required: the label naming containers, usually `container`"
                )
        return self


_DURATION = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?\Z")


def _is_duration(text: str) -> bool:
    return bool(_DURATION.match(text)) and text != "" and any(ch.isdigit() for ch in text)


class PrometheusAdapterRules(Section):
    """Exactly the shape of a prometheus-adapter `--config` file; also the rule part of `adapter:`."""

    rules: list[DiscoveryRule] = Field(
        default_factory=list,
        description="prometheus-adapter `rules`: metrics served under custom.metrics.k8s.io (pods, "
        "namespaces, nodes, any namespaced object), discovered from series on every relist.",
    )
    external_rules: list[DiscoveryRule] = Field(
        default_factory=list,
        alias="externalRules",
        description="prometheus-adapter `externalRules`: metrics served under external.metrics.k8s.io.",
    )
    resource_rules: ResourceRules | None = Field(
        default=None,
        alias="resourceRules",
        description="prometheus-adapter `resourceRules`: when set, the adapter also serves metrics.k8s.io "
        "(`kubectl top`, HPA cpu/memory targets) from these queries, in place of metrics-server.",
    )
