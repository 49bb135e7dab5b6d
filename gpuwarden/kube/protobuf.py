"""Kubernetes' protobuf wire format: the envelope, lists, watch frames and `Status`, decoded to what the JSON
path gives (plain dicts), with each object's bytes handed to a caller's `ObjectDecoder`.

Why it exists: kube-scheduler (like every client-go informer) watches pods as protobuf, and the API server's
watch cache encodes each event once per format; a JSON watch beside it makes the server encode every pod
event a second time, and makes us parse all of it (managedFields included) to read a dozen fields. A
decoder built on a subset message (controller/gpus/podpb) skips what it does not read by length.

The format (k8s.io/apimachinery pkg/runtime/serializer/protobuf, framer): a body is the 4-byte magic
`k8s\\x00` then a `runtime.Unknown` whose `raw` is the object's own message (a `...List` for a list). A
watch response (`;stream=watch`) is a sequence of frames, each a 4-byte big-endian length then a
`metav1.WatchEvent` without the envelope; its `object.raw` is an envelope again (the object, or a `Status`
for ERROR events).

What it must not do: interpret objects (the decoder is the caller's) or events (ERROR and BOOKMARK are
passed on as the JSON path passes them: `watch.py` maps them), or load the protobuf runtime before it is
needed: the generated classes are imported on first use, so a process that never asks for protobuf (the
adapter; a controller reading JSON) does not carry it (~1.5 MiB). Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import KubeError

if TYPE_CHECKING:
    from gpuwarden.kube.k8spb import runtime_pb2

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"
ACCEPT = f"{PROTOBUF}, application/json"
"""Protobuf first, JSON as the fallback for a server (or kind: CRDs) that cannot encode protobuf."""
WATCH_CONTENT_TYPE = f"{PROTOBUF};stream=watch"

ObjectDecoder = Callable[[bytes], dict[str, Any]]
"""An object's message bytes (the envelope's `raw`) → the JSON-shaped dict its reader needs; `ValueError`
for bytes that are not such an object (a `KubeError` for the caller, as any other invalid answer)."""


def _decoded(decode: ObjectDecoder, raw: bytes, where: str) -> dict[str, Any]:
    try:
        return decode(raw)
    except ValueError as exc:
        raise KubeError(f"{where}: {exc}") from None


def is_protobuf(body: bytes) -> bool:
    """Whether a response body is a protobuf envelope (a JSON body starts with `{`, never with the magic)."""
    return body[:4] == MAGIC


def _parse(message: str, data: bytes, what: str) -> Any:
    """`data` parsed as the generated class `message` (imported on first use); invalid bytes are a
    `KubeError` starting with `what`."""
    from google.protobuf.message import DecodeError

    from gpuwarden.kube.k8spb import runtime_pb2

    parsed = getattr(runtime_pb2, message)()
    try:
        parsed.ParseFromString(data)
    except DecodeError as exc:
        raise KubeError(f"{what}: {exc}") from None
    return parsed


def _unknown(body: bytes) -> runtime_pb2.Unknown:
    if not is_protobuf(body):
        raise KubeError("API server answered protobuf without the k8s envelope")
    envelope: runtime_pb2.Unknown = _parse("Unknown", body[4:], "API server answered invalid protobuf")
    if envelope.contentEncoding:
        raise KubeError(f"protobuf content encoding {envelope.contentEncoding!r} is not supported")
    return envelope


def status_object(raw: bytes) -> dict[str, Any]:
    """A `metav1.Status` message as its JSON object (the fields `status.py` reads)."""
    status: runtime_pb2.Status = _parse("Status", raw, "API server sent an invalid protobuf Status")
    obj: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    for name in ("status", "message", "reason", "code"):
        if status.HasField(name):
            obj[name] = getattr(status, name)
    if status.HasField("details"):
        details = status.details
        obj["details"] = {
            name: getattr(details, name)
            for name in ("name", "group", "kind", "uid", "retryAfterSeconds")
            if details.HasField(name)
        }
    return obj


def status_body(body: bytes) -> dict[str, Any]:
    """An error answer's protobuf-encoded `Status` as its JSON object ({} when it is something else)."""
    try:
        envelope = _unknown(body)
        if envelope.typeMeta.kind != "Status":
            return {}
        return status_object(envelope.raw)
    except KubeError:
        return {}


def decode_list(body: bytes, decode: ObjectDecoder, api_version: str, kind: str) -> dict[str, Any]:
    """A protobuf `...List` answer as the JSON list object: `items` decoded one by one (each given
    `apiVersion`/`kind`, as `KubeClient.list_objects` does for JSON lists), `metadata.resourceVersion` and
    `continue`."""
    envelope = _unknown(body)
    listed: runtime_pb2.RawList = _parse(
        "RawList", envelope.raw, "API server answered an invalid protobuf list"
    )
    items = []
    for raw in listed.items:
        item = _decoded(decode, raw, "API server listed an object that cannot be decoded")
        item["apiVersion"], item["kind"] = api_version, kind
        items.append(item)
    meta = {"resourceVersion": listed.metadata.resourceVersion}
    if listed.metadata.HasField("continue"):
        meta["continue"] = getattr(listed.metadata, "continue")
    return {"metadata": meta, "items": items}


def watch_event(frame: bytes, decode: ObjectDecoder) -> dict[str, Any]:
    """One watch frame's `WatchEvent` as the JSON event `{"type", "object"}`: an ERROR event's object is its
    `Status`, every other event's object goes through `decode` (BOOKMARKs carry only metadata)."""
    event: runtime_pb2.WatchEvent = _parse("WatchEvent", frame, "watch stream carried invalid protobuf")
    if not event.type:
        raise KubeError("watch stream carried a frame that is not a watch event")
    envelope = _unknown(event.object.raw)
    if envelope.typeMeta.kind == "Status":
        obj = status_object(envelope.raw)
    else:
        obj = _decoded(decode, envelope.raw, "watch stream carried an object that cannot be decoded")
        obj["apiVersion"], obj["kind"] = envelope.typeMeta.apiVersion, envelope.typeMeta.kind
    return {"type": event.type, "object": obj}


_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 16 << 20
"""The largest watch frame taken, as client-go's streaming decoder (`maxBytes`, 16 MiB): a length above
it is refused as soon as it is read, before its bytes are buffered (a length field may ask for 4 GiB)."""


class Frames:
    """Splits a length-delimited stream (4-byte big-endian length, then that many bytes) into frames, fed
    with the chunks as they arrive; a frame longer than `max_bytes` is a `KubeError`."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """The frames completed by `chunk`, in order; `KubeError` at a frame over the limit (once the
        frames before it have been returned)."""
        self._buffer += chunk
        frames: list[bytes] = []
        start, end = 0, len(self._buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(self._buffer, start)
            if length > self._max:
                if frames:  # hand out the frames before it first; the next call refuses it
                    break
                raise KubeError(f"watch stream frame of {length} bytes is over the {self._max}-byte limit")
            if end - start - 4 < length:
                break
            frames.append(bytes(self._buffer[start + 4 : start + 4 + length]))
            start += 4 + length
        if start:
            del self._buffer[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (non-zero at the end of a stream: it was cut short)."""
        return len(self._buffer)
