"""The simulator's serving engines: a queue that grows with load, KV cache, TTFT, tokens, the router queue."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.simulator.engine import (
    DECODE_SECONDS,
    PREFILL_SECONDS,
    ROUTER_HOLD_SECONDS,
    TOKENS_PER_REQUEST,
    EngineState,
    Router,
    step,
)
from harness.simulator.exposition import Renderer
from harness.simulator.fleet import Fleet, PodSpec
from harness.simulator.scenario import parse_scenario
from harness.simulator.workload import LoadCurve

T0 = 1000.0


@pytest.mark.parametrize(
    ("arrivals", "capacity", "seconds", "waiting", "running"),
    [
        pytest.param(50.0, 100.0, 10, 0.0, 50.0 * DECODE_SECONDS, id="below-capacity-no-queue"),
        pytest.param(150.0, 100.0, 10, 500.0, 100.0 * DECODE_SECONDS, id="overload-queue-grows"),
        pytest.param(0.0, 100.0, 10, 0.0, 0.0, id="idle"),
    ],
)
def test_queue_grows_by_what_exceeds_capacity(
    arrivals: float, capacity: float, seconds: int, waiting: float, running: float
) -> None:
    state = EngineState()
    for _ in range(seconds):
        step(state, arrivals, capacity, 1.0)
    assert state.waiting == pytest.approx(waiting)
    assert state.running == pytest.approx(running)
    assert state.generated_tokens == pytest.approx(min(arrivals, capacity) * seconds * TOKENS_PER_REQUEST)
    assert state.ttft_count == pytest.approx(min(arrivals, capacity) * seconds)


def test_a_queue_drains_at_the_spare_capacity_and_ttft_follows_the_wait() -> None:
    state = EngineState(waiting=300.0)
    step(state, 50.0, 100.0, 1.0)  # 50 spare: 250 left
    assert state.waiting == pytest.approx(250.0)
    assert state.ttft_sum / state.ttft_count == pytest.approx(PREFILL_SECONDS + 250.0 / 100.0)
    assert state.ttft_buckets[:5] == [0, 0, 0, 0, 0]  # 2.58 s is above the 1 s bucket
    assert state.kv_cache > 0.9  # a full batch and a queue


def test_the_router_holds_requests_while_no_pod_runs_and_hands_them_over() -> None:
    router = Router()
    for _ in range(10):
        assert router.step(2.0, 0, 1.0) == 0.0
    assert router.waiting == pytest.approx(20.0)
    for _ in range(100):
        router.step(2.0, 0, 1.0)
    assert router.waiting == pytest.approx(2.0 * ROUTER_HOLD_SECONDS)  # older requests gave up
    assert router.step(2.0, 1, 1.0) == pytest.approx(60.0)
    assert router.waiting == 0.0
    router.step(2.0, 0, 1.0)
    router.step(0.0, 0, 1.0)
    assert router.waiting == 0.0  # no traffic: nothing held


def families(fleet: Fleet) -> dict[str, list[Any]]:
    text = Renderer(fleet).render(dcgm=False)
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_fleet_serves_vllm_series_per_pod_and_the_router_queue_at_zero() -> None:
    fleet = Fleet(parse_scenario({"fleet": {"nodes": 1, "gpus_per_node": 4}}), start=T0)
    fleet.set_load("ml", "llm", LoadCurve.constant(150.0, fleet.now), qps_per_gpu=100.0, engine="vllm")
    for second in range(1, 11):
        fleet.advance(T0 + second)
    at_zero = families(fleet)
    assert "vllm:num_requests_waiting" not in at_zero
    (router,) = at_zero["router_queue_depth"]
    assert router.labels == {"namespace": "ml", "service": "llm"}
    assert router.value == pytest.approx(1500.0)
    fleet.set_pods([PodSpec("ml", "llm-a", "gpu-node-000", (0,), "llm")], replace=False)
    fleet.advance(T0 + 11)
    one = families(fleet)
    (waiting,) = one["vllm:num_requests_waiting"]
    assert waiting.labels == {"engine": "0", "model_name": "simulated/llm", "namespace": "ml", "pod": "llm-a"}
    assert waiting.value == pytest.approx(1500.0 + 50.0)  # what the router held, plus 150 - 100 this second
    assert one["router_queue_depth"][0].value == 0.0
    assert {s.name for s in one["vllm:time_to_first_token_seconds"]} == {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
    }
    fleet.set_pods(
        [PodSpec("ml", f"llm-{c}", "gpu-node-000", (i,), "llm") for i, c in enumerate("abc")], replace=True
    )
    before = waiting.value
    fleet.advance(T0 + 12)
    after = {s.labels["pod"]: s.value for s in families(fleet)["vllm:num_requests_waiting"]}
    assert after["llm-a"] < before  # three pods: 50 req/s each, 50 spare on llm-a drains its queue
    assert after["llm-b"] == 0.0


def test_tgi_shaped_series() -> None:
    fleet = Fleet(parse_scenario({"fleet": {"nodes": 1, "gpus_per_node": 2}}), start=T0)
    fleet.set_load("ml", "tgi", LoadCurve.constant(10.0, fleet.now), engine="tgi")
    fleet.set_pods([PodSpec("ml", "tgi-a", "gpu-node-000", (0,), "tgi")], replace=False)
    fleet.advance(T0 + 5)
    got = families(fleet)
    assert got["tgi_queue_size"][0].value == 0.0
    assert got["tgi_batch_current_size"][0].value == pytest.approx(10.0 * DECODE_SECONDS)
    tokens = {s.name: s.value for s in got["tgi_request_generated_tokens"]}
    assert tokens["tgi_request_generated_tokens_sum"] == pytest.approx(5 * 10.0 * TOKENS_PER_REQUEST)
