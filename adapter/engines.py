"""What each LLM serving engine exports, and the per-pod metrics the engine presets build from it.

Why: inference fleets scale on what their serving engine reports — requests waiting in its queue, KV-cache
use, time to first token, tokens per second — not on GPU utilization, which sits near 100 % on a busy and on
a saturated server alike. Every engine names these differently (vLLM `vllm:num_requests_waiting`, TGI
`tgi_queue_size`, SGLang `sglang:num_queue_reqs`, Triton `nv_inference_pending_request_count`), and some do
not export a quantity at all. This module is the one home of those upstream names (docs/presets.md, "Serving
engines", names each source) and of the PromQL that turns them into one value per pod; `adapter.presets` makes
prometheus-adapter rules of them, `adapter.kedascaler` KEDA preset names. It holds facts and templates only:
no config, no I/O.

Choices made here:
- Names: metrics-API `<engine>_<quantity>` (`vllm_queue_depth`), KEDA preset `<engine>-<quantity>`
  (`vllm-queue`), as `gpu_utilization` / `gpu-utilization`.
- Per pod: queue depth and running requests are summed over the pod's series (one per model / engine
  index), KV-cache use is the pod's fullest cache (max, as `gpu_memory_used_ratio`), TTFT p90 is the
  quantile of the pod's summed bucket rates, tokens/s the summed rate of the generated-token counter.
- Renamed series are read with `or`, newest name first (vLLM `vllm:kv_cache_usage_perc`, before it
  `vllm:gpu_cache_usage_perc`): `or` matches on labels without the metric name, so a release that exports
  both counts once.
- These metrics exist only while an engine pod runs: they cannot wake a Deployment parked at zero
  (`ROUTER_QUEUE` can, the external metric of a gateway's or router's queue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Engine = Literal["vllm", "tgi", "sglang", "triton"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
Quantity = Literal[
    "queue_depth", "running_requests", "kv_cache_usage", "ttft_p90_seconds", "tokens_per_second"
]

KEDA_SUFFIX: dict[Quantity, str] = {
    "queue_depth": "queue",
    "running_requests": "running",
    "kv_cache_usage": "kv-cache",
    "ttft_p90_seconds": "ttft-p90",
    "tokens_per_second": "tokens",
}

WINDOW = "<<.Window>>"
"""Placeholder for the rate window (`adapter.presets.engines.rate_window_seconds`); see `metrics_query`."""


@dataclass(frozen=True)
class EngineMetric:
    """One per-pod metric of one engine: the upstream series it reads and the query that makes it."""

    engine: Engine
    quantity: Quantity
    series: tuple[str, ...]
    """The upstream series read (histograms: the `_bucket` series), newest name first."""
    template: str
    """metricsQuery with `<<.LabelMatchers>>`, `<<.GroupBy>>` and `WINDOW` placeholders."""
    unit: str
    target: str
    """A starting target and why (docs/presets.md repeats it)."""

    @property
    def metric(self) -> str:
        """The metrics-API name (`vllm_queue_depth`)."""
        return f"{self.engine}_{self.quantity}"

    @property
    def keda_preset(self) -> str:
        """The KEDA trigger's `preset:` value (`vllm-queue`)."""
        return f"{self.engine}-{KEDA_SUFFIX[self.quantity]}"


def _sel(series: str, extra: str = "") -> str:
    return f"{series}{{{extra + ',' if extra else ''}<<.LabelMatchers>>}}"


def _sum(series: str) -> str:
    return f"sum({_sel(series)}) by (<<.GroupBy>>)"


def _sum_rate(series: str) -> str:
    return f"sum(rate({_sel(series)}[{WINDOW}])) by (<<.GroupBy>>)"


def _p90(bucket: str, scale: str = "") -> str:
    inner = f"sum(rate({_sel(bucket)}[{WINDOW}])) by (<<.GroupBy>>,le)"
    return f"histogram_quantile(0.9, {inner}){scale}"


QUEUE_TARGET = "5 waiting per pod: a queue that does not drain within a few decode steps means TTFT grows"
KV_TARGET = "0.8: above it the engine starts preempting or refusing to batch new requests"
TTFT_TARGET = (
    "your TTFT objective (e.g. 0.5 s); TTFT is not proportional to replicas, use it beside the queue"
)
TOKENS_TARGET = "about 70 % of the generated tokens/s one pod sustains on your model and GPU (measure it)"
RUNNING_TARGET = "about 70 % of the engine's batch limit (vLLM --max-num-seqs, TGI --max-batch-size)"

VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TRITON_KV = "nv_trt_llm_kv_cache_block_metrics"
TRITON_KV_TYPE = "kv_cache_block_type"
TRITON_USED = f'{TRITON_KV_TYPE}="used"'
TRITON_MAX = f'{TRITON_KV_TYPE}="max"'

