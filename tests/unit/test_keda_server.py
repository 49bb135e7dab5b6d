"""The KEDA external scaler's gRPC shell (`adapter.kedaserver`) over a real grpc.aio server and client.

Values come from a fake source (the provider's `external_items` / `custom_items`); everything else is real:
the generated stubs, the server, status codes, self-metrics, TLS and mutual TLS. Answers are compared with
golden JSON (tests/unit/golden/keda/answers.json); regenerate after an intended change with
`GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_keda_server.py` and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import json_format
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from adapter import kedascaler
from adapter.errors import Internal, Unavailable
from adapter.kedaapi import externalscaler_pb2 as pb
from adapter.kedaapi import externalscaler_pb2_grpc as pb_grpc
from adapter.kedaserver import ExternalScaler, server_credentials, start_server, status_of
from adapter.routing import CustomRoute, ExternalRoute
from adapter.selfmetrics import new_metrics, register_keda_snapshots
from gpuwarden.config.adapter import KedaScaler, Presets
from gpuwarden.errors import ConfigError
from gpuwarden.ports import free_port
from tests.pki import CA

GOLDEN = Path(__file__).parent / "golden" / "keda" / "answers.json"
NOW = 10_000.0


class FakeValues:
    """The provider's value reads: answers (or exceptions) by (metric, namespace, selector)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str, str], list[tuple[float, float]] | Exception] = {}
        self.reads = 0
        self.accounted: list[tuple[str, list[float]]] = []

    def _answer(self, key: tuple[str, str, str]) -> list[tuple[float, float]]:
        self.reads += 1
        answer = self.answers.get(key, [])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def external_items(
        self, route: ExternalRoute
    ) -> tuple[Any, list[tuple[dict[str, str], float, float]]]:
        points = self._answer((route.metric, route.namespace, str(route.selector)))
        return None, [({"queue": str(i)}, v, ts) for i, (v, ts) in enumerate(points)]

    async def custom_items(self, route: CustomRoute) -> tuple[Any, list[tuple[Any, float, float]]]:
        points = self._answer((route.metric, route.namespace, str(route.label_selector)))
        return None, [({"kind": "Pod", "name": f"p{i}"}, v, ts) for i, (v, ts) in enumerate(points)]

    def account(self, api: str, timestamps: list[float]) -> None:
        self.accounted.append((api, timestamps))


class Refreshes:
    """Stands in for the cache's refresh rounds: the test says when a round happened."""

    def __init__(self) -> None:
        self.rounds = 0
        self.event = asyncio.Event()

    async def refreshed(self, after: int) -> None:
        while self.rounds <= after:
            await self.event.wait()

    def fire(self) -> None:
        self.rounds += 1
        event, self.event = self.event, asyncio.Event()
        event.set()


class Served:
    def __init__(
        self,
        values: FakeValues,
        refreshes: Refreshes,
        scaler: ExternalScaler,
        registry: CollectorRegistry,
        stub: Any,
    ) -> None:
        self.values, self.refreshes, self.scaler, self.registry, self.stub = (
            values,
            refreshes,
            scaler,
            registry,
            stub,
        )

    def count(self, rpc: str, code: str) -> float:
        value = self.registry.get_sample_value(
            "gpuwarden_adapter_keda_requests_total", {"rpc": rpc, "code": code}
        )
        return value or 0.0


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    values, refreshes = FakeValues(), Refreshes()
    registry = CollectorRegistry()
    scaler = ExternalScaler(
        values,
        kedascaler.keda_presets(Presets()),
        metrics=new_metrics(registry),
        max_age=60.0,
        push_interval=30.0,
        max_streams=2,
        refreshes=refreshes,
        clock=lambda: NOW,
    )
    register_keda_snapshots(registry, streams=lambda: {(): float(scaler.open_streams)})
    cfg = KedaScaler.model_validate(
        {"enabled": True, "bind_address": "127.0.0.1", "port": free_port(), "tls": {"plaintext": True}}
    )
    server = await start_server(scaler, cfg, None)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{cfg.port}")
    try:
        yield Served(values, refreshes, scaler, registry, pb_grpc.ExternalScalerStub(channel))
    finally:
        await channel.close()
        await server.stop(None)


