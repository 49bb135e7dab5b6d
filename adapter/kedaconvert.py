"""`gpuwarden keda convert`: rewrite ScaledObjects' `prometheus` triggers as gpuwarden `external` triggers.

Why: moving a fleet of ScaledObjects off one-query-per-trigger (reference/keda.md §2) should not mean
rewriting each trigger by hand, and must never change what a trigger measures. So a trigger is rewritten
only when its query is one gpuwarden's presets answer with the same number; every other trigger is kept as
it is, and the report says why (the command's contract: convert what is provably equal, name the rest).

Recognised queries (a small PromQL subset, parsed here; anything else is "not covered"):

- `avg(DCGM_FI_DEV_GPU_UTIL{namespace="ns", ...})` → `preset: gpu-utilization`, `aggregation: avg`. Equal
  when every pod has the same number of GPUs (gpuwarden averages per pod first); the report says so.
- `sum(rate(http_requests_total{namespace="ns", ...}[2m]))` → `preset: qps` (sum of per-pod rates is the
  sum of rates), only when the window equals `adapter.presets.requests_per_second.rate_window_seconds`.

Matchers: the namespace label becomes `namespace`; other `=` / `!=` matchers become `metricLabelSelector`
(series labels). A query with no namespace matcher, a pod-name matcher, a regex, or a value a label
selector cannot express is not converted: gpuwarden selects pods by their labels, within one namespace.
Pure: documents in, documents and a report out; the CLI reads and writes the files.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapter import selectors
from gpuwarden.config.adapter import Presets

_AGG = r"(?P<agg>sum|avg|max|min)"
_NAME = r"(?P<series>[a-zA-Z_:][a-zA-Z0-9_:]*)"
_SELECTOR = _NAME + r"\s*(?:\{(?P<matchers>(?:[^{}\"']|\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')*)\})?"
_QUERY = re.compile(
    r"^\s*"
    + _AGG
    + r"\s*\(\s*(?:(?P<fn>rate)\s*\(\s*"
    + _SELECTOR
    + r"\s*\[\s*(?P<window>[0-9]+[smh])\s*\]\s*\)"
    r"|" + _SELECTOR.replace("series", "series2").replace("matchers", "matchers2") + r")\s*\)\s*$"
)
_MATCHER = re.compile(
    r"\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')\s*(?:,|$)"
)
_UNITS = {"s": 1, "m": 60, "h": 3600}


class NotCovered(Exception):
    """Why a trigger is kept as it is; the message is shown to the user."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Query:
    """`agg(series{matchers})` or `agg(rate(series{matchers}[window]))`."""

    aggregation: str
    series: str
    matchers: tuple[Matcher, ...]
    rate_window_seconds: float | None = None


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


def parse_query(promql: str) -> Query:
    """The recognised shape of `promql`, or `NotCovered` saying it is outside the subset."""
    m = _QUERY.match(promql)
    if m is None:
        raise NotCovered(
            "the query is not of the form agg(series{...}) or agg(rate(series{...}[window])) "
            "(agg: sum, avg, max, min) that gpuwarden's presets answer"
        )
    series = m.group("series") or m.group("series2")
    raw = m.group("matchers") if m.group("series") else m.group("matchers2")
    matchers: list[Matcher] = []
    rest = (raw or "").strip()
    while rest:
        mm = _MATCHER.match(rest)
        if mm is None:
            raise NotCovered(f"cannot read the label matchers {raw!r}")
        matchers.append(Matcher(mm.group("label"), mm.group("op"), _unquote(mm.group("value"))))
        rest = rest[mm.end() :].strip()
    window = m.group("window")
    seconds = float(int(window[:-1]) * _UNITS[window[-1]]) if window else None
    return Query(m.group("agg"), series, tuple(matchers), seconds)


