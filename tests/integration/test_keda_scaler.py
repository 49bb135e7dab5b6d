"""KEDA's external scaler end to end: a REAL Prometheus, the adapter's own cache, real gRPC clients.

History for ten minutes ending at T is backfilled with promtool (dcgm-exporter GPU series, a queue gauge,
a pending-requests gauge that turns from 0 to 4 half-way); the adapter's clock is pinned (and moved by the
tests), so every query evaluates at a known time. The adapter serves its gRPC port with mutual TLS, as a
KEDA TriggerAuthentication (caCert, tlsClientCert, tlsClientKey) would use it. Clients:

- the generated Python stub (every RPC, status codes, the Prometheus query count under load);
- KEDA's own external-scaler client (`github.com/kedacore/keda/v2/pkg/scalers`, `make keda-client` builds
  tests/keda into .cache/kedaclient): the HPA target and metric quantities KEDA itself computes, the
  activity it reads, its error on missing data and external-push activation.

The values must equal those computed by hand from the data, and those the external.metrics.k8s.io and
custom.metrics.k8s.io routes of the same adapter answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from adapter.app import Adapter
from adapter.kedaapi import externalscaler_pb2 as pb
from adapter.kedaapi import externalscaler_pb2_grpc as pb_grpc
from adapter.objects import LabelIndex
from adapter.resources import PODS
from gpuwarden.config.root import Config
from gpuwarden.ports import free_port
from harness.localprom import LocalPrometheus, backfill_openmetrics
from tests.pki import CA

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
KEDACLIENT = Path(os.environ.get("GPUWARDEN_KEDACLIENT", ROOT / ".cache" / "kedaclient" / "kedaclient"))
STEP, POINTS = 15, 41  # ten minutes of history
SWITCH = 20  # pending_requests is 0 before this sample, 4 from it on

# (node, gpu, pod, namespace, util)
GPUS = [
    ("node-1", 0, "llm-a", "ml", 40.0),
    ("node-1", 1, "llm-a", "ml", 60.0),
    ("node-2", 0, "llm-b", "ml", 73.5),
    ("node-2", 1, "other-c", "ml", 10.0),
    ("node-3", 0, "web-x", "prod", 90.0),
]
POD_LABELS = {
    ("ml", "llm-a"): {"app": "llm"},
    ("ml", "llm-b"): {"app": "llm"},
    ("ml", "other-c"): {"app": "x"},
}
EXTERNAL_RULES = [
    {
        "seriesQuery": "queue_depth",
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)",
    },
    {
        "seriesQuery": "pending_requests",
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (model)",
    },
]
QUEUE = {"metricName": "queue_depth", "labelSelector": "queue in (a,b)", "targetValue": "5"}
GPU = {
    "preset": "gpu-utilization",
    "labelSelector": "app=llm",
    "targetValue": "60",
    "activationThreshold": "100",
}
PENDING = {"metricName": "pending_requests", "targetValue": "2"}


def history(t_end: int) -> str:
    fams: dict[str, list[str]] = {"DCGM_FI_DEV_GPU_UTIL": [], "queue_depth": [], "pending_requests": []}
    for i in range(POINTS):
        ts = t_end - (POINTS - 1 - i) * STEP
        for node, gpu, pod, ns, util in GPUS:
            labels = f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}",pod="{pod}",namespace="{ns}"'
            fams["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util} {ts}")
        for queue, ns, depth in (("a", "ml", 7), ("b", "ml", 5), ("c", "prod", 100)):
            fams["queue_depth"].append(f'queue_depth{{queue="{queue}",namespace="{ns}"}} {depth} {ts}')
        pending = 4 if i >= SWITCH else 0
        fams["pending_requests"].append(f'pending_requests{{model="m1",namespace="ml"}} {pending} {ts}')
    out: list[str] = []
    for name, lines in fams.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    return "\n".join(out) + "\n# EOF\n"


class Clock:
    """Wall time and query evaluation time of the adapter, moved by the tests."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Pki:
    server_ca: CA
    client_cert: bytes
    client_key: bytes
    files: dict[str, str]

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.server_ca.pem,
            private_key=self.client_key,
            certificate_chain=self.client_cert,
        )

    def auth_params(self) -> dict[str, str]:
        """What a KEDA TriggerAuthentication hands the external scaler (PEM content, not paths)."""
        return {
            "caCert": self.server_ca.pem.decode(),
            "tlsClientCert": self.client_cert.decode(),
            "tlsClientKey": self.client_key.decode(),
        }