def ref(metadata: dict[str, str], namespace: str = "ml") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)


QUEUE = {"metricName": "queue_depth", "labelSelector": "queue in (a,b)", "targetValue": "10"}
GPU = {
    "preset": "gpu-utilization",
    "labelSelector": "app=llm",
    "targetValue": "70",
    "activationThreshold": "5",
}


async def answer(call: Any, request: Message) -> dict[str, Any]:
    """The response as JSON (all fields, defaults included), or the status code and details."""
    try:
        response = await call(request)
    except grpc.aio.AioRpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    return json_format.MessageToDict(response, always_print_fields_with_no_presence=True)


async def test_golden_answers(served: Served) -> None:
    v, stub = served.values, served.stub
    v.answers[("queue_depth", "ml", "queue in (a,b)")] = [(7.0, NOW), (5.5, NOW - 10)]
    v.answers[("queue_depth", "prod", "")] = [(0.0, NOW)]
    v.answers[("queue_depth", "old", "")] = [(3.0, NOW - 61)]
    v.answers[("queue_depth", "down", "")] = Unavailable("unable to fetch metrics: Prometheus is unavailable")
    v.answers[("queue_depth", "bug", "")] = Internal("Prometheus rejected 'sum(x': parse error at char 6")
    v.answers[("gpu_utilization", "ml", "app=llm")] = [(40.0, NOW), (73.5, NOW), (0.25, NOW)]
    prod = {"metricName": "queue_depth", "targetValue": "0.5", "namespace": "prod"}
    cases: list[tuple[str, Any, Message]] = [
        ("spec-external", stub.GetMetricSpec, ref(QUEUE)),
        ("spec-fractional-target", stub.GetMetricSpec, ref(prod)),
        ("spec-preset", stub.GetMetricSpec, ref(GPU)),
        (
            "metrics-external-sum",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE), metricName="gpuwarden-queue_depth"),
        ),
        (
            "metrics-preset-sum-over-pods",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref(GPU), metricName="gpuwarden-gpu_utilization"),
        ),
        (
            "metrics-real-zero",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref(prod), metricName=""),
        ),
        (
            "metrics-other-name",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE), metricName="gpuwarden-other"),
        ),
        ("active-external", stub.IsActive, ref(QUEUE)),
        ("inactive-zero", stub.IsActive, ref(prod)),
        ("active-above-threshold", stub.IsActive, ref(GPU)),
        (
            "no-data",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref({**QUEUE, "labelSelector": "queue=zzz"})),
        ),
        ("no-data-is-active", stub.IsActive, ref({**QUEUE, "labelSelector": "queue=zzz"})),
        ("stale", stub.GetMetrics, pb.GetMetricsRequest(scaledObjectRef=ref({**prod, "namespace": "old"}))),
        (
            "prometheus-down",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref({**prod, "namespace": "down"})),
        ),
        ("prometheus-down-is-active", stub.IsActive, ref({**prod, "namespace": "down"})),
        (
            "internal-detail-not-leaked",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref({**prod, "namespace": "bug"})),
        ),
        ("bad-metadata-spec", stub.GetMetricSpec, ref({"metricName": "q", "targetValue": "x", "typo": "1"})),
        (
            "bad-metadata-metrics",
            stub.GetMetrics,
            pb.GetMetricsRequest(scaledObjectRef=ref({"targetValue": "1"})),
        ),
        ("empty-ref", stub.IsActive, pb.ScaledObjectRef()),
        ("stream-metric-spec", lambda r: _first(stub.StreamMetricSpec(r)), ref(QUEUE)),
    ]
    got = {name: await answer(call, request) for name, call, request in cases}
    if os.environ.get("GPUWARDEN_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())


async def _first(stream: Any) -> Message:
    async for item in stream:
        return item  # type: ignore[no-any-return]
    raise AssertionError("stream ended without a message")


async def test_self_metrics_count_every_rpc_by_status(served: Served) -> None:
    served.values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(7.0, NOW)]
    stub = served.stub
    await stub.GetMetricSpec(ref(QUEUE))
    await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE)))
    await stub.IsActive(ref(QUEUE))
    await stub.IsActive(ref(QUEUE))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.IsActive(ref({"metricName": "q"}))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref({**QUEUE, "labelSelector": "x=y"})))
    assert served.count("GetMetricSpec", "OK") == 1
    assert served.count("GetMetrics", "OK") == 1
    assert served.count("IsActive", "OK") == 2
    assert served.count("IsActive", "INVALID_ARGUMENT") == 1
    assert served.count("GetMetrics", "NOT_FOUND") == 1
    histogram = served.registry.get_sample_value(
        "gpuwarden_adapter_keda_request_duration_seconds_count", {"rpc": "IsActive"}
    )
    assert histogram == 3
    assert ("keda", [NOW]) in served.values.accounted


