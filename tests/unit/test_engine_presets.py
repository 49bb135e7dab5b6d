"""The serving-engine presets (`adapter.engines`) against recorded engine exposition text.

Golden data: tests/unit/golden/engines/*.txt are /metrics pages in the shape each engine serves (each file
names its upstream source), and tests/unit/golden/engines/rules.json the rules the presets generate
(regenerate after an intended change with `GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/pytest` on this file).
The values the presets compute from these pages on a real Prometheus:
tests/integration/test_engine_presets.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapter import engines, naming, presets, queries
from adapter.kedascaler import InvalidMetadata, NoData, decide_value, keda_presets, parse_trigger
from adapter.routing import CustomRoute, ExternalRoute
from gpuwarden.config.adapter import Presets, ServingEngine

GOLDEN = Path(__file__).parent / "golden" / "engines"


def recorded(name: str) -> dict[str, str]:
    """{sample name: family type} of a recorded /metrics page."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families((GOLDEN / name).read_text()):
        for sample in family.samples:
            out[sample.name] = family.type
    return out


def test_config_knows_the_same_engines() -> None:
    assert tuple(get_args(ServingEngine)) == engines.ENGINES


def test_generated_rules_match_golden() -> None:
    got = presets.engine_documents(Presets())
    path = GOLDEN / "rules.json"
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


# (recorded page, engine, metric -> the series of it the page must hold, with their family type)
PAGES = [
    pytest.param(
        "vllm-v1.txt",
        "vllm",
        {
            "queue_depth": {"vllm:num_requests_waiting": "gauge"},
            "running_requests": {"vllm:num_requests_running": "gauge"},
            "kv_cache_usage": {"vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge"},
            "ttft_p90_seconds": {"vllm:time_to_first_token_seconds_bucket": "histogram"},
            "tokens_per_second": {"vllm:generation_tokens_total": "counter"},
        },
        id="vllm-v1",
    ),
    pytest.param(
        "vllm-v0.txt",
        "vllm",
        {
            "queue_depth": {"vllm:num_requests_waiting": "gauge"},
            "running_requests": {"vllm:num_requests_running": "gauge"},
            "kv_cache_usage": {"vllm:gpu_cache_usage_perc": "gauge"},  # the old name alone
            "tokens_per_second": {"vllm:generation_tokens_total": "counter"},
        },
        id="vllm-v0-before-the-kv-rename",
    ),
    pytest.param(
        "tgi.txt",
        "tgi",
        {
            "queue_depth": {"tgi_queue_size": "gauge"},
            "running_requests": {"tgi_batch_current_size": "gauge"},
            "tokens_per_second": {"tgi_request_generated_tokens_sum": "histogram"},
        },
        id="tgi",
    ),
    pytest.param(
        "sglang.txt",
        "sglang",
        {
            "queue_depth": {"sglang:num_queue_reqs": "gauge"},
            "running_requests": {"sglang:num_running_reqs": "gauge"},
            "kv_cache_usage": {"sglang:token_usage": "gauge"},
            "ttft_p90_seconds": {"sglang:time_to_first_token_seconds_bucket": "histogram"},
            "tokens_per_second": {"sglang:generation_tokens_total": "counter"},
        },
        id="sglang",
    ),
    pytest.param(
        "triton.txt",
        "triton",
        {
            "queue_depth": {"nv_inference_pending_request_count": "gauge"},
            "kv_cache_usage": {"nv_trt_llm_kv_cache_block_metrics": "gauge"},
            "ttft_p90_seconds": {"nv_inference_first_response_histogram_ms_bucket": "histogram"},
        },
        id="triton",
    ),
]


@pytest.mark.parametrize(("page", "engine", "expected"), PAGES)
def test_presets_read_the_engines_real_series(
    page: str, engine: str, expected: dict[str, dict[str, str]]
) -> None:
    """Every series a preset reads is on the engine's page with the right type, and a page's series that
    no preset reads are absent from the table (a renamed series would fail here)."""
    families = recorded(page)
    by_quantity: dict[str, engines.EngineMetric] = {m.quantity: m for m in engines.catalog([engine])}
    for quantity, series in expected.items():
        metric = by_quantity[quantity]
        for name, kind in series.items():
            assert name in metric.series, (quantity, name)
            assert families.get(name) == kind, (page, name)
        on_page = [s for s in metric.series if s in families]
        assert on_page == list(series), (quantity, on_page)  # newest name first, as the `or` reads them