@dataclass
class Stack:
    adapter: Adapter
    clock: Clock
    t_end: int
    port: int
    pki: Pki
    http: TestClient[Any, Any]
    stub: Any

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def value_queries(self) -> float:
        total = 0.0
        for outcome in ("success", "empty"):
            labels = {"purpose": "values", "outcome": outcome}
            total += (
                self.adapter.collector_registry.get_sample_value(
                    "gpuwarden_adapter_prometheus_queries_total", labels
                )
                or 0.0
            )
        return total


def make_pki(tmp: Path) -> Pki:
    server_ca, client_ca = CA.new("keda-scaler-server"), CA.new("keda-clients")
    cert, key = server_ca.issue("localhost", server=True)
    client_cert, client_key = client_ca.issue("keda-operator", server=False)
    files = {"cert_file": cert, "key_file": key, "client_ca_file": client_ca.pem}
    paths = {}
    for name, pem in files.items():
        (tmp / name).write_bytes(pem)
        paths[name] = str(tmp / name)
    return Pki(server_ca, client_cert, client_key, paths)


def label_index() -> LabelIndex:
    index = LabelIndex([PODS])
    for (ns, name), labels in POD_LABELS.items():
        index.upsert(PODS, ns, name, labels)
    index.mark_synced(PODS)
    return index


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir = tmp_path_factory.mktemp("keda-prom")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    pki = make_pki(tmp_path_factory.mktemp("keda-pki"))
    port = free_port()
    async with LocalPrometheus(workdir) as prom:
        config = Config.model_validate(
            {
                "prometheus": {"url": prom.url, "retries": 0},
                "adapter": {
                    "externalRules": EXTERNAL_RULES,
                    "authentication": {"enabled": False},
                    "metrics_max_age_seconds": 900,
                    "keda": {"enabled": True, "bind_address": "127.0.0.1", "port": port, "tls": pki.files},
                },
            }
        )
        clock = Clock(float(t_end))
        adapter = Adapter(config, index=label_index(), clock=clock)
        assert await adapter.discovery.relist()
        app = await adapter.start()
        await adapter.serve_keda()
        async with TestClient(TestServer(app)) as http:
            channel = grpc.aio.secure_channel(f"localhost:{port}", pki.credentials())
            try:
                yield Stack(adapter, clock, t_end, port, pki, http, pb_grpc.ExternalScalerStub(channel))
            finally:
                await channel.close()
        await adapter.stop()


def ref(metadata: dict[str, str], name: str = "so") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="ml", scalerMetadata=metadata)


async def get_metric(stack: Stack, metadata: dict[str, str]) -> float:
    response = await stack.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(metadata)))
    assert len(response.metricValues) == 1
    value: float = response.metricValues[0].metricValueFloat
    return value


# ---- the Python stub -------------------------------------------------------------------------------


async def test_external_metric_value_spec_and_activity_match_the_external_metrics_api(stack: Stack) -> None:
    spec = await stack.stub.GetMetricSpec(ref(QUEUE))
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
        ("gpuwarden-queue_depth", 5, 5.0)
    ]
    response = await stack.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE)))
    assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in response.metricValues] == [
        ("gpuwarden-queue_depth", 12, 12.0)  # 7 (queue a) + 5 (queue b)
    ]
    assert (await stack.stub.IsActive(ref(QUEUE))).result is True
    api = await stack.http.get(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/queue_depth?labelSelector=queue+in+%28a%2Cb%29"
    )
    body = await api.json()
    assert sorted(item["value"] for item in body["items"]) == ["5", "7"]  # the HPA's sum is the same 12