async def test_stream_pushes_activity_on_open_and_on_change_after_refreshes(served: Served) -> None:
    key = ("queue_depth", "ml", "queue in (a,b)")
    v = served.values
    v.answers[key] = [(0.0, NOW)]
    stream = served.stub.StreamIsActive(ref(QUEUE))
    received: list[bool] = []

    async def next_push() -> bool:
        item = await asyncio.wait_for(stream.read(), timeout=5)
        received.append(item.result)
        return bool(item.result)

    assert await next_push() is False  # the state on open
    assert served.scaler.open_streams == 1
    assert served.registry.get_sample_value("gpuwarden_adapter_keda_open_streams") == 1
    reads = v.reads
    v.answers[key] = [(3.0, NOW)]
    served.refreshes.fire()
    assert await next_push() is True  # crossed activation: pushed at the refresh, not after a poll interval
    assert v.reads == reads + 1
    # unchanged, then undecidable (no data, Prometheus down): nothing is pushed
    served.refreshes.fire()
    v.answers[key] = Unavailable("down")
    await _until(lambda: v.reads >= reads + 2)
    served.refreshes.fire()
    await _until(lambda: v.reads >= reads + 3)
    v.answers[key] = [(0.0, NOW)]
    served.refreshes.fire()
    assert await next_push() is False
    assert received == [False, True, False]
    assert served.registry.get_sample_value("gpuwarden_adapter_keda_pushes_total", {"result": "true"}) == 1
    assert served.registry.get_sample_value("gpuwarden_adapter_keda_pushes_total", {"result": "false"}) == 2
    assert (
        served.registry.get_sample_value("gpuwarden_adapter_keda_pushes_total", {"result": "error"}) or 0
    ) >= 1
    stream.cancel()
    await _until(lambda: served.scaler.open_streams == 0)
    await _until(lambda: served.count("StreamIsActive", "CANCELLED") == 1)


async def test_stream_refuses_bad_metadata_and_too_many_streams(served: Served) -> None:
    served.values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(1.0, NOW)]
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await _first(served.stub.StreamIsActive(ref({"metricName": "q"})))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "targetValue: required" in (bad.value.details() or "")
    streams = [served.stub.StreamIsActive(ref(QUEUE)) for _ in range(2)]
    for s in streams:
        assert (await s.read()).result is True
    with pytest.raises(grpc.aio.AioRpcError) as full:
        await _first(served.stub.StreamIsActive(ref(QUEUE)))
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert served.count("StreamIsActive", "RESOURCE_EXHAUSTED") == 1
    for s in streams:
        s.cancel()
    await _until(lambda: served.scaler.open_streams == 0)