@dataclass(frozen=True)
class Options:
    """How converted triggers reach gpuwarden (docs/keda.md)."""

    scaler_address: str = "gpuwarden-keda.gpuwarden.svc:6000"
    auth_ref: str | None = None
    """A TriggerAuthentication (caCert, tlsClientCert, tlsClientKey) for mutual TLS; None: none."""
    push: bool = False
    """`external-push` (scale from zero at once on activation) instead of `external`."""
    transport: str = "tls"
    """`tls` (enableTLS), `tls-unverified` (enableTLS + unsafeSsl: the self-signed default), `plaintext`."""


@dataclass(frozen=True)
class Conversion:
    """The gpuwarden trigger metadata for a recognised query, and what the user should know."""

    metadata: dict[str, str]
    notes: tuple[str, ...] = ()


def _selectors(
    query: Query, namespace_label: str, pod_label: str, scaled_object_namespace: str
) -> tuple[str, str]:
    """(namespace, metricLabelSelector) for the query's matchers; NotCovered when they cannot be kept."""
    namespace = ""
    requirements: list[str] = []
    for m in query.matchers:
        if m.label == namespace_label:
            if m.op != "=":
                raise NotCovered(f"{m.label}{m.op}{m.value!r}: gpuwarden reads one namespace per trigger")
            namespace = m.value
        elif m.label == pod_label:
            raise NotCovered(
                f"{m.label}{m.op}{m.value!r} selects pods by name; gpuwarden selects pods by their labels "
                "(write the trigger by hand with labelSelector: <the workload's pod labels>)"
            )
        elif m.op in ("=~", "!~"):
            raise NotCovered(f"{m.label}{m.op}{m.value!r}: a regex matcher has no label-selector equal")
        else:
            requirements.append(f"{m.label}{'!=' if m.op == '!=' else '='}{m.value}")
    if not namespace:
        raise NotCovered(
            f'the query is not limited to one namespace (no {namespace_label}="..." matcher); '
            f"gpuwarden reads one namespace per trigger ({scaled_object_namespace!r} by default)"
        )
    text = ",".join(requirements)
    try:
        selectors.parse(text)
    except selectors.SelectorError as exc:
        raise NotCovered(f"the matchers {text!r} are not a valid label selector: {exc}") from None
    return namespace, text


def convert_query(promql: str, presets: Presets, scaled_object_namespace: str) -> Conversion:
    """gpuwarden trigger metadata (without target, address or TLS) answering exactly `promql`."""
    query = parse_query(promql)
    gpu, qps = presets.gpu_utilization, presets.requests_per_second
    if query.series == "DCGM_FI_DEV_GPU_UTIL" and query.rate_window_seconds is None:
        if not gpu.enabled or gpu.source != "DCGM_FI_DEV_GPU_UTIL":
            raise NotCovered("adapter.presets.gpu_utilization does not serve DCGM_FI_DEV_GPU_UTIL")
        if query.aggregation != "avg":
            raise NotCovered(
                f"{query.aggregation}() over GPUs has no equal: "
                "gpuwarden's gpu_utilization is the mean per pod"
            )
        namespace, metric_selector = _selectors(
            query, presets.dcgm_namespace_label, presets.dcgm_pod_label, scaled_object_namespace
        )
        metadata = {"preset": "gpu-utilization", "aggregation": "avg"}
        notes: tuple[str, ...] = (
            "equal when every pod has the same number of GPUs (gpuwarden averages per pod first)",
        )
    elif query.series == qps.series and query.rate_window_seconds is not None:
        if not qps.enabled:
            raise NotCovered("adapter.presets.requests_per_second is disabled")
        if query.aggregation != "sum":
            raise NotCovered(
                f"{query.aggregation}() of rates has no equal: the qps preset sums per-pod rates"
            )
        if query.rate_window_seconds != qps.rate_window_seconds:
            raise NotCovered(
                f"rate window {query.rate_window_seconds:g}s differs from the qps preset's "
                f"{qps.rate_window_seconds:g}s (adapter.presets.requests_per_second.rate_window_seconds)"
            )
        namespace, metric_selector = _selectors(
            query, qps.namespace_label, qps.pod_label, scaled_object_namespace
        )
        metadata = {"preset": "qps"}
        notes = ("series without a pod label are not counted (the preset sums per pod)",)
    else:
        raise NotCovered(
            f"no gpuwarden preset serves {query.series}"
            + (" through rate()" if query.rate_window_seconds is not None else "")
            + " (add an externalRule, or keep the prometheus trigger)"
        )
    if namespace != scaled_object_namespace:
        metadata["namespace"] = namespace
    if metric_selector:
        metadata["metricLabelSelector"] = metric_selector
    return Conversion(metadata, notes)