async def test_gpu_preset_sums_per_pod_utilization_like_the_custom_metrics_api(stack: Stack) -> None:
    value = await get_metric(stack, GPU)
    assert value == 123.5  # llm-a (40 + 60) / 2 = 50, llm-b 73.5; other-c has app=x
    api = await stack.http.get(
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization?labelSelector=app%3Dllm"
    )
    body = await api.json()
    assert {item["describedObject"]["name"]: item["value"] for item in body["items"]} == {
        "llm-a": "50",
        "llm-b": "73500m",
    }
    assert await get_metric(stack, {**GPU, "aggregation": "avg"}) == 61.75
    assert (await stack.stub.IsActive(ref(GPU))).result is True  # 123.5 > activationThreshold 100
    assert (await stack.stub.IsActive(ref({**GPU, "activationThreshold": "123.5"}))).result is False


@pytest.mark.parametrize(
    ("metadata", "code", "detail"),
    [
        pytest.param(
            {**QUEUE, "labelSelector": "queue=zzz"},
            "NOT_FOUND",
            "no value for external metric",
            id="no-series",
        ),
        pytest.param(
            {**QUEUE, "metricName": "nope"},
            "NOT_FOUND",
            "could not find the external metric nope",
            id="no-metric",
        ),
        pytest.param(
            {**GPU, "labelSelector": "app=none"}, "NOT_FOUND", "no value for custom metric", id="no-pods"
        ),
        pytest.param(
            {**QUEUE, "targetValue": "0"},
            "INVALID_ARGUMENT",
            "targetValue: 0 must be greater than 0",
            id="bad",
        ),
    ],
)
async def test_missing_data_is_an_error_never_zero(
    stack: Stack, metadata: dict[str, str], code: str, detail: str
) -> None:
    for call in (
        stack.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(metadata))),
        stack.stub.IsActive(ref(metadata)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code().name == code
        assert detail in (caught.value.details() or "")


async def test_many_scaled_objects_cost_one_prometheus_query_per_distinct_metric(stack: Stack) -> None:
    await get_metric(stack, QUEUE)  # warm
    before = stack.value_queries()
    calls = [
        stack.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE, name=f"so-{i}")))
        for i in range(200)
    ] + [stack.stub.IsActive(ref(QUEUE, name=f"so-{i}")) for i in range(200)]
    answers = await asyncio.gather(*calls)
    assert {a.metricValues[0].metricValueFloat for a in answers[:200]} == {12.0}
    assert stack.value_queries() == before  # 400 RPCs, 0 Prometheus queries: all from the cache
    stack.clock.now += 15  # one refresh interval later: the background refresh re-runs each entry once
    refreshed = await stack.adapter.cache.refresh_due() if stack.adapter.cache else 0
    assert refreshed >= 1
    assert stack.value_queries() == before + refreshed
    stack.clock.now -= 15


async def test_self_metrics_per_rpc(stack: Stack) -> None:
    await stack.stub.GetMetricSpec(ref(QUEUE))
    sample = stack.adapter.collector_registry.get_sample_value
    assert (sample("gpuwarden_adapter_keda_requests_total", {"rpc": "GetMetricSpec", "code": "OK"}) or 0) >= 1
    assert (
        sample("gpuwarden_adapter_keda_requests_total", {"rpc": "GetMetrics", "code": "NOT_FOUND"}) or 0
    ) >= 1
    assert (sample("gpuwarden_adapter_items_served_total", {"api": "keda"}) or 0) >= 1