async def test_stream_metric_spec_sends_the_spec_on_open_and_stays_open(served: Served) -> None:
    """KEDA >= 2.21 opens StreamMetricSpec beside StreamIsActive and re-opens it 2 s after it ends: it must
    send the spec GetMetricSpec answers, then stay open; unchanged specs after refresh rounds are not sent."""
    stream = served.stub.StreamMetricSpec(ref(QUEUE))
    first = await asyncio.wait_for(stream.read(), timeout=5)
    assert first == await served.stub.GetMetricSpec(ref(QUEUE))
    assert served.scaler.open_streams == 1
    served.refreshes.fire()
    served.refreshes.fire()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stream.read(), timeout=0.3)
    # wait_for cancelled the read, which ends the call on the client side; the server sees CANCELLED
    await _until(lambda: served.scaler.open_streams == 0)
    await _until(lambda: served.count("StreamMetricSpec", "CANCELLED") == 1)
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await _first(served.stub.StreamMetricSpec(ref({"metricName": "q"})))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert served.count("StreamMetricSpec", "INVALID_ARGUMENT") == 1


async def test_metric_spec_warms_the_triggers_values_without_answering_or_counting(served: Served) -> None:
    v = served.values
    v.answers[("queue_depth", "ml", "queue in (a,b)")] = [(7.0, NOW)]
    reads = v.reads
    await served.stub.GetMetricSpec(ref(QUEUE))
    await _until(lambda: v.reads == reads + 1)  # read in the background: KEDA's first poll follows
    assert v.accounted == []  # nothing was served
    v.answers[("queue_depth", "ml", "queue in (a,b)")] = Unavailable("down")
    await served.stub.GetMetricSpec(ref(QUEUE))  # a failing read does not fail the spec
    await _until(lambda: v.reads == reads + 2)


async def test_triggers_are_parsed_once_per_namespace_and_metadata(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real = kedascaler.parse_trigger

    def counting(metadata: Any, namespace: str, presets: Any) -> Any:
        parsed.append(namespace)
        return real(metadata, namespace, presets)

    monkeypatch.setattr(kedascaler, "parse_trigger", counting)
    served.values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(7.0, NOW)]
    served.values.answers[("queue_depth", "web", "queue in (a,b)")] = [(2.0, NOW)]
    for _ in range(3):
        await served.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE)))
        await served.stub.IsActive(ref(QUEUE))
    assert parsed == ["ml"]
    got = await served.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE, namespace="web")))
    assert got.metricValues[0].metricValueFloat == 2.0  # the namespace is part of the key
    assert parsed == ["ml", "web"]
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError):
            await served.stub.IsActive(ref({"metricName": "q"}))
    assert parsed == ["ml", "web", "ml", "ml"]  # malformed metadata is not kept: each call says why


async def test_stream_without_cache_polls_at_push_interval() -> None:
    values = FakeValues()
    values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(0.0, NOW)]
    scaler = ExternalScaler(
        values,
        {},
        metrics=new_metrics(None),
        max_age=60,
        push_interval=0.05,
        max_streams=1,
        refreshes=None,
        clock=lambda: NOW,
    )
    cfg = KedaScaler.model_validate(
        {"bind_address": "127.0.0.1", "port": free_port(), "tls": {"plaintext": True}}
    )
    server = await start_server(scaler, cfg, None)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cfg.port}") as channel:
            stream = pb_grpc.ExternalScalerStub(channel).StreamIsActive(ref(QUEUE))
            assert (await stream.read()).result is False
            values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(2.0, NOW)]
            assert (await asyncio.wait_for(stream.read(), timeout=5)).result is True
            stream.cancel()
    finally:
        await server.stop(None)


