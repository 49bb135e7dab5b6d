"""PrometheusClient failure paths a real server cannot be made to produce: respx answers, fake clock/sleep.

Every row states the answer, the error class we promise, and its policy (retryable, status, retry_after);
no httpx exception may escape.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import respx
from prometheus_client import CollectorRegistry

from gpuwarden.errors import (
    PrometheusBadQuery,
    PrometheusError,
    PrometheusServerError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from tests.unit.test_promclient import BASE, FakeTime, golden, make_client, ok

QUERY = f"{BASE}/api/v1/query"
DEEP = '{"status":"success","data":' + "[" * 100_000 + "]" * 100_000 + "}"
"""Nested deeper than `json.loads` recurses: its `RecursionError` escaped the error mapping (issue 44, P1)."""
OVERFLOW = (
    '{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1%s,"1"]}]}}'
    % ("0" * 400)
)
"""A timestamp beyond a float's range: its `OverflowError` escaped the error mapping (issue 44, P1)."""


@pytest.fixture
def router() -> respx.MockRouter:
    """Routes only; it answers through the client's injected MockTransport, nothing is patched."""
    return respx.MockRouter(assert_all_called=False)


def text(status: int, body: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, text=body, headers=headers)


@pytest.mark.parametrize(
    ("response", "error", "expected"),
    [
        (ok("error_400_bad_data", 400), PrometheusBadQuery, {"error_type": "bad_data", "retryable": False}),
        (ok("error_422_execution", 422), PrometheusBadQuery, {"error_type": "execution", "retryable": False}),
        (ok("error_422_victoriametrics", 422), PrometheusBadQuery, {"error_type": "422"}),
        (ok("error_503_timeout", 503), PrometheusTimeout, {"retryable": True}),
        (ok("error_500_internal", 500), PrometheusServerError, {"status": 500, "retryable": True}),
        (text(502, "<html>Bad Gateway</html>"), PrometheusServerError, {"status": 502, "retry_after": None}),
        (text(429, "too many outstanding requests", **{"Retry-After": "3"}), PrometheusServerError,
         {"status": 429, "retry_after": 3.0, "retryable": True}),
        (text(503, "", **{"Retry-After": "120"}), PrometheusServerError,
         {"status": 503, "retry_after": 30.0}),
        (text(404, "404 page not found"), PrometheusServerError, {"status": 404, "retryable": False}),
        (text(401, "Unauthorized"), PrometheusServerError, {"status": 401, "retryable": False}),
        (httpx.Response(200, content=golden("vector_special_values")[:97]), PrometheusServerError,
         {"status": 200}),
        (text(200, "<html>login</html>"), PrometheusServerError, {"status": 200}),
        (httpx.Response(200, json={"status": "success"}), PrometheusServerError, {"status": 200}),
        (httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": {}}}),
         PrometheusServerError, {}),
        (httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []},
                                   "warnings": "oops"}), PrometheusServerError, {}),
        (text(200, DEEP), PrometheusServerError, {"status": 200}),
        (text(200, OVERFLOW), PrometheusServerError, {}),
    ],
    ids=[
        "400-bad-data", "422-execution", "422-victoriametrics", "503-prometheus-timeout", "500-internal",
        "502-html-proxy", "429-retry-after", "503-retry-after-capped", "404-wrong-prefix", "401-auth",
        "200-truncated-json", "200-not-json", "200-no-data", "200-result-not-list", "200-bad-warnings",
        "200-nested-too-deep", "200-timestamp-overflow",
    ],
)  # fmt: skip
async def test_error_mapping(
    router: respx.MockRouter, response: httpx.Response, error: type[PrometheusError], expected: dict[str, Any]
) -> None:
    route = router.post(QUERY).mock(return_value=response)
    async with make_client(router, retries=0) as prom:
        with pytest.raises(error) as caught:
            await prom.query("sum(")
    assert type(caught.value) is error
    for attribute, value in expected.items():
        assert getattr(caught.value, attribute) == value, attribute
    assert route.call_count == 1


async def test_bad_query_keeps_prometheus_message_and_is_never_retried(router: respx.MockRouter) -> None:
    route = router.post(QUERY).mock(return_value=ok("error_400_bad_data", 400))
    async with make_client(router, retries=3) as prom:
        with pytest.raises(PrometheusBadQuery) as caught:
            await prom.query("sum(")
    assert caught.value.message == 'invalid parameter "query": 1:5: parse error: unclosed left parenthesis'
    assert route.call_count == 1


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), PrometheusUnreachable),
        (httpx.ConnectTimeout("connect timed out"), PrometheusTimeout),
        (httpx.ReadTimeout("read timed out"), PrometheusTimeout),
        (httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
         PrometheusServerError),
        (httpx.ReadError("connection reset by peer"), PrometheusServerError),
    ],
    ids=["connect-refused", "connect-timeout", "read-timeout", "truncated-body", "reset"],
)  # fmt: skip
async def test_transport_errors_do_not_leak(
    router: respx.MockRouter, exc: httpx.HTTPError, error: type[PrometheusError]
) -> None:
    router.post(QUERY).mock(side_effect=exc)
    async with make_client(router, retries=0) as prom:
        with pytest.raises(error) as caught:
            await prom.query("up")
    assert type(caught.value) is error
    assert not isinstance(caught.value.__cause__, httpx.HTTPError)  # raised `from None`