@pytest.mark.parametrize("metric", engines.CATALOG, ids=lambda m: m.metric)
def test_each_engine_preset_is_one_grouped_query_per_namespace(metric: engines.EngineMetric) -> None:
    (rule,) = [r for r in presets.preset_rules(Presets(), 120) if r.name.as_ == metric.metric]
    compiled = naming.compile_rule(rule, 0, external=False)
    assert queries.batchable(compiled)
    for series in metric.series:
        assert compiled.metric_name(series) == metric.metric
    assert not compiled.accepts("vllm:num_requests_swapped")


def test_kv_rename_reads_the_new_name_first() -> None:
    (kv,) = [m for m in engines.catalog(["vllm"]) if m.quantity == "kv_cache_usage"]
    assert kv.series == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    query = engines.metrics_query(kv, 60)
    assert query.index("vllm:kv_cache_usage_perc") < query.index(" or vllm:gpu_cache_usage_perc")
    assert engines.series_query(kv) == '{__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"}'


@pytest.mark.parametrize(
    ("cfg", "present", "absent"),
    [
        pytest.param(
            {}, {"vllm_queue_depth", "triton_ttft_p90_seconds", "tgi_tokens_per_second"}, set(), id="all"
        ),
        pytest.param(
            {"engines": {"engines": ["tgi"]}}, {"tgi_queue_depth"}, {"vllm_queue_depth"}, id="one-engine"
        ),
        pytest.param(
            {"engines": {"enabled": False}}, set(), {"tgi_queue_depth", "vllm_queue_depth"}, id="off"
        ),
    ],
)
def test_engines_config(cfg: dict[str, object], present: set[str], absent: set[str]) -> None:
    names = {r.name.as_ for r in presets.preset_rules(Presets.model_validate(cfg), 120)}
    assert present <= names
    assert not absent & names


def test_rate_window_is_the_configured_one() -> None:
    docs = presets.engine_documents(Presets.model_validate({"engines": {"rate_window_seconds": 30}}))
    ttft = next(d for d in docs if d["name"]["as"] == "vllm_ttft_p90_seconds")
    assert "[30s]" in ttft["metricsQuery"]


def test_engine_names_are_reserved() -> None:
    with pytest.raises(ValueError, match="named like an engine preset"):
        Presets.model_validate({"requests_per_second": {"name": "vllm_qps"}})


# ---- KEDA: preset names, 0 -> 1 ---------------------------------------------------------------------


def test_keda_engine_presets_are_custom_metrics_on_pods() -> None:
    offered = keda_presets(Presets())
    trigger = parse_trigger(
        {"preset": "vllm-queue", "labelSelector": "app=llm", "targetValue": "5"}, "ml", offered
    )
    assert isinstance(trigger.route, CustomRoute)
    assert trigger.route.metric == "vllm_queue_depth"
    assert {m.keda_preset for m in engines.CATALOG} <= set(offered)


def test_keda_router_queue_is_an_external_metric_selected_by_series_labels() -> None:
    offered = keda_presets(Presets())
    trigger = parse_trigger(
        {"preset": "router-queue", "labelSelector": "service=llm", "targetValue": "5"}, "ml", offered
    )
    assert isinstance(trigger.route, ExternalRoute)
    assert (trigger.route.metric, trigger.route.namespace) == ("router_queue_depth", "ml")
    with pytest.raises(InvalidMetadata, match="metricLabelSelector: only for metricKind: custom"):
        parse_trigger(
            {"preset": "router-queue", "metricLabelSelector": "a=b", "targetValue": "5"}, "ml", offered
        )


@pytest.mark.parametrize(
    ("preset", "hint"),
    [
        pytest.param("vllm-queue", True, id="per-pod-says-it-cannot-wake"),
        pytest.param("router-queue", False, id="external-no-hint"),
    ],
)
def test_no_value_at_zero_pods_says_what_wakes_a_workload(preset: str, hint: bool) -> None:
    trigger = parse_trigger({"preset": preset, "targetValue": "5"}, "ml", keda_presets(Presets()))
    with pytest.raises(NoData) as caught:
        decide_value([], trigger, now=100.0, max_age=30.0)
    assert ("preset: router-queue" in caught.value.message) is hint
