"""Built-in metric definitions for GPU fleets, expressed as ordinary prometheus-adapter rules.

Why: most users want the same three HPA metrics — GPU utilization and GPU memory from dcgm-exporter, and
QPS from the application's request counter — and should not have to write PromQL templates for them. The
presets are generated as `DiscoveryRule`s (the same model a pasted prometheus-adapter config produces), so
they go through the same discovery, query building and caching as user rules; nothing downstream knows a
metric came from a preset.

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

from typing import Any

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


def gpu_utilization_rule(presets: Presets, max_sample_age: float) -> DiscoveryRule:
    """Mean GPU utilization (percent) per object, from DCGM_FI_DEV_GPU_UTIL or ..._PROF_GR_ENGINE_ACTIVE."""
    preset = presets.gpu_utilization
    scale = " * 100" if preset.source == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else ""
    return DiscoveryRule.model_validate(
        {
            "seriesQuery": preset.source,
            "resources": _dcgm_resources(presets),
            "name": _exact_name(preset.source, preset.name),
            "metricsQuery": f"avg({_fresh('<<.Series>>', max_sample_age)}) by (<<.GroupBy>>){scale}",
        }
    )


def gpu_memory_rule(presets: Presets, max_sample_age: float) -> DiscoveryRule:
    """Max over the object's GPUs of framebuffer used / (used + free), 0-1."""
    preset = presets.gpu_memory_used_ratio
    used = _fresh("<<.Series>>", max_sample_age)
    free = "DCGM_FI_DEV_FB_FREE{<<.LabelMatchers>>}"
    return DiscoveryRule.model_validate(
        {
            "seriesQuery": "DCGM_FI_DEV_FB_USED",
            "resources": _dcgm_resources(presets),
            "name": _exact_name("DCGM_FI_DEV_FB_USED", preset.name),
            "metricsQuery": f"max({used} / ({used} + {free})) by (<<.GroupBy>>)",
        }
    )


def requests_per_second_rule(presets: Presets) -> DiscoveryRule:
    """Per-second rate of the request counter per object, over `rate_window_seconds`."""
    preset = presets.requests_per_second
    window = f"{int(preset.rate_window_seconds)}s"
    return DiscoveryRule.model_validate(
        {
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
    )


def preset_rules(presets: Presets, max_sample_age: float) -> list[DiscoveryRule]:
    """The enabled presets as custom-metrics rules, in a fixed order."""
    rules: list[DiscoveryRule] = []
    if presets.gpu_utilization.enabled:
        rules.append(gpu_utilization_rule(presets, max_sample_age))
    if presets.gpu_memory_used_ratio.enabled:
        rules.append(gpu_memory_rule(presets, max_sample_age))
    if presets.requests_per_second.enabled:
        rules.append(requests_per_second_rule(presets))
    return rules
