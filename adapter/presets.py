"""Built-in metric definitions for GPU fleets, expressed as ordinary prometheus-adapter rules.

Why: most users want the same few HPA metrics — GPU utilization and GPU memory from dcgm-exporter, QPS from
the application's request counter, their serving engine's queue, KV cache, TTFT and tokens/s
(`adapter.engines`), and for waking a workload from zero the queue of the router in front of it — and should
not have to write PromQL templates for them. The
presets are generated as prometheus-adapter rule documents and read as `DiscoveryRule`s (the fields a pasted
prometheus-adapter config produces), so they go through the same discovery, query building and caching as
user rules; nothing downstream knows a metric came from a preset. The serving process does not import the
config models (gpuwarden/config/view.py): a preset rule is a `view.Record` with the model's fields and
defaults, and a test checks it equals what `DiscoveryRule.model_validate` makes of the same document.

Choices made here:
- `gpu_utilization` is the mean over the pod's GPUs, in percent (0-100). DCGM_FI_PROF_GR_ENGINE_ACTIVE is a
  ratio, so it is scaled by 100 to keep the unit when users switch sources.
- Shared GPUs (docs/presets.md, "Shared GPUs"): a MIG instance has no DCGM_FI_DEV_GPU_UTIL (NVML does not
  support it there), so its series' DCGM_FI_PROF_GR_ENGINE_ACTIVE x 100 stands in, in the same grouped query
  (`... or GR_ENGINE_ACTIVE{GPU_I_ID!=""} * 100`): one query per (preset, namespace) serves whole GPUs and MIG
  instances alike, and discovery finds the metric on a fleet with either. Before the mean, series are
  reduced to one per device (`max by` the group and the device's identity: node, `gpu`, `UUID`, `GPU_I_ID`),
  so dcgm-exporter's per-pod copies (KUBERNETES_VIRTUAL_GPUS: one per replica a pod holds, and for
  DCGM_FI_DEV_GPU_UTIL the device series beside the per-pod ones) count a device once per pod, and once per
  node. Without virtual GPUs a time-sliced GPU's one series names one of its pods: that pod gets the whole
  GPU's utilization and the GPU's other pods get no value.
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

from adapter import engines
from gpuwarden.config.view import Record

if TYPE_CHECKING:
    from gpuwarden.config.adapter import Presets
    from gpuwarden.config.metric_rules import DiscoveryRule

DCGM_NODE_LABELS = ("Hostname", "hostname")
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
MIG_INSTANCE_LABEL = "GPU_I_ID"
"""dcgm-exporter's label on the series of a MIG GPU instance (its GPU instance ID)."""
DEVICE_LABELS = (*DCGM_NODE_LABELS, "gpu", "UUID", MIG_INSTANCE_LABEL)
"""What names one device (a GPU or a MIG instance) on dcgm-exporter's series; per-pod copies share them."""


def _fresh(series: str, max_sample_age: float, extra: str = "") -> str:
    """`series{[extra,]matchers}` keeping only samples scraped within `max_sample_age` seconds."""
    sel = f"{series}{{{extra + ',' if extra else ''}<<.LabelMatchers>>}}"
    return f"({sel} and timestamp({sel}) > time() - {max_sample_age:g})"


def gpu_utilization_query(source: str, max_sample_age: float) -> str:
    """Mean over each object's devices of their utilization in percent, one value per device.

    `source` DCGM_FI_DEV_GPU_UTIL: whole GPUs from it, MIG instances (which have none) from their
    DCGM_FI_PROF_GR_ENGINE_ACTIVE x 100; DCGM_FI_PROF_GR_ENGINE_ACTIVE: every device from it x 100."""
    if source == GPU_UTIL:
        mig = f'{MIG_INSTANCE_LABEL}!=""'
        per_device = (
            f"{_fresh(GPU_UTIL, max_sample_age)} or ({_fresh(GR_ENGINE_ACTIVE, max_sample_age, mig)} * 100)"
        )
    else:
        per_device = f"{_fresh(GR_ENGINE_ACTIVE, max_sample_age)} * 100"
    device = ",".join(DEVICE_LABELS)
    return f"avg by (<<.GroupBy>>) (max by (<<.GroupBy>>,{device}) ({per_device}))"


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
    """Mean GPU utilization (percent) per object, from DCGM_FI_DEV_GPU_UTIL (MIG instances: their
    DCGM_FI_PROF_GR_ENGINE_ACTIVE) or DCGM_FI_PROF_GR_ENGINE_ACTIVE everywhere."""
    preset = presets.gpu_utilization
    if preset.source == GPU_UTIL:
        series_query = f'{{__name__=~"{GPU_UTIL}|{GR_ENGINE_ACTIVE}"}}'
        name = {"matches": f"^({GPU_UTIL}|{GR_ENGINE_ACTIVE})$", "as": preset.name}
    else:
        series_query, name = GR_ENGINE_ACTIVE, _exact_name(GR_ENGINE_ACTIVE, preset.name)
    return {
        "seriesQuery": series_query,
        "resources": _dcgm_resources(presets),
        "name": name,
        "metricsQuery": gpu_utilization_query(preset.source, max_sample_age),
    }