CATALOG: tuple[EngineMetric, ...] = (
    # vLLM (V1 engine; labels model_name, engine): docs.vllm.ai "Metrics"
    EngineMetric("vllm", "queue_depth", ("vllm:num_requests_waiting",),
                 _sum("vllm:num_requests_waiting"), "requests", QUEUE_TARGET),
    EngineMetric("vllm", "running_requests", ("vllm:num_requests_running",),
                 _sum("vllm:num_requests_running"), "requests", RUNNING_TARGET),
    EngineMetric("vllm", "kv_cache_usage", VLLM_KV,
                 f"max({_sel(VLLM_KV[0])} or {_sel(VLLM_KV[1])}) by (<<.GroupBy>>)", "ratio 0-1", KV_TARGET),
    EngineMetric("vllm", "ttft_p90_seconds", ("vllm:time_to_first_token_seconds_bucket",),
                 _p90("vllm:time_to_first_token_seconds_bucket"), "seconds", TTFT_TARGET),
    EngineMetric("vllm", "tokens_per_second", ("vllm:generation_tokens_total",),
                 _sum_rate("vllm:generation_tokens_total"), "tokens/s", TOKENS_TARGET),
    # Hugging Face TGI (no labels of its own): huggingface.co/docs/text-generation-inference "Metrics".
    # No KV-cache gauge and no TTFT histogram; generated tokens are counted when a request ends.
    EngineMetric("tgi", "queue_depth", ("tgi_queue_size",), _sum("tgi_queue_size"), "requests", QUEUE_TARGET),
    EngineMetric("tgi", "running_requests", ("tgi_batch_current_size",),
                 _sum("tgi_batch_current_size"), "requests", RUNNING_TARGET),
    EngineMetric("tgi", "tokens_per_second", ("tgi_request_generated_tokens_sum",),
                 _sum_rate("tgi_request_generated_tokens_sum"), "tokens/s", TOKENS_TARGET),
    # SGLang (label model_name): docs "Production Metrics", python/sglang/srt/metrics/collector.py
    EngineMetric("sglang", "queue_depth", ("sglang:num_queue_reqs",),
                 _sum("sglang:num_queue_reqs"), "requests", QUEUE_TARGET),
    EngineMetric("sglang", "running_requests", ("sglang:num_running_reqs",),
                 _sum("sglang:num_running_reqs"), "requests", RUNNING_TARGET),
    EngineMetric("sglang", "kv_cache_usage", ("sglang:token_usage",),
                 f"max({_sel('sglang:token_usage')}) by (<<.GroupBy>>)", "ratio 0-1", KV_TARGET),
    EngineMetric("sglang", "ttft_p90_seconds", ("sglang:time_to_first_token_seconds_bucket",),
                 _p90("sglang:time_to_first_token_seconds_bucket"), "seconds", TTFT_TARGET),
    EngineMetric("sglang", "tokens_per_second", ("sglang:generation_tokens_total",),
                 _sum_rate("sglang:generation_tokens_total"), "tokens/s", TOKENS_TARGET),
    # NVIDIA Triton / NIM (labels model, version): Triton user guide "Metrics"; KV cache from the TensorRT-LLM
    # backend; the first-response histogram needs `--metrics-config histogram_latencies=true` (milliseconds).
    # Triton counts inferences, not tokens: no tokens/s, and no running-requests gauge.
    EngineMetric("triton", "queue_depth", ("nv_inference_pending_request_count",),
                 _sum("nv_inference_pending_request_count"), "requests", QUEUE_TARGET),
    EngineMetric("triton", "kv_cache_usage", (TRITON_KV,),
                 f"max(sum({_sel(TRITON_KV, TRITON_USED)}) by (<<.GroupBy>>,model)"
                 f" / sum({_sel(TRITON_KV, TRITON_MAX)}) by (<<.GroupBy>>,model))"
                 " by (<<.GroupBy>>)", "ratio 0-1", KV_TARGET),
    EngineMetric("triton", "ttft_p90_seconds", ("nv_inference_first_response_histogram_ms_bucket",),
                 _p90("nv_inference_first_response_histogram_ms_bucket", " / 1000"), "seconds", TTFT_TARGET),
)  # fmt: skip


def catalog(engines: Sequence[str] = ENGINES) -> list[EngineMetric]:
    """The metrics of `engines`, in catalog order."""
    return [m for m in CATALOG if m.engine in engines]


def metrics_query(metric: EngineMetric, rate_window_seconds: float) -> str:
    """The metric's prometheus-adapter `metricsQuery`, its rate window filled in."""
    return metric.template.replace(WINDOW, f"{int(rate_window_seconds)}s")


def series_query(metric: EngineMetric) -> str:
    """Discovery's `seriesQuery`: the one series, or any of its names (a renamed series)."""
    if len(metric.series) == 1:
        return metric.series[0]
    return '{__name__=~"' + "|".join(metric.series) + '"}'


def name_pattern(metric: EngineMetric) -> str:
    """Discovery's `name.matches` for the metric's series (`:` needs no escaping in a regex)."""
    return "^(" + "|".join(s.replace(".", r"\.") for s in metric.series) + ")$"


ROUTER_QUEUE_KEDA = "router-queue"
"""The KEDA preset of the external router/gateway queue metric (`adapter.presets.router_queue`)."""
