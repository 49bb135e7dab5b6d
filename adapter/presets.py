"""Built-in metric definitions for GPU fleets, expressed as ordinary prometheus-adapter rules.

Why: most users want the same three HPA metrics — GPU utilization and GPU memory from dcgm-exporter, and
QPS from the application's request counter — and should not have to write PromQL templates for them. The
presets are generated as prometheus-adapter rule documents and read as `DiscoveryRule`s (the fields a pasted
prometheus-adapter config produces), so they go through the same discovery, query building and caching as
user rules; nothing downstream knows a metric came from a preset. The serving process does not import the
config models (gpuwarden/config/view.py): a preset rule is a `view.Record` with the model's fields and
defaults, and a test checks it equals what `DiscoveryRule.model_validate` makes of the same document.

Choices made here:
- `gpu_utilization` is the mean over the pod's GPUs, in percent (0-100). DCGM_FI_PROF_GR_ENGINE_ACTIVE is a
  ratio, so it is scaled by 100 to keep the unit when users switch sources.
- `gpu_memory_used_ratio` is the *max* over the pod's GPUs of used / (used + free): a pod runs out of memory
  on its fullest GPU, not on the average one.
- dcgm-exporter samples older than `max_sample_age_seconds` are dropped inside the query
  (`x and timestamp(x) > time() - age`), so a vanished exporter's last value is not served for Prometheus'
  whole 5-minute lookback. Rates are bounded by their own window.
- Nodes are served too (`nodes/<node>/gpu_utilization`), from dcgm-exporter's `Hostname` label (or
  `hostname`, as on dcgm-exporter main); discovery keeps whichever the series actually carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from gpuwarden.config.view import Record

if TYPE_CHECKING:
    from gpuwarden.config.adapter import Presets
    from gpuwarden.config.metric_rules import DiscoveryRule

DCGM_NODE_LABELS = ("Hostname", "hostname")


def _fresh(series: str, max_sample_age: float) -> str:
    """`series{matchers}` keeping only samples scraped within `max_sample_age` seconds."""
    sel = f"{series}{{<<.LabelMatchers>>}}"
    return f"({sel} and timestamp({sel}) > time() - {max_sample_age:g})"


def _dcgm_resources(presets: Presets) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        presets.dcgm_pod_label: {"resource": "pod"},
        presets.dcgm_namespace_label: {"resource": "namespace"},
    }
    for label in DCGM_NODE_LABELS:
        overrides[label] = {"resource": "node"}
    return {"overrides": overrides}


def _exact_name(series: str, name: str) -> dict[str, str]:
    return {"matches": f"^{series}$", "as": name}


def gpu_utilization_document(presets: Presets, max_sample_age: float) -> dict[str, Any]:
    """Mean GPU utilization (percent) per object, from DCGM_FI_DEV_GPU_UTIL or ..._PROF_GR_ENGINE_ACTIVE."""
    preset = presets.gpu_utilization
    scale = " * 100" if preset.source == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else ""
    return {
        "seriesQuery": preset.source,
        "resources": _dcgm_resources(presets),
        "name": _exact_name(preset.source, preset.name),
        "metricsQuery": f"avg({_fresh('<<.Series>>', max_sample_age)}) by (<<.GroupBy>>){scale}",
    }


def gpu_memory_document(presets: Presets, max_sample_age: float) -> dict[str, Any]:
    """Max over the object's GPUs of framebuffer used / (used + free), 0-1."""
    preset = presets.gpu_memory_used_ratio
    used = _fresh("<<.Series>>", max_sample_age)
    free = "DCGM_FI_DEV_FB_FREE{<<.LabelMatchers>>}"
    return {
        "seriesQuery": "DCGM_FI_DEV_FB_USED",
        "resources": _dcgm_resources(presets),
        "name": _exact_name("DCGM_FI_DEV_FB_USED", preset.name),
        "metricsQuery": f"max({used} / ({used} + {free})) by (<<.GroupBy>>)",
    }


def requests_per_second_document(presets: Presets) -> dict[str, Any]:
    """Per-second rate of the request counter per object, over `rate_window_seconds`."""
    preset = presets.requests_per_second
    window = f"{int(preset.rate_window_seconds)}s"
    return {
        "seriesQuery": preset.series,
        "resources": {
            "overrides": {
                preset.pod_label: {"resource": "pod"},
                preset.namespace_label: {"resource": "namespace"},
            }
        },
        "name": _exact_name(preset.series, preset.name),
        "metricsQuery": f"sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[{window}])) by (<<.GroupBy>>)",
    }


def preset_documents(presets: Presets, max_sample_age: float) -> list[dict[str, Any]]:
    """The enabled presets as prometheus-adapter rule documents, in a fixed order."""
    documents: list[dict[str, Any]] = []
    if presets.gpu_utilization.enabled:
        documents.append(gpu_utilization_document(presets, max_sample_age))
    if presets.gpu_memory_used_ratio.enabled:
        documents.append(gpu_memory_document(presets, max_sample_age))
    if presets.requests_per_second.enabled:
        documents.append(requests_per_second_document(presets))
    return documents


def rule_record(document: Mapping[str, Any]) -> DiscoveryRule:
    """A preset's document as a `DiscoveryRule` would read it: the model's fields, its defaults for the
    keys the presets leave out (no series filters, no label template, `namespaced` unset)."""
    resources = document.get("resources") or {}
    overrides = {
        label: Record({"group": gr.get("group", ""), "resource": gr["resource"]})
        for label, gr in (resources.get("overrides") or {}).items()
    }
    record = Record(
        {
            "series_query": document["seriesQuery"],
            "series_filters": [],
            "resources": Record(
                {"template": resources.get("template"), "overrides": overrides, "namespaced": None}
            ),
            "name": Record({"matches": document["name"]["matches"], "as_": document["name"]["as"]}),
            "metrics_query": document["metricsQuery"],
        }
    )
    return cast("DiscoveryRule", record)


def preset_rules(presets: Presets, max_sample_age: float) -> list[DiscoveryRule]:
    """The enabled presets as custom-metrics rules, in a fixed order."""
    return [rule_record(d) for d in preset_documents(presets, max_sample_age)]