POD_UID_LABEL = "pod_uid"
"""dcgm-exporter's label on the per-pod (per-process) DCGM_FI_DEV_FB_USED series under virtual GPUs only: the
DCGM_FI_DEV_FB_FREE copies of the same device and pod lack it, so the two are matched ignoring it."""


def gpu_memory_document(presets: Presets, max_sample_age: float) -> dict[str, Any]:
    """Max over the object's devices of framebuffer used / (used + free), 0-1 (with virtual GPUs: the pod's
    own processes' framebuffer over that plus what the device has free)."""
    preset = presets.gpu_memory_used_ratio
    used = _fresh("<<.Series>>", max_sample_age)
    free = "DCGM_FI_DEV_FB_FREE{<<.LabelMatchers>>}"
    ignoring = f"ignoring({POD_UID_LABEL})"
    return {
        "seriesQuery": "DCGM_FI_DEV_FB_USED",
        "resources": _dcgm_resources(presets),
        "name": _exact_name("DCGM_FI_DEV_FB_USED", preset.name),
        "metricsQuery": f"max({used} / {ignoring} ({used} + {ignoring} {free})) by (<<.GroupBy>>)",
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


def engine_documents(presets: Presets) -> list[dict[str, Any]]:
    """One rule per serving-engine metric of the enabled engines (`adapter.engines`), pods and namespaces."""
    cfg = presets.engines
    if not cfg.enabled:
        return []
    resources = {
        "overrides": {cfg.pod_label: {"resource": "pod"}, cfg.namespace_label: {"resource": "namespace"}}
    }
    return [
        {
            "seriesQuery": engines.series_query(metric),
            "resources": resources,
            "name": {"matches": engines.name_pattern(metric), "as": metric.metric},
            "metricsQuery": engines.metrics_query(metric, cfg.rate_window_seconds),
        }
        for metric in engines.catalog(cfg.engines)
    ]


def router_queue_document(presets: Presets) -> dict[str, Any]:
    """The external metric of a router's queue: summed per (namespace, the selector's labels), so every
    selector of a namespace is answered from one shared query (`adapter.sharing`)."""
    preset = presets.router_queue
    return {
        "seriesQuery": preset.series,
        "resources": {"overrides": {preset.namespace_label: {"resource": "namespace"}}},
        "name": _exact_name(preset.series, preset.name),
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }


def preset_documents(presets: Presets, max_sample_age: float) -> list[dict[str, Any]]:
    """The enabled custom-metric presets as prometheus-adapter rule documents, in a fixed order."""
    documents: list[dict[str, Any]] = []
    if presets.gpu_utilization.enabled:
        documents.append(gpu_utilization_document(presets, max_sample_age))
    if presets.gpu_memory_used_ratio.enabled:
        documents.append(gpu_memory_document(presets, max_sample_age))
    if presets.requests_per_second.enabled:
        documents.append(requests_per_second_document(presets))
    documents.extend(engine_documents(presets))
    return documents


def external_preset_documents(presets: Presets) -> list[dict[str, Any]]:
    """The enabled external-metric presets as prometheus-adapter `externalRules` documents."""
    return [router_queue_document(presets)] if presets.router_queue.enabled else []


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


def external_preset_rules(presets: Presets) -> list[DiscoveryRule]:
    """The enabled presets as external-metrics rules."""
    return [rule_record(d) for d in external_preset_documents(presets)]
