"""KubeClient against a local HTTP server: config loading, error mapping, paging, patch types, raw watch.

These are the transport paths a real API server will not produce on demand (a 503 with Retry-After, a
truncated body, a refused connection, a watch idling while we close it). A tiny aiohttp server on loopback
plays the API server; everything else runs against the real control plane in tests/e2e/test_kube_access.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuwarden.errors import ConfigError, KubeError, KubeNotFound, KubeUnreachable
from gpuwarden.kube.client import METADATA_LIST, METADATA_WATCH, KubeClient, load_configuration
from gpuwarden.kube.connection import Connection
from gpuwarden.kube.connection import in_cluster as in_cluster_connection
from gpuwarden.kube.resources import NODES, PatchType


def kubeconfig(tmp_path: Path, server: str, token: str = "s3cret") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(autouse=True, params=["aiohttp", "streams"])
def http(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both transports: aiohttp's pool (adapter, controller) and plain asyncio streams
    (the node agent); both must map every failure alike."""
    original = KubeClient.__init__

    def init(self: KubeClient, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("http", request.param)
        original(self, *args, **kwargs)

    monkeypatch.setattr(KubeClient, "__init__", init)
    return str(request.param)


# ------------------------------------------------------------------------------------------ configuration
def test_kubeconfig_path_and_context(tmp_path: Path) -> None:
    cfg = load_configuration(kubeconfig=kubeconfig(tmp_path, "http://127.0.0.1:1"), context="other")
    assert cfg.host == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"kubeconfig": "/nonexistent/kubeconfig"}, "kubernetes.kubeconfig", id="missing-file"),
        pytest.param({"in_cluster": False}, "kubernetes.kubeconfig", id="nothing-to-load"),
        pytest.param({}, "kubernetes.kubeconfig", id="not-in-a-cluster"),
        pytest.param({"kubeconfig": "x", "in_cluster": True}, "kubernetes.in_cluster", id="both"),
    ],
)
def test_configuration_errors_name_the_field(
    kwargs: dict[str, Any], field: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # a ~/.kube/config must never be consulted
    with pytest.raises(ConfigError) as info:
        load_configuration(**kwargs)
    assert info.value.problems[0][0] == field


def test_unknown_context_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_configuration(kubeconfig=kubeconfig(tmp_path, "http://127.0.0.1:1"), context="nope")


# ------------------------------------------------------------------------------------------ fake server
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0", "resourceVersion": "3"}}


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


class FakeApi:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], str, Any]] = []
        self.accepts: list[str] = []
        self.watch_open = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        self.seen.append(
            (
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Content-Type", ""),
                json.loads(body) if body else None,
            )
        )
        assert request.headers["Authorization"] == "Bearer s3cret"
        self.accepts.append(request.headers.get("Accept", ""))
        name = request.path.rsplit("/", 1)[-1]
        if request.query.get("watch") == "true":
            return await self.watch(request)
        if request.method == "GET" and request.path == "/api/v1/nodes":
            if request.query.get("continue") == "page2":
                return web.json_response(
                    {"items": [{"metadata": {"name": "b"}}], "metadata": {"resourceVersion": "9"}}
                )
            return web.json_response(
                {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "page2"}}
            )
        if name == "missing":
            return status(404, "NotFound", 'nodes "missing" not found')
        if name == "busy":
            return web.Response(status=503, text="", headers={"Retry-After": "5"})
        if name == "slow":
            await asyncio.sleep(0.3)
        if name == "truncated":
            resp = web.StreamResponse(headers={"Content-Length": "1000", "Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"kind": "No')
            assert request.transport is not None
            request.transport.close()
            return resp
        if name == "notjson":
            return web.Response(text="<html>", content_type="application/json")
        return web.json_response(NODE | ({"echo": json.loads(body)} if body else {}))

    async def watch(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        one = json.dumps({"type": "ADDED", "object": NODE}).encode() + b"\n"
        two = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410}}).encode() + b"\n"
        await resp.write(one[:10])
        await resp.write(one[10:] + two[:5])
        await resp.write(two[5:])
        self.watch_open.set()
        if request.query.get("timeoutSeconds") == "1":
            return resp  # the server ends the watch
        await asyncio.sleep(30)  # idle, like a quiet watch
        return resp


