"""The one Prometheus client: every PromQL query gpuwarden sends goes through `PrometheusClient`.

Why this module exists: the adapter, the health loop and `gpuwarden plan` all read Prometheus (or Thanos
Query, Mimir, VictoriaMetrics — same HTTP API, path prefix kept from `url`). One place gives one set of rules
for auth, tenancy headers, timeouts, retries, error mapping and self-metrics, and keeps httpx exceptions from
leaking: callers only ever see `gpuwarden.errors.PrometheusError` subclasses.

Timeout semantics: `timeout` (default `timeout_seconds`) is the budget of the whole call, retries included.
Each attempt gets what is left; Prometheus is sent a slightly smaller `timeout` so that normally it gives up
first and says so (503 `errorType: timeout`), and `asyncio.timeout` enforces the budget client-side anyway.
A retry only starts if its back-off still fits in the budget, so one slow query never stalls an HPA sync.
(Hence the `timeout` parameters, which ruff's ASYNC109 would rather see as a caller-side `asyncio.timeout`.)

Self-metrics are counted per HTTP attempt, so a retried-then-successful call shows its failed attempts.
What it must not do: cache, interpret metrics, or know about GPUs — that is the callers' business.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import TYPE_CHECKING, Final, NamedTuple, TypeAlias, TypeVar
from urllib.parse import urlencode

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuwarden import __version__, promjson
from gpuwarden.errors import (
    PrometheusBadQuery,
    PrometheusError,
    PrometheusServerError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from gpuwarden.httpxlib import httpx
from gpuwarden.promauth import build_auth, build_ssl_context, plain_http_verify
from gpuwarden.promtypes import (
    DurationLike,
    InstantResult,
    Matrix,
    ResponseShapeError,
    TimeLike,
    format_seconds,
    parse_query_data,
    parse_series_data,
    parse_string_list,
)

if TYPE_CHECKING:
    from gpuwarden.config.prometheus import PrometheusConfig

log = logging.getLogger(__name__)

Params: TypeAlias = list[tuple[str, str]]
_T = TypeVar("_T")

ENDPOINTS: Final = ("query", "query_range", "series", "labels", "label_values")
OUTCOMES: Final = ("success", "bad_query", "timeout", "unreachable", "server_error")
MAX_BACKOFF_SECONDS: Final = 5.0  # the config documents this cap
MAX_RETRY_AFTER_SECONDS: Final = 30.0  # a longer Retry-After counts as 30 s (and rarely fits a budget)
HTTPX_GRACE_SECONDS: Final = 1.0  # httpx' own timeouts sit behind asyncio.timeout, which is authoritative
_DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Metrics(NamedTuple):
    requests: Counter
    duration: Histogram


_metrics_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()


def _metrics_for(registry: CollectorRegistry) -> _Metrics:
    """One set of collectors per registry, so several clients may share a registry."""
    metrics = _metrics_by_registry.get(registry)
    if metrics is None:
        requests = Counter(
            "gpuwarden_prometheus_requests",
            "HTTP requests to Prometheus by API endpoint and outcome (every attempt, retries included).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        duration = Histogram(
            "gpuwarden_prometheus_request_duration_seconds",
            "Duration of HTTP requests to Prometheus, by API endpoint.",
            ["endpoint"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        for endpoint in ENDPOINTS:  # present from the start, so rate() sees the first failure
            duration.labels(endpoint)
            for outcome in OUTCOMES:
                requests.labels(endpoint, outcome)
        metrics = _metrics_by_registry[registry] = _Metrics(requests, duration)
    return metrics


def _outcome(err: PrometheusError) -> str:
    if isinstance(err, PrometheusBadQuery):
        return "bad_query"
    if isinstance(err, PrometheusTimeout):
        return "timeout"
    if isinstance(err, PrometheusServerError):
        return "server_error"
    return "unreachable"  # unreachable, or a credential file we could not read: the request was never sent


def _retry_after(header: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), capped; None when absent or bad."""
    if not header:
        return None
    try:
        seconds = float(header)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(header).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def _server_error(message: str, status: int, retry_after: float | None) -> PrometheusServerError:
    err = PrometheusServerError(message, status=status, retry_after=retry_after)
    if 400 <= status < 500 and status != 429:
        err.retryable = False  # 401/403/404/405…: asking again will not help
    return err


def _api_error(status: int, body: dict[str, object], retry_after: float | None) -> PrometheusError:
    """Map Prometheus' `{"status":"error","errorType":…,"error":…}` to our hierarchy, keeping its message."""
    error_type = str(body.get("errorType", ""))
    message = str(body.get("error", "")) or f"HTTP {status} ({error_type or 'no errorType'})"
    if error_type == "timeout":
        return PrometheusTimeout(message)
    if status in (400, 422) or error_type == "bad_data":
        return PrometheusBadQuery(message, error_type=error_type or "bad_data")
    return _server_error(message, status, retry_after)