async def test_503_with_retry_after_is_retried_then_succeeds(router: respx.MockRouter) -> None:
    fake = FakeTime()
    busy = text(503, "busy", **{"Retry-After": "2"})
    route = router.post(QUERY).mock(side_effect=[busy, ok("scalar")])
    async with make_client(router, fake, retries=2, retry_backoff_seconds=0.2) as prom:
        result = await prom.query("scalar(vector(2.5))")
    assert result.value == 2.5  # type: ignore[union-attr]
    assert route.call_count == 2
    assert fake.sleeps == [2.0]  # Retry-After beats the 0.1-0.2 s back-off


async def test_503_retries_exhausted_raises_server_error_with_retry_after(router: respx.MockRouter) -> None:
    fake = FakeTime()
    route = router.post(QUERY).mock(return_value=text(503, "busy", **{"Retry-After": "1"}))
    async with make_client(router, fake, retries=2, retry_backoff_seconds=0.2) as prom:
        with pytest.raises(PrometheusServerError) as caught:
            await prom.query("up")
    assert (caught.value.status, caught.value.retry_after) == (503, 1.0)
    assert route.call_count == 3
    assert fake.sleeps == [1.0, 1.0]


async def test_retry_after_longer_than_the_budget_is_not_waited_for(router: respx.MockRouter) -> None:
    fake = FakeTime()
    route = router.post(QUERY).mock(return_value=text(429, "slow down", **{"Retry-After": "20"}))
    async with make_client(router, fake, retries=5, timeout_seconds=5) as prom:
        with pytest.raises(PrometheusServerError) as caught:
            await prom.query("up")
    assert caught.value.retry_after == 20.0
    assert route.call_count == 1 and fake.sleeps == []


async def test_backoff_doubles_with_jitter_and_stays_within_bounds(router: respx.MockRouter) -> None:
    fake = FakeTime()
    route = router.post(QUERY).mock(side_effect=httpx.ConnectError("refused"))
    async with make_client(router, fake, retries=4, retry_backoff_seconds=0.2, timeout_seconds=60) as prom:
        with pytest.raises(PrometheusUnreachable):
            await prom.query("up")
    assert route.call_count == 5
    for attempt, delay in enumerate(fake.sleeps):
        full = 0.2 * 2**attempt
        assert full / 2 <= delay <= full, (attempt, delay)
    assert len(set(fake.sleeps)) == 4


async def test_slow_headers_hit_the_client_side_timeout(router: respx.MockRouter) -> None:
    async def stall(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return ok("scalar")

    router.post(QUERY).mock(side_effect=stall)
    async with make_client(router, retries=2) as prom:
        started = time.monotonic()
        with pytest.raises(PrometheusTimeout, match="client-side limit"):
            await prom.query("up", timeout=0.2)
        elapsed = time.monotonic() - started
    assert 0.15 <= elapsed < 2.0  # the budget covers retries too: no second 0.2 s attempt


async def test_self_metrics_count_every_attempt_by_outcome(router: respx.MockRouter) -> None:
    registry = CollectorRegistry()
    router.post(QUERY).mock(side_effect=[text(503, "busy"), ok("scalar"), ok("error_400_bad_data", 400)])
    async with make_client(router, registry=registry, retries=1) as prom:
        await prom.query("1")
        with pytest.raises(PrometheusBadQuery):
            await prom.query("sum(")

    def count(outcome: str) -> float | None:
        labels = {"endpoint": "query", "outcome": outcome}
        return registry.get_sample_value("gpuwarden_prometheus_requests_total", labels)

    assert (count("success"), count("server_error"), count("bad_query"), count("timeout")) == (1, 1, 1, 0)
    durations = registry.get_sample_value(
        "gpuwarden_prometheus_request_duration_seconds_count", {"endpoint": "query"}
    )
    assert durations == 3
    assert (
        registry.get_sample_value(
            "gpuwarden_prometheus_requests_total", {"endpoint": "series", "outcome": "unreachable"}
        )
        == 0
    )  # pre-initialised, so rate() sees the first failure


async def test_an_answer_nested_too_deep_is_counted_as_a_server_error(router: respx.MockRouter) -> None:
    registry = CollectorRegistry()
    router.post(QUERY).mock(return_value=text(200, DEEP))
    async with make_client(router, registry=registry, retries=0) as prom:
        with pytest.raises(PrometheusServerError):
            await prom.query("1")
    labels = {"endpoint": "query", "outcome": "server_error"}
    assert registry.get_sample_value("gpuwarden_prometheus_requests_total", labels) == 1


def test_two_clients_can_share_a_registry(router: respx.MockRouter) -> None:
    registry = CollectorRegistry()
    make_client(router, registry=registry)
    make_client(router, registry=registry)  # would raise "Duplicated timeseries" if registered twice
