"""KEDA's external scaler over gRPC (`externalscaler.ExternalScaler`), answered from the adapter's cache.

Why in the adapter process: KEDA's own Prometheus trigger sends one query per trigger per poll and per HPA
read, never deduplicated. Served from here, every ScaledObject reads the provider's grouped cache — the one
the HPA's custom/external metrics requests read — so Prometheus load stays at one query per (metric,
namespace group) per refresh interval however many ScaledObjects there are. Every RPC is answered from
memory once the cache holds the entry.

This module is the I/O shell: it parses nothing itself (`adapter.kedascaler` decides), reads values through
`Provider.external_items` / `custom_items`, and maps failures to gRPC status codes exactly once, in `_call`:
bad metadata → INVALID_ARGUMENT, unknown metric or no data → NOT_FOUND, Prometheus down or stale data →
UNAVAILABLE, anything else → INTERNAL with a generic message (detail logged). Never a 0 instead of an error.

- `StreamIsActive` (trigger type `external-push`) re-evaluates after every cache refresh round and at
  least every `push_interval_seconds`, and sends the activity on open and whenever it changes (KEDA scales
  from zero on `true` at once; it ignores `false`).
- `StreamMetricSpec` (KEDA ≥ 2.21, optional; opened beside `StreamIsActive` by `external-push`) sends the
  metric spec on open and again whenever it changes, re-derived after every cache refresh round as
  `StreamIsActive` does, and stays open (KEDA re-opens a closed stream every 2 s). Targets come from the
  trigger's own metadata, so in practice one message per stream.
- `GetMetricSpec` (KEDA sets a trigger up, its first poll follows) starts a background read of the
  trigger's values, so that poll is answered from memory.
- Parsed triggers are kept by (namespace, metadata): KEDA sends the same `ScaledObjectRef` on every poll
  and HPA read, and parsing it (selectors, the metrics-API route) was the largest part of an answer's
  Python time (docs/keda.md, "Answer latency").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc

from adapter import kedascaler
from adapter.errors import ApiError, BadRequest, Internal, NotFound, Unavailable
from adapter.kedaapi import externalscaler_pb2 as pb
from adapter.kedaapi import externalscaler_pb2_grpc as pb_grpc
from adapter.kedascaler import Preset, Trigger, TriggerError
from adapter.kedatls import server_credentials
from adapter.registry import CustomMetric, ExternalMetric
from adapter.routing import CustomRoute, ExternalRoute
from adapter.selfmetrics import AdapterMetrics
from adapter.wire import ObjectReference
from gpuwarden.errors import ConfigError

if TYPE_CHECKING:
    from gpuwarden.config.adapter import KedaScaler

log = logging.getLogger(__name__)

__all__ = ["ExternalScaler", "server_credentials", "start_server", "status_of"]

T = TypeVar("T")
M = TypeVar("M", pb.IsActiveResponse, pb.GetMetricSpecResponse)

TRIGGER_CACHE_SIZE = 20_000
"""Parsed triggers kept: more than the ScaledObjects one KEDA runs; past it the oldest is dropped."""

_API_ERROR_CODES: tuple[tuple[type[ApiError], grpc.StatusCode], ...] = (
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
)


class Values(Protocol):
    """Where values come from: `adapter.provider.Provider` (its cache, or Prometheus per request)."""

    async def external_items(
        self, route: ExternalRoute
    ) -> tuple[ExternalMetric, list[tuple[dict[str, str], float, float]]]: ...

    async def custom_items(
        self, route: CustomRoute
    ) -> tuple[CustomMetric, list[tuple[ObjectReference, float, float]]]: ...

    def account(self, api: str, timestamps: list[float]) -> None: ...


class Refreshes(Protocol):
    """The cache's refresh rounds (`adapter.cache.ValueCache`), which external-push streams follow."""

    rounds: int

    async def refreshed(self, after: int) -> None: ...


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """(gRPC status code, message safe to show KEDA) for a failure while answering."""
    if isinstance(exc, TriggerError):
        return grpc.StatusCode[exc.code], exc.message
    if isinstance(exc, ApiError) and not isinstance(exc, Internal):
        for cls, code in _API_ERROR_CODES:
            if isinstance(exc, cls):
                return code, exc.message
    return grpc.StatusCode.INTERNAL, "unable to fetch metrics"


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    """The servicer: one instance per adapter, shared by every KEDA connection."""

    def __init__(
        self,
        provider: Values,
        presets: Mapping[str, Preset],
        *,
        metrics: AdapterMetrics,
        max_age: float,
        push_interval: float,
        max_streams: int,
        refreshes: Refreshes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`refreshes`: the cache's refresh rounds (None: no cache, streams poll every `push_interval`);
        `max_age` is the oldest value served, in seconds (the cache's max_age)."""
        self._provider = provider
        self._presets = dict(presets)
        self._metrics = metrics
        self._max_age = max_age
        self._push_interval = push_interval
        self._max_streams = max_streams
        self._refreshes = refreshes
        self._clock = clock
        self.open_streams = 0
        self._triggers: dict[tuple[str, tuple[tuple[str, str], ...]], Trigger] = {}
        self._warming: set[asyncio.Task[None]] = set()

    # ---- the decisions, with I/O -------------------------------------------------------------------

    def _trigger(self, ref: pb.ScaledObjectRef) -> Trigger:
        """The ref's parsed trigger, kept by (namespace, metadata); malformed metadata is not kept."""
        metadata = dict(ref.scalerMetadata)
        key = (ref.namespace, tuple(sorted(metadata.items())))
        trigger = self._triggers.get(key)
        if trigger is None:
            trigger = kedascaler.parse_trigger(metadata, ref.namespace, self._presets)
            if len(self._triggers) >= TRIGGER_CACHE_SIZE:
                del self._triggers[next(iter(self._triggers))]  # the oldest: a ScaledObject since changed
            self._triggers[key] = trigger
        return trigger

    async def evaluate(
        self, ref: pb.ScaledObjectRef, trigger: Trigger | None = None
    ) -> tuple[Trigger, float]:
        """(trigger, its current value) from the cache (or Prometheus); raises on no / stale data."""
        trigger = trigger or self._trigger(ref)
        try:
            points = await self._points(trigger.route)
        except NotFound as exc:  # e.g. an engine's series not seen yet: no pod has run
            if trigger.kind != "custom":
                raise
            raise NotFound(exc.message + kedascaler.AT_ZERO_HINT) from None
        value = kedascaler.decide_value(points, trigger, now=self._clock(), max_age=self._max_age)
        self._provider.account("keda", [max(ts for _, ts in points)])
        return trigger, value

    async def _points(self, route: ExternalRoute | CustomRoute) -> list[tuple[float, float]]:
        if isinstance(route, ExternalRoute):
            _, samples = await self._provider.external_items(route)
            return [(v, ts) for _, v, ts in samples]
        _, objects = await self._provider.custom_items(route)
        return [(v, ts) for _, v, ts in objects]

    def _warm(self, trigger: Trigger) -> None:
        """Read the trigger's values in the background, unanswered and uncounted.

        KEDA asks for a trigger's spec when it sets the trigger up and polls its value right after: read
        now, the value is in the cache by then (and the misses of many new triggers share batched
        queries) instead of the first poll of each waiting on Prometheus."""

        async def warm() -> None:
            try:
                await self._points(trigger.route)
            except Exception as exc:  # the poll that follows answers the error
                log.debug("KEDA trigger warm-up: %s", exc)

        task = asyncio.ensure_future(warm())
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)

    async def _call(self, rpc: str, context: grpc.aio.ServicerContext, answer: Awaitable[T]) -> T:
        """Run one unary answer: time it, count it by status code, turn failures into a gRPC status."""
        began = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await answer
        except Exception as exc:
            code, message = status_of(exc)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("KEDA %s failed", rpc)
            else:
                log.debug("KEDA %s: %s", rpc, message)
            await context.abort(code, message)
            raise AssertionError("unreachable: abort raises") from exc
        finally:
            self._metrics.keda_requests.labels(rpc, code.name).inc()
            self._metrics.keda_request_duration.labels(rpc).observe(time.perf_counter() - began)

    # ---- the RPCs ----------------------------------------------------------------------------------

    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        async def answer() -> pb.IsActiveResponse:
            trigger, value = await self.evaluate(request)
            return pb.IsActiveResponse(result=kedascaler.is_active(value, trigger.activation_threshold))

        return await self._call("IsActive", context, answer())

    def _spec(self, request: pb.ScaledObjectRef) -> pb.GetMetricSpecResponse:
        trigger = self._trigger(request)
        size, size_float = kedascaler.target_fields(trigger.target)
        spec = pb.MetricSpec(metricName=trigger.metric_name, targetSize=size, targetSizeFloat=size_float)
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        async def answer() -> pb.GetMetricSpecResponse:
            spec = self._spec(request)
            self._warm(self._trigger(request))
            return spec

        return await self._call("GetMetricSpec", context, answer())

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        async def answer() -> pb.GetMetricsResponse:
            trigger = self._trigger(request.scaledObjectRef)
            if request.metricName and request.metricName != trigger.metric_name:
                raise NotFound(
                    f"metric {request.metricName!r} is not this trigger's (it serves {trigger.metric_name!r})"
                )
            trigger, value = await self.evaluate(request.scaledObjectRef, trigger)
            as_int, as_float = kedascaler.metric_value_fields(value)
            item = pb.MetricValue(
                metricName=trigger.metric_name, metricValue=as_int, metricValueFloat=as_float
            )
            return pb.GetMetricsResponse(metricValues=[item])

        return await self._call("GetMetrics", context, answer())

    async def _stream(
        self,
        rpc: str,
        request: pb.ScaledObjectRef,
        context: grpc.aio.ServicerContext,
        current: Callable[[], Awaitable[M | None]],
    ) -> AsyncIterator[M]:
        """A push stream: `current()` after every cache refresh round (at least every push interval), sent
        on open and whenever it changes (None: undecided, nothing sent); open until KEDA cancels it."""
        code = grpc.StatusCode.OK
        try:
            if self.open_streams >= self._max_streams:
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
                await context.abort(code, f"too many open push streams ({self._max_streams})")
            try:
                self._trigger(request)
            except TriggerError as exc:
                code = grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, exc.message)
            self.open_streams += 1
            try:
                last: M | None = None
                while True:
                    seen = self._refreshes.rounds if self._refreshes is not None else 0
                    message = await current()
                    if message is not None and message != last:
                        last = message
                        yield message
                    await self._next_round(seen)
            finally:
                self.open_streams -= 1
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            self._metrics.keda_requests.labels(rpc, code.name).inc()

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        async def current() -> pb.IsActiveResponse | None:
            active = await self._activity(request)
            return None if active is None else pb.IsActiveResponse(result=active)

        last: bool | None = None
        async for message in self._stream("StreamIsActive", request, context, current):
            if message.result != last:
                self._metrics.keda_pushes.labels(str(message.result).lower()).inc()
                last = message.result
            yield message

    async def _activity(self, request: pb.ScaledObjectRef) -> bool | None:
        """The stream's activity now, or None when it cannot be decided (kept open; KEDA's poll decides)."""
        try:
            trigger, value = await self.evaluate(request)
        except Exception as exc:
            code, message = status_of(exc)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("KEDA StreamIsActive evaluation failed")
            else:
                log.debug("KEDA StreamIsActive: %s", message)
            self._metrics.keda_pushes.labels("error").inc()
            return None
        return kedascaler.is_active(value, trigger.activation_threshold)

    async def _next_round(self, seen: int) -> None:
        """Until a cache refresh round after round `seen`, or `push_interval` at most."""
        if self._refreshes is None:
            await asyncio.sleep(self._push_interval)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._refreshes.refreshed(seen), timeout=self._push_interval)

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        async def current() -> pb.GetMetricSpecResponse | None:
            try:
                return self._spec(request)
            except TriggerError:  # checked on open; a preset set cannot change under a running adapter
                return None

        async for message in self._stream("StreamMetricSpec", request, context, current):
            yield message


async def start_server(
    servicer: ExternalScaler, cfg: KedaScaler, credentials: grpc.ServerCredentials | None
) -> grpc.aio.Server:
    """Bind and start the gRPC server on `cfg.bind_address:cfg.port`; a taken port is a ConfigError."""
    options: list[tuple[str, Any]] = [
        ("grpc.so_reuseport", 0),  # a second process on the port must fail, not share it silently
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    address = f"{cfg.bind_address}:{cfg.port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise ConfigError([("adapter.keda.port", f"cannot listen on {address}: {exc}")]) from None
    if bound == 0:
        raise ConfigError([("adapter.keda.port", f"cannot listen on {address}")])
    await server.start()
    mode = "plaintext" if credentials is None else "mTLS" if cfg.tls.client_ca_file else "TLS"
    log.info("KEDA external scaler serving", extra={"address": address, "transport": mode})
    return server
