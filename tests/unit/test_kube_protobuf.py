"""Kubernetes' protobuf wire format (gpuwarden/kube/protobuf.py) and the protobuf list+watch through
`KubeClient` and `ProtobufSource` against a loopback server playing the API server: the envelope, lists with
continue tokens, length-prefixed watch frames cut at any byte, ERROR events and error answers carrying a
protobuf `Status` (410 → relist, as for JSON), BOOKMARKs, and the JSON fallback. The real API server's
encoding is checked in tests/e2e/test_kube_access.py."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from controller.app import build_capabilities
from controller.gpus.podpb.pod_pb2 import Pod
from controller.gpus.podproto import pod_object
from gpuwarden.config.root import Config
from gpuwarden.errors import KubeError, KubeGone, KubeUnreachable
from gpuwarden.kube import PODS, Informer, KubeClient, ProtobufSource
from gpuwarden.kube.k8spb.runtime_pb2 import RawList, Status, Unknown, WatchEvent
from gpuwarden.kube.protobuf import (
    MAGIC,
    MAX_FRAME_BYTES,
    PROTOBUF,
    Frames,
    decode_list,
    status_body,
    watch_event,
)
from gpuwarden.kube.status import error_from_status
from gpuwarden.promclient import PrometheusClient
from tests.unit.test_kube_client import kubeconfig, serving


# ------------------------------------------------------------------------------ what the API server sends
def envelope(kind: str, raw: bytes, api_version: str = "v1") -> bytes:
    message = Unknown(raw=raw)
    message.typeMeta.apiVersion, message.typeMeta.kind = api_version, kind
    return MAGIC + message.SerializeToString()


def pod_message(name: str, rv: str, gpus: int = 1) -> bytes:
    pod = Pod()
    pod.metadata.name, pod.metadata.namespace, pod.metadata.resourceVersion = name, "ml", rv
    container = pod.spec.containers.add(name="main")
    container.resources.limits["nvidia.com/gpu"].string = str(gpus)
    return pod.SerializeToString()


def status_message(code: int, reason: str, message: str, retry_after: int = 0) -> bytes:
    status = Status(status="Failure", code=code, reason=reason, message=message)
    if retry_after:
        status.details.retryAfterSeconds = retry_after
    return status.SerializeToString()


def pod_list(names: list[str], rv: str, token: str = "") -> bytes:
    listed = RawList(items=[pod_message(n, rv) for n in names])
    listed.metadata.resourceVersion = rv
    if token:
        setattr(listed.metadata, "continue", token)
    return envelope("PodList", listed.SerializeToString())


def frame(kind: str, obj: bytes) -> bytes:
    """One watch frame: the 4-byte big-endian length, then a WatchEvent (no envelope) whose object is one."""
    event = WatchEvent(type=kind)
    event.object.raw = obj
    body = event.SerializeToString()
    return struct.pack(">I", len(body)) + body


# ----------------------------------------------------------------------------------------- wire, pure
FRAMES = [frame("ADDED", envelope("Pod", pod_message(f"p{i}", str(i), gpus=i))) for i in range(1, 4)]
STREAM = b"".join(FRAMES)


@pytest.mark.parametrize(
    "size", [1, 3, 4, 5, 17, len(FRAMES[0]), len(STREAM)], ids=lambda n: f"chunks-of-{n}"
)
def test_frames_are_cut_back_out_of_any_chunking(size: int) -> None:
    frames = Frames()
    out: list[bytes] = []
    for i in range(0, len(STREAM), size):
        out.extend(frames.feed(STREAM[i : i + size]))
    assert out == [f[4:] for f in FRAMES]
    assert frames.pending == 0


def test_a_frame_over_16_mib_is_refused_as_soon_as_its_length_is_read() -> None:
    """client-go's streaming decoder refuses frames over 16 MiB; before the cap a length field alone made
    the stream buffer up to 4 GiB (issue 44)."""
    assert Frames().feed(struct.pack(">I", MAX_FRAME_BYTES)) == []  # the limit itself: waited for
    with pytest.raises(KubeError, match="over the 16777216-byte limit"):
        Frames().feed(struct.pack(">I", MAX_FRAME_BYTES + 1) + b"x")
    frames = Frames()  # a good frame, then one over the limit, in one chunk: the good one first
    assert frames.feed(FRAMES[0] + struct.pack(">I", 0xFFFFFFFF)) == [FRAMES[0][4:]]
    with pytest.raises(KubeError):
        frames.feed(b"")


def test_an_object_the_decoder_refuses_is_a_kube_error() -> None:
    """A decoder's `ValueError` (podproto's `PodDecodeError`) escaped the watch stream and the list, which
    handle `KubeError` only (issue 44)."""
    raw = Pod().SerializeToString()
    event = WatchEvent(type="ADDED")
    event.object.raw = envelope("Pod", raw)

    def refuse(data: bytes) -> dict[str, Any]:
        raise ValueError("not a pod")

    with pytest.raises(KubeError, match="not a pod"):
        watch_event(event.SerializeToString(), refuse)
    listed = RawList(items=[raw])
    with pytest.raises(KubeError, match="not a pod"):
        decode_list(envelope("PodList", listed.SerializeToString()), refuse, "v1", "Pod")


def test_a_stream_cut_inside_a_frame_leaves_bytes_pending() -> None:
    frames = Frames()
    assert frames.feed(STREAM[:-1]) == [f[4:] for f in FRAMES[:2]]
    assert frames.pending == len(FRAMES[2]) - 1


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        pytest.param(
            "ADDED",
            envelope("Pod", pod_message("a", "7", gpus=2)),
            {
                "type": "ADDED",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "a", "namespace": "ml", "resourceVersion": "7"},
                    "spec": {
                        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
                    },
                },
            },
            id="added-pod",
        ),
        pytest.param(
            "BOOKMARK",
            envelope("Pod", Pod(metadata={"resourceVersion": "99"}).SerializeToString()),
            {
                "type": "BOOKMARK",
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"resourceVersion": "99"}},
            },
            id="bookmark",
        ),
        pytest.param(
            "ERROR",
            envelope("Status", status_message(410, "Expired", "too old resource version: 1 (5)")),
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "too old resource version: 1 (5)",
                    "reason": "Expired",
                    "code": 410,
                },
            },
            id="error-status",
        ),
    ],
)
def test_watch_event_reads_like_the_json_event(kind: str, obj: bytes, expected: dict[str, Any]) -> None:
    assert watch_event(frame(kind, obj)[4:], pod_object) == expected


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(frame("ADDED", pod_message("a", "1"))[4:], "without the k8s envelope", id="no-envelope"),
        pytest.param(WatchEvent().SerializeToString(), "not a watch event", id="no-type"),
        pytest.param(b"\x0a\xff\xff", "invalid protobuf", id="garbage"),
    ],
)
def test_watch_event_rejects(body: bytes, error: str) -> None:
    with pytest.raises(KubeError, match=error):
        watch_event(body, pod_object)


def test_list_items_are_decoded_one_by_one_with_kind_and_continue() -> None:
    listed = decode_list(pod_list(["a", "b"], "12", token="next"), pod_object, "v1", "Pod")
    assert [(i["kind"], i["metadata"]["name"]) for i in listed["items"]] == [("Pod", "a"), ("Pod", "b")]
    assert listed["metadata"] == {"resourceVersion": "12", "continue": "next"}
    assert decode_list(pod_list([], "13"), pod_object, "v1", "Pod")["metadata"] == {"resourceVersion": "13"}


@pytest.mark.parametrize(
    ("code", "body", "error", "retry_after"),
    [
        pytest.param(410, envelope("Status", status_message(410, "Expired", "x")), KubeGone, None, id="gone"),
        pytest.param(
            429, envelope("Status", status_message(429, "Busy", "y", 3)), KubeUnreachable, 3, id="retry"
        ),
        pytest.param(410, b"k8s\x00\xff", KubeGone, None, id="unreadable-envelope"),
    ],
)
def test_an_error_answer_in_protobuf_maps_like_json(
    code: int, body: bytes, error: type[KubeError], retry_after: float | None
) -> None:
    mapped = error_from_status(code, body)
    assert type(mapped) is error
    assert mapped.retry_after == retry_after
    if status_body(body):
        assert str(status_body(body)["message"]) in str(mapped)


# ------------------------------------------------------------------------- the client and an informer
class ProtobufApi:
    """Pods as the API server serves them to a protobuf client: two list pages, then watches scripted by
    `watches` (a list of frames bytes, cut into chunks of `chunk` bytes); `json=True` answers JSON."""

    def __init__(self, watches: list[bytes], *, chunk: int = 7, json: bool = False) -> None:
        self.watches = list(watches)
        self.chunk = chunk
        self.json = json
        self.accepts: list[str] = []
        self.queries: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.accepts.append(request.headers.get("Accept", ""))
        self.queries.append(dict(request.query))
        if self.json:
            return await self.json_answer(request)
        if request.query.get("watch") != "true":
            if request.query.get("continue") == "page2":
                return web.Response(body=pod_list(["b"], "10"), content_type=PROTOBUF)
            return web.Response(body=pod_list(["a"], "10", token="page2"), content_type=PROTOBUF)
        resp = web.StreamResponse(headers={"Content-Type": f"{PROTOBUF};stream=watch"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        body = self.watches.pop(0) if self.watches else b""
        for i in range(0, len(body), self.chunk):
            await resp.write(body[i : i + self.chunk])
        if not self.watches and not body:
            await asyncio.sleep(30)  # idle, like a quiet watch
        return resp

    async def json_answer(self, request: web.Request) -> web.StreamResponse:
        pod: dict[str, Any] = {
            "metadata": {"name": "j", "namespace": "ml", "resourceVersion": "3"},
            "spec": {"containers": []},
        }
        if request.query.get("watch") != "true":
            return web.json_response({"items": [pod], "metadata": {"resourceVersion": "3"}})
        resp = web.StreamResponse()
        await resp.prepare(request)
        changed = {"metadata": {**pod["metadata"], "resourceVersion": "4", "labels": {"x": "y"}}}
        await resp.write(json.dumps({"type": "MODIFIED", "object": changed}).encode() + b"\n")
        await asyncio.sleep(30)
        return resp


async def run_until(informer: Informer, done: Callable[[], bool]) -> None:
    task = asyncio.create_task(informer.run())
    try:
        for _ in range(500):
            if done():
                return
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        raise AssertionError("the informer did not get there")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture(params=["aiohttp", "streams"])
def client_for(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], KubeClient]:
    """Clients on both native-async transports (aiohttp's pool, the node agent's plain streams)."""

    def make(url: str) -> KubeClient:
        path = kubeconfig(tmp_path, url)
        return KubeClient.from_config(kubeconfig=path, registry=CollectorRegistry(), http=request.param)

    return make


async def test_informer_lists_and_watches_protobuf_and_relists_on_a_410_error_event(
    client_for: Callable[[str], KubeClient],
) -> None:
    first = (
        frame("ADDED", envelope("Pod", pod_message("c", "11", gpus=4)))
        + frame("BOOKMARK", envelope("Pod", Pod(metadata={"resourceVersion": "15"}).SerializeToString()))
        + frame("DELETED", envelope("Pod", pod_message("a", "16")))
        + frame("ERROR", envelope("Status", status_message(410, "Expired", "too old resource version")))
    )
    api = ProtobufApi([first])
    async with serving(api.handle) as url:
        client = client_for(url)
        informer = Informer(ProtobufSource(client, decode=pod_object), PODS, page_size=1)
        seen: list[tuple[str, str]] = []
        informer.subscribe(lambda e: seen.append((e.type, str(e.object.get("metadata", {}).get("name", "")))))
        try:
            await run_until(informer, lambda: informer.lists == 2 and seen[-1] == ("SYNCED", ""))
        finally:
            await client.aclose()
    assert seen == [
        ("ADDED", "a"), ("ADDED", "b"), ("SYNCED", ""),  # two list pages
        ("ADDED", "c"), ("DELETED", "a"),  # the watch, cut into 7-byte chunks; the bookmark moved the rv
        ("ADDED", "a"), ("DELETED", "c"), ("SYNCED", ""),  # the 410: relisted, the difference emitted
    ]  # fmt: skip
    watches = [q for q in api.queries if q.get("watch") == "true"]
    assert watches[0]["resourceVersion"] == "10"
    assert set(api.accepts) == {"application/vnd.kubernetes.protobuf, application/json"}
    assert informer.store["ml/b"]["spec"] == {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }


async def test_a_json_answer_is_read_as_json(client_for: Callable[[str], KubeClient]) -> None:
    api = ProtobufApi([], json=True)
    async with serving(api.handle) as url:
        client = client_for(url)
        informer = Informer(ProtobufSource(client, decode=pod_object), PODS)
        try:
            await run_until(informer, lambda: informer.resource_version == "4")
        finally:
            await client.aclose()
    assert informer.store["ml/j"]["metadata"]["labels"] == {"x": "y"}  # whole objects, not the decoder's


async def test_a_watch_cut_inside_a_frame_is_an_error(client_for: Callable[[str], KubeClient]) -> None:
    cut = frame("ADDED", envelope("Pod", pod_message("c", "11")))
    api = ProtobufApi([cut + cut[:-3]])
    async with serving(api.handle) as url:
        client = client_for(url)
        try:
            stream = client.watch(PODS, resource_version="10", protobuf=pod_object)
            assert (await anext(stream))["object"]["metadata"]["name"] == "c"
            with pytest.raises(KubeError, match="inside a protobuf frame"):
                await anext(stream)
        finally:
            await client.aclose()


async def test_a_watch_frame_over_the_limit_ends_the_watch_with_an_error(
    client_for: Callable[[str], KubeClient],
) -> None:
    good = frame("ADDED", envelope("Pod", pod_message("c", "11")))
    api = ProtobufApi([good + struct.pack(">I", MAX_FRAME_BYTES + 1) + b"\0" * 64])
    async with serving(api.handle) as url:
        client = client_for(url)
        try:
            stream = client.watch(PODS, resource_version="10", protobuf=pod_object)
            assert (await anext(stream))["object"]["metadata"]["name"] == "c"
            with pytest.raises(KubeError, match="over the"):
                await anext(stream)
        finally:
            await client.aclose()


async def test_without_protobuf_the_client_asks_for_json(client_for: Callable[[str], KubeClient]) -> None:
    api = ProtobufApi([], json=True)
    async with serving(api.handle) as url:
        client = client_for(url)
        try:
            listed = await client.list_objects(PODS)
        finally:
            await client.aclose()
    assert api.accepts == ["application/json"]
    assert listed.items[0]["metadata"]["name"] == "j"


def test_the_protobuf_runtime_is_loaded_only_when_protobuf_is_read() -> None:
    """The adapter and a controller reading JSON never ask for protobuf; the runtime (~1.5 MiB RSS) stays
    out of them. Reading one protobuf body loads it (the check itself can see it)."""
    code = (
        "import sys\n"
        "import adapter.app, controller.app, gpuwarden.kube.client, gpuwarden.kube.status\n"
        "from gpuwarden.kube.status import error_from_status\n"
        'error_from_status(410, b\'{"reason": "Expired"}\')\n'
        "print('google.protobuf' in sys.modules)\n"
        "error_from_status(410, b'k8s\\x00\\x12\\x00')\n"
        "print('google.protobuf' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.parametrize(
    ("protobuf", "json_server", "accept"),
    [
        pytest.param(True, False, PROTOBUF, id="protobuf"),
        pytest.param(False, True, "application/json", id="configured-json"),
        pytest.param(True, True, PROTOBUF, id="server-answers-json"),
    ],
)
async def test_the_controllers_shared_pod_informer_reads_as_configured(
    client_for: Callable[[str], KubeClient], protobuf: bool, json_server: bool, accept: str
) -> None:
    """`gpuwarden controller`'s one live-pod informer (every capability's pods) lists and watches as
    protobuf with `kubernetes.protobuf`, and still reads a server that answers JSON."""
    config = Config.model_validate({"kubernetes": {"protobuf": protobuf}})
    api = ProtobufApi([], json=json_server)
    async with serving(api.handle) as url:
        client = client_for(url)
        try:
            caps = build_capabilities(
                config,
                client,
                PrometheusClient(config.prometheus),
                registry=CollectorRegistry(),
                dry_run=True,
                identity="test",
            )
            await run_until(caps.pods, lambda: caps.pods.synced.is_set())
        finally:
            await client.aclose()
    assert api.accepts[0].split(",")[0].split(";")[0] == accept
    assert sorted(caps.pods.store) == (["ml/j"] if json_server else ["ml/a", "ml/b"])
