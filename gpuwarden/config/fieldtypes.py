"""Field types shared by every config section: durations, counts, ports, Prometheus and Kubernetes names.

Why: the same rules ("a duration is a positive number of seconds", "a count is an integer, not `true`", "a
label name matches Prometheus' grammar") must read the same in every section and produce the same error
message, so they live here once. Only types and their validators; no section models, no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# A Kubernetes qualified name (label / annotation key, extended resource name): optional DNS prefix + name.
QUALIFIED_NAME_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z"
)
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
LABEL_MATCHERS_RE = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*,?)?\s*$")


class FieldError(ValueError):
    """A cross-field check failed; `field` names the key to blame (relative to the model that raised it).

    Pydantic reports a model validator's error at the model itself; the loader appends `field` so the user
    is pointed at `kubernetes.burst`, not just `kubernetes`.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _no_bool(value: Any) -> Any:
    """Pydantic's lax mode reads `true` as 1; in a config file that is always a mistake."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


def _label_name(value: str) -> str:
    if not LABEL_NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid label name: letters, digits and '_', not starting with a digit"
        )
    return value


def _metric_name(value: str) -> str:
    if not METRIC_NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid metric name: letters, digits, '_' and ':', not starting with a digit"
        )
    return value


def _qualified_name(value: str) -> str:
    if len(value) > 316 or not QUALIFIED_NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid Kubernetes qualified name (e.g. 'nvidia.com/gpu')")
    return value


def _dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid Kubernetes name: lower-case letters, digits and '-', at most 63 long"
        )
    return value


def _label_matchers(value: str) -> str:
    if not LABEL_MATCHERS_RE.match(value):
        raise ValueError(
            f'{value!r} is not a PromQL label-matcher list; write e.g. \'cluster="prod",job=~"dcgm.*"\' '
            "(no braces, values in double quotes)"
        )
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    return value


NoBool = BeforeValidator(_no_bool)

Seconds = Annotated[float, NoBool, Field(gt=0, le=7 * 86400)]
"""A positive duration in seconds (at most a week): loop intervals, windows, timeouts."""

Integer = Annotated[int, NoBool]
"""Any integer (e.g. a pod priority), but not `true`."""

Count = Annotated[int, NoBool, Field(ge=0)]
"""A non-negative integer count."""

PositiveCount = Annotated[int, NoBool, Field(ge=1)]
"""An integer count of at least one."""

Percent = Annotated[float, NoBool, Field(ge=0, le=100)]
"""A percentage, 0 to 100."""

Port = Annotated[int, NoBool, Field(ge=1, le=65535)]
"""A TCP port."""

LabelName = Annotated[str, AfterValidator(_label_name)]
"""A Prometheus label name."""

MetricName = Annotated[str, AfterValidator(_metric_name)]
"""A metric name as served to HPAs and as written in PromQL."""

QualifiedName = Annotated[str, AfterValidator(_qualified_name)]
"""A Kubernetes qualified name: a label/annotation key or an extended resource such as nvidia.com/gpu."""

DnsLabel = Annotated[str, AfterValidator(_dns_label)]
"""A Kubernetes object name that must be a DNS label (namespaces, leases)."""

LabelMatchers = Annotated[str, AfterValidator(_label_matchers)]
"""A comma-separated PromQL label-matcher list without braces, e.g. `cluster="prod"`; may be empty."""

Regex = Annotated[str, AfterValidator(_regex)]
"""A regular expression, checked to compile."""