async def _until(condition: Any) -> None:
    deadline = asyncio.get_running_loop().time() + 5.0
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        pytest.param(
            kedascaler.InvalidMetadata("bad"), grpc.StatusCode.INVALID_ARGUMENT, "bad", id="metadata"
        ),
        pytest.param(kedascaler.NoData("none"), grpc.StatusCode.NOT_FOUND, "none", id="no-data"),
        pytest.param(kedascaler.StaleData("old"), grpc.StatusCode.UNAVAILABLE, "old", id="stale"),
        pytest.param(Unavailable("down"), grpc.StatusCode.UNAVAILABLE, "down", id="prometheus-down"),
        pytest.param(
            Internal("secret detail"), grpc.StatusCode.INTERNAL, "unable to fetch metrics", id="internal"
        ),
        pytest.param(KeyError("bug"), grpc.StatusCode.INTERNAL, "unable to fetch metrics", id="any-bug"),
    ],
)
def test_status_of(exc: Exception, code: grpc.StatusCode, message: str) -> None:
    assert status_of(exc) == (code, message)


# ---- transport security -------------------------------------------------------------------------------


async def _serve_tls(tmp_path: Path, tls: dict[str, Any]) -> tuple[grpc.aio.Server, int]:
    values = FakeValues()
    values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(1.0, NOW)]
    scaler = ExternalScaler(
        values, {}, metrics=new_metrics(None), max_age=60, push_interval=30, max_streams=1, clock=lambda: NOW
    )
    cfg = KedaScaler.model_validate({"bind_address": "127.0.0.1", "port": free_port(), "tls": tls})
    fallback = CA.new("fallback").issue("localhost", server=True)
    return await start_server(scaler, cfg, server_credentials(cfg, lambda: fallback)), cfg.port


async def _is_active(port: int, credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
    async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
        try:
            await pb_grpc.ExternalScalerStub(channel).IsActive(ref(QUEUE), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _files(tmp_path: Path, **pems: bytes) -> dict[str, str]:
    out = {}
    for name, pem in pems.items():
        (tmp_path / name).write_bytes(pem)
        out[name] = str(tmp_path / name)
    return out


async def test_tls_serves_the_configured_certificate(tmp_path: Path) -> None:
    ca = CA.new()
    cert, key = ca.issue("localhost", server=True)
    files = _files(tmp_path, cert_file=cert, key_file=key)
    server, port = await _serve_tls(tmp_path, files)
    try:
        assert (
            await _is_active(port, grpc.ssl_channel_credentials(root_certificates=ca.pem))
            == grpc.StatusCode.OK
        )
        other = CA.new("other")
        assert (
            await _is_active(port, grpc.ssl_channel_credentials(root_certificates=other.pem))
            == grpc.StatusCode.UNAVAILABLE
        )
    finally:
        await server.stop(None)


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(tmp_path: Path) -> None:
    server_ca, client_ca, rogue_ca = CA.new("server"), CA.new("clients"), CA.new("rogue")
    cert, key = server_ca.issue("localhost", server=True)
    files = _files(tmp_path, cert_file=cert, key_file=key, client_ca_file=client_ca.pem)
    server, port = await _serve_tls(tmp_path, files)
    try:
        good_cert, good_key = client_ca.issue("keda-operator", server=False)
        rogue_cert, rogue_key = rogue_ca.issue("keda-operator", server=False)

        def creds(pair: tuple[bytes, bytes] | None) -> grpc.ChannelCredentials:
            if pair is None:
                return grpc.ssl_channel_credentials(root_certificates=server_ca.pem)
            return grpc.ssl_channel_credentials(
                root_certificates=server_ca.pem, private_key=pair[1], certificate_chain=pair[0]
            )

        assert await _is_active(port, creds((good_cert, good_key))) == grpc.StatusCode.OK
        assert await _is_active(port, creds(None)) == grpc.StatusCode.UNAVAILABLE
        assert await _is_active(port, creds((rogue_cert, rogue_key))) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


async def test_tls_without_files_serves_the_fallback_pair(tmp_path: Path) -> None:
    server, port = await _serve_tls(tmp_path, {})
    try:
        # the fallback pair is signed by a CA the client does not know: refused, so TLS is really on
        assert await _is_active(port, grpc.ssl_channel_credentials()) == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as plain:
                await pb_grpc.ExternalScalerStub(channel).IsActive(ref(QUEUE), timeout=5)
            assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        pytest.param(
            {"cert_file": "missing.crt", "key_file": "missing.key"}, "missing.crt", id="missing-cert"
        ),
        pytest.param({"client_ca_file": "garbage.pem"}, "garbage.pem: no PEM certificate", id="garbage-ca"),
        pytest.param(
            {"cert_file": "garbage.pem", "key_file": "garbage.pem"},
            "not a usable certificate and key",
            id="garbage-pair",
        ),
    ],
)
def test_unusable_tls_files_are_config_errors(tmp_path: Path, tls: dict[str, str], message: str) -> None:
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    cfg = KedaScaler.model_validate({"tls": {k: str(tmp_path / v) for k, v in tls.items()}})
    with pytest.raises(ConfigError) as caught:
        server_credentials(cfg, lambda: CA.new().issue("localhost", server=True))
    assert caught.value.problems[0][0] == "adapter.keda.tls"
    assert message in caught.value.problems[0][1]