@contextlib.asynccontextmanager
async def serving(handle: Any) -> AsyncIterator[str]:
    """`handle` answering every path on a loopback port; yields its base URL, stopped on exit."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[KubeClient, FakeApi, CollectorRegistry]]:
    fake = FakeApi()
    async with serving(fake.handle) as url:
        registry = CollectorRegistry()
        client = KubeClient.from_config(
            kubeconfig=kubeconfig(tmp_path, url), registry=registry, request_timeout=5
        )
        try:
            yield client, fake, registry
        finally:
            await client.aclose()


def count(registry: CollectorRegistry, verb: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "gpuwarden_kube_requests_total", {"verb": verb, "resource": "nodes", "outcome": outcome}
    )
    return value or 0.0


async def test_get_returns_raw_json_and_counts(api: tuple[KubeClient, FakeApi, CollectorRegistry]) -> None:
    client, _fake, registry = api
    assert await client.get(NODES, "gpu-0") == NODE
    assert count(registry, "get", "success") == 1


@pytest.mark.parametrize(
    ("name", "error", "outcome", "retry_after"),
    [
        pytest.param("missing", KubeNotFound, "not_found", None, id="404"),
        pytest.param("busy", KubeUnreachable, "unreachable", 5.0, id="503-retry-after"),
        pytest.param("truncated", KubeUnreachable, "unreachable", None, id="truncated-body"),
        pytest.param("notjson", KubeError, "error", None, id="invalid-json"),
    ],
)
async def test_errors_are_mapped_and_counted(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
    name: str,
    error: type[KubeError],
    outcome: str,
    retry_after: float | None,
) -> None:
    client, _fake, registry = api
    with pytest.raises(error) as info:
        await client.get(NODES, name)
    assert type(info.value) is error
    assert info.value.retry_after == retry_after
    assert count(registry, "get", outcome) == 1


async def test_connection_refused_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()
    client = KubeClient.from_config(
        kubeconfig=kubeconfig(tmp_path, f"http://127.0.0.1:{port}"), registry=registry
    )
    try:
        with pytest.raises(KubeUnreachable):
            await client.get(NODES, "gpu-0")
    finally:
        await client.aclose()
    assert count(registry, "get", "unreachable") == 1


async def test_event_loop_keeps_running_during_a_slow_call(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
) -> None:
    client, _fake, _ = api
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await client.get(NODES, "slow")
    task.cancel()
    assert ticks >= 10  # 0.3 s of server delay; a blocked loop would not tick at all


async def test_list_objects_follows_continue(api: tuple[KubeClient, FakeApi, CollectorRegistry]) -> None:
    client, fake, _ = api
    listed = await client.list_objects(NODES, label_selector="gpu=true", limit=1)
    assert [i["metadata"]["name"] for i in listed.items] == ["a", "b"]
    assert {(i["apiVersion"], i["kind"]) for i in listed.items} == {("v1", "Node")}  # filled in like a GET
    assert listed.resource_version == "9"
    queries = [q for (_m, _p, q, _c, _b) in fake.seen]
    assert queries == [
        {"labelSelector": "gpu=true", "limit": "1"},
        {"labelSelector": "gpu=true", "limit": "1", "continue": "page2"},
    ]


async def test_metadata_only_list_asks_for_partial_metadata_and_transforms_page_by_page(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
) -> None:
    client, fake, _ = api
    pages_seen: list[int] = []

    def keep_name(obj: dict[str, Any]) -> dict[str, Any]:
        pages_seen.append(len(fake.seen))  # requests sent so far when this item is transformed
        return {"metadata": {"name": obj["metadata"]["name"]}}

    listed = await client.list_objects(NODES, limit=1, metadata_only=True, transform=keep_name)
    assert listed.items == [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    assert pages_seen == [1, 2]  # each item transformed before the next page was requested
    assert fake.accepts == [METADATA_LIST, METADATA_LIST]
    assert METADATA_LIST.startswith("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,")
    await client.list_objects(NODES, limit=1)
    assert fake.accepts[-1] == "application/json"  # full objects unless asked


async def test_metadata_only_watch_sends_the_partial_metadata_accept_header(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
) -> None:
    client, fake, _ = api
    async with client.watch(NODES, resource_version="3", timeout_seconds=1, metadata_only=True) as stream:
        assert [e["type"] async for e in stream] == ["ADDED", "ERROR"]
    assert fake.accepts == [METADATA_WATCH]
    assert "as=PartialObjectMetadata;" in METADATA_WATCH


@pytest.mark.parametrize(
    ("patch_type", "body"),
    [
        pytest.param(PatchType.MERGE, {"metadata": {"labels": {"a": "b"}}}, id="merge"),
        pytest.param(PatchType.STRATEGIC, {"spec": {"taints": []}}, id="strategic"),
        pytest.param(PatchType.JSON, [{"op": "add", "path": "/metadata/labels/a", "value": "b"}], id="json"),
    ],
)
async def test_patch_sends_content_type_field_manager_and_subresource(
    api: tuple[KubeClient, FakeApi, CollectorRegistry], patch_type: PatchType, body: Any
) -> None:
    client, fake, _ = api
    result = await client.patch(
        NODES, "gpu-0", body, patch_type=patch_type, subresource="status", dry_run=True
    )
    assert result["echo"] == body
    method, path, query, content_type, _ = fake.seen[-1]
    assert (method, path, content_type) == ("PATCH", "/api/v1/nodes/gpu-0/status", patch_type.value)
    assert query == {"fieldManager": "gpuwarden", "dryRun": "All"}


async def test_patch_body_must_match_type(api: tuple[KubeClient, FakeApi, CollectorRegistry]) -> None:
    client, _, _ = api
    with pytest.raises(TypeError):
        await client.patch(NODES, "gpu-0", {"a": 1}, patch_type=PatchType.JSON)


async def test_watch_stream_reassembles_lines_and_ends_with_the_server(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
) -> None:
    client, fake, registry = api
    async with client.watch(NODES, resource_version="3", timeout_seconds=1) as stream:
        events = [e async for e in stream]
    assert [e["type"] for e in events] == ["ADDED", "ERROR"]  # ERROR passes through untouched
    assert events[0]["object"] == NODE
    _m, _p, query, _c, _b = fake.seen[-1]
    assert query == {
        "watch": "true",
        "resourceVersion": "3",
        "timeoutSeconds": "1",
        "allowWatchBookmarks": "true",
    }
    assert count(registry, "watch", "success") == 1


async def test_aclose_wakes_a_reader_blocked_on_an_idle_watch(
    api: tuple[KubeClient, FakeApi, CollectorRegistry],
) -> None:
    client, _fake, _ = api
    stream = client.watch(NODES, resource_version="3")
    assert (await anext(stream))["type"] == "ADDED"
    assert (await anext(stream))["type"] == "ERROR"
    reader = asyncio.create_task(anext(stream))  # blocks: the server is idle
    await asyncio.sleep(0.1)
    started = time.monotonic()
    reader.cancel()
    await stream.aclose()
    assert time.monotonic() - started < 2.0
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_idle_watches_never_starve_requests(tmp_path: Path) -> None:
    """Watches hold their connection for minutes: they have their own pool, so with one connection for
    requests and one for watches a GET still goes through while a watch idles (a shared pool of one would
    block it behind the watch)."""
    fake = FakeApi()
    async with serving(fake.handle) as url:
        client = KubeClient.from_config(
            kubeconfig=kubeconfig(tmp_path, url), max_connections=1, max_watches=1
        )
        try:
            stream = client.watch(NODES, resource_version="3")
            assert (await anext(stream))["type"] == "ADDED"  # connected; the server now idles for 30 s
            got = await asyncio.wait_for(asyncio.gather(*(client.get(NODES, "gpu-0") for _ in range(3))), 5)
            assert got == [NODE] * 3  # three requests share the one request connection in turn
            await stream.aclose()
        finally:
            await client.aclose()


def test_unreadable_client_certificate_is_a_config_error(tmp_path: Path) -> None:
    configuration = load_configuration(kubeconfig=kubeconfig(tmp_path, "https://127.0.0.1:6443"))
    configuration.cert_file = str(tmp_path / "missing.crt")
    configuration.key_file = str(tmp_path / "missing.key")
    with pytest.raises(ConfigError) as info:
        KubeClient(configuration)
    assert "kubernetes.kubeconfig" in str(info.value) and "TLS" in str(info.value)


async def test_bearer_token_is_asked_for_on_every_request_so_rotated_tokens_are_used(tmp_path: Path) -> None:
    """In-cluster and exec-plugin credentials rotate through the configuration's refresh hook; the async
    transport must ask for the token per request, not once."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response(NODE)

    async with serving(handle) as url:
        from kubernetes.client import Configuration  # an exec plugin's kubeconfig is loaded by `kubernetes`

        configuration = Configuration(host=url, api_key={"authorization": "t0"})
        tokens = iter(["t1", "t2", "t3", "t4", "t5"])

        def refresh(conf: Any) -> None:
            conf.api_key = {"authorization": next(tokens)}
            conf.api_key_prefix = {"authorization": "Bearer"}

        configuration.refresh_api_key_hook = refresh
        client = KubeClient(configuration, credential_ttl=0)
        cached = KubeClient(configuration)  # the default: asked at most once a second
        try:
            for _ in range(3):
                await client.get(NODES, "gpu-0")
            await cached.get(NODES, "gpu-0")
            await cached.get(NODES, "gpu-0")
        finally:
            await client.aclose()
            await cached.aclose()
    assert seen == ["Bearer t1", "Bearer t2", "Bearer t3", "Bearer t4", "Bearer t4"]