async def test_a_client_without_the_trusted_certificate_is_refused(stack: Stack) -> None:
    async with grpc.aio.secure_channel(
        stack.address, grpc.ssl_channel_credentials(root_certificates=stack.pki.server_ca.pem)
    ) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.ExternalScalerStub(channel).IsActive(ref(QUEUE), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_external_push_activates_from_the_cache_refresh(stack: Stack) -> None:
    switch_at = stack.t_end - (POINTS - 1 - SWITCH) * STEP
    stack.clock.now = switch_at - 2 * STEP  # pending_requests is still 0 here
    try:
        stream = stack.stub.StreamIsActive(ref(PENDING))
        assert (await asyncio.wait_for(stream.read(), timeout=10)).result is False
        stack.clock.now = switch_at  # 4 pending requests from now on
        assert stack.adapter.cache is not None
        await stack.adapter.cache.refresh_due(everything=True)  # what the refresher does every interval
        assert (await asyncio.wait_for(stream.read(), timeout=10)).result is True
        stream.cancel()
    finally:
        stack.clock.now = float(stack.t_end)


# ---- KEDA's own client -----------------------------------------------------------------------------


def kedaclient_binary() -> str:
    """The built client; a missing binary fails the test (the tier never skips silently)."""
    if not KEDACLIENT.is_file():
        pytest.fail(f"{KEDACLIENT} is missing: run `make keda-client` (builds tests/keda with Go)")
    return str(KEDACLIENT)


async def kedaclient(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run KEDA's external-scaler client over `cases`; its JSON result per case id."""
    proc = await asyncio.create_subprocess_exec(
        kedaclient_binary(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps({"cases": cases}).encode()), timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    results = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    return {r["id"]: r for r in results}


def case(stack: Stack, case_id: str, metadata: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "id": case_id,
        "name": case_id,
        "namespace": "ml",
        "triggerIndex": extra.pop("triggerIndex", 0),
        "metricType": extra.pop("metricType", ""),
        "metadata": {"scalerAddress": stack.address, **metadata},
        "authParams": stack.pki.auth_params(),
        "op": extra.pop("op", "poll"),
        **extra,
    }


async def test_keda_client_reads_targets_values_and_activity(stack: Stack) -> None:
    results = await kedaclient(
        [
            case(stack, "queue", QUEUE),
            case(
                stack, "gpu-index-2-value", {**GPU, "targetValue": "62.5"}, triggerIndex=2, metricType="Value"
            ),
            case(stack, "gpu-inactive", {**GPU, "activationThreshold": "200"}),
            case(stack, "no-data", {**QUEUE, "labelSelector": "queue=zzz"}),
            case(stack, "bad-metadata", {**QUEUE, "targetValue": "lots"}),
        ]
    )
    queue = results["queue"]
    assert queue["specs"] == [
        {"name": "s0-gpuwarden-queue_depth", "targetType": "AverageValue", "averageValue": "5"}
    ]
    assert queue["values"] == [{"name": "s0-gpuwarden-queue_depth", "value": "12"}]
    assert (queue["active"], queue.get("error")) == (True, None)
    gpu = results["gpu-index-2-value"]
    # KEDA writes floats as resource.MustParse("%.3f"): 62.5 -> "62.500"
    assert gpu["specs"] == [
        {"name": "s2-gpuwarden-gpu_utilization", "targetType": "Value", "value": "62.500"}
    ]
    assert gpu["values"] == [{"name": "s2-gpuwarden-gpu_utilization", "value": "123.500"}]
    assert gpu["active"] is True
    assert results["gpu-inactive"]["active"] is False
    assert results["gpu-inactive"]["values"] == [{"name": "s0-gpuwarden-gpu_utilization", "value": "123.500"}]
    no_data = results["no-data"]
    assert no_data["values"] == [] and "NotFound" in no_data["error"] and "no value" in no_data["error"]
    bad = results["bad-metadata"]
    assert bad["specs"] == [] and "GetMetricSpecForScaling returned no metric spec" in bad["error"]


async def test_keda_client_external_push_activates_from_zero(stack: Stack) -> None:
    switch_at = stack.t_end - (POINTS - 1 - SWITCH) * STEP
    stack.clock.now = switch_at - 2 * STEP
    assert stack.adapter.keda is not None
    try:
        # the selectors of an external metric share one cache entry (adapter/sharing.py), which earlier
        # tests filled at a later clock: refresh it at this one, where pending_requests is still 0
        assert stack.adapter.cache is not None
        await stack.adapter.cache.refresh_due(everything=True)
        pending = {**PENDING, "labelSelector": "model=m1"}
        run = asyncio.ensure_future(kedaclient([case(stack, "push", pending, op="push", pushSeconds=8)]))
        deadline = time.monotonic() + 6
        while stack.adapter.keda.open_streams == 0:  # KEDA's Run has opened StreamIsActive
            assert time.monotonic() < deadline, "KEDA never opened StreamIsActive"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let the state on open reach KEDA first
        stack.clock.now = switch_at
        assert stack.adapter.cache is not None
        await stack.adapter.cache.refresh_due(everything=True)
        push = (await run)["push"]
    finally:
        stack.clock.now = float(stack.t_end)
    assert push["pushed"] == [False, True]
    # KEDA >= 2.21 also opened StreamMetricSpec: it got the spec once (targets come from the metadata) and the
    # stream stayed open, rather than UNIMPLEMENTED or a stream KEDA re-opens every 2 s
    assert push["streamedSpecs"] == [
        [{"name": "s0-gpuwarden-pending_requests", "targetType": "AverageValue", "averageValue": "2"}]
    ]


async def test_keda_client_many_scaled_objects_share_the_cache(stack: Stack) -> None:
    assert stack.adapter.cache is not None
    await stack.adapter.cache.refresh_due(everything=True)  # every entry fresh at this clock (tests moved it)
    assert await get_metric(stack, QUEUE) == 12.0
    before = stack.value_queries()
    results = await kedaclient([case(stack, f"so-{i}", QUEUE, repeat=20) for i in range(50)])
    assert stack.value_queries() == before  # 50 ScaledObjects x 20 polls x 2 RPCs: no Prometheus query
    assert {r["values"][0]["value"] for r in results.values()} == {"12"}
    assert sum(r["calls"] for r in results.values()) == 1000


async def test_prometheus_gone_is_an_error_for_keda_once_the_cache_expires(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Last: a stack of its own whose Prometheus is stopped; KEDA must see errors (its fallback), not 0."""
    workdir = tmp_path_factory.mktemp("keda-prom-gone")
    t_end = (int(time.time()) // 3600 - 4) * 3600 + 1800
    backfill_openmetrics(workdir, history(t_end))
    port = free_port()
    prom = LocalPrometheus(workdir)
    await prom.start()
    try:
        config = Config.model_validate(
            {
                "prometheus": {"url": prom.url, "retries": 0, "timeout_seconds": 2},
                "adapter": {
                    "externalRules": EXTERNAL_RULES,
                    "authentication": {"enabled": False},
                    "metrics_max_age_seconds": 900,
                    "keda": {
                        "enabled": True,
                        "bind_address": "127.0.0.1",
                        "port": port,
                        "tls": {"plaintext": True},
                    },
                },
            }
        )
        clock = Clock(float(t_end))
        adapter = Adapter(config, clock=clock)
        assert await adapter.discovery.relist()
        await adapter.start()
        await adapter.serve_keda()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.ExternalScalerStub(channel)
                request = pb.GetMetricsRequest(scaledObjectRef=ref(QUEUE))
                assert (await stub.GetMetrics(request)).metricValues[0].metricValueFloat == 12.0
                await prom.stop()
                clock.now += 30  # within max_age (60 s): the cached answer is still served
                assert (await stub.GetMetrics(request)).metricValues[0].metricValueFloat == 12.0
                clock.now += 31  # past max_age, and Prometheus is gone
                for call in (stub.GetMetrics(request), stub.IsActive(ref(QUEUE))):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await call
                    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert caught.value.details() == "unable to fetch metrics: Prometheus is unavailable"
                metadata = {"scalerAddress": f"127.0.0.1:{port}", **QUEUE}
                keda = await kedaclient(
                    [{"id": "gone", "name": "so", "namespace": "ml", "metadata": metadata, "authParams": {}}]
                )
                assert keda["gone"]["values"] == [] and "Unavailable" in keda["gone"]["error"]
        finally:
            await adapter.stop()
    finally:
        await prom.stop()