def test_plaintext_has_no_credentials() -> None:
    cfg = KedaScaler.model_validate({"tls": {"plaintext": True}})
    assert server_credentials(cfg, lambda: (b"", b"")) is None


async def test_a_taken_port_is_a_config_error() -> None:
    scaler = ExternalScaler(
        FakeValues(), {}, metrics=new_metrics(None), max_age=60, push_interval=30, max_streams=1
    )
    cfg = KedaScaler.model_validate(
        {"bind_address": "127.0.0.1", "port": free_port(), "tls": {"plaintext": True}}
    )
    first = await start_server(scaler, cfg, None)
    try:
        with pytest.raises(ConfigError, match=r"adapter\.keda\.port"):
            await start_server(scaler, cfg, None)
    finally:
        await first.stop(None)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


async def test_a_rotated_pair_serves_new_handshakes_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    old_ca, new_ca = CA.new("old"), CA.new("new")
    files = _files(tmp_path, cert_file=b"", key_file=b"")
    cert, key = Path(files["cert_file"]), Path(files["key_file"])
    pair = old_ca.issue("localhost", server=True)
    _write(cert, pair[0])
    _write(key, pair[1])
    registry = CollectorRegistry()
    metrics = new_metrics(registry)
    values = FakeValues()
    values.answers[("queue_depth", "ml", "queue in (a,b)")] = [(1.0, NOW)]
    scaler = ExternalScaler(
        values, {}, metrics=metrics, max_age=60, push_interval=30, max_streams=1, clock=lambda: NOW
    )
    cfg = KedaScaler.model_validate({"bind_address": "127.0.0.1", "port": free_port(), "tls": files})
    server = await start_server(scaler, cfg, server_credentials(cfg, lambda: (b"", b""), metrics))

    def trusting(ca: CA) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=ca.pem)

    def reloads(outcome: str) -> float:
        return (
            registry.get_sample_value("gpuwarden_adapter_certificate_reloads_total", {"outcome": outcome})
            or 0.0
        )

    try:
        assert await _is_active(cfg.port, trusting(old_ca)) == grpc.StatusCode.OK
        new_cert, new_key = new_ca.issue("localhost", server=True)
        _write(key, new_key)
        _write(cert, new_cert + b"\n")  # a size change, whatever the clock's resolution
        assert await _is_active(cfg.port, trusting(new_ca)) == grpc.StatusCode.OK
        assert await _is_active(cfg.port, trusting(old_ca)) == grpc.StatusCode.UNAVAILABLE
        assert reloads("success") == 1
        _write(cert, b"not a certificate\n")
        assert await _is_active(cfg.port, trusting(new_ca)) == grpc.StatusCode.OK  # the last good pair
        assert reloads("invalid") == 1
    finally:
        await server.stop(None)