async def test_service_account_token_file_is_reread_so_rotated_tokens_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-cluster without `kubernetes`: the kubelet rotates the projected token file; each request (at most
    once per credential_ttl) reads it again."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response(NODE)

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_text("unused: the fake API server is plain HTTP\n")
    (account / "token").write_text("t1\n")
    async with serving(handle) as url:
        connection = in_cluster_connection(
            {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, account
        )
        assert connection is not None and connection.host == "https://h:1"
        connection.host = url
        client = KubeClient(connection, credential_ttl=0)
        try:
            await client.get(NODES, "gpu-0")
            (account / "token").write_text("t2\n")
            await client.get(NODES, "gpu-0")
        finally:
            await client.aclose()
    assert seen == ["Bearer t1", "Bearer t2"]


@pytest.mark.parametrize("loader", ["kubernetes", "connection"])
async def test_a_failing_credential_hook_is_a_kube_error(tmp_path: Path, loader: str) -> None:
    configuration: Any
    if loader == "kubernetes":
        from kubernetes.client import Configuration

        configuration = Configuration(host="http://127.0.0.1:9", api_key={"authorization": "t0"})

        def broken(conf: Any) -> None:
            raise OSError("token file unreadable")

        configuration.refresh_api_key_hook = broken
    else:  # the service account's token file vanished
        configuration = Connection(host="http://127.0.0.1:9", token_file=str(tmp_path / "token file"))
    client = KubeClient(configuration)
    try:
        with pytest.raises(KubeError, match=r"cannot get credentials for the API server: .*token file"):
            await client.get(NODES, "gpu-0")
    finally:
        await client.aclose()


async def test_watch_reassembles_a_large_event_from_small_chunks_and_fails_cleanly_on_garbage(
    tmp_path: Path,
) -> None:
    big = {"type": "ADDED", "object": NODE | {"data": "x" * 200_000}}
    tail = {"type": "MODIFIED", "object": NODE}
    body = json.dumps(big).encode() + b"\n\n" + json.dumps(tail).encode()  # last line without newline

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        payload = body if request.query.get("resourceVersion") == "1" else b"not json\n"
        for i in range(0, len(payload), 1000):
            await resp.write(payload[i : i + 1000])
        return resp

    async with serving(handle) as url:
        registry = CollectorRegistry()
        client = KubeClient.from_config(kubeconfig=kubeconfig(tmp_path, url), registry=registry)
        try:
            async with client.watch(NODES, resource_version="1") as stream:
                events = [e async for e in stream]
            assert events == [big, tail]
            stream = client.watch(NODES, resource_version="2")
            with pytest.raises(KubeError, match="invalid JSON"):
                await anext(stream)
            assert count(registry, "watch", "error") == 1
            with pytest.raises(StopAsyncIteration):  # closed on the error: the connection is already released
                await anext(stream)
        finally:
            await client.aclose()