async def _load(response: httpx.Response) -> object:
    """The decoded JSON body (a large vector a slice at a time: gpuwarden/promjson.py); None if it is not
    JSON."""
    try:
        return await promjson.loads(response.content)
    except ValueError:
        return None


def _decode(response: httpx.Response, body: object) -> tuple[object, list[str]]:
    """The `data` and `warnings` of a successful answer (`body`, decoded); otherwise the mapped error."""
    status = response.status_code
    retry_after = _retry_after(response.headers.get("Retry-After")) if status in (429, 503) else None
    if isinstance(body, dict) and body.get("status") == "error":
        raise _api_error(status, body, retry_after)
    if not 200 <= status < 300:
        snippet = response.text[:200].strip() or "empty body"
        raise _server_error(f"HTTP {status} from Prometheus: {snippet}", status, retry_after)
    if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
        what = "invalid or truncated JSON" if body is None else "JSON that is not a Prometheus API answer"
        raise PrometheusServerError(f"Prometheus answered HTTP {status} with {what}", status=status)
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list):
        raise PrometheusServerError("Prometheus answered with malformed warnings", status=status)
    return body["data"], [str(w) for w in warnings]


def _transport_error(exc: httpx.HTTPError, url: httpx.URL, remaining: float) -> PrometheusError:
    if isinstance(exc, httpx.TimeoutException):
        return PrometheusTimeout(f"no answer from {url} within {remaining:.3f}s ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol | httpx.ProxyError):
        return PrometheusUnreachable(f"cannot reach Prometheus at {url}: {exc or type(exc).__name__}")
    return PrometheusServerError(f"broken answer from Prometheus at {url}: {exc or type(exc).__name__}")


class PrometheusClient:
    """Async client for the Prometheus HTTP API; use as `async with PrometheusClient(cfg) as prom:`."""

    def __init__(
        self,
        config: PrometheusConfig,
        *,
        registry: CollectorRegistry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`registry=None` keeps self-metrics private (not exported); tests pass a fresh registry.

        `transport`, `clock`, `sleep` and `rng` are for tests: a respx/mock transport, and control over
        deadlines, back-off sleeps and jitter.
        """
        self.config = config
        self._metrics = _metrics_for(registry if registry is not None else CollectorRegistry())
        self._clock, self._sleep, self._rng = clock, sleep, rng or random.Random()
        base = httpx.URL(str(config.url))
        self._base = base.copy_with(query=None, fragment=None)
        self._prefix = base.path.rstrip("/")
        self._urls: dict[str, httpx.URL] = {}  # parsing URLs is a visible share of per-query cost
        self._url_params: Params = [*base.params.multi_items(), *config.extra_query_params.items()]
        tls = config.tls
        needs_tls = base.scheme == "https" or tls.ca_file or tls.cert_file or tls.insecure_skip_verify
        self._http = httpx.AsyncClient(
            transport=transport,
            verify=build_ssl_context(tls) if needs_tls else plain_http_verify(),
            auth=build_auth(config),
            headers={"User-Agent": f"gpuwarden/{__version__}", "Accept": "application/json"} | config.headers,
            timeout=config.timeout_seconds + HTTPX_GRACE_SECONDS,
            follow_redirects=False,
        )

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close pooled connections. Idempotent."""
        await self._http.aclose()

    async def query(
        self,
        promql: str,
        time: TimeLike | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InstantResult:
        """Instant query at `time` (default: the server's now)."""
        params: Params = [("query", promql)]
        if time is not None:
            params.append(("time", format_seconds(time)))
        data, warnings = await self._call("query", "/api/v1/query", params, timeout, send_timeout=True)
        return self._shaped("query", lambda d: parse_query_data(d, warnings), data)

    async def query_range(
        self,
        promql: str,
        start: TimeLike,
        end: TimeLike,
        step: DurationLike,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Matrix:
        """Range query over [start, end] every `step`."""
        params: Params = [
            ("query", promql),
            ("start", format_seconds(start)),
            ("end", format_seconds(end)),
            ("step", format_seconds(step)),
        ]
        data, warnings = await self._call(
            "query_range", "/api/v1/query_range", params, timeout, send_timeout=True
        )
        result = self._shaped("query_range", lambda d: parse_query_data(d, warnings), data)
        if not isinstance(result, Matrix):
            raise PrometheusServerError(f"query_range: expected a matrix, got {type(result).__name__}")
        return result

    async def series(
        self,
        matchers: Sequence[str],
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[dict[str, str]]:
        """Label sets of the series matching any of `matchers` (e.g. `['up{job="x"}']`)."""
        if not matchers:
            raise ValueError("series() needs at least one matcher")
        params = self._range_params(matchers, start, end)
        data, _ = await self._call("series", "/api/v1/series", params, timeout)
        return self._shaped("series", parse_series_data, data)

    async def labels(
        self,
        matchers: Sequence[str] = (),
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[str]:
        """Label names, optionally of the series matching `matchers`."""
        params = self._range_params(matchers, start, end)
        data, _ = await self._call("labels", "/api/v1/labels", params, timeout)
        return self._shaped("labels", parse_string_list, data)

    async def label_values(
        self,
        name: str,
        matchers: Sequence[str] = (),
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[str]:
        """Values of label `name` (this endpoint is GET-only in Prometheus)."""
        params = self._range_params(matchers, start, end)
        path = f"/api/v1/label/{name}/values"
        data, _ = await self._call("label_values", path, params, timeout, method="GET")
        return self._shaped("label_values", parse_string_list, data)

    @staticmethod
    def _range_params(matchers: Sequence[str], start: TimeLike | None, end: TimeLike | None) -> Params:
        params: Params = [("match[]", m) for m in matchers]
        if start is not None:
            params.append(("start", format_seconds(start)))
        if end is not None:
            params.append(("end", format_seconds(end)))
        return params

    @staticmethod
    def _shaped(endpoint: str, parse: Callable[[object], _T], data: object) -> _T:
        try:
            return parse(data)
        except ResponseShapeError as exc:
            raise PrometheusServerError(f"{endpoint}: malformed result: {exc}") from None

    async def _call(
        self,
        endpoint: str,
        path: str,
        params: Params,
        budget: float | None,
        *,
        send_timeout: bool = False,
        method: str | None = None,
    ) -> tuple[object, list[str]]:
        """Run one API call within its budget, retrying retryable failures with jittered back-off."""
        budget = self.config.timeout_seconds if budget is None else budget
        if budget <= 0:
            raise ValueError("timeout must be positive")
        deadline = self._clock() + budget
        attempt = 0
        while True:
            try:
                remaining = deadline - self._clock()
                return await self._attempt(endpoint, path, params, remaining, send_timeout, method)
            except PrometheusError as err:
                if not err.retryable or attempt >= self.config.retries:
                    raise
                delay = self._backoff(attempt, err.retry_after)
                if self._clock() + delay >= deadline:
                    raise
                attempt += 1
                log.debug("prometheus %s failed (%s); retry %d in %.3fs", endpoint, err, attempt, delay)
                await self._sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(MAX_BACKOFF_SECONDS, self.config.retry_backoff_seconds * 2.0**attempt)
        delay = delay / 2 + self._rng.uniform(0, delay / 2)  # "equal jitter": never zero, never in lockstep
        return max(delay, retry_after or 0.0)

    async def _attempt(
        self,
        endpoint: str,
        path: str,
        params: Params,
        remaining: float,
        send_timeout: bool,
        method: str | None,
    ) -> tuple[object, list[str]]:
        url = self._urls.get(path) or self._base.copy_with(path=self._prefix + path)
        if len(self._urls) < 32:  # the fixed endpoints plus a few label names; never unbounded
            self._urls[path] = url
        if remaining <= 0:
            self._record(endpoint, "timeout", None)
            raise PrometheusTimeout(f"{endpoint}: timeout budget spent before the request")
        if send_timeout:  # a little less than ours, so Prometheus gives up (and says so) first
            params = [*params, ("timeout", format_seconds(max(remaining - min(0.5, remaining * 0.1), 0.001)))]
        http_timeout = remaining + HTTPX_GRACE_SECONDS
        if (method or self.config.method) == "POST":
            body = urlencode(params).encode()
            request = self._http.build_request(
                "POST", url, params=tuple(self._url_params), content=body, timeout=http_timeout,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )  # fmt: skip
        else:
            query = (*self._url_params, *params)
            request = self._http.build_request("GET", url, params=query, timeout=http_timeout)
        started = time.perf_counter()
        err: PrometheusError
        try:
            async with asyncio.timeout(remaining):
                response = await self._http.send(request)
            result = _decode(response, await _load(response))
        except PrometheusError as exc:
            err = exc
        except TimeoutError:
            err = PrometheusTimeout(f"{endpoint}: no answer within {remaining:.3f}s (client-side limit)")
        except httpx.HTTPError as exc:
            err = _transport_error(exc, url, remaining)
        else:
            self._record(endpoint, "success", started)
            return result
        self._record(endpoint, _outcome(err), started)
        raise err

    def _record(self, endpoint: str, outcome: str, started: float | None) -> None:
        self._metrics.requests.labels(endpoint, outcome).inc()
        if started is not None:
            self._metrics.duration.labels(endpoint).observe(time.perf_counter() - started)