@dataclass
class Report:
    """One `prometheus` trigger: converted (with notes) or kept (with the reason)."""

    scaled_object: str
    index: int
    converted: bool
    message: str
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        verdict = "converted" if self.converted else "kept"
        extra = "".join(f"; note: {n}" for n in self.notes)
        return f"{self.scaled_object} trigger {self.index}: {verdict}: {self.message}{extra}"


def _number(value: Any) -> float | None:
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def convert_trigger(
    trigger: Mapping[str, Any], namespace: str, presets: Presets, options: Options
) -> tuple[dict[str, Any], Conversion]:
    """The gpuwarden trigger replacing `trigger` (a `prometheus` one), or NotCovered."""
    meta = trigger.get("metadata") or {}
    query = meta.get("query")
    if not isinstance(query, str) or not query.strip():
        raise NotCovered("no metadata.query (queryFromEnv and friends are not read)")
    threshold = _number(meta.get("threshold"))
    if threshold is None or threshold <= 0:
        raise NotCovered(f"threshold {meta.get('threshold')!r} is not a number above 0")
    conversion = convert_query(query, presets, namespace)
    metadata: dict[str, str] = {"scalerAddress": options.scaler_address, **conversion.metadata}
    metadata["targetValue"] = str(meta["threshold"]).strip()
    if "activationThreshold" in meta:
        if _number(meta["activationThreshold"]) is None:
            raise NotCovered(f"activationThreshold {meta['activationThreshold']!r} is not a number")
        metadata["activationThreshold"] = str(meta["activationThreshold"]).strip()
    if options.transport in ("tls", "tls-unverified"):
        metadata["enableTLS"] = "true"
    if options.transport == "tls-unverified":
        metadata["unsafeSsl"] = "true"
    out: dict[str, Any] = {"type": "external-push" if options.push else "external"}
    for key in ("name", "metricType", "useCachedMetrics"):
        if key in trigger:
            out[key] = copy.deepcopy(trigger[key])
    out["metadata"] = metadata
    if options.auth_ref:
        out["authenticationRef"] = {"name": options.auth_ref}
    return out, conversion


def convert_documents(
    documents: Sequence[Any], presets: Presets, options: Options
) -> tuple[list[Any], list[Report]]:
    """Every document, with the covered `prometheus` triggers of ScaledObjects rewritten; and the report."""
    out: list[Any] = []
    reports: list[Report] = []
    for doc in documents:
        if not (isinstance(doc, dict) and doc.get("kind") == "ScaledObject"):
            out.append(doc)
            continue
        doc = copy.deepcopy(doc)
        meta = doc.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        who = f"ScaledObject {namespace}/{meta.get('name', '?')}"
        triggers = (doc.get("spec") or {}).get("triggers") or []
        for i, trigger in enumerate(triggers):
            if not isinstance(trigger, dict) or trigger.get("type") != "prometheus":
                continue
            try:
                new, conversion = convert_trigger(trigger, namespace, presets, options)
            except NotCovered as exc:
                reports.append(Report(who, i, False, str(exc)))
                continue
            if trigger.get("authenticationRef") and not options.auth_ref:
                conversion = Conversion(
                    conversion.metadata,
                    (*conversion.notes, "its authenticationRef (for Prometheus) was dropped"),
                )
            triggers[i] = new
            what = ", ".join(f"{k}: {v}" for k, v in new["metadata"].items() if k != "scalerAddress")
            reports.append(Report(who, i, True, f"{new['type']} trigger ({what})", list(conversion.notes)))
        out.append(doc)
    return out, reports
